"""`kvtier simulate`: bookkeeping-only hit-ratio studies of cache policies on a trace.

`run_sweep` replays policies at several capacities next to two bounds (the infinite cache and
Belady's OPT, in `bounds`); `simulate_chain` serves a trace through kvtier's own chained
manager with instant copies and counts each tier's hits. Nothing here moves bytes, so a whole
trace takes seconds.
"""

from kvtier_tools.workloads.simulation.bounds import (
    INFINITE_NAME,
    OPT_NAME,
    BeladyOracle,
    belady_opt,
    infinite_cache_hits,
)
from kvtier_tools.workloads.simulation.chain import (
    ChainResult,
    ChainTier,
    chain_tiers,
    chain_tiers_from_config,
    serve_request,
    simulate_chain,
)
from kvtier_tools.workloads.simulation.sweep import (
    DEFAULT_CAPACITIES,
    DEFAULT_POLICIES,
    Capacity,
    CapacitySpec,
    SimTrace,
    SweepReport,
    SweepRow,
    load_trace,
    parse_capacities,
    parse_policies,
    reference_hit_ratio,
    run_sweep,
    write_sweep_outputs,
)

__all__ = [
    "DEFAULT_CAPACITIES",
    "DEFAULT_POLICIES",
    "INFINITE_NAME",
    "OPT_NAME",
    "BeladyOracle",
    "Capacity",
    "CapacitySpec",
    "ChainResult",
    "ChainTier",
    "SimTrace",
    "SweepReport",
    "SweepRow",
    "belady_opt",
    "chain_tiers",
    "chain_tiers_from_config",
    "infinite_cache_hits",
    "load_trace",
    "parse_capacities",
    "parse_policies",
    "reference_hit_ratio",
    "run_sweep",
    "serve_request",
    "simulate_chain",
    "write_sweep_outputs",
]
