"""The chained form of `kvtier simulate`: a trace through the real `TieredManager`, bytes-free.

Rather than re-implementing the chain's rules (stores at the top, write-back demotion of
victims, promotion of lower-tier hits, write-through cascades), this drives the very
`TieredManager` a `kvtier.hierarchy.Hierarchy` runs, with the same calls in the same order as
the Hierarchy's `lookup` / `get` / `put`, and completes each transfer job at once, as if every
copy were instant and succeeded. So the per-tier hits reported here are, by construction,
those of a byte-moving replay that serves each request as

    n = hierarchy.lookup(keys)                       # leading blocks some tier holds
    tiers = [hierarchy.where(key) for key in keys[:n]]
    got = len(await hierarchy.get(keys[:n]))         # promoted, loaded, verified
    await hierarchy.put(keys[got:], recomputed_blocks)

counting block i < got as a hit of `tiers[i]` (the tier that held it when looked up), as long
as every copy succeeds and, with write-through, background cascades have finished before the
next request (`Hierarchy.drain()`), as they have here. A block after a request's first miss is
recomputed whatever holds it: these are prefix hits. So a one-tier chain does not reproduce
the flat per-access figures of the capacity sweep (the reference method); it reproduces the
demo's per-tier "prefix hit ratio" when requests fit the Hierarchy's batches.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.config import BaseTierConfig, HierarchyConfig
from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey, key_from_int, make_offload_key
from kvtier.manager import TieredManager, make_tier_manager
from kvtier.manager.planner import WritePolicy
from kvtier.policies import ADMISSIONS
from kvtier.tiers.refill import refill_floors
from kvtier_tools.workloads.simulation.sweep import Capacity, CapacitySpec, SimTrace

DEFAULT_WATERMARKS = (
    float(BaseTierConfig.model_fields["low_watermark"].default),
    float(BaseTierConfig.model_fields["high_watermark"].default),
)
"""A tier's (low, high) watermarks when no config gives them (the config's defaults)."""

CHAIN_BLOCK_SIZE = 1
"""Block size given to the bookkeeping-only tiers: no bytes move, so any size will do."""

_MEDIA = ("gpu", "cpu", "disk")


def offload_key_of(key: Hashable) -> OffloadKey:
    """The offload key of a trace key: `key_from_int` for a non-negative int (a Mooncake hash
    id, as every kvtier replay encodes them), else the UTF-8 bytes of its text."""
    if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < 1 << 64:
        return key_from_int(key)
    return make_offload_key(str(key).encode())


@dataclass(frozen=True, slots=True)
class ChainTier:
    """One tier of a simulated chain: its name, nominal medium, policy, capacity and
    (low, high) watermarks: a tier above another keeps a reserve of free slots, as in a
    Hierarchy, so the decisions (and hits) are the same."""

    name: str
    medium: str
    policy: str
    capacity: Capacity
    watermarks: tuple[float, float] = DEFAULT_WATERMARKS
    admission: str = "all"
    min_refill: int = 0
    """The least blocks a refill of its reserve frees (`kvtier.tiers.refill`)."""


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """How one request was served: the tier of each block of its hit prefix (0 = top)."""

    served_from: tuple[int, ...]
    stored: int
    store_refused: bool
    lost_at_top: int = 0
    """Blocks answered ready at the top but gone before `get` could pin them (0 unless the
    manager breaks its promise)."""


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """Running totals after `requests` requests: accesses, each tier's hits, and the hits an
    infinite cache would have had so far."""

    requests: int
    accesses: int
    tier_hits: tuple[int, ...]
    infinite_hits: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "accesses": self.accesses,
            "tier_hits": list(self.tier_hits),
            "infinite_hits": self.infinite_hits,
        }


@dataclass(frozen=True, slots=True)
class ChainResult:
    """Per-tier hits of a trace through a chain, and what the chain did to get them."""

    tiers: tuple[ChainTier, ...]
    write_policy: str
    requests: int
    accesses: int
    tier_hits: tuple[int, ...]
    stored: int
    store_refusals: int
    counters: dict[str, int]
    timeline: tuple[TimelinePoint, ...] = ()
    """Running totals at about 200 evenly spaced points of the replay, and at its end."""
    tier_written: tuple[int, ...] = ()
    """Blocks stored into each tier (puts, demotions, cascades, promotions)."""
    block_bytes: int | None = None
    """The configured block size, when the chain came from a config: bytes written per tier
    are then `tier_written` times it (the simulation itself moves no bytes)."""

    def bytes_written(self, index: int) -> int | None:
        """Bytes stored into tier `index`, when the block size is known."""
        if self.block_bytes is None or index >= len(self.tier_written):
            return None
        return self.tier_written[index] * self.block_bytes

    @property
    def hits(self) -> int:
        return sum(self.tier_hits)

    @property
    def hit_ratio(self) -> float:
        """All tiers' prefix hits over all block accesses."""
        return self.hits / self.accesses if self.accesses else 0.0

    def tier_hit_ratio(self, index: int) -> float:
        """Tier `index`'s hits over all block accesses (the ratios add up to `hit_ratio`)."""
        return self.tier_hits[index] / self.accesses if self.accesses else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "write_policy": self.write_policy,
            "requests": self.requests,
            "block_accesses": self.accesses,
            "hits": self.hits,
            "hit_ratio": self.hit_ratio,
            "tiers": [
                {
                    "name": tier.name,
                    "medium": tier.medium,
                    "policy": tier.policy,
                    "admission": tier.admission,
                    "capacity": tier.capacity.label,
                    "blocks": tier.capacity.blocks,
                    "hits": hits,
                    "hit_ratio": self.tier_hit_ratio(index),
                    "blocks_written": (
                        self.tier_written[index] if index < len(self.tier_written) else None
                    ),
                    "bytes_written": self.bytes_written(index),
                }
                for index, (tier, hits) in enumerate(zip(self.tiers, self.tier_hits, strict=True))
            ],
            "stored": self.stored,
            "store_refusals": self.store_refusals,
            "counters": self.counters,
            "timeline": [point.to_dict() for point in self.timeline],
        }


