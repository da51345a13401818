"""S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP 2023).

Three FIFO queues: a small one S (`SMALL` = 10 % of the capacity), a main one M (the rest),
and a ghost one G of keys only (as many as M holds). A new block goes to S, or to M when its
key is in G (it was evicted from S not long ago: it comes back). A hit only raises the
block's frequency, a 2-bit counter (at most 3); no queue changes on a hit. An eviction
takes from S while S holds at least its share, else from M:
  - S's oldest block moves to M (its counter cleared) if it was hit at least
    `MOVE_THRESHOLD` times while in S, else it is evicted and its key enters G;
  - M's oldest block is reinserted at M's newest end with its counter decreased by one if it
    is above 0 (FIFO with reinsertion, "2-bit clock"), else evicted.
Most blocks of a real workload are seen once: S lets them go after a short stay, while M
keeps what was reused, and G brings back quickly what S let go too soon.

The only departures are where a tier cannot follow the paper:
  - a pinned, pending or protected block is never evicted: it is put back at the newest end
    of its queue, counter unchanged, and the walk goes on (the queue whose evictable blocks
    run out gives way to the other);
  - `evict(n)` evicts exactly `n` blocks or changes nothing: it first checks, walking S then
    M, that `n` blocks can be evicted (O(n + blocks skipped)), then evicts as the paper does.
  - a failed store (`remove`) leaves no ghost.
A move from S to M is free (libCacheSim's S3FIFO.c does the same: an eviction evicts one
block; M may grow past its share until the next eviction from it).

The state and steps are `S3FIFOQueues` (`kvtier/policies/_s3fifo_core.py`, this algorithm's
one source: an int node per key, S, M and G linked lists over int arrays, every step O(1)
amortized, a hit one dict look-up), written in Cython's pure Python mode as
ARC's core is: `scripts/build-core` compiles it, and without a build it runs as plain Python,
the same text. This class adds what is not S3-FIFO's: the checks of its arguments and the
reuse hints.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies._key_ids import KeyIds
from kvtier.policies._s3fifo_core import S3FIFOQueues
from kvtier.policies.base import CachePolicy, check_evict_count
from kvtier.policies.hinted import HintBook

SMALL = 0.10
"""The small queue's share of the capacity (the paper's 10 %)."""
GHOSTS = 0.90
"""Keys the ghost queue remembers, as a share of the capacity (as many as M holds)."""
MOVE_THRESHOLD = 1
"""Hits while in S that move a block to M instead of evicting it: the paper's "accessed at
least once" (libCacheSim's `move-to-main-threshold=1`, the SOSP'23 setting)."""
MAX_FREQ = 3
"""The counter's ceiling: two bits."""


