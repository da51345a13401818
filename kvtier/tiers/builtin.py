"""The openers of the built-in tiers (gpu, cpu, disk), named by their kinds in
`kvtier.tiers.registry` and imported only when a storage is opened (this module imports
torch)."""

from __future__ import annotations

import asyncio

from kvtier.config import CPUTierConfig, DiskTierConfig, GPUTierConfig
from kvtier.namespaces import combined_model_id
from kvtier.tiers.pool import TorchPool
from kvtier.tiers.registry import TierContext
from kvtier.tiers.storage import BlockStorage
from kvtier.tiers.tensor_copy import cuda_available


async def open_gpu_tier(config: GPUTierConfig, context: TierContext) -> BlockStorage:
    """A tensor pool on the tier's device (falling back as `TorchPool` does)."""
    return TorchPool(config.num_blocks, context.block_size, config.device, copier=context.copier)


async def open_cpu_tier(config: CPUTierConfig, context: TierContext) -> BlockStorage:
    """A host-memory tensor pool, page-locked when asked for and CUDA is present."""
    return TorchPool(
        config.num_blocks,
        context.block_size,
        "cpu",
        pin_memory=config.pin_memory and cuda_available(),
        copier=context.copier,
    )


async def open_disk_tier(config: DiskTierConfig, context: TierContext) -> BlockStorage:
    """A disk store, opened off the event loop (it may scan its index and preallocate files);
    `context.options` are `DiskStore`'s own (`max_workers`, `io`, ...)."""
    from kvtier.tiers.disk import DiskStore

    # A tenant narrows the namespace of the store's blocks (and so its directory), as it does
    # for the shared tiers; without one the store is the model's, as before.
    model_id = combined_model_id(context.model_id, context.tenant) if context.tenant else (
        context.model_id
    )
    return await asyncio.to_thread(
        DiskStore.from_config, config, context.block_size, model_id, **context.options
    )
