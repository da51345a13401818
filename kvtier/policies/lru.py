"""Least-recently-used eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from itertools import islice
from operator import attrgetter, itemgetter
from typing import ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies._key_ids import KeyIds
from kvtier.policies._lru_core import LRUIds
from kvtier.policies.base import CachePolicy, check_evict_count
from kvtier.policies.hinted import HintBook

# C-level field readers for map() over a batch of (key, block) entries.
_key_of = itemgetter(0)
_block_of = itemgetter(1)
_ref_cnt = attrgetter("ref_cnt")


class LRUCachePolicy(CachePolicy):
    """Evicts the least recently inserted-or-touched ready block.

    One ordered dict, least recent first: every operation is O(1) and eviction walks from the
    old end, skipping blocks that are pinned, pending or protected.
    """

    name: ClassVar[str] = "lru"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._hints = HintBook()
        self._ids: LRUIds | None = None
        """On ids (`use_ids`, an `auto` shadow): the order, instead of `_blocks`."""
        # `get` is that dict's own bound method (shadowing the method below, which documents
        # it): every caller, not only `getter()`'s, looks up with no Python frame. The dict
        # is never replaced (`clear` empties it), so the binding stays valid. A subclass
        # that overrides `get` keeps its own.
        if type(self).get is LRUCachePolicy.get:
            self.get = self._blocks.get  # type: ignore[method-assign,assignment]

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        if self._ids is not None:
            return self._ids.get
        return self._blocks.get

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._blocks:
            raise BlockStateError(f"lru: key {key!r} is already resident")
        self._blocks[key] = block

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        blocks_by_key = self._blocks
        self._check_insert_batch(keys, blocks, blocks_by_key)
        # a loop, not OrderedDict.update, which is slower than item assignment
        for key, block in zip(keys, blocks, strict=True):
            blocks_by_key[key] = block

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is None:
            raise BlockStateError(f"lru: key {key!r} is not resident")
        if self._hints.reuse:
            self._hints.discard(key)

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        self._hints.mark(key, reuse, key in self._blocks)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        if self._hints.reuse:
            self._hints.touched(keys)
        blocks = self._blocks
        move_to_end = blocks.move_to_end
        for key in reversed(keys):
            if key in blocks:
                move_to_end(key)

    def access(self, keys: Sequence[OffloadKey], block: BlockStatus) -> int:
        """`CachePolicy.access` in one loop over the ordered dict: a hit moves to the
        recent end; a miss evicts the oldest block when full (`evict(1)` when it is pinned
        or hints are active) and is stored."""
        blocks = self._blocks
        move_to_end = blocks.move_to_end
        capacity = self.cache_capacity
        hinted = self._hints.active
        hits = 0
        for key in reversed(keys):
            if key in blocks:
                if hinted:
                    self.touch((key,))
                else:
                    move_to_end(key)
                hits += 1
                continue
            if len(blocks) >= capacity:
                oldest = next(iter(blocks))
                if hinted or blocks[oldest].ref_cnt != 0:
                    if not self.evict(1):
                        continue
                else:
                    del blocks[oldest]
            blocks[key] = block
        return hits

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
        blocks = self._blocks
        # The usual case: the n least recent blocks are all ready, unpinned and unprotected,
        # checked with C-level calls instead of a Python step per block.
        oldest = list(islice(blocks.items(), n))
        if not any(map(_ref_cnt, map(_block_of, oldest))) and not any(
            map(protected.__contains__, map(_key_of, oldest))
        ):
            for key, _ in oldest:
                del blocks[key]
            return oldest
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        for key, block in blocks.items():
            if block.ref_cnt == 0 and key not in protected:
                victims.append((key, block))
                if len(victims) == n:
                    break
        else:
            return None
        for key, _ in victims:
            del blocks[key]
        return victims

    def clear(self) -> None:
        self._blocks.clear()
        self._hints.clear()
        if self._ids is not None:
            self._ids.clear()

    def __len__(self) -> int:
        if self._ids is not None:
            return len(self._ids)
        return len(self._blocks)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        if self._ids is not None:
            return iter(self._ids.entries())
        return iter(list(self._blocks.items()))

    def lru_order(self) -> list[OffloadKey]:
        """Resident keys, least recently used first (for tests and inspection)."""
        if self._ids is not None:
            return self._ids.order()
        return list(self._blocks)

    # -- a shadow on ids (`auto`) ------------------------------------------------------------

    @property
    def on_ids(self) -> bool:
        """Whether this shadow runs on ids (`use_ids`)."""
        return self._ids is not None

    def use_ids(self, table: KeyIds) -> None:
        """Run as a shadow on the ids of `table` from now on (`kvtier.policies._key_ids`),
        in the same order: `access_ids` and `store_ids` take a request's ids; `get`,
        `len`, `items` and `lru_order` read through the table; nothing else is called."""
        if self._ids is not None:
            return
        core = LRUIds(self.cache_capacity, table)
        core.load(list(self._blocks), list(self._blocks.values()))
        self._blocks.clear()
        self._ids = core
        self.get = core.get  # type: ignore[method-assign]
        self.access_ids = core.access  # type: ignore[method-assign]
        self.store_ids = core.store  # type: ignore[method-assign]

    def access_ids(self, ids: Sequence[int], block: BlockStatus) -> int:
        """`access` of a shadow on ids (`use_ids`): a request's ids, as `KeyIds.intern`
        gives them; the hits. (Bound to the core's own by `use_ids`.)"""
        if self._ids is None:
            raise BlockStateError("lru: access_ids needs a shadow on ids (use_ids)")
        return self._ids.access(ids, block)

    def store_ids(self, ids: Sequence[int], block: BlockStatus) -> None:
        """Each id not held stored as a miss (`auto`'s `on_store_move` of a shadow on ids)."""
        if self._ids is None:
            raise BlockStateError("lru: store_ids needs a shadow on ids (use_ids)")
        self._ids.store(ids, block)

    def use_keys(self) -> None:
        """Run on keys again, in the same order (its ids released): a shadow that took
        over and is dropped by `auto` stays readable."""
        core = self._ids
        if core is None:
            return
        self._blocks.update(core.entries())
        core.drop_ids()
        self._ids = None
        del self.get, self.access_ids, self.store_ids
        if type(self).get is LRUCachePolicy.get:
            self.get = self._blocks.get  # type: ignore[method-assign,assignment]
