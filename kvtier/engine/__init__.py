"""The transfer engine: asyncio execution of the chained manager's jobs over the tiers."""

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
from kvtier.tiers.tensor_copy import TensorCopier, coalesce

__all__ = [
    "CALLER",
    "Endpoint",
    "EngineCounters",
    "MoveResult",
    "PairCounters",
    "Priority",
    "PrioritySemaphore",
    "TensorCopier",
    "TransferEngine",
    "coalesce",
    "finish_even_if_cancelled",
    "move",
]
