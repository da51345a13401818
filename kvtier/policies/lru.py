"""Least-recently-used eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.keys import OffloadKey
from kvtier.policies.base import CachePolicy, check_evict_count


class LRUCachePolicy(CachePolicy):
    """Evicts the least recently inserted-or-touched ready block.

    One ordered dict, least recent first: every operation is O(1) and eviction walks from the
    old end, skipping blocks that are pinned, pending or protected.
    """

    name: ClassVar[str] = "lru"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
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

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        blocks = self._blocks
        move_to_end = blocks.move_to_end
        for key in reversed(keys):
            if key in blocks:
                move_to_end(key)

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        check_evict_count(n)
        if n == 0:
            return []
        if n > len(self._blocks):
            return None
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        for key, block in self._blocks.items():
            if block.ref_cnt == 0 and key not in protected:
                victims.append((key, block))
                if len(victims) == n:
                    break
        else:
            return None
        blocks = self._blocks
        for key, _ in victims:
            del blocks[key]
        return victims

    def clear(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(list(self._blocks.items()))

    def lru_order(self) -> list[OffloadKey]:
        """Resident keys, least recently used first (for tests and inspection)."""
        return list(self._blocks)
