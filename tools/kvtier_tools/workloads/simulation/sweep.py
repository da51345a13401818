"""The capacity sweep behind `kvtier simulate`: policies x capacities on one trace, with bounds.

Bookkeeping only (no bytes move): each policy is replayed with `kvtier.policies.simulate`,
exactly as a tier drives it, at each capacity; Belady's OPT and the infinite-cache bound are
computed on the same accesses. When the accesses are those of the shipped conversation trace
(recognized by content, whatever file or compression they came from), each figure is shown
next to the independently computed reference of `tools/kvtier_tools/workloads/data/NOTICE.md`.

Method (the reference's): flatten the trace (each request's hash ids, left to right, one
access each), cold start, every miss admitted, capacity = floor(fraction x unique blocks).
"""

from __future__ import annotations

import array
import hashlib
import itertools
import math
import re
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, cast

from kvtier.errors import InvalidValueError, TraceFormatError
from kvtier.policies import POLICIES, SimulationResult, get_policy_class, simulate
from kvtier_tools.workloads.simulation.bounds import (
    INFINITE_NAME,
    OPT_NAME,
    BeladyOracle,
    infinite_cache_hits,
)
from kvtier_tools.workloads.traces import (
    REFERENCE_FRACTIONS,
    REFERENCE_HIT_RATIOS,
    REFERENCE_INFINITE_HIT_RATIO,
    read_keys,
    read_mooncake,
    shipped_trace_path,
)

TraceFormat = Literal["mooncake", "keys"]

DEFAULT_POLICIES = "lru,arc"
DEFAULT_CAPACITIES = "1%,5%,10%,25%,50%"
"""The reference fractions, so a default run on the shipped trace checks every figure."""

SHIPPED_ACCESS_DIGEST = "0aab94d4d574ea3fc9498b7400862d4e358bc9f064e843ef776aecf6dcb66cb2"
"""sha256 of the shipped trace's 288,500 block accesses as little-endian uint64s."""

# Belady's OPT and the best possible hit ratio of the shipped conversation trace, from the
# same reference table (tools/kvtier_tools/workloads/data/NOTICE.md) as demo.REFERENCE_HIT_RATIOS.
REFERENCE_OPT_HIT_RATIOS: dict[float, float] = {
    0.01: 0.246319,
    0.05: 0.366412,
    0.10: 0.366412,
    0.25: 0.366412,
    0.50: 0.366412,
}

_PERCENT = re.compile(r"([0-9]+(?:\.[0-9]+)?)%")
_BLOCKS = re.compile(r"[0-9]+")


# -- inputs ---------------------------------------------------------------------------------


def parse_policies(text: str) -> tuple[str, ...]:
    """Policy names from a comma list (`"lru,arc"`), validated against `POLICIES`.

    Names are case-insensitive and deduplicated in order. An unknown name raises
    UnknownPolicyError listing the valid ones; OPT is a bound, always reported, not a policy.
    """
    names: list[str] = []
    for item in text.split(","):
        name = item.strip().lower()
        if not name:
            raise InvalidValueError(
                f"--policy: empty name in {text!r}; valid policies: {', '.join(sorted(POLICIES))}"
            )
        get_policy_class(name)
        if name not in names:
            names.append(name)
    return tuple(names)


@dataclass(frozen=True, slots=True)
class CapacitySpec:
    """One capacity as the user wrote it: a percentage of the trace's unique blocks, or an
    absolute number of blocks."""

    text: str
    percent: Decimal | None = None
    blocks: int | None = None

    def resolve(self, unique_blocks: int) -> int:
        """The capacity in blocks: floor(percent/100 x unique blocks) (at least 1), or the
        absolute count. Exact decimal arithmetic, so `10%` of 182,790 is 18,279, not 18,278."""
        if self.blocks is not None:
            return self.blocks
        assert self.percent is not None
        return max(1, math.floor(self.percent * unique_blocks / 100))


