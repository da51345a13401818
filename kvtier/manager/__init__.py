"""Bookkeeping, synchronous and I/O-free: per-tier managers and the chained manager.

- `tier.py`: `TierManager`, a slot pool (a `Backend`, `backend.py`, plus a `CachePolicy`);
  `keyed.py`: `KeyedTierManager`, a tier that owns its index; both are `ChainTier`s
  (`chain_tier.py`), what the chained manager drives.
- `tiered.py`: `TieredManager`, the chained manager, composed of `planner.py`
  (`ChainPlanner`: the chain's decisions, stores, demotions, promotions, cascades, as
  `TransferJob`s, `jobs.py`, with `slot_ids`, the slots a spec names) and `ledger.py`
  (`JobLedger`: those jobs tracked from emitted to settled); `counters.py`:
  `ChainCounters`, what the chain did.
"""

from kvtier.manager.backend import Backend, SlotPoolBackend
from kvtier.manager.base import (
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvtier.manager.chain_tier import ChainTier
from kvtier.manager.counters import ChainCounters
from kvtier.manager.jobs import CopyStep, JobKind, PromotionHold, TransferJob, slot_ids
from kvtier.manager.keyed import KeyedTierManager
from kvtier.manager.planner import TieredStoreOutput
from kvtier.manager.tier import TierManager, TierStats, make_tier_manager
from kvtier.manager.tiered import TieredManager

__all__ = [
    "Backend",
    "ChainCounters",
    "ChainTier",
    "CopyStep",
    "JobKind",
    "KeyedTierManager",
    "OffloadingEvent",
    "OffloadingManager",
    "PrepareStoreOutput",
    "PromotionHold",
    "ReqContext",
    "SlotPoolBackend",
    "TierManager",
    "TierStats",
    "TieredManager",
    "TieredStoreOutput",
    "TransferJob",
    "make_tier_manager",
    "slot_ids",
]
