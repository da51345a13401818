"""`NaiveBlockAllocator`: paged-KV blocks without prefix caching.

Every allocation takes a fresh physical block; blocks are shared only by `fork`, and a shared
block is copied on the first append (copy-on-write). Freed blocks go straight back to the free
list. The prefix-caching methods exist so that both allocators are interchangeable; here they
validate their arguments and report that nothing is cached.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.allocator.base import PooledBlockAllocator
from kvtier.allocator.block import Block
from kvtier.errors import BlockStateError


class NaiveBlockAllocator(PooledBlockAllocator):
    """A pool of `num_blocks` blocks of `block_size` tokens; ids `block_ids` (default
    `range(num_blocks)`). Every operation is O(1) per block touched."""

    def _on_unreferenced(self, block_id: int) -> None:
        self._free.append(block_id)

    def allocate_immutable_blocks(
        self, prev_block: Block | None, block_token_ids: Sequence[Sequence[int]]
    ) -> list[Block]:
        """A fresh full block per entry of `block_token_ids`, chained after `prev_block`.
        All or nothing: NoFreeBlocksError when fewer blocks are free than asked for."""
        self._check_prev(prev_block, need_hash=True)
        packed = self._pack_full_blocks(block_token_ids)
        if len(packed) > len(self._free):
            raise self._no_free_blocks(len(packed))
        blocks: list[Block] = []
        prev = prev_block
        for token_ids, data in zip(block_token_ids, packed, strict=True):
            block = self._new_block(prev, self._acquire_id())
            block._fill(token_ids, data)
            blocks.append(block)
            prev = block
        return blocks

    def promote_to_immutable_block(self, block: Block) -> int:
        """Nothing to register without a cache: checks the block is full and hashed, returns
        its own physical block id."""
        block_id = self._check_block(block, "promote", BlockStateError)
        if block.content_hash is None:
            raise BlockStateError(f"cannot promote {block!r}: it has no content hash")
        return block_id

    def mark_blocks_as_accessed(self, block_ids: Sequence[int], now: float) -> None:
        """Validates `block_ids`; there is no eviction order to update."""
        self._check_ids(block_ids)

    def mark_blocks_as_computed(self, block_ids: Sequence[int]) -> None:
        """Validates `block_ids`; nothing is cached, so nothing is recorded."""
        self._check_ids(block_ids)

    def block_is_computed(self, block_id: int) -> bool:
        """Always False: the naive allocator does not track computed blocks."""
        self._check_id(block_id)
        return False

    def get_common_computed_block_ids(
        self, computed_seq_block_ids: Sequence[Sequence[int]]
    ) -> list[int]:
        """Always []: without prefix caching no prefill can be skipped."""
        return []

    def find_cached_blocks_prefix(self, block_hashes: Sequence[bytes]) -> list[bytes]:
        """Always []: nothing is cached."""
        return []

    def get_num_full_blocks_touched(self, blocks: Sequence[Block]) -> int:
        """Full blocks in `blocks`, counting once those that share one physical block."""
        groups = self._swap_in_groups(blocks, for_swap_in=False)
        return sum(1 for group in groups if group[0].is_full)

    def swap_in(self, blocks: Sequence[Block]) -> None:
        """A fresh physical block per group of blocks that shared one where they come from.
        All or nothing: NoFreeBlocksError when too few are free."""
        groups = self._swap_in_groups(blocks)
        if len(groups) > len(self._free):
            raise self._no_free_blocks(len(groups))
        for group in groups:
            new_id = self._acquire_id()
            for _ in group[1:]:
                self._refs.incr(new_id)
            for block in group:
                block._allocator = self
                block._block_id = new_id

    def check(self) -> None:
        """Every block is either free or referenced, exactly once."""
        problems: list[str] = []
        in_use = self._check_pool(problems)
        if len(self._free) + len(in_use) != self.get_num_total_blocks():
            problems.append(
                f"{len(self._free)} free + {len(in_use)} in use != "
                f"{self.get_num_total_blocks()} blocks"
            )
        self._raise_problems(type(self).__name__, problems)
