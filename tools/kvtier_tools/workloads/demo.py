"""The foundation demo: a tier chain's bookkeeping driven by a real request trace.

No bytes move yet (that is the data path's job): each active tier of the configuration gets
its own TierManager, and the trace's requests are replayed through it as a serving engine
would drive one tier (lookup the prefix, pin and unpin the hits, store the misses). Alongside,
`simulate` replays the same accesses through each policy at the reference capacities, so the
output also shows the reference hit ratios being reproduced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.config import HierarchyConfig
from kvtier.keys import key_from_int
from kvtier.manager import TierManager, make_tier_manager
from kvtier.policies import SimulationResult, simulate
from kvtier_tools.workloads.traces import REFERENCE_FRACTIONS, REFERENCE_HIT_RATIOS, TraceRequest


@dataclass(frozen=True, slots=True)
class TierReplay:
    """One tier's bookkeeping replay of the trace."""

    tier: str
    medium: str
    policy: str
    num_blocks: int
    requests: int
    accesses: int
    prefix_hits: int
    stored: int
    evicted: int
    store_refusals: int
    events: int

    @property
    def prefix_hit_ratio(self) -> float:
        return self.prefix_hits / self.accesses if self.accesses else 0.0


@dataclass(frozen=True, slots=True)
class PolicyReference:
    """A simulate() result next to the published reference figure."""

    result: SimulationResult
    fraction: float
    reference: float | None

    @property
    def difference_pp(self) -> float | None:
        if self.reference is None:
            return None
        return (self.result.hit_ratio - self.reference) * 100


def replay_tier(
    manager: TierManager,
    requests: Sequence[TraceRequest],
    progress: Callable[[int], None] | None = None,
) -> TierReplay:
    """Drive one tier's manager over the trace, request by request."""
    prefix_hits = stored = evicted = refusals = events = accesses = 0
    for number, request in enumerate(requests, 1):
        keys = [key_from_int(i) for i in request.hash_ids]
        accesses += len(keys)
        hit = 0
        for key in keys:
            if manager.lookup(key) is not True:
                break
            hit += 1
        if hit:
            manager.prepare_load(keys[:hit])
            manager.touch(keys[:hit])
            manager.complete_load(keys[:hit])
        prefix_hits += hit
        rest = keys[hit:]
        if rest:
            out = manager.prepare_store(rest)
            if out is None:
                refusals += 1
            else:
                manager.complete_store(out.keys_to_store)
                stored += len(out.keys_to_store)
                evicted += len(out.evicted_keys)
        events += len(manager.take_events())
        if progress is not None and number % 500 == 0:
            progress(500)
    manager.check()
    return TierReplay(
        manager.name,
        str(manager.medium),
        manager.policy.name,
        manager.backend.num_blocks,
        len(requests),
        accesses,
        prefix_hits,
        stored,
        evicted,
        refusals,
        events,
    )


def replay_config(
    config: HierarchyConfig,
    requests: Sequence[TraceRequest],
    cuda_available: bool | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[TierReplay]:
    """Replay the trace through a standalone TierManager for each active tier."""
    replays = []
    for tier in config.active_tiers(cuda_available):
        manager = make_tier_manager(
            tier.num_blocks, config.block_size, tier.medium, tier.policy, name=tier.name
        )
        replays.append(replay_tier(manager, requests, progress))
    return replays


def policy_references(
    accesses: Sequence[int],
    policies: Sequence[str] = ("lru", "arc"),
    fractions: Sequence[float] = REFERENCE_FRACTIONS,
    compare_with_reference: bool = True,
) -> list[PolicyReference]:
    """simulate() each policy at each fraction of the unique blocks (floored, as the reference
    figures were computed); reference figures are attached for the shipped trace."""
    unique = len(set(accesses))
    references = []
    for fraction in fractions:
        capacity = max(1, math.floor(fraction * unique))
        for policy in policies:
            result = simulate(policy, capacity, accesses)
            reference = None
            if compare_with_reference and fraction in REFERENCE_HIT_RATIOS:
                figures = REFERENCE_HIT_RATIOS[fraction]
                reference = {"lru": figures[0], "arc": figures[1]}.get(policy)
            references.append(PolicyReference(result, fraction, reference))
    return references