def _one_per_tier(
    text: str, tiers: int, option: str, what: str, check: Callable[[str], object]
) -> tuple[str, ...]:
    """Names from `text`: one for every tier ("lru") or one per tier ("lru,arc"), each
    validated by `check` (which raises naming the valid ones)."""
    names = [item.strip().lower() for item in text.split(",")]
    for name in names:
        check(name)
    if len(names) == 1:
        return tuple(names * tiers)
    if len(names) != tiers:
        raise InvalidValueError(
            f"{option}: {len(names)} {what} for {tiers} tiers; with --tiers give one for every "
            "tier, or one per tier"
        )
    return tuple(names)


def parse_chain_policies(text: str, tiers: int) -> tuple[str, ...]:
    """One policy per tier from `"lru"` (every tier) or `"lru,arc,lru"` (one per tier)."""
    from kvtier_tools.workloads.simulation.sweep import parse_policies

    return _one_per_tier(text, tiers, "--policy", "policies", parse_policies)


def _check_admission(name: str) -> None:
    if name not in ADMISSIONS:
        raise InvalidValueError(
            f"--admission: unknown admission {name!r}; valid admissions: {', '.join(ADMISSIONS)}"
        )


def parse_chain_admissions(text: str, tiers: int) -> tuple[str, ...]:
    """One admission filter per tier from `"all"` (every tier) or `"all,second-sighting"`
    (one per tier)."""
    return _one_per_tier(text, tiers, "--admission", "admissions", _check_admission)


def chain_tiers(
    capacities: Sequence[CapacitySpec],
    policies: Sequence[str],
    unique_blocks: int,
    admissions: Sequence[str] | None = None,
) -> tuple[ChainTier, ...]:
    """Name and size the tiers of a chain, top first: t1, t2, ... The media are nominal
    (bookkeeping does not depend on them): the last of several tiers is "disk", the first of
    three or more "gpu", the others "cpu". `admissions`: each tier's admission filter
    (default: "all")."""
    if len(capacities) != len(policies):
        raise InvalidValueError(f"{len(capacities)} capacities for {len(policies)} policies")
    admissions = admissions if admissions is not None else ["all"] * len(capacities)
    if len(admissions) != len(capacities):
        raise InvalidValueError(f"{len(capacities)} capacities for {len(admissions)} admissions")
    count = len(capacities)
    tiers = []
    for index, (spec, policy, admission) in enumerate(
        zip(capacities, policies, admissions, strict=True)
    ):
        if count > 1 and index == count - 1:
            medium = "disk"
        elif count > 2 and index == 0:
            medium = "gpu"
        else:
            medium = "cpu"
        capacity = Capacity(spec.text, spec.resolve(unique_blocks))
        tiers.append(ChainTier(f"t{index + 1}", medium, policy, capacity, admission=admission))
    return tuple(tiers)


