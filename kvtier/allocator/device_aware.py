"""`CpuGpuBlockAllocator`: a GPU and a CPU block allocator behind one interface.

Block ids are global: the two pools have disjoint ids (`create` gives the GPU ids
`[0, num_gpu_blocks)` and the CPU ids after them), so a block id alone says which device holds
it, and `swap` can return one `{source id: destination id}` map for the engine's copy kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from kvtier.allocator.block import Block
from kvtier.allocator.device import Device
from kvtier.allocator.interfaces import (
    BlockAllocator,
    DeviceAwareBlockAllocator,
    EvictionListener,
)
from kvtier.allocator.naive import NaiveBlockAllocator
from kvtier.allocator.prefix_caching import PrefixCachingBlockAllocator
from kvtier.errors import BlockStateError, InvalidValueError

AllocatorType = Literal["naive", "prefix_caching"]
"""The kinds of per-device allocator `CpuGpuBlockAllocator.create` builds."""


class CpuGpuBlockAllocator(DeviceAwareBlockAllocator):
    """Routes each call to the GPU or CPU allocator: by the `device` argument for new blocks,
    by the block (or its global id) for everything else."""

    @classmethod
    def create(
        cls,
        allocator_type: AllocatorType,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        *,
        on_gpu_evict: EvictionListener | None = None,
    ) -> CpuGpuBlockAllocator:
        """Two allocators of `allocator_type`, GPU ids first. `on_gpu_evict` is the GPU
        prefix-caching allocator's eviction listener (where demotion to a lower tier starts)."""
        gpu_ids = range(num_gpu_blocks)
        cpu_ids = range(num_gpu_blocks, num_gpu_blocks + num_cpu_blocks)
        if allocator_type == "naive":
            if on_gpu_evict is not None:
                raise InvalidValueError("on_gpu_evict needs allocator_type='prefix_caching'")
            gpu: BlockAllocator = NaiveBlockAllocator(num_gpu_blocks, block_size, gpu_ids)
            cpu: BlockAllocator = NaiveBlockAllocator(num_cpu_blocks, block_size, cpu_ids)
        elif allocator_type == "prefix_caching":
            gpu = PrefixCachingBlockAllocator(
                num_gpu_blocks, block_size, gpu_ids, on_evict=on_gpu_evict
            )
            cpu = PrefixCachingBlockAllocator(num_cpu_blocks, block_size, cpu_ids)
        else:
            raise InvalidValueError(
                f"unknown allocator_type {allocator_type!r}; valid: 'naive', 'prefix_caching'"
            )
        return cls(gpu=gpu, cpu=cpu)

    def __init__(self, gpu: BlockAllocator, cpu: BlockAllocator) -> None:
        if gpu is cpu:
            raise InvalidValueError("the GPU and CPU allocators must be two objects")
        shared = gpu.all_block_ids & cpu.all_block_ids
        if shared:
            raise InvalidValueError(
                f"GPU and CPU block ids must not collide; both have {sorted(shared)[:5]}"
            )
        if gpu.block_size != cpu.block_size:
            raise InvalidValueError(
                f"GPU and CPU block sizes differ: {gpu.block_size} != {cpu.block_size}"
            )
        self._allocators: dict[Device, BlockAllocator] = {Device.GPU: gpu, Device.CPU: cpu}
        self._device_of_id: dict[int, Device] = {}
        for device, allocator in self._allocators.items():
            self._device_of_id.update(dict.fromkeys(allocator.all_block_ids, device))
        self._all_block_ids = frozenset(self._device_of_id)

    # -- routing -----------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        """Tokens per block (the same on both devices)."""
        return self._allocators[Device.GPU].block_size

    def allocator(self, device: Device | str) -> BlockAllocator:
        """The allocator of `device` ("gpu" or "cpu")."""
        return self._allocators[Device.parse(device)]

    def device_of(self, block_id: int) -> Device:
        """The device whose pool holds global id `block_id`."""
        try:
            return self._device_of_id[block_id]
        except (KeyError, TypeError):
            raise InvalidValueError(f"block id {block_id!r} is on no device") from None

    def _owner(self, block: Block, action: str) -> BlockAllocator:
        if not isinstance(block, Block):
            raise InvalidValueError(f"cannot {action} a {type(block).__name__}: not a Block")
        for allocator in self._allocators.values():
            if block.allocator is allocator:
                return allocator
        raise InvalidValueError(f"cannot {action} {block!r}: it belongs to no device here")

    # -- allocation ----------------------------------------------------------------------------

    def allocate_mutable_block(self, prev_block: Block | None, device: Device | str) -> Block:
        """A new empty block on `device` after `prev_block`."""
        return self.allocator(device).allocate_mutable_block(prev_block)

    def allocate_immutable_block(
        self, prev_block: Block | None, token_ids: Sequence[int], device: Device | str
    ) -> Block:
        """A full block of `token_ids` on `device` after `prev_block`."""
        return self.allocator(device).allocate_immutable_block(prev_block, token_ids)

    def allocate_immutable_blocks(
        self,
        prev_block: Block | None,
        block_token_ids: Sequence[Sequence[int]],
        device: Device | str,
    ) -> list[Block]:
        """A chain of full blocks on `device` after `prev_block`; all or nothing."""
        return self.allocator(device).allocate_immutable_blocks(prev_block, block_token_ids)

    def allocate_or_get_null_block(self) -> Block:
        """The GPU allocator's null block (one per allocator)."""
        return self._allocators[Device.GPU].allocate_or_get_null_block()

    def free(self, block: Block) -> None:
        """Free `block` on its device (DoubleFreeError if it holds no block)."""
        self._owner(block, "free").free(block)

    def fork(self, last_block: Block) -> list[Block]:
        """Fork the chain ending at `last_block` on its device."""
        return self._owner(last_block, "fork").fork(last_block)

    # -- capacity and ids ----------------------------------------------------------------------

    def get_num_free_blocks(self, device: Device | str) -> int:
        """Free plus evictable blocks on `device`."""
        return self.allocator(device).get_num_free_blocks()

    def get_num_total_blocks(self, device: Device | str) -> int:
        """Blocks on `device`."""
        return self.allocator(device).get_num_total_blocks()

    def get_physical_block_id(self, device: Device | str, absolute_id: int) -> int:
        """The zero-based index of `absolute_id` within `device`'s pool."""
        return self.allocator(device).get_physical_block_id(absolute_id)

    @property
    def all_block_ids(self) -> frozenset[int]:
        """Every global block id of both devices."""
        return self._all_block_ids

    # -- copy-on-write and prefix caching --------------------------------------------------------

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Pending copy-on-writes of the GPU, then of the CPU; forgets them."""
        pairs: list[tuple[int, int]] = []
        for allocator in self._allocators.values():
            pairs.extend(allocator.clear_copy_on_writes())
        return pairs

    def _ids_by_device(self, block_ids: Sequence[int]) -> dict[Device, list[int]]:
        by_device: dict[Device, list[int]] = {}
        for block_id in block_ids:
            by_device.setdefault(self.device_of(block_id), []).append(block_id)
        return by_device

    def mark_blocks_as_accessed(self, block_ids: Sequence[int], now: float) -> None:
        """Mark each id accessed at `now` on the device that owns it (unknown ids raise
        before anything is marked)."""
        for device, ids in self._ids_by_device(block_ids).items():
            self._allocators[device].mark_blocks_as_accessed(ids, now)

    def mark_blocks_as_computed(self, block_ids: Sequence[int]) -> None:
        """Mark each id computed on the device that owns it (unknown ids raise before
        anything is marked)."""
        for device, ids in self._ids_by_device(block_ids).items():
            self._allocators[device].mark_blocks_as_computed(ids)

    def get_common_computed_block_ids(
        self, computed_seq_block_ids: Sequence[Sequence[int]]
    ) -> list[int]:
        """The GPU allocator's answer (prefill runs on the GPU)."""
        return self._allocators[Device.GPU].get_common_computed_block_ids(computed_seq_block_ids)

    def find_cached_blocks_prefix(
        self, block_hashes: Sequence[bytes], device: Device | str = Device.GPU
    ) -> list[bytes]:
        """The leading `block_hashes` cached and computed on `device`."""
        return self.allocator(device).find_cached_blocks_prefix(block_hashes)

    def get_num_full_blocks_touched(self, blocks: Sequence[Block], device: Device | str) -> int:
        """How many physical blocks swapping `blocks` onto `device` would take."""
        return self.allocator(device).get_num_full_blocks_touched(blocks)

    # -- swapping --------------------------------------------------------------------------------

    def swap(
        self, blocks: Sequence[Block], src_device: Device | str, dst_device: Device | str
    ) -> dict[int, int]:
        """Move `blocks` from `src_device` to `dst_device`: returns {source id: destination
        id}, one entry per distinct source block, for the caller to copy the KV bytes.

        The destination takes its blocks first; only then are the source blocks released, so
        NoFreeBlocksError on the destination leaves both devices and the blocks unchanged.
        Blocks sharing a source block (forks) share a destination block; the `computed` state
        travels with the blocks, and a released source block that is cached and computed stays
        cached on the source device (a later swap back may find it there).
        """
        src = self.allocator(src_device)
        dst = self.allocator(dst_device)
        if src is dst:
            raise InvalidValueError(f"cannot swap from {src_device!r} to itself")
        src_ids: list[int] = []
        for block in blocks:
            if self._owner(block, "swap") is not src:
                raise InvalidValueError(f"cannot swap {block!r}: it is not on {src_device!r}")
            if block.block_id is None:
                raise BlockStateError(f"cannot swap {block!r}: it holds no physical block")
            src_ids.append(block.block_id)
        computed_before = [block.computed for block in blocks]
        for block, block_id in zip(blocks, src_ids, strict=True):
            block.computed = block.computed or src.block_is_computed(block_id)
        try:
            dst.swap_in(blocks)
        except BaseException:
            for block, was_computed in zip(blocks, computed_before, strict=True):
                block.computed = was_computed
            raise
        mapping: dict[int, int] = {}
        for block, src_id in zip(blocks, src_ids, strict=True):
            dst_id = block.block_id
            if dst_id is None:  # swap_in gives every block one; refuse to return a bad map
                raise BlockStateError(f"{block!r} was swapped in without a block id")
            src.free_block_id(src_id)
            mapping[src_id] = dst_id
        return mapping

    def check(self) -> None:
        """`check()` of both allocators."""
        for allocator in self._allocators.values():
            allocator.check()
