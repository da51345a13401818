"""Paged-KV block allocation for engines that bring no block manager of their own.

The interface of vLLM's v0 block manager (`Block`, `BlockAllocator`,
`DeviceAwareBlockAllocator`), implemented for kvtier: a naive allocator, a prefix-caching
allocator whose evictions can be demoted to kvtier's lower tiers (`on_evict`), and a GPU+CPU
allocator with global block ids and `swap`. Content hashes are stable 16-byte BLAKE2b digests
chained over the prefix, so they can key blocks in any process (`make_offload_key(hash)`).
"""

from kvtier.allocator.base import PooledBlockAllocator, common_prefix
from kvtier.allocator.block import DEFAULT_LAST_ACCESSED, Block, BlockHooks, NullBlock
from kvtier.allocator.device import Device
from kvtier.allocator.device_aware import AllocatorType, CpuGpuBlockAllocator
from kvtier.allocator.evictor import LRUEvictor
from kvtier.allocator.hashing import (
    BLOCK_HASH_BYTES,
    MAX_TOKEN_ID,
    hash_block_tokens,
    hash_token_blocks,
    pack_token_ids,
)
from kvtier.allocator.interfaces import (
    BlockAllocator,
    DeviceAwareBlockAllocator,
    EvictionListener,
)
from kvtier.allocator.naive import NaiveBlockAllocator
from kvtier.allocator.prefix_caching import PrefixCachingBlockAllocator
from kvtier.allocator.refcount import CopyOnWriteTracker, RefCounter
from kvtier.errors import NoFreeBlocksError

__all__ = [
    "BLOCK_HASH_BYTES",
    "DEFAULT_LAST_ACCESSED",
    "MAX_TOKEN_ID",
    "AllocatorType",
    "Block",
    "BlockAllocator",
    "BlockHooks",
    "CopyOnWriteTracker",
    "CpuGpuBlockAllocator",
    "Device",
    "DeviceAwareBlockAllocator",
    "EvictionListener",
    "LRUEvictor",
    "NaiveBlockAllocator",
    "NoFreeBlocksError",
    "NullBlock",
    "PooledBlockAllocator",
    "PrefixCachingBlockAllocator",
    "RefCounter",
    "common_prefix",
    "hash_block_tokens",
    "hash_token_blocks",
    "pack_token_ids",
]
