"""Serve a trace through a simulated fleet: route each request, serve it on its node, feed
the node's events to the router, count.

In file order, for each request: the router picks a node; the node serves it through its
chain (prefix hits per tier, the rest stored at its top); with a shared tier, the blocks
after the node's own prefix that the shared store holds (as a prefix) are hits of the
shared tier, and the blocks computed (after both) are written into it; then the node's
events (what its chain stored and removed while serving) are handed to the router. A block
is a hit when every block before it in the request hit too (prefix hits, as `kvtier
simulate --config` counts them), so the fleet hit ratio of one node equals that command's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvtier.errors import InvalidValueError
from kvtier.manager.planner import WritePolicy
from kvtier_tools.workloads.fleet.nodes import SharedStore, SimNode
from kvtier_tools.workloads.fleet.routers import Router
from kvtier_tools.workloads.simulation.chain import ChainTier, offload_key_of
from kvtier_tools.workloads.simulation.sweep import Capacity, SimTrace

SHARED_TIER = "shared"
"""The shared tier's name in the per-tier hits."""


def scale_tiers(tiers: Sequence[ChainTier], factor: int) -> tuple[ChainTier, ...]:
    """`tiers` with every capacity `factor` times larger (the one-big-node reference)."""
    if factor < 1:
        raise InvalidValueError(f"--capacity-scale: {factor} must be at least 1")
    if factor == 1:
        return tuple(tiers)
    return tuple(
        replace(
            tier,
            capacity=Capacity(f"{tier.capacity.label} x{factor}", tier.capacity.blocks * factor),
        )
        for tier in tiers
    )


@dataclass(frozen=True)
class FleetResult:
    """What a fleet did with a trace."""

    router: str
    nodes: int
    requests: int
    accesses: int
    tier_hits: dict[str, int]
    """Hits per tier name (every node's tier of that name together; `shared` last)."""
    node_requests: tuple[int, ...]
    wall_s: float
    events: int = 0
    """Wire events the nodes published (0 for a router that reads none)."""
    event_blocks: int = 0
    """Block keys in those events."""
    batches: int = 0
    apply_s: float = 0.0
    """Time the index spent applying the batches."""
    index: dict[str, Any] | None = None
    """The index's `IndexStats` at the end (kvtier router only)."""
    outcomes: dict[str, int] | None = None
    """How the index took the batches (kvtier router only)."""
    matched_requests: int | None = None
    """Requests the kvtier router sent to a node holding part of their prefix."""

    @property
    def hits(self) -> int:
        return sum(self.tier_hits.values())

    @property
    def hit_ratio(self) -> float:
        """Prefix hits of every tier over all block accesses."""
        return self.hits / self.accesses if self.accesses else 0.0

    @property
    def imbalance(self) -> float:
        """Load imbalance: the busiest node's requests over the mean (1.0 is even)."""
        mean = self.requests / self.nodes if self.nodes else 0.0
        return max(self.node_requests) / mean if mean else 1.0

    @property
    def events_per_s(self) -> float | None:
        """Events the index applied per second of applying (decoding included)."""
        return self.events / self.apply_s if self.apply_s > 0 else None

    @property
    def event_blocks_per_s(self) -> float | None:
        """Block keys of those events per second of applying."""
        return self.event_blocks / self.apply_s if self.apply_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "router": self.router,
            "nodes": self.nodes,
            "requests": self.requests,
            "block_accesses": self.accesses,
            "hits": self.hits,
            "hit_ratio": self.hit_ratio,
            "tier_hits": dict(self.tier_hits),
            "tier_hit_ratios": {
                name: hits / self.accesses if self.accesses else 0.0
                for name, hits in self.tier_hits.items()
            },
            "node_requests": list(self.node_requests),
            "load_imbalance": self.imbalance,
            "events": self.events,
            "event_blocks": self.event_blocks,
            "batches": self.batches,
            "index_apply_s": self.apply_s,
            "events_per_s": self.events_per_s,
            "event_blocks_per_s": self.event_blocks_per_s,
            "index": self.index,
            "index_outcomes": self.outcomes,
            "matched_requests": self.matched_requests,
            "wall_s": self.wall_s,
        }


def simulate_fleet(
    trace: SimTrace,
    tiers: Sequence[ChainTier],
    router: Router,
    nodes: int,
    *,
    write_policy: WritePolicy = "write-back",
    shared: SharedStore | None = None,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 500,
) -> FleetResult:
    """Serve every request of `trace` through `nodes` fresh nodes of `tiers` (top first),
    each request on the node `router` picks (see the module docstring). `progress` is
    called with the number of requests served, every `progress_every` and at the end."""
    if nodes < 1:
        raise InvalidValueError(f"--nodes: {nodes} must be at least 1")
    started = time.perf_counter()
    names = [f"node{i}" for i in range(nodes)]
    fleet = [
        SimNode(name, tiers, write_policy, publish=router.wants_events, incarnation=i + 1)
        for i, name in enumerate(names)
    ]
    counts = [0] * nodes
    events = batches = 0
    apply_s = 0.0
    done = 0
    for number, request in enumerate(trace.requests, 1):
        keys = [offload_key_of(key) for key in request]
        chosen = router.route(keys, counts)
        node = fleet[chosen]
        counts[chosen] += 1
        local = node.serve(keys)
        if shared is not None and local < len(keys):
            found = shared.continuation(keys[local:])
            shared.write(keys[local + found :])
        if router.wants_events:
            payloads = node.take_payloads(float(number))
            if payloads:
                began = time.perf_counter()
                router.observe(chosen, payloads)
                apply_s += time.perf_counter() - began
                batches += len(payloads)
        if progress is not None and number % progress_every == 0:
            progress(number - done)
            done = number
    if progress is not None and len(trace.requests) > done:
        progress(len(trace.requests) - done)
    event_blocks = 0
    for node in fleet:
        events += node.events
        event_blocks += node.event_blocks
        node.close()
    tier_hits = {tier.name: 0 for tier in tiers}
    for node in fleet:
        for tier, hits in zip(tiers, node.tier_hits, strict=True):
            tier_hits[tier.name] += hits
    if shared is not None:
        tier_hits[SHARED_TIER] = shared.hits
    report = router.report()
    return FleetResult(
        router=router.name,
        nodes=nodes,
        requests=len(trace.requests),
        accesses=sum(node.accesses for node in fleet),
        tier_hits=tier_hits,
        node_requests=tuple(counts),
        wall_s=time.perf_counter() - started,
        events=events,
        event_blocks=event_blocks,
        batches=batches,
        apply_s=apply_s,
        index=None if report is None else report.index,
        outcomes=None if report is None else report.outcomes,
        matched_requests=None if report is None else report.matched_requests,
    )