class S3FIFOCachePolicy(CachePolicy):
    """S3-FIFO: a small probation FIFO, a main FIFO with reinsertion, a ghost FIFO.

    `get` and `insert` are `S3FIFOQueues`' own, with no frame of this class's, unless a
    subclass overrides them."""

    name: ClassVar[str] = "s3fifo"
    queues_class: ClassVar[type[S3FIFOQueues]] = S3FIFOQueues
    """The class of the state and steps: `S3FIFOQueues`, compiled when the core is; a test
    gives a subclass the pure-Python one to compare the two (`tests/test_compiled_s3fifo.py`)."""

    def __init__(
        self,
        cache_capacity: int,
        *,
        small: float = SMALL,
        ghosts: float = GHOSTS,
        move_threshold: int = MOVE_THRESHOLD,
    ) -> None:
        """`small` and `ghosts` (shares of the capacity) and `move_threshold` default to the
        paper's settings; they are parameters for comparison with other implementations."""
        super().__init__(cache_capacity)
        if not 0.0 < small < 1.0:
            raise InvalidValueError(f"s3fifo: small must be in (0, 1), got {small!r}")
        if not ghosts >= 0.0:
            raise InvalidValueError(f"s3fifo: ghosts must be >= 0, got {ghosts!r}")
        if not 1 <= move_threshold <= MAX_FREQ:
            raise InvalidValueError(
                f"s3fifo: move_threshold must be 1 to {MAX_FREQ}, got {move_threshold!r}"
            )
        self._hints = HintBook()
        self._bind(
            self.queues_class(
                cache_capacity,
                max(1, round(small * cache_capacity)),
                round(ghosts * cache_capacity),
                move_threshold,
            )
        )

    def _bind(self, core: S3FIFOQueues) -> None:
        """Serve from `core`: `get` and `insert` bound to the instance, so that every caller
        reaches the dict or the core with no Python frame (the dict is never replaced)."""
        self._core = core
        cls = type(self)
        if cls.get is S3FIFOCachePolicy.get:
            self.get = core.blocks.get  # type: ignore[method-assign,assignment]
        if cls.insert is S3FIFOCachePolicy.insert:
            self.insert = core.insert  # type: ignore[method-assign]

    # -- inspection ------------------------------------------------------------------------

    @property
    def small_target(self) -> int:
        """S's share, in blocks: evictions take from S while it holds at least this many."""
        return self._core.small_target

    @property
    def ghost_capacity(self) -> int:
        """Keys the ghost queue remembers."""
        return self._core.ghost_capacity

    @property
    def move_threshold(self) -> int:
        """Hits while in S that move a block to M."""
        return self._core.move_threshold

    def queues(self) -> dict[str, list[OffloadKey]]:
        """S, M and G, each oldest first (for tests and inspection)."""
        core = self._core
        return {"small": list(core.small), "main": list(core.main), "ghost": list(core.ghost)}

    def frequency(self, key: OffloadKey) -> int:
        """The 2-bit counter of resident `key` (0 if absent)."""
        return self._core.frequency(key)

    def access(self, keys: Sequence[OffloadKey], block: BlockStatus) -> int:
        """A shadow's accesses of `keys`, last first, each stored with `block` on a miss:
        the hits (`S3FIFOQueues.access`; what `auto` drives a shadow with)."""
        if self._hints.active:  # never in a shadow; the calls one by one honour the hints
            return super().access(keys, block)
        return self._core.access(keys, block)

    def adopted(self, entries: Sequence[tuple[OffloadKey, BlockStatus]]) -> S3FIFOCachePolicy:
        """A new S3-FIFO of this capacity holding exactly `entries` (key, block), oldest
        first, in this one's state: its queues' order, counters and ghosts for the keys it
        holds; a key it does not hold goes first into S (the first to leave), and a key it
        holds that `entries` lack becomes a ghost (newest), so that it comes back to M, where
        this one kept it (without, a switch of `auto` on cloudPhysics at 10 % lost 0.005
        more). `auto` hands the tier over this way to the S3-FIFO its shadow simulated."""
        new = type(self)(self.cache_capacity)
        old = self._core
        core = self.queues_class(
            self.cache_capacity, old.small_target, old.ghost_capacity, old.move_threshold
        )
        new._bind(core)
        blocks = dict(entries)
        held = old.blocks if not old.on_ids else dict(old.entries())
        core.blocks.update(entries)  # the resident dict in `entries`' order, as before
        for key, block in entries:
            if key not in held:
                core.place(key, block, False, 0)
        for to_main, queue in ((False, old.small), (True, old.main)):
            for key in queue:
                if key in blocks:
                    core.place(key, blocks[key], to_main, old.frequency(key))
        for key in old.ghost:
            if key not in blocks:
                core.remember(key)
        for queue in (old.main, old.small):  # what the tier lacks comes back to M
            for key in queue:
                if key not in blocks:
                    core.remember(key)
        return new

    # -- CachePolicy -----------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._core.blocks.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        if self._core.on_ids:
            return self._core.get
        return self._core.blocks.get

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._core.insert(key, block)

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        core = self._core
        self._check_insert_batch(keys, blocks, core.blocks)
        core.insert_many(keys, blocks)

    def remove(self, key: OffloadKey) -> None:
        self._core.remove(key)
        if self._hints.reuse:
            self._hints.discard(key)

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        self._hints.mark(key, reuse, key in self._core.blocks)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        if self._hints.reuse:
            self._hints.touched(keys)
        self._core.touch(keys)

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        check_evict_count(n)
        if n == 0:
            return []
        if n > self._core.resident_count():
            return None
        if self._hints.active:
            return self._hints.evict_hinted(
                n, protected, self.evict, self._core.blocks.get, self.remove, self.items
            )
        return self._core.evict(n, protected)

    def clear(self) -> None:
        self._core.clear()
        self._hints.clear()

    def __len__(self) -> int:
        return self._core.resident_count()

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        if self._core.on_ids:
            return iter(self._core.entries())
        return iter(list(self._core.blocks.items()))

    # -- a shadow on ids (`auto`) ------------------------------------------------------------

    @property
    def on_ids(self) -> bool:
        """Whether this shadow runs on ids (`use_ids`)."""
        return self._core.on_ids

    def use_ids(self, table: KeyIds) -> None:
        """Run as a shadow on the ids of `table` from now on (`kvtier.policies._key_ids`),
        in the same state: `access_ids` and `store_ids` take a request's ids; `get`, `len`,
        `items`, `queues`, `frequency` and `adopted` read through the table; nothing else
        is called."""
        core = self._core
        core.use_ids(table)
        self.get = core.get  # type: ignore[method-assign]
        self.access_ids = core.access  # type: ignore[method-assign,assignment]
        self.store_ids = core.store  # type: ignore[method-assign,assignment]

    def access_ids(self, ids: Sequence[int], block: BlockStatus) -> int:
        """`access` of a shadow on ids (`use_ids`): a request's ids, as `KeyIds.intern`
        gives them; the hits. (Bound to the core's own by `use_ids`.)"""
        if not self._core.on_ids:
            raise BlockStateError("s3fifo: access_ids needs a shadow on ids (use_ids)")
        return self._core.access(ids, block)  # type: ignore[arg-type]

    def store_ids(self, ids: Sequence[int], block: BlockStatus) -> None:
        """Each id not held stored as a miss (`auto`'s `on_store_move` of a shadow on ids)."""
        if not self._core.on_ids:
            raise BlockStateError("s3fifo: store_ids needs a shadow on ids (use_ids)")
        self._core.store(ids, block)  # type: ignore[arg-type]

    def use_keys(self) -> None:
        """Run on keys again, in the same state (its ids released): a shadow that took
        over and is dropped by `auto` stays readable."""
        if self._core.on_ids:
            self._core.use_keys()
            self._bind(self._core)
            del self.access_ids, self.store_ids
