"""Bookkeeping, synchronous and I/O-free: per-tier managers and the chained manager."""

from kvtier.manager.base import (
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvtier.manager.handler import OffloadingHandler, TransferResult, TransferSpec
from kvtier.manager.jobs import CopyStep, JobKind, PromotionHold, TransferJob
from kvtier.manager.tier import TierManager, TierStats, make_tier_manager
from kvtier.manager.tiered import ChainCounters, TieredManager, TieredStoreOutput

__all__ = [
    "ChainCounters",
    "CopyStep",
    "JobKind",
    "OffloadingEvent",
    "OffloadingHandler",
    "OffloadingManager",
    "PrepareStoreOutput",
    "PromotionHold",
    "ReqContext",
    "TierManager",
    "TierStats",
    "TieredManager",
    "TieredStoreOutput",
    "TransferJob",
    "TransferResult",
    "TransferSpec",
    "make_tier_manager",
]