def parse_capacities(text: str, option: str = "--capacity") -> tuple[CapacitySpec, ...]:
    """Capacities from a comma list such as `"1%,5%,4096"`.

    A percentage must lie in (0%, 100%]; a block count must be a positive integer. Any other
    item raises InvalidValueError naming it (and `option`, the flag it came from).
    """
    specs: list[CapacitySpec] = []
    for item in text.split(","):
        token = item.strip().replace(" ", "")
        if match := _PERCENT.fullmatch(token):
            percent = Decimal(match.group(1))
            if not 0 < percent <= 100:
                raise InvalidValueError(
                    f"{option}: {token!r} is out of range; a percentage of the trace's "
                    "unique blocks must be above 0% and at most 100%"
                )
            specs.append(CapacitySpec(token, percent=percent))
        elif _BLOCKS.fullmatch(token):
            blocks = int(token)
            if blocks < 1:
                raise InvalidValueError(f"{option}: {token!r} blocks; a cache needs at least 1")
            specs.append(CapacitySpec(token, blocks=blocks))
        else:
            raise InvalidValueError(
                f"{option}: {item.strip()!r} is neither a percentage of the unique blocks "
                '(like "5%") nor a block count (like "4096")'
            )
    return tuple(specs)


@dataclass(frozen=True, slots=True)
class Capacity:
    """A resolved capacity: the label the user gave and the number of blocks."""

    label: str
    blocks: int


def resolve_capacities(specs: Sequence[CapacitySpec], unique_blocks: int) -> tuple[Capacity, ...]:
    """Resolve `specs` against a trace, smallest first; specs that come to the same number
    of blocks are reported once (under the first label)."""
    by_blocks: dict[int, Capacity] = {}
    for spec in specs:
        blocks = spec.resolve(unique_blocks)
        by_blocks.setdefault(blocks, Capacity(spec.text, blocks))
    return tuple(by_blocks[blocks] for blocks in sorted(by_blocks))


# -- the trace ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimTrace:
    """A trace ready to simulate: its requests (each a prefix of block keys) and the flat
    access sequence. A plain key file has one single-block request per key."""

    name: str
    path: str
    format: TraceFormat
    requests: list[tuple[Hashable, ...]]
    accesses: list[Hashable]
    unique_blocks: int
    limited: bool
    sessions: tuple[str, ...] | None = None
    """Each request's session, when every request of the trace names one (an agentic
    trace's `"session"` key): `simulate --hints` then gives session hints."""
    times_s: tuple[float, ...] | None = None
    """Each request's timestamp in seconds, with `sessions`."""

    @classmethod
    def from_requests(
        cls, requests: Iterable[Sequence[Hashable]], name: str = "requests"
    ) -> SimTrace:
        """A trace from in-memory requests (each a sequence of block keys), for tests and
        embedders."""
        frozen = [tuple(request) for request in requests]
        accesses = [key for request in frozen for key in request]
        return cls(name, "", "mooncake", frozen, accesses, len(set(accesses)), False)

    @property
    def is_shipped_trace(self) -> bool:
        """Whether the accesses are exactly those of the shipped conversation trace."""
        return access_digest(self.accesses) == SHIPPED_ACCESS_DIGEST

    def summary(self) -> dict[str, Any]:
        """The trace's description for a report."""
        return {
            "name": self.name,
            "path": self.path,
            "format": self.format,
            "requests": len(self.requests),
            "block_accesses": len(self.accesses),
            "unique_blocks": self.unique_blocks,
            "limited": self.limited,
            "sessions": len(set(self.sessions)) if self.sessions is not None else None,
            "shipped": self.is_shipped_trace,
        }


def detect_trace_format(path: Path) -> TraceFormat:
    """`mooncake` when the file's first key line (plain or zstd) starts with `{`, else `keys`.

    Raises TraceFormatError if the file is missing or unreadable.
    """
    keys = read_keys(path)
    try:
        first = next(keys, None)
    finally:
        keys.close()  # type: ignore[attr-defined]
    return "mooncake" if isinstance(first, str) and first.startswith("{") else "keys"