def chain_tiers_from_config(
    config: HierarchyConfig, cuda_available: bool | None = None
) -> tuple[ChainTier, ...]:
    """The active tiers of a configuration (names, media, policies, block counts), as the
    hierarchy built from it would have them. Raises InvalidValueError if none is active."""
    active = config.active_tiers(cuda_available)
    if not active:
        raise InvalidValueError("the configuration has no active tier here (no CUDA?)")
    floors = refill_floors(active, config.block_size)
    return tuple(
        ChainTier(
            tier.name,
            str(tier.medium),
            tier.policy,
            Capacity(str(tier.capacity), tier.num_blocks),
            (tier.low_watermark, tier.high_watermark),
            tier.admission,
            floor,
        )
        for tier, floor in zip(active, floors, strict=True)
    )


def build_chain(tiers: Sequence[ChainTier], write_policy: WritePolicy) -> TieredManager:
    """A TieredManager over bookkeeping-only tiers (slot pools) of the given sizes."""
    return TieredManager(
        [
            make_tier_manager(
                tier.capacity.blocks,
                CHAIN_BLOCK_SIZE,
                tier.medium,
                tier.policy,
                name=tier.name,
                enable_events=False,
                admission=tier.admission,
            )
            for tier in tiers
        ],
        write_policy=write_policy,
        watermarks=[tier.watermarks for tier in tiers],
        min_refills=[tier.min_refill for tier in tiers],
    )


def settle_jobs(manager: TieredManager) -> None:
    """Complete every job the manager has queued, as if each copy happened at once."""
    while jobs := manager.take_jobs():
        for job in jobs:
            manager.complete_job(job)


