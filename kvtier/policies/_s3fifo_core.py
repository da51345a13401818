# cython: annotation_typing=True
"""S3-FIFO's state and steps, `S3FIFOQueues`: the one source of the algorithm that
`kvtier.policies.s3fifo.S3FIFOCachePolicy` runs, compiled or as plain Python.

The algorithm and its departures for a tier are s3fifo.py's docstring. The queues S, M and G
are ordered dicts of keys (oldest first), beside a dict of the resident blocks and one of
their 2-bit counters: every step is O(1) amortized (a block in M is reinserted at most 3
times per hit it had). `access` is a whole request's accesses of a shadow at once (`auto`
drives its shadows so): per key, what `simulate` does with one access, with no Python call
per key when compiled.

Written in Cython's pure Python mode, as `_arc_core.py` is: `scripts/build-core` compiles
this file with its annotations as C types (the class an extension type, its counts C
integers, its `@cython.cfunc` methods C functions); without a build it runs as the Python it
is (`cython` is Cython's shadow module, or `_cython_shim`). Both take the same decisions
(`tests/test_compiled_s3fifo.py` runs this file's text both ways in one process and compares
every answer and state).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.keys import OffloadKey

if TYPE_CHECKING:  # mypy checks this module against what runs without Cython
    from kvtier.policies import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the module runs as the plain Python it is
        from kvtier.policies import _cython_shim as cython

MAX_FREQ = cython.declare(cython.int, 3)
"""The counter's ceiling: two bits."""