def load_trace(path: Path | None = None, limit: int | None = None) -> SimTrace:
    """Read a Mooncake JSONL trace or a plain key file (one key per line), plain or zstd.

    `path` None is the shipped conversation trace. `limit` keeps the first N requests of a
    Mooncake trace, or the first N keys of a key file; lines past it are not read. A
    malformed line raises TraceFormatError naming the file and line; a trace without a
    single access raises it too.
    """
    source = shipped_trace_path() if path is None else Path(path)
    trace_format = "mooncake" if path is None else detect_trace_format(source)
    requests: list[tuple[Hashable, ...]]
    accesses: list[Hashable]
    sessions: tuple[str, ...] | None = None
    times_s: tuple[float, ...] | None = None
    if trace_format == "mooncake":
        read = list(itertools.islice(read_mooncake(source), limit))
        requests = [r.hash_ids for r in read]
        accesses = [key for request in requests for key in request]
        names = [r.session for r in read]
        if read and all(name is not None for name in names):
            sessions = tuple(cast("list[str]", names))
            times_s = tuple(r.timestamp_ms / 1000 for r in read)
    else:
        accesses = list(itertools.islice(read_keys(source), limit))
        requests = [(key,) for key in accesses]
    if not accesses:
        raise TraceFormatError(f"{source}: the trace has no block accesses")
    return SimTrace(
        name=source.name,
        path=str(source),
        format=trace_format,
        requests=requests,
        accesses=accesses,
        unique_blocks=len(set(accesses)),
        limited=limit is not None and len(requests) >= limit,
        sessions=sessions,
        times_s=times_s,
    )


def access_digest(accesses: Sequence[Hashable]) -> str | None:
    """sha256 of `accesses` as little-endian uint64s; None if a key is not such an int."""
    try:
        packed = array.array("Q", cast("Sequence[int]", accesses))
    except (TypeError, OverflowError):
        return None
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    return hashlib.sha256(packed.tobytes()).hexdigest()


# -- the sweep ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One policy (or OPT) at one capacity, with the reference figure where there is one."""

    capacity: Capacity
    result: SimulationResult
    reference: float | None
    seconds: float

    @property
    def policy(self) -> str:
        return self.result.policy

    @property
    def difference_pp(self) -> float | None:
        """Hit ratio minus the reference, in percentage points."""
        if self.reference is None:
            return None
        return (self.result.hit_ratio - self.reference) * 100

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity.label,
            "blocks": self.capacity.blocks,
            "policy": self.policy,
            "accesses": self.result.accesses,
            "hits": self.result.hits,
            "hit_ratio": self.result.hit_ratio,
            "evictions": self.result.evictions,
            "reference_hit_ratio": self.reference,
            "difference_pp": self.difference_pp,
            "seconds": round(self.seconds, 4),
        }


