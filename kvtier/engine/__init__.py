"""The transfer engine: asyncio execution of the chained manager's jobs over the tiers.

- `engine.py`: `TransferEngine` (one priority queue per tier, loads first), and
  `finish_even_if_cancelled`, the await that never abandons a copy in flight.
- `moves.py`: `move`, the one function that copies blocks between any two endpoints.
- `staging.py`: `StagingArena`, host rows that let a demotion to a slow tier give its
  sources back after a memory copy.
- `supervisor.py`: `JobSupervisor`, the owner of every background job.

It imports only what is below it (the bookkeeping's jobs, the tiers' storages): never the
chain that drives it, the hierarchy, or what a serving engine embeds.
"""

from kvtier.engine.engine import (
    CALLER,
    EngineCounters,
    PairCounters,
    Priority,
    PrioritySemaphore,
    TransferEngine,
    finish_even_if_cancelled,
)
from kvtier.engine.moves import Endpoint, MoveResult, move
from kvtier.engine.staging import DEFAULT_STAGING_BYTES, StagingArena
from kvtier.engine.supervisor import JobSupervisor, SupervisorCounters
from kvtier.tiers.tensor_copy import TensorCopier, coalesce

__all__ = [
    "CALLER",
    "DEFAULT_STAGING_BYTES",
    "Endpoint",
    "EngineCounters",
    "JobSupervisor",
    "MoveResult",
    "PairCounters",
    "Priority",
    "PrioritySemaphore",
    "StagingArena",
    "SupervisorCounters",
    "TensorCopier",
    "TransferEngine",
    "coalesce",
    "finish_even_if_cancelled",
    "move",
]
