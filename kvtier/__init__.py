"""kvtier: a tiered store for the KV-cache blocks of LLM serving engines.

Blocks (fixed-size pages of K and V for N tokens, named by a prefix hash) live in a chain of
tiers (GPU, pinned CPU, disk, shared stores). `Hierarchy` (`hierarchy.py`) is the facade over
the running chain (`chain/`): the bookkeeping (`manager/`) decides, as `TransferJob`s whose
slots travel as `LoadStoreSpec`s, and the transfer engine (`engine/`) moves the bytes between
the tiers' storages (`tiers/`). What a serving engine embeds is in `embed/`.
"""

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

# First: picks the compiled bookkeeping core or its .py source before any of it is imported.
from kvtier import compiled as _compiled  # noqa: F401
from kvtier.blocks import BlockStatus
from kvtier.config import HierarchyConfig, load_config, load_default_config, parse_config
from kvtier.errors import (
    AllocationError,
    BlockStateError,
    ConfigError,
    DirectIOError,
    DiskLayoutError,
    DiskLockedError,
    DiskTierError,
    DoubleFreeError,
    InvalidValueError,
    KeyFormatError,
    KvtierError,
    ManagerClosedError,
    NoFreeBlocksError,
    SpecError,
    StorageClosedError,
    TraceFormatError,
    UnknownPolicyError,
)
from kvtier.hints import Reuse, ReuseHint
from kvtier.keys import (
    OffloadKey,
    get_offload_block_hash,
    get_offload_group_idx,
    key_from_int,
    make_offload_key,
    split_offload_key,
)
from kvtier.manager import (
    Backend,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    SlotPoolBackend,
    TieredManager,
    TierManager,
    TierStats,
    TransferJob,
    make_tier_manager,
)
from kvtier.policies import (
    POLICIES,
    ARCCachePolicy,
    CachePolicy,
    LRUCachePolicy,
    SimulationResult,
    get_policy_class,
    simulate,
)
from kvtier.specs import (
    BlockIDsLoadStoreSpec,
    CPULoadStoreSpec,
    DiskLoadStoreSpec,
    GPULoadStoreSpec,
    LoadStoreSpec,
    Medium,
)

if TYPE_CHECKING:  # the data path imports torch: loaded on first use (see __getattr__)
    from kvtier.hierarchy import Hierarchy, HierarchyStats
    from kvtier.sync import SyncHierarchy
    from kvtier.tiers.disk import DiskStore
    from kvtier.tiers.pool.storage import TorchPool


def __getattr__(name: str) -> object:
    """The data path (Hierarchy, SyncHierarchy, TieredManager) needs torch; import it on first
    use so that the bookkeeping, config and simulate work without torch installed."""
    if name in ("Hierarchy", "HierarchyStats"):
        from kvtier import hierarchy

        return getattr(hierarchy, name)
    if name == "DiskStore":
        from kvtier.tiers.disk import DiskStore

        return DiskStore
    if name == "TorchPool":
        from kvtier.tiers.pool.storage import TorchPool

        return TorchPool
    if name == "SyncHierarchy":
        from kvtier.sync import SyncHierarchy

        return SyncHierarchy
    raise AttributeError(f"module 'kvtier' has no attribute {name!r}")


try:
    __version__ = version("kvtier")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "POLICIES",
    "ARCCachePolicy",
    "AllocationError",
    "Backend",
    "BlockIDsLoadStoreSpec",
    "BlockStateError",
    "BlockStatus",
    "CPULoadStoreSpec",
    "CachePolicy",
    "ConfigError",
    "DirectIOError",
    "DiskLayoutError",
    "DiskLoadStoreSpec",
    "DiskLockedError",
    "DiskStore",
    "DiskTierError",
    "DoubleFreeError",
    "GPULoadStoreSpec",
    "Hierarchy",
    "HierarchyConfig",
    "HierarchyStats",
    "InvalidValueError",
    "KeyFormatError",
    "KvtierError",
    "LRUCachePolicy",
    "LoadStoreSpec",
    "ManagerClosedError",
    "Medium",
    "NoFreeBlocksError",
    "OffloadKey",
    "OffloadingEvent",
    "OffloadingManager",
    "PrepareStoreOutput",
    "ReqContext",
    "Reuse",
    "ReuseHint",
    "SimulationResult",
    "SlotPoolBackend",
    "SpecError",
    "StorageClosedError",
    "SyncHierarchy",
    "TierManager",
    "TierStats",
    "TieredManager",
    "TorchPool",
    "TraceFormatError",
    "TransferJob",
    "UnknownPolicyError",
    "__version__",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "get_policy_class",
    "key_from_int",
    "load_config",
    "load_default_config",
    "make_offload_key",
    "make_tier_manager",
    "parse_config",
    "simulate",
    "split_offload_key",
]