def _batch_size(manager: TieredManager) -> int:
    """The Hierarchy's batch for `get` and `put`: a quarter of the top tier (at least 1)."""
    return max(1, manager.top.num_blocks // 4)


def _get(manager: TieredManager, keys: Sequence[OffloadKey]) -> tuple[int, int]:
    """`Hierarchy.get` with instant copies: (blocks served, blocks answered ready at the top
    but gone before they could be pinned). Batches of `_batch_size`; in each, the blocks
    answered ready are pinned, copied out, unpinned and touched; blocks being promoted are
    looked up again once their job is done; the first refused or absent block ends it."""
    chunk = _batch_size(manager)
    top = manager.top
    served = lost = 0
    stalls = 0
    while served < len(keys):
        batch = keys[served : served + chunk]
        answers = manager.lookup_many(batch)
        settle_jobs(manager)
        ready = 0
        while ready < len(answers) and answers[ready] is True:
            ready += 1
        if ready == 0:
            if not answers or answers[0] is False:
                break  # absent, or no room at the top (no transfer in flight to free some)
            stalls += 1
            if stalls > 2:  # promotions are done at once, so a second look must find them
                break
            continue
        stalls = 0
        # The manager answers True only for blocks it keeps at the top; should one be gone
        # anyway, the Hierarchy's prepare_load would fail: stop serving before it.
        readable = 0
        while readable < ready and top.lookup(batch[readable]) is True:
            readable += 1
        lost += ready - readable
        part = list(batch[:readable])
        if not part:
            break
        manager.prepare_load(part)
        manager.complete_load(part)
        manager.touch(part)
        served += readable
        if readable < ready:
            break
    return served, lost


def _put(
    manager: TieredManager, keys: Sequence[OffloadKey], partial_last: bool = False
) -> tuple[int, int]:
    """`Hierarchy.put` with instant copies: (blocks newly stored, blocks refused). Batches of
    `_batch_size`, each stored at the top after its DEMOTE job; then queued jobs (cascades).
    `partial_last`: the last key is a partial block, never stored (as `Hierarchy.put`)."""
    chunk = _batch_size(manager)
    stored = refused = 0
    partial = (keys[-1],) if partial_last and keys else ()
    for start in range(0, len(keys), chunk):
        part = list(keys[start : start + chunk])
        out = manager.prepare_store(part, partial=partial if start + chunk >= len(keys) else ())
        if out is None:
            refused += len(part)
            continue
        if not out.keys_to_store:
            continue
        if out.demotion is not None:
            manager.complete_job(out.demotion)
        manager.complete_store(out.keys_to_store)
        stored += len(out.keys_to_store)
        settle_jobs(manager)
    return stored, refused


def serve_request(
    manager: TieredManager, keys: Sequence[OffloadKey], partial_last: bool = False
) -> RequestOutcome:
    """Serve one request through `manager` with instant copies, exactly as a replay through a
    Hierarchy does (see the module docstring): lookup, where, get, put of the rest (the last
    block not stored when `partial_last` says it is a partial block).

    Returns the tier each served block came from, how many blocks were newly stored, whether
    a store was refused, and how many blocks `get` found ready at the top but could not pin.
    """
    if not keys:
        return RequestOutcome((), 0, False)
    sources: list[int] = []
    for key in keys:  # Hierarchy.lookup and Hierarchy.where
        where = manager.locate(key)
        if where is None:
            break
        sources.append(where[0])
    served, lost = _get(manager, keys[: len(sources)])
    stored, refused = _put(manager, keys[served:], partial_last and served < len(keys))
    return RequestOutcome(tuple(sources[:served]), stored, refused > 0, lost)


def simulate_chain(
    trace: SimTrace,
    tiers: Sequence[ChainTier],
    write_policy: WritePolicy = "write-back",
    progress: Callable[[int], None] | None = None,
    progress_every: int = 500,
    partial: Sequence[bool] | None = None,
) -> ChainResult:
    """Serve every request of `trace` through a fresh chain of `tiers` (top first).

    `partial` (a flag per access, as `kvtier.policies.partial_block_flags` makes them) says
    which blocks are partial: a request's last block so flagged is never stored.

    `progress` is called with the number of requests served, every `progress_every`
    requests and once at the end.
    """
    if partial is not None and len(partial) != len(trace.accesses):
        raise InvalidValueError(
            f"partial: {len(partial)} flags for a trace of {len(trace.accesses)} block accesses"
        )
    manager = build_chain(tiers, write_policy)
    tier_hits = [0] * len(tiers)
    stored = refusals = accesses = cut = 0
    seen: set[OffloadKey] = set()
    timeline: list[TimelinePoint] = []
    sample_every = max(1, len(trace.requests) // 200)
    done = 0
    for number, request in enumerate(trace.requests, 1):
        keys = [offload_key_of(key) for key in request]
        accesses += len(keys)
        seen.update(keys)
        partial_last = False
        if partial is not None and keys:
            partial_last = partial[accesses - 1]
        outcome = serve_request(manager, keys, partial_last)
        for source in outcome.served_from:
            tier_hits[source] += 1
        stored += outcome.stored
        refusals += outcome.store_refused
        cut += outcome.lost_at_top
        if number % sample_every == 0 or number == len(trace.requests):
            timeline.append(TimelinePoint(number, accesses, tuple(tier_hits), accesses - len(seen)))
        if progress is not None and number % progress_every == 0:
            progress(number - done)
            done = number
    if progress is not None and len(trace.requests) > done:
        progress(len(trace.requests) - done)
    manager.check()
    written = tuple(tier.blocks_written for tier in manager.tiers)
    counters = manager.counters
    summary = {
        "promotions": counters.promotions,
        "promotions_refused": counters.promotions_refused,
        "partial_refused": counters.partial_refused,
        "demoted": counters.demoted,
        "demotions_dropped": counters.demotions_dropped,
        "demotions_refused": counters.demotions_refused,
        "dropped_at_bottom": counters.dropped_at_bottom,
        "cascaded": counters.cascaded,
        "cascades_dropped": counters.cascades_dropped,
        "lost_at_top": cut,
    }
    manager.shutdown()
    return ChainResult(
        tiers=tuple(tiers),
        write_policy=write_policy,
        requests=len(trace.requests),
        accesses=accesses,
        tier_hits=tuple(tier_hits),
        stored=stored,
        store_refusals=refusals,
        counters=summary,
        timeline=tuple(timeline),
        tier_written=written,
    )


def write_chain_outputs(result: ChainResult, trace: SimTrace, out_dir: Path) -> Path:
    """Write `simulate.json` (the chain's figures beside the infinite cache's) into `out_dir`;
    return its path. The command line draws the chart (`kvtier_tools.cli.charts.chart_chain`)."""
    import json

    from kvtier_tools.workloads.simulation.bounds import infinite_cache_hits

    infinite = infinite_cache_hits(trace.accesses)
    document = {
        "trace": trace.summary(),
        "method": (
            "requests served in file order through kvtier's TieredManager with instant "
            "transfers: prefix lookup, promotion of lower-tier hits, load, store of the rest; "
            "a block is a hit of the tier that held it, while every block before it hit"
        ),
        "chain": result.to_dict(),
        "infinite_cache": {
            "hits": infinite.hits,
            "accesses": infinite.accesses,
            "hit_ratio": infinite.hit_ratio,
        },
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "simulate.json"
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    return json_path
