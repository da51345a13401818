"""`kvtier fleet simulate`: what routing buys a fleet of kvtier nodes, bookkeeping only.

N simulated nodes each run the chain of a config through the product's own simulator
(`kvtier_tools.workloads.simulation.chain`: the real `TieredManager`, instant copies); a
router sends each request of a trace to one node (`routers`); the kvtier router asks the
fleet's `PrefixIndex` (`kvtier.fleet.index`), fed by the nodes' own chain events in vLLM's
wire format, through the same `apply` as the `kvtier fleet index` daemon. `nodes` holds a
node and the optional fleet-shared tier; `run` serves the trace and counts.
"""

from kvtier_tools.workloads.fleet.nodes import SharedStore, SimNode
from kvtier_tools.workloads.fleet.routers import (
    DEFAULT_MAX_IMBALANCE,
    ROUTERS,
    KvtierRouter,
    PrefixHashRouter,
    RandomRouter,
    RoundRobinRouter,
    Router,
    RouterReport,
    make_router,
)
from kvtier_tools.workloads.fleet.run import FleetResult, scale_tiers, simulate_fleet

__all__ = [
    "DEFAULT_MAX_IMBALANCE",
    "ROUTERS",
    "FleetResult",
    "KvtierRouter",
    "PrefixHashRouter",
    "RandomRouter",
    "RoundRobinRouter",
    "Router",
    "RouterReport",
    "SharedStore",
    "SimNode",
    "make_router",
    "scale_tiers",
    "simulate_fleet",
]
