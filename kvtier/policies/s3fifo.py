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

Plain Python (ordered dicts), as LRU is: every step is O(1) amortized (a block in M is
reinserted at most 3 times per hit it had).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from itertools import chain
from typing import ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
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
    """S3-FIFO: a small probation FIFO, a main FIFO with reinsertion, a ghost FIFO."""

    name: ClassVar[str] = "s3fifo"

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
        self.small_target = max(1, round(small * cache_capacity))
        """S's share, in blocks: evictions take from S while it holds at least this many."""
        self.ghost_capacity = round(ghosts * cache_capacity)
        self.move_threshold = move_threshold
        self._blocks: dict[OffloadKey, BlockStatus] = {}
        self._freq: dict[OffloadKey, int] = {}
        self._small: OrderedDict[OffloadKey, None] = OrderedDict()
        self._main: OrderedDict[OffloadKey, None] = OrderedDict()
        self._ghost: OrderedDict[OffloadKey, None] = OrderedDict()
        self._hints = HintBook()
        # `get` is that dict's own bound method, as LRU's is (the dict is never replaced).
        if type(self).get is S3FIFOCachePolicy.get:
            self.get = self._blocks.get  # type: ignore[method-assign,assignment]

    # -- inspection ------------------------------------------------------------------------

    def queues(self) -> dict[str, list[OffloadKey]]:
        """S, M and G, each oldest first (for tests and inspection)."""
        return {"small": list(self._small), "main": list(self._main), "ghost": list(self._ghost)}

    def frequency(self, key: OffloadKey) -> int:
        """The 2-bit counter of resident `key` (0 if absent)."""
        return self._freq.get(key, 0)

    def adopted(self, entries: Sequence[tuple[OffloadKey, BlockStatus]]) -> S3FIFOCachePolicy:
        """A new S3-FIFO of this capacity holding exactly `entries` (key, block), oldest
        first, in this one's state: its queues' order, counters and ghosts for the keys it
        holds; a key it does not hold goes first into S (the first to leave), and a key it
        holds that `entries` lack becomes a ghost (newest), so that it comes back to M, where
        this one kept it (without, a switch of `auto` on cloudPhysics at 10 % lost 0.005
        more). `auto` hands the tier over this way to the S3-FIFO its shadow simulated."""
        new = S3FIFOCachePolicy(self.cache_capacity)
        new.small_target, new.ghost_capacity = self.small_target, self.ghost_capacity
        new.move_threshold = self.move_threshold
        blocks = dict(entries)
        new._blocks.update(entries)
        for key, _ in entries:
            if key not in self._blocks:
                new._small[key] = None
                new._freq[key] = 0
        for queue, into in ((self._small, new._small), (self._main, new._main)):
            for key in queue:
                if key in blocks:
                    into[key] = None
                    new._freq[key] = self._freq[key]
        new._ghost.update((key, None) for key in self._ghost if key not in blocks)
        for queue in (self._main, self._small):  # what the tier lacks comes back to M
            for key in queue:
                if key not in blocks:
                    new._remember(key)
        return new

    # -- CachePolicy -----------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._blocks.get

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._blocks:
            raise BlockStateError(f"s3fifo: key {key!r} is already resident")
        self._insert(key, block)

    def _insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._blocks[key] = block
        self._freq[key] = 0
        if self._ghost.pop(key, 0) is None:  # a ghost's value is None: it comes back to M
            self._main[key] = None
        else:
            self._small[key] = None

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        self._check_insert_batch(keys, blocks, self._blocks)
        for key, block in zip(keys, blocks, strict=True):
            self._insert(key, block)

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is None:
            raise BlockStateError(f"s3fifo: key {key!r} is not resident")
        del self._freq[key]
        if self._small.pop(key, 0) is not None:  # not in S: in M
            del self._main[key]
        if self._hints.reuse:
            self._hints.discard(key)

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        self._hints.mark(key, reuse, key in self._blocks)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        if self._hints.reuse:
            self._hints.touched(keys)
        freq = self._freq
        for key in keys:
            count = freq.get(key)
            if count is not None and count < MAX_FREQ:
                freq[key] = count + 1

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        check_evict_count(n)
        if n == 0:
            return []
        if n > len(self._blocks):
            return None
        if self._hints.active:
            return self._hints.evict_hinted(
                n, protected, self.evict, self._blocks.get, self.remove, self.items
            )
        if not self._can_evict(n, protected):
            return None
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        while len(victims) < n:
            victims.append(self._evict_one(protected))
        return victims

    def _can_evict(self, n: int, protected: Collection[OffloadKey]) -> bool:
        """Whether `n` resident blocks are ready, unpinned and unprotected."""
        blocks = self._blocks
        found = 0
        for key in chain(self._small, self._main):
            if blocks[key].ref_cnt == 0 and key not in protected:
                found += 1
                if found == n:
                    return True
        return False

    def _evict_one(self, protected: Collection[OffloadKey]) -> tuple[OffloadKey, BlockStatus]:
        """One eviction, the paper's; some block is evictable (`_can_evict`)."""
        small, main, blocks, freq = self._small, self._main, self._blocks, self._freq
        # Blocks put back since the last progress in each queue: a queue all of whose
        # blocks were put back has no evictable one, and the other queue is walked instead.
        stuck_small = stuck_main = 0
        while True:
            use_small = small and stuck_small < len(small)
            if use_small and len(small) < self.small_target and main and stuck_main < len(main):
                use_small = False
            if use_small:
                key, _ = small.popitem(last=False)
                block = blocks[key]
                if block.ref_cnt != 0 or key in protected:
                    small[key] = None
                    stuck_small += 1
                    continue
                stuck_small = 0
                if freq[key] >= self.move_threshold:
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

    def _remember(self, key: OffloadKey) -> None:
        """Put `key`, evicted from S, in the ghost queue (its oldest falls out when full)."""
        if self.ghost_capacity <= 0:
            return
        ghost = self._ghost
        ghost[key] = None
        if len(ghost) > self.ghost_capacity:
            ghost.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
        self._freq.clear()
        self._small.clear()
        self._main.clear()
        self._ghost.clear()
        self._hints.clear()

    def __len__(self) -> int:
        return len(self._blocks)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(list(self._blocks.items()))
