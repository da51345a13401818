"""The running chain: what `Hierarchy` (the facade) calls into.

- `runtime.py`: `Chain`, the bookkeeping, transfer engine, supervisor, staging arena and
  change signal of an open chain: the one object that drives both the bookkeeping and the
  transfer engine.
- `assembly.py`: `open_chain` / `close_chain` from a config, the one reader of the tiers'
  declarations.
- `store.py`: the put protocol (backpressure, the victims' snapshot, the copy in), shared
  with a serving engine's own stores (`prepare_engine_store`), and the flush.
- `load.py`: the get protocol, with deadlines.
- `stats.py`: the stats schema (`HierarchyStats`) and its snapshot, what the metrics read.

Nothing here imports what a serving engine embeds (`kvtier.embed`).
"""

from kvtier.chain.assembly import ChainOptions, close_chain, open_chain
from kvtier.chain.runtime import Chain, ChangeSignal
from kvtier.chain.stats import (
    FlushReport,
    HierarchyCounters,
    HierarchyStats,
    TierActivity,
    TierInfo,
    TransferStats,
)

__all__ = [
    "Chain",
    "ChainOptions",
    "ChangeSignal",
    "FlushReport",
    "HierarchyCounters",
    "HierarchyStats",
    "TierActivity",
    "TierInfo",
    "TransferStats",
    "close_chain",
    "open_chain",
]