@dataclass(frozen=True, slots=True)
class SweepReport:
    """Every policy and OPT at every capacity, and the infinite-cache bound."""

    trace: SimTrace
    policies: tuple[str, ...]
    capacities: tuple[Capacity, ...]
    rows: tuple[SweepRow, ...]
    infinite: SimulationResult
    infinite_reference: float | None
    shipped: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self, policy: str, blocks: int) -> SweepRow:
        """The row of `policy` (or "opt") at `blocks`."""
        for row in self.rows:
            if row.policy == policy and row.capacity.blocks == blocks:
                return row
        raise KeyError((policy, blocks))

    def worst_difference_pp(self, policy: str) -> float | None:
        """The largest |difference| from the reference over `policy`'s rows, if any."""
        differences = [
            abs(row.difference_pp)
            for row in self.rows
            if row.policy == policy and row.difference_pp is not None
        ]
        return max(differences) if differences else None

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (what `simulate.json` holds)."""
        return {
            "trace": self.trace.summary(),
            "method": (
                "one access per block, requests in file order, hash ids left to right; "
                "cold start; every miss admitted; percentages are of the unique blocks, floored"
            ),
            "policies": list(self.policies),
            "capacities": [{"label": c.label, "blocks": c.blocks} for c in self.capacities],
            "infinite_cache": {
                "hits": self.infinite.hits,
                "accesses": self.infinite.accesses,
                "hit_ratio": self.infinite.hit_ratio,
                "reference_hit_ratio": self.infinite_reference,
            },
            "results": [row.to_dict() for row in self.rows],
            **self.extra,
        }


def reference_hit_ratio(policy: str, blocks: int, unique_blocks: int) -> float | None:
    """The shipped trace's reference hit ratio of `policy` ("lru", "arc" or "opt") at
    `blocks`, if `blocks` is one of the reference capacities; else None."""
    for fraction in REFERENCE_FRACTIONS:
        if math.floor(Fraction(str(fraction)) * unique_blocks) != blocks:
            continue
        if policy == OPT_NAME:
            return REFERENCE_OPT_HIT_RATIOS.get(fraction)
        lru, arc = REFERENCE_HIT_RATIOS[fraction]
        return {"lru": lru, "arc": arc}.get(policy)
    return None


def run_sweep(
    trace: SimTrace,
    policies: Sequence[str],
    capacities: Sequence[CapacitySpec],
    progress: Callable[[int], None] | None = None,
    partial: Sequence[bool] | None = None,
) -> SweepReport:
    """Simulate each policy, and OPT, at each capacity over `trace`'s accesses. With
    `partial` (a flag per access), flagged misses store nothing (partial blocks) and no
    reference figure is shown (the references store every miss).

    `progress` is called with 1 after each (capacity, policy) run; there are
    `len(resolved capacities) * (len(policies) + 1)` of them.
    """
    resolved = resolve_capacities(capacities, trace.unique_blocks)
    shipped = trace.is_shipped_trace
    oracle = BeladyOracle(trace.accesses)
    rows: list[SweepRow] = []
    for capacity in resolved:
        for policy in (*policies, OPT_NAME):
            started = time.perf_counter()
            if policy == OPT_NAME:
                result = oracle.simulate(capacity.blocks)
            else:
                result = simulate(policy, capacity.blocks, trace.accesses, partial=partial)
            seconds = time.perf_counter() - started
            reference = (
                reference_hit_ratio(policy, capacity.blocks, trace.unique_blocks)
                if shipped and (partial is None or policy == OPT_NAME)
                else None
            )
            rows.append(SweepRow(capacity, result, reference, seconds))
            if progress is not None:
                progress(1)
    return SweepReport(
        trace=trace,
        policies=tuple(policies),
        capacities=resolved,
        rows=tuple(rows),
        infinite=infinite_cache_hits(trace.accesses),
        infinite_reference=REFERENCE_INFINITE_HIT_RATIO if shipped else None,
        shipped=shipped,
    )


def write_sweep_outputs(report: SweepReport, out_dir: Path) -> Path:
    """Write `simulate.json` into `out_dir`; return its path. The command line draws the chart
    (`kvtier_tools.cli.charts.chart_sweep`)."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "simulate.json"
    json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return json_path


def sweep_runs(policies: Sequence[str], capacities: Sequence[CapacitySpec], unique: int) -> int:
    """How many progress steps `run_sweep` will report."""
    return len(resolve_capacities(capacities, unique)) * (len(policies) + 1)


__all__ = [
    "DEFAULT_CAPACITIES",
    "DEFAULT_POLICIES",
    "INFINITE_NAME",
    "OPT_NAME",
    "Capacity",
    "CapacitySpec",
    "SimTrace",
    "SweepReport",
    "SweepRow",
    "load_trace",
    "parse_capacities",
    "parse_policies",
    "reference_hit_ratio",
    "run_sweep",
    "write_sweep_outputs",
]
