"""Bookkeeping, synchronous and I/O-free: per-tier managers (later: the chained manager)."""

from kvtier.manager.base import (
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvtier.manager.tier import TierManager, TierStats, make_tier_manager

__all__ = [
    "OffloadingEvent",
    "OffloadingManager",
    "PrepareStoreOutput",
    "ReqContext",
    "TierManager",
    "TierStats",
    "make_tier_manager",
]
