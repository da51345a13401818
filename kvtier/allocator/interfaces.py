"""The paged-KV allocator interface: `BlockAllocator` (one pool) and
`DeviceAwareBlockAllocator` (a pool per device behind one interface).

The method set follows vLLM's v0 block manager (`vllm/core/block/interfaces.py`), so a
scheduler written against it ports directly; kvtier's own implementations differ in that
every contract violation raises a kvtier error naming the bad value, content hashes are
stable `bytes` (they key blocks demoted to lower tiers), and multi-block operations are
all-or-nothing.

Ids: a block's `block_id` is a global id, unique across all pools of a device-aware
allocator; `get_physical_block_id` turns it into the zero-based row in its own pool's memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

from kvtier.allocator.block import Block
from kvtier.allocator.device import Device


class EvictionListener(Protocol):
    """Called by a prefix-caching allocator just before it reuses an unused cached block, while
    the block still holds the KV of prefix `content_hash`: the moment to demote it (copy its
    bytes to a lower tier). Raising aborts the allocation that needed the block, which is then
    undone."""

    def __call__(self, content_hash: bytes, block_id: int) -> None: ...


class BlockAllocator(ABC):
    """One pool of fixed-size KV blocks: allocation, reference counting, copy-on-write and
    (in the prefix-caching implementation) sharing of equal prefixes."""

    @property
    @abstractmethod
    def block_size(self) -> int:
        """Tokens per block."""

    # -- allocation --------------------------------------------------------------------------

    @abstractmethod
    def allocate_mutable_block(self, prev_block: Block | None) -> Block:
        """A new empty block after `prev_block` (None: the first block of a sequence), for
        tokens still being generated. NoFreeBlocksError when no block is free or evictable."""

    @abstractmethod
    def allocate_immutable_block(self, prev_block: Block | None, token_ids: Sequence[int]) -> Block:
        """A full block of exactly `block_size` `token_ids` after `prev_block` (which must be
        None or have a content hash). Under prefix caching an equal cached block is shared
        instead of allocating one (and revived if it was unused)."""

    @abstractmethod
    def allocate_immutable_blocks(
        self, prev_block: Block | None, block_token_ids: Sequence[Sequence[int]]
    ) -> list[Block]:
        """A chain of full blocks, one per entry of `block_token_ids`, after `prev_block`.
        All or nothing: NoFreeBlocksError leaves the allocator unchanged."""

    @abstractmethod
    def allocate_or_get_null_block(self) -> Block:
        """The null block: a placeholder for KV blocks dropped by a sliding window. Allocated
        on first call, the same object afterwards (at most one per allocator); never freed."""

    # -- references --------------------------------------------------------------------------

    @abstractmethod
    def free(self, block: Block) -> None:
        """Drop `block`'s reference to its physical block; the block then holds none. Freeing
        the null block does nothing; freeing a block twice raises DoubleFreeError."""

    @abstractmethod
    def free_block_id(self, block_id: int) -> None:
        """Drop one reference to physical block `block_id` without a Block object: for a
        caller that moved its Block objects elsewhere (`DeviceAwareBlockAllocator.swap`)."""

    @abstractmethod
    def fork(self, last_block: Block) -> list[Block]:
        """New Block objects for the whole chain ending at `last_block`, sharing its physical
        blocks (each gains a reference); the first append to a shared block copies it."""

    @abstractmethod
    def refcount(self, block_id: int) -> int:
        """How many Block objects reference physical block `block_id`."""

    # -- capacity and ids --------------------------------------------------------------------

    @abstractmethod
    def get_num_free_blocks(self) -> int:
        """Blocks an allocation could take now: free ones plus unused cached ones."""

    @abstractmethod
    def get_num_total_blocks(self) -> int:
        """Blocks in the pool."""

    @abstractmethod
    def get_physical_block_id(self, absolute_id: int) -> int:
        """The zero-based index of global block id `absolute_id` within this pool (the row of
        the pool's KV memory that holds it). O(1)."""

    @property
    @abstractmethod
    def all_block_ids(self) -> frozenset[int]:
        """Every global block id of this pool."""

    # -- copy-on-write and promotion (called by Block.append_token_ids) ----------------------

    @abstractmethod
    def cow_block_if_not_appendable(self, block: Block) -> int:
        """The physical block `block` may append into: its own if nobody shares it, otherwise a
        fresh one (recorded for `clear_copy_on_writes`); the block is updated to it."""

    @abstractmethod
    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """The (source, destination) block id pairs whose contents must be copied, recorded
        since the last call, in order; forgets them."""

    @abstractmethod
    def promote_to_immutable_block(self, block: Block) -> int:
        """Register the now-full `block` as immutable. Under prefix caching, if an equal block
        is already cached, `block` switches to it and its own physical block is released. The
        block is updated; returns its physical block id."""

    # -- prefix caching ----------------------------------------------------------------------

    @abstractmethod
    def mark_blocks_as_accessed(self, block_ids: Sequence[int], now: float) -> None:
        """Record that the physical blocks `block_ids` were used at time `now` (drives LRU)."""

    @abstractmethod
    def mark_blocks_as_computed(self, block_ids: Sequence[int]) -> None:
        """Record that the KV of the in-use physical blocks `block_ids` has been computed (or
        loaded): only computed blocks are offered as cache hits or kept once unused."""

    @abstractmethod
    def block_is_computed(self, block_id: int) -> bool:
        """Whether physical block `block_id` holds computed KV (see `mark_blocks_as_computed`)."""

    @abstractmethod
    def get_common_computed_block_ids(
        self, computed_seq_block_ids: Sequence[Sequence[int]]
    ) -> list[int]:
        """The longest common prefix of the sequences' computed block id lists: the blocks a
        sequence group may skip in prefill."""

    @abstractmethod
    def find_cached_blocks_prefix(self, block_hashes: Sequence[bytes]) -> list[bytes]:
        """The longest leading run of `block_hashes` whose blocks are cached and computed here."""

    @abstractmethod
    def get_num_full_blocks_touched(self, blocks: Sequence[Block]) -> int:
        """How many physical blocks swapping `blocks` in here would take (full blocks only)."""

    # -- swapping ----------------------------------------------------------------------------

    @abstractmethod
    def swap_out(self, blocks: Sequence[Block]) -> None:
        """Release the physical blocks of `blocks` (like `free`), keeping the Block objects'
        tokens, hashes and computed flags so that another allocator can `swap_in` them."""

    @abstractmethod
    def swap_in(self, blocks: Sequence[Block]) -> None:
        """Give each block a physical block here and make this allocator its owner. Blocks that
        share a physical block where they come from share one here. All or nothing:
        NoFreeBlocksError leaves everything unchanged."""

    # -- checking ----------------------------------------------------------------------------

    @abstractmethod
    def check(self) -> None:
        """Verify the bookkeeping against itself; BlockStateError names each inconsistency.
        Walks every block: for tests, not the hot path."""


class DeviceAwareBlockAllocator(ABC):
    """A `BlockAllocator` per device (GPU, CPU) behind one interface; calls that create
    blocks take the device, calls on existing blocks find it from the block."""

    @abstractmethod
    def allocator(self, device: Device | str) -> BlockAllocator:
        """The allocator of `device`."""

    @abstractmethod
    def device_of(self, block_id: int) -> Device:
        """The device that owns global block id `block_id`."""

    @abstractmethod
    def allocate_mutable_block(self, prev_block: Block | None, device: Device | str) -> Block:
        """`BlockAllocator.allocate_mutable_block` on `device`."""

    @abstractmethod
    def allocate_immutable_block(
        self, prev_block: Block | None, token_ids: Sequence[int], device: Device | str
    ) -> Block:
        """`BlockAllocator.allocate_immutable_block` on `device`."""

    @abstractmethod
    def allocate_immutable_blocks(
        self,
        prev_block: Block | None,
        block_token_ids: Sequence[Sequence[int]],
        device: Device | str,
    ) -> list[Block]:
        """`BlockAllocator.allocate_immutable_blocks` on `device`."""

    @abstractmethod
    def allocate_or_get_null_block(self) -> Block:
        """The GPU allocator's null block."""

    @abstractmethod
    def free(self, block: Block) -> None:
        """Free `block` on the device that owns it."""

    @abstractmethod
    def fork(self, last_block: Block) -> list[Block]:
        """Fork the chain ending at `last_block` on the device that owns it."""

    @abstractmethod
    def get_num_free_blocks(self, device: Device | str) -> int:
        """Free plus evictable blocks on `device`."""

    @abstractmethod
    def get_num_total_blocks(self, device: Device | str) -> int:
        """Blocks on `device`."""

    @abstractmethod
    def get_physical_block_id(self, device: Device | str, absolute_id: int) -> int:
        """The zero-based index of global id `absolute_id` within `device`'s pool."""

    @property
    @abstractmethod
    def all_block_ids(self) -> frozenset[int]:
        """Every global block id, of every device."""

    @abstractmethod
    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """The pending copy-on-write (source, destination) pairs of every device; forgets them.
        Global ids say which device each pair is on."""

    @abstractmethod
    def mark_blocks_as_accessed(self, block_ids: Sequence[int], now: float) -> None:
        """`BlockAllocator.mark_blocks_as_accessed`, each id on the device that owns it."""

    @abstractmethod
    def mark_blocks_as_computed(self, block_ids: Sequence[int]) -> None:
        """`BlockAllocator.mark_blocks_as_computed`, each id on the device that owns it."""

    @abstractmethod
    def get_common_computed_block_ids(
        self, computed_seq_block_ids: Sequence[Sequence[int]]
    ) -> list[int]:
        """`BlockAllocator.get_common_computed_block_ids` of the GPU allocator."""

    @abstractmethod
    def find_cached_blocks_prefix(
        self, block_hashes: Sequence[bytes], device: Device | str = Device.GPU
    ) -> list[bytes]:
        """`BlockAllocator.find_cached_blocks_prefix` on `device`."""

    @abstractmethod
    def get_num_full_blocks_touched(self, blocks: Sequence[Block], device: Device | str) -> int:
        """How many physical blocks swapping `blocks` onto `device` would take."""

    @abstractmethod
    def swap(
        self, blocks: Sequence[Block], src_device: Device | str, dst_device: Device | str
    ) -> dict[int, int]:
        """Move `blocks` from `src_device` to `dst_device`; returns {source id: destination id}
        for the caller to copy the KV bytes. All or nothing."""
