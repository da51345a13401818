"""`CachePolicy`: which blocks a tier keeps and which it evicts.

Policies are pure data structures: no I/O, no clock reads, no knowledge of tiers or bytes.
They hold each resident block's `BlockStatus` and may only evict blocks that are ready and
unpinned (`ref_cnt == 0`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Container, Iterator, Sequence
from typing import Any, ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies.hinted import HintBook


class CachePolicy(ABC):
    """Organizes a tier's resident blocks and chooses eviction victims.

    The protocol a tier follows (and `simulate` replays):
      - a hit: `touch(keys)`;
      - a miss: `on_store_miss(keys)`, then `evict(n, protected)` if space is short, then
        `insert(key, block)` for each key;
      - a failed store: `remove(key)`;
      - an application's reuse hint on a resident block: `hint(key, reuse)`.
    """

    name: ClassVar[str]

    def __init__(self, cache_capacity: int) -> None:
        if (
            isinstance(cache_capacity, bool)
            or not isinstance(cache_capacity, int)
            or cache_capacity < 1
        ):
            raise InvalidValueError(
                f"cache_capacity must be a positive int, got {cache_capacity!r}"
            )
        self.cache_capacity = cache_capacity

    @abstractmethod
    def get(self, key: OffloadKey) -> BlockStatus | None:
        """The resident block of `key`, or None."""

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        """A callable that does what `get` does, for hot loops; it stays valid for the
        policy's lifetime. The default is `get` itself; a policy that keeps its blocks in one
        dict returns that dict's `get`, a C-level lookup with no Python frame per call."""
        return self.get

    @abstractmethod
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        """Make a newly allocated block resident. Raises BlockStateError if `key` is resident."""

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        """`insert(key, block)` for each pair, in order; raises BlockStateError, inserting
        none, if a key is resident or given twice. Policies override it to insert a tier's
        batch without a Python call per block."""
        self._check_insert_batch(keys, blocks, self)
        for key, block in zip(keys, blocks, strict=True):
            self.insert(key, block)

    def _check_insert_batch(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        resident: Container[OffloadKey],
    ) -> None:
        """Reject a batch that `insert_many` cannot insert whole (checks run in C)."""
        if len(keys) != len(blocks):
            raise InvalidValueError(
                f"{self.name}: {len(keys)} keys but {len(blocks)} blocks to insert"
            )
        if len(keys) > 1 and len(set(keys)) != len(keys):
            raise BlockStateError(f"{self.name}: a key is given twice to insert_many")
        if (
            not resident.keys().isdisjoint(keys)  # one C call for a policy's own dict
            if isinstance(resident, dict)
            else any(map(resident.__contains__, keys))
        ):
            key = next(key for key in keys if key in resident)
            raise BlockStateError(f"{self.name}: key {key!r} is already resident")

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Forget a resident block without recording it as evicted (a failed store leaves no
        trace). Raises BlockStateError if `key` is not resident."""

    @abstractmethod
    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """Record an access to each resident key; absent keys are ignored.

        Keys are taken as one request's prefix, head first: the head ends up the most recently
        used, so a prefix's tail is evicted before its head (a block is only useful when every
        block before it is cached).
        """

    admits_all: ClassVar[bool] = True
    """True when `admit` always says yes (a tier then skips asking)."""

    def admit(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """Whether each absent key (announced by `on_store_miss`) is worth storing; a policy
        that learns which blocks never pay (`lct`) refuses them, and the tier stores only the
        admitted keys. The default admits every key."""
        return [True] * len(keys)

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        """Announce that `keys` (not resident) were requested and are about to be stored.

        Called before `evict` makes room for them. A policy that learns from misses (ARC's
        ghost hits) reads this; the default ignores it. Must not change what `get`, `evict` or
        `len` would observe if no store follows.
        """
        return

    def on_store_move(self, keys: Sequence[OffloadKey]) -> None:
        """Announce that `keys` (not resident) are about to be stored because a tier above is
        evicting them, and this tier has already heard of the access that brought them (a
        write-through chain cascaded them here on their miss). Not a request: a policy that
        counts accesses (`lct`) must not count it again. The default treats it as
        `on_store_miss`, so LRU and ARC decide as they always did; the same rules apply."""
        self.on_store_miss(keys)

    def access(self, keys: Sequence[OffloadKey], block: BlockStatus) -> int:
        """Accesses of `keys`, last first, one by one as `simulate` makes them, and the hits:
        a resident key is touched; an absent one is announced (`on_store_miss`), and if
        admitted stored with `block` after one eviction when the cache is full (not stored
        when no block can be evicted). What `auto` drives a shadow with (one shared ready
        block for every key: metadata only), one call per request; LRU, ARC and S3-FIFO run
        it in one call of their own, with no Python call per key when compiled."""
        get = self.get
        hits = 0
        for key in reversed(keys):
            one = (key,)
            if get(key) is not None:
                self.touch(one)
                hits += 1
                continue
            self.on_store_miss(one)
            if not self.admits_all and not self.admit(one)[0]:
                continue
            if len(self) >= self.cache_capacity and not self.evict(1):
                continue
            self.insert(key, block)
        return hits

    @abstractmethod
    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """Evict exactly `n` ready, unpinned blocks (`ref_cnt == 0`) whose keys are not in
        `protected`, and return them; or return None and change nothing when fewer than `n`
        such blocks exist. Costs O(n + blocks skipped)."""

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        """Take the application's reuse hint on resident `key` (None: withdraw it); a key
        that is not resident is ignored. See `kvtier.hints`: a `"never"` block is evicted
        before any other, an `"unlikely"` one before any unhinted one, a `"likely"` one only
        when every evictable block is `"likely"`. A policy keeps no clock: its driver (the
        tier's bookkeeping, `simulate`) withdraws a hint whose TTL passed. The default
        ignores hints, so a policy written before them keeps working; the built-in ones
        honour them with a `HintBook` (`kvtier.policies.hinted`)."""
        return

    def rank(self, key: OffloadKey, rank: Any) -> None:
        """Take the application's eviction rank of resident `key` (None: withdraw it); a key
        that is not resident is ignored. Ranked blocks that hold no `"likely"` hint are
        evicted lowest rank first, after the `"never"` and `"unlikely"` ones and before the
        policy's own victims; ranked `"likely"` ones likewise before the other `"likely"`
        ones (`kvtier.policies.hinted`). Session hints become ranks (`kvtier.sessions`:
        the least recently active session's blocks first). A rank is any value comparable
        with the others the driver gives. The default hands it to the policy's `HintBook`
        (the `_hints` attribute every built-in policy has), so every policy that honours
        reuse hints honours ranks with no code of its own; a policy without one ignores
        them."""
        book = getattr(self, "_hints", None)
        if isinstance(book, HintBook):
            book.set_rank(key, rank, self.get(key) is not None)

    @abstractmethod
    def clear(self) -> None:
        """Forget every block (whatever its ref_cnt) and all learned state."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of resident blocks."""

    @abstractmethod
    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        """Every resident (key, block), in no promised order."""

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.cache_capacity}, resident={len(self)})"


def check_evict_count(n: int) -> None:
    """Reject a negative or non-integer eviction count."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidValueError(f"evict: n must be a non-negative int, got {n!r}")