@cython.final
@cython.cclass
class S3FIFOQueues:
    """S3-FIFO's state (S, M, G, the blocks and their counters) and steps, each one of
    `S3FIFOCachePolicy`'s calls once the policy has checked its arguments."""

    _capacity: cython.Py_ssize_t
    _small_target: cython.Py_ssize_t
    _ghost_capacity: cython.Py_ssize_t
    _move_threshold: cython.int
    _blocks: dict[OffloadKey, BlockStatus]
    _freq: dict[OffloadKey, int]
    _small: OrderedDict[OffloadKey, None]
    _main: OrderedDict[OffloadKey, None]
    _ghost: OrderedDict[OffloadKey, None]

    def __init__(
        self,
        capacity: cython.Py_ssize_t,
        small_target: cython.Py_ssize_t,
        ghost_capacity: cython.Py_ssize_t,
        move_threshold: cython.int,
    ) -> None:
        self._capacity = capacity
        self._small_target = small_target
        self._ghost_capacity = ghost_capacity
        self._move_threshold = move_threshold
        self._blocks = {}
        self._freq = {}
        self._small = OrderedDict()
        self._main = OrderedDict()
        self._ghost = OrderedDict()

    # -- inspection ------------------------------------------------------------------------

    @property
    def small_target(self) -> int:
        """S's share, in blocks: evictions take from S while it holds at least this many."""
        return self._small_target

    @property
    def ghost_capacity(self) -> int:
        return self._ghost_capacity

    @property
    def move_threshold(self) -> int:
        return self._move_threshold

    @property
    def blocks(self) -> dict[OffloadKey, BlockStatus]:
        """The resident blocks by key (unordered): `S3FIFOCachePolicy.get` is its `get`."""
        return self._blocks

    @property
    def freq(self) -> dict[OffloadKey, int]:
        """Each resident key's 2-bit counter."""
        return self._freq

    @property
    def small(self) -> OrderedDict[OffloadKey, None]:
        return self._small

    @property
    def main(self) -> OrderedDict[OffloadKey, None]:
        return self._main

    @property
    def ghost(self) -> OrderedDict[OffloadKey, None]:
        return self._ghost

    # -- steps -----------------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._blocks:
            raise BlockStateError(f"s3fifo: key {key!r} is already resident")
        self._insert(key, block)

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        """Insert every key (the policy checked the batch)."""
        i: cython.Py_ssize_t
        for i in range(len(keys)):
            self._insert(keys[i], blocks[i])

    @cython.cfunc
    def _insert(self, key: OffloadKey, block: BlockStatus) -> cython.int:
        self._blocks[key] = block
        self._freq[key] = 0
        if self._ghost.pop(key, 0) is None:  # a ghost's value is None: it comes back to M
            self._main[key] = None
        else:
            self._small[key] = None
        return 0

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is None:
            raise BlockStateError(f"s3fifo: key {key!r} is not resident")
        del self._freq[key]
        if self._small.pop(key, 0) is not None:  # not in S: in M
            del self._main[key]

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """Hits: each resident key's counter goes up by one, to `MAX_FREQ` at most."""
        for key in keys:
            self._touch(key)

    @cython.cfunc
    def _touch(self, key: OffloadKey) -> cython.bint:
        """A hit on `key` if resident; whether it was."""
        count = self._freq.get(key)
        if count is None:
            return False
        if count < MAX_FREQ:
            self._freq[key] = count + 1
        return True

    def access(self, keys: Sequence[OffloadKey], block: BlockStatus) -> int:
        """Accesses of `keys`, last first, as `simulate` makes them one by one: a hit
        touches the key; a miss stores it with `block`, evicting one block when full (not
        stored when every block is pinned). Returns the hits. (S3-FIFO admits every key and
        ignores announcements; hints are the policy's, which `auto` never gives a shadow.)"""
        hits: cython.Py_ssize_t = 0
        i: cython.Py_ssize_t
        for i in range(len(keys) - 1, -1, -1):
            key = keys[i]
            if self._touch(key):
                hits += 1
                continue
            if len(self._blocks) >= self._capacity and not self._evict_into(1, (), None):
                continue
            self._insert(key, block)
        return hits

    def evict(
        self, n: cython.Py_ssize_t, protected: Collection[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """n >= 1 victims (n at most the resident count), or None changing nothing when n
        blocks cannot be evicted."""
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        if not self._evict_into(n, protected, victims):
            return None
        return victims

    @cython.cfunc
    def _evict_into(
        self,
        n: cython.Py_ssize_t,
        protected: Collection[OffloadKey],
        victims: list[tuple[OffloadKey, BlockStatus]] | None,
    ) -> cython.bint:
        """Evict n blocks (appended to `victims` unless None); False changing nothing when
        n blocks cannot be evicted."""
        if n > len(self._blocks) or not self._can_evict(n, protected):
            return False
        done: cython.Py_ssize_t = 0
        while done < n:
            victim = self._evict_one(protected)
            done += 1
            if victims is not None:
                victims.append(victim)
        return True

    @cython.cfunc
    def _can_evict(self, n: cython.Py_ssize_t, protected: Collection[OffloadKey]) -> cython.bint:
        """Whether `n` resident blocks are ready, unpinned and unprotected."""
        blocks = self._blocks
        found: cython.Py_ssize_t = 0
        for queue in (self._small, self._main):
            for key in queue:
                if blocks[key].ref_cnt == 0 and key not in protected:
                    found += 1
                    if found == n:
                        return True
        return False

    @cython.cfunc
    def _evict_one(self, protected: Collection[OffloadKey]) -> tuple[OffloadKey, BlockStatus]:
        """One eviction, the paper's; some block is evictable (`_can_evict`)."""
        small, main, blocks, freq = self._small, self._main, self._blocks, self._freq
        # Blocks put back since the last progress in each queue: a queue all of whose
        # blocks were put back has no evictable one, and the other queue is walked instead.
        stuck_small: cython.Py_ssize_t = 0
        stuck_main: cython.Py_ssize_t = 0
        count: cython.int
        use_small: cython.bint
        while True:
            use_small = len(small) > 0 and stuck_small < len(small)
            if (
                use_small
                and len(small) < self._small_target
                and len(main) > 0
                and stuck_main < len(main)
            ):
                use_small = False
            if use_small:
                key, _ = small.popitem(last=False)
                block = blocks[key]
                if block.ref_cnt != 0 or key in protected:
                    small[key] = None
                    stuck_small += 1
                    continue
                stuck_small = 0
                if freq[key] >= self._move_threshold:
                    freq[key] = 0
                    main[key] = None
                    stuck_main = 0  # M has an evictable block again
                    continue
                del blocks[key], freq[key]
                self._remember(key)
                return key, block
            key, _ = main.popitem(last=False)
            block = blocks[key]
            if block.ref_cnt != 0 or key in protected:
                main[key] = None
                stuck_main += 1
                continue
            count = freq[key]
            if count > 0:
                freq[key] = count - 1
                main[key] = None
                stuck_main = 0
                continue
            del blocks[key], freq[key]
            return key, block

    @cython.cfunc
    def _remember(self, key: OffloadKey) -> cython.int:
        """Put `key`, evicted from S, in the ghost queue (its oldest falls out when full)."""
        if self._ghost_capacity <= 0:
            return 0
        ghost = self._ghost
        ghost[key] = None
        if len(ghost) > self._ghost_capacity:
            ghost.popitem(last=False)
        return 0

    def clear(self) -> None:
        self._blocks.clear()
        self._freq.clear()
        self._small.clear()
        self._main.clear()
        self._ghost.clear()
