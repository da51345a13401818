"""Bookkeeping throughput: kvtier's `TierManager` against vLLM's own CPU offloading manager.

A benchmark that prints figures; it asserts nothing about speed.

What is measured
----------------
The shipped Mooncake conversation trace (12,031 requests, 288,500 block accesses, 182,790
unique blocks) is replayed request by request, as a serving engine's scheduler drives an
offloading tier:

1. ``lookup``: look the request's blocks up in order until the first one that is not a ready
   hit (a prefix lookup). One op per `lookup` call, the failing one included.
2. ``load``: the hit prefix (if any) is pinned (`prepare_load`), marked recently used
   (`touch`) and unpinned (`complete_load`). One op per key of the prefix.
3. ``store``: the rest of the request (if any) is offered to `prepare_store`, which evicts by
   policy to make room, and the keys it chose are made ready (`complete_store`). One op per key
   offered to `prepare_store` (so load ops + store ops == block accesses).

Each phase is timed on its own with `time.perf_counter_ns`, accumulated over the replay: one
clock read before and after each phase of each request. The cost of a clock read, calibrated
once per benchmark (median of back-to-back reads), is subtracted from every timed interval,
the same for both contenders; ``raw_ns`` keeps the uncorrected figure. The driver code between
the clock reads (the prefix loop, two list slices, bound-method calls) is identical for both
contenders and is counted in their phases. Capacity is ``floor(fraction * unique blocks)``;
every replay starts from a fresh manager; each figure is the median of `repeats` replays, the
contenders alternating (and swapping order every repeat) so that drift on a noisy machine hits
both. The garbage collector is collected before and disabled during a timed replay, as
`timeit` does. Events are enabled on both managers (kvtier's default) and drained after every
request, outside the timed phases. The hit count is the number of blocks served from the tier
(the sum of the hit-prefix lengths).

Contenders
----------
``kvtier``: `kvtier.manager.tier.make_tier_manager(capacity, ..., policy)`, the manager the
product uses, over kvtier's `LRUCachePolicy` / `ARCCachePolicy`.

``vllm``: vLLM's own `CPUOffloadingManager(capacity, policy, enable_events=True)`
(`vllm.v1.kv_offload.cpu.manager`, over vLLM's `LRUCachePolicy` / `ARCCachePolicy`), imported
on first use, with a fresh vLLM `ReqContext` per request, so its per-request access tracking
runs as in the serving engine. The scheduler's `on_new_request` / `on_request_finished` calls
around a request are not made, for either contender (vLLM's LRU would repeat the `touch` of the
hit prefix). The manager's module needs vLLM's dependencies (`scripts/setup.sh --vllm`
installs them); where it cannot be imported, the vLLM rows are left out and the table and the
progress lines say why (`vllm_skipped()`).

LRU hit counts must be equal between the two (same protocol, same recency order), and so must
the blocks each holds at the end (asked through `lookup`); ARC implementations differ (kvtier
follows the ARC paper, vLLM's does not), so their hit ratios are only reported side by side.
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager.base import ReqContext
from kvtier.manager.tier import make_tier_manager

PHASES: tuple[str, ...] = ("lookup", "load", "store")
"""The timed phases of a request, in the order the driver runs them."""

OVERALL = "all"
"""The phase name of the rows that sum the three phases."""

DEFAULT_FRACTIONS: tuple[float, ...] = (0.01, 0.10, 0.50)
DEFAULT_POLICIES: tuple[str, ...] = ("lru", "arc")
QUICK_LIMIT_REQUESTS = 2000
"""Trace prefix (requests) replayed by ``--quick``."""

VLLM_REFERENCE_VERSION = "0.33.0"
"""The vLLM release the comparison was written against (the one `scripts/setup.sh --vllm`
installs)."""
VLLM_SKIPPED = "vLLM comparison skipped"
"""How the table and the progress lines begin the reason the vLLM rows are left out."""

_BLOCK_SIZE = 16  # tokens per block given to the kvtier tier; bookkeeping never reads it
_JSON_FORMAT = "kvtier_tools.bench.bookkeeping/1"


# -- results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Measurement:
    """One contender's figures for one (policy, capacity, phase).

    `ns` is the median over repeats of the phase's time, clock overhead subtracted; `raw_ns`
    the same without the subtraction; `runs_ns` every repeat's corrected time. `intervals` is
    the number of timed intervals per replay (one per request that ran the phase). `hits`,
    `accesses`, `failed_stores` (prepare_store returned None) and `resident_digest` (of the
    keys resident at the end) describe the whole replay and repeat across its phases.
    """

    ops: int
    ns: int
    raw_ns: int
    intervals: int
    runs_ns: tuple[int, ...]
    hits: int
    accesses: int
    failed_stores: int
    resident_digest: str

    @property
    def mops(self) -> float:
        """Millions of block-operations per second."""
        return self.ops * 1e3 / self.ns if self.ns > 0 else math.inf

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0


@dataclass(frozen=True, slots=True)
class Result:
    """One row: a policy at a capacity, one phase (or `OVERALL`), both contenders."""

    policy: str
    fraction: float
    capacity: int
    phase: str
    requests: int
    unique_blocks: int
    repeats: int
    timer_overhead_ns: float
    kvtier: Measurement
    vllm: Measurement | None
    vllm_version: str | None = None
    """The vLLM version `vllm` was measured with (None without vLLM figures)."""

    @property
    def kvtier_mops(self) -> float:
        return self.kvtier.mops

    @property
    def vllm_mops(self) -> float | None:
        return None if self.vllm is None else self.vllm.mops

    @property
    def ratio(self) -> float | None:
        """kvtier throughput / vLLM throughput (None without vLLM)."""
        if self.vllm is None:
            return None
        return self.kvtier.mops / self.vllm.mops

    @property
    def hit_ratio(self) -> float:
        """kvtier's hit ratio (blocks served from the tier / block accesses)."""
        return self.kvtier.hit_ratio

    @property
    def vllm_hit_ratio(self) -> float | None:
        return None if self.vllm is None else self.vllm.hit_ratio

    @property
    def hits_agree(self) -> bool | None:
        """For LRU, whether both contenders hit the same blocks (hit counts and final resident
        sets equal); None where not compared (ARC, or no vLLM)."""
        if self.vllm is None or self.policy != "lru":
            return None
        return (
            self.kvtier.hits == self.vllm.hits
            and self.kvtier.resident_digest == self.vllm.resident_digest
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kvtier_mops"] = self.kvtier_mops
        data["vllm_mops"] = self.vllm_mops
        data["ratio"] = self.ratio
        data["hits_agree"] = self.hits_agree
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        def measurement(raw: dict[str, Any] | None) -> Measurement | None:
            if raw is None:
                return None
            fields = {name: raw[name] for name in Measurement.__dataclass_fields__}
            fields["runs_ns"] = tuple(fields["runs_ns"])
            return Measurement(**fields)

        kvtier = measurement(data["kvtier"])
        if kvtier is None:
            raise ValueError("a result needs kvtier figures")
        return cls(
            policy=data["policy"],
            fraction=data["fraction"],
            capacity=data["capacity"],
            phase=data["phase"],
            requests=data["requests"],
            unique_blocks=data["unique_blocks"],
            repeats=data["repeats"],
            timer_overhead_ns=data["timer_overhead_ns"],
            kvtier=kvtier,
            vllm=measurement(data["vllm"]),
            vllm_version=data.get("vllm_version"),
        )


def results_to_json(results: Sequence[Result], vllm_skipped: str | None = None) -> str:
    """A JSON document of `results` (with derived Mops/s and ratios), for machines;
    `vllm_skipped` says why there are no vLLM figures (see `vllm_skipped()`)."""
    document = {
        "format": _JSON_FORMAT,
        "unit": "block-operations per second (Mops/s = millions)",
        "vllm_reference_version": VLLM_REFERENCE_VERSION,
        # the version compared with (None when there are no vLLM figures)
        "vllm_installed_version": next(
            (result.vllm_version for result in results if result.vllm_version), None
        ),
        "vllm_skipped": vllm_skipped,
        "results": [result.to_dict() for result in results],
    }
    return json.dumps(document, indent=2)


def results_from_json(text: str) -> list[Result]:
    """The results of a document written by `results_to_json`."""
    document = json.loads(text)
    if document.get("format") != _JSON_FORMAT:
        raise ValueError(f"not a {_JSON_FORMAT} document")
    return [Result.from_dict(row) for row in document["results"]]


# -- vLLM's own manager --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VllmClasses:
    """What the comparison drives of vLLM: its CPU offloading manager class, its request
    context class, the `lookup` answer of a ready hit, and the installed version."""

    manager: Any  # vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager
    req_context: Any  # vllm.v1.kv_offload.base.ReqContext
    hit: Any  # vllm.v1.kv_offload.base.LookupResult.HIT
    version: str


@functools.cache
def import_vllm() -> VllmClasses | str:
    """vLLM's classes, or why they cannot be imported (one line, to print).

    Imported once, on first use: the manager's module loads vLLM's configuration and with it
    most of vLLM's dependencies (seconds). Any exception counts as "cannot be imported": a
    vLLM installed without its dependencies fails with more than ImportError.
    """
    try:
        import vllm
        from vllm.v1.kv_offload.base import LookupResult, ReqContext
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    except Exception as error:
        return (
            f"vLLM's CPUOffloadingManager cannot be imported ({type(error).__name__}: "
            f"{error}); `scripts/setup.sh --vllm` installs vLLM {VLLM_REFERENCE_VERSION}"
        )
    version = str(getattr(vllm, "__version__", "unknown"))
    return VllmClasses(CPUOffloadingManager, ReqContext, LookupResult.HIT, version)


def vllm_skipped(include_vllm: bool | None = None) -> str | None:
    """Why the vLLM rows are left out, or None when they are measured. `include_vllm` as in
    `run_bookkeeping_benchmark` (False: left out on request)."""
    if include_vllm is False:
        return "not asked for (--no-vllm)"
    found = import_vllm()
    return found if isinstance(found, str) else None


# -- the driver ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Contender:
    """How the driver builds and talks to one implementation."""

    name: str
    make_manager: Callable[[int, str], Any]
    make_context: Callable[[str], Any]
    hit: Any  # what `lookup` returns for a ready hit (compared with `is`)


@dataclass(slots=True)
class _Replay:
    """What one replay counted and timed, per phase (in `PHASES` order)."""

    ns: list[int]
    ops: list[int]
    intervals: list[int]
    hits: int
    accesses: int
    failed_stores: int
    resident_digest: str


def _kvtier_contender() -> _Contender:
    def make_manager(capacity: int, policy: str) -> Any:
        return make_tier_manager(capacity, _BLOCK_SIZE, "cpu", policy, name="bench")

    return _Contender(
        name="kvtier",
        make_manager=make_manager,
        make_context=lambda req_id: ReqContext(req_id=req_id),
        hit=True,
    )


def _vllm_contender(vllm: VllmClasses) -> _Contender:
    """vLLM's own `CPUOffloadingManager` (events on, as kvtier's), a fresh `ReqContext` per
    request."""

    def make_manager(capacity: int, policy: str) -> Any:
        return vllm.manager(capacity, policy, enable_events=True)

    return _Contender(
        name="vllm",
        make_manager=make_manager,
        make_context=lambda req_id: vllm.req_context(req_id=req_id),
        hit=vllm.hit,
    )


def resident_digest(contender: _Contender, manager: Any, keys: Iterable[OffloadKey]) -> str:
    """A digest of which of `keys` `manager` holds ready, asked through its public `lookup`
    (after a replay, untimed): equal digests mean equal resident sets."""
    context = contender.make_context("resident-check")
    resident = sorted(key for key in keys if manager.lookup(key, context) is contender.hit)
    return hashlib.sha256(b"".join(resident)).hexdigest()[:16]


def replay(
    manager: Any,
    hit: Any,
    requests: Sequence[Sequence[OffloadKey]],
    contexts: Sequence[Any],
    clock: Callable[[], int] = time.perf_counter_ns,
) -> tuple[list[int], list[int], list[int], int, int]:
    """Drive `manager` over `requests` as a serving engine would; time each phase.

    Returns (ns, ops, intervals) per phase in `PHASES` order, the hit count (blocks served
    from the tier) and the number of requests whose `prepare_store` returned None.
    """
    lookup = manager.lookup
    prepare_load, touch, complete_load = (
        manager.prepare_load,
        manager.touch,
        manager.complete_load,
    )
    prepare_store, complete_store = manager.prepare_store, manager.complete_store
    take_events = manager.take_events
    lookup_ns = load_ns = store_ns = 0
    lookup_ops = load_ops = store_ops = 0
    load_intervals = store_intervals = 0
    hits = failed_stores = 0
    for keys, ctx in zip(requests, contexts, strict=True):
        n = len(keys)
        t0 = clock()
        h = 0
        while h < n and lookup(keys[h], ctx) is hit:
            h += 1
        t1 = clock()
        lookup_ns += t1 - t0
        lookup_ops += h + 1 if h < n else h
        if h:
            t1 = clock()
            prefix = keys[:h]
            prepare_load(prefix, ctx)
            touch(prefix, ctx)
            complete_load(prefix, ctx)
            t2 = clock()
            load_ns += t2 - t1
            load_ops += h
            load_intervals += 1
            hits += h
        if h < n:
            t2 = clock()
            rest = keys[h:]
            output = prepare_store(rest, ctx)
            if output is not None:
                complete_store(output.keys_to_store, req_context=ctx)
            t3 = clock()
            store_ns += t3 - t2
            store_ops += n - h
            store_intervals += 1
            if output is None:
                failed_stores += 1
        for _ in take_events():
            pass
    return (
        [lookup_ns, load_ns, store_ns],
        [lookup_ops, load_ops, store_ops],
        [len(requests), load_intervals, store_intervals],
        hits,
        failed_stores,
    )


def _run_once(
    contender: _Contender,
    policy: str,
    capacity: int,
    requests: Sequence[Sequence[OffloadKey]],
    distinct: Sequence[OffloadKey],
) -> _Replay:
    manager = contender.make_manager(capacity, policy)
    contexts = [contender.make_context(f"req-{index}") for index in range(len(requests))]
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        ns, ops, intervals, hits, failed = replay(manager, contender.hit, requests, contexts)
    finally:
        if gc_was_enabled:
            gc.enable()
    return _Replay(
        ns=ns,
        ops=ops,
        intervals=intervals,
        hits=hits,
        accesses=sum(len(keys) for keys in requests),
        failed_stores=failed,
        resident_digest=resident_digest(contender, manager, distinct),
    )


def clock_overhead_ns(samples: int = 20001) -> float:
    """The median time between two back-to-back `perf_counter_ns` reads, as the driver reads
    them (the overhead each timed interval carries)."""
    clock = time.perf_counter_ns
    deltas = []
    for _ in range(samples):
        t0 = clock()
        t1 = clock()
        deltas.append(t1 - t0)
    return float(statistics.median(deltas))


def _median_int(values: Iterable[int]) -> int:
    return round(statistics.median(values))


def _measurements(replays: list[_Replay], overhead_ns: float) -> dict[str, Measurement]:
    """Per phase (and `OVERALL`), the median figures of a contender's replays."""
    first = replays[0]
    for other in replays[1:]:
        if (other.hits, other.ops, other.resident_digest) != (
            first.hits,
            first.ops,
            first.resident_digest,
        ):
            raise RuntimeError("two replays of the same configuration diverged")

    def corrected(run: _Replay, index: int) -> int:
        return max(1, round(run.ns[index] - run.intervals[index] * overhead_ns))

    def build(ops: int, intervals: int, runs: list[int], raw: list[int]) -> Measurement:
        return Measurement(
            ops=ops,
            ns=_median_int(runs),
            raw_ns=_median_int(raw),
            intervals=intervals,
            runs_ns=tuple(runs),
            hits=first.hits,
            accesses=first.accesses,
            failed_stores=first.failed_stores,
            resident_digest=first.resident_digest,
        )

    out: dict[str, Measurement] = {}
    for index, phase in enumerate(PHASES):
        out[phase] = build(
            first.ops[index],
            first.intervals[index],
            [corrected(run, index) for run in replays],
            [run.ns[index] for run in replays],
        )
    out[OVERALL] = build(
        sum(first.ops),
        sum(first.intervals),
        [sum(corrected(run, index) for index in range(len(PHASES))) for run in replays],
        [sum(run.ns) for run in replays],
    )
    return out


# -- the trace -----------------------------------------------------------------------------


def load_requests(
    limit_requests: int | None = None, path: str | Path | None = None
) -> list[list[int]]:
    """The hash ids of each request of a Mooncake trace (default: the shipped one), in order;
    only the first `limit_requests` requests when given."""
    from kvtier_tools.workloads.traces import read_mooncake

    requests: Iterable[Any] = read_mooncake(path)
    if limit_requests is not None:
        if limit_requests < 1:
            raise ValueError(f"limit_requests must be positive, got {limit_requests}")
        requests = itertools.islice(requests, limit_requests)
    return [list(request.hash_ids) for request in requests]


def keys_for(requests: Iterable[Iterable[int]]) -> list[list[OffloadKey]]:
    """Offload keys for the requests' hash ids, one shared (and pre-hashed) key per id."""
    interned: dict[int, OffloadKey] = {}
    out: list[list[OffloadKey]] = []
    for hash_ids in requests:
        row: list[OffloadKey] = []
        for hash_id in hash_ids:
            key = interned.get(hash_id)
            if key is None:
                key = interned[hash_id] = key_from_int(hash_id)
                hash(key)  # bytes cache their hash: no contender pays for the first one
            row.append(key)
        out.append(row)
    return out


def capacity_for(fraction: float, unique_blocks: int) -> int:
    """`floor(fraction * unique_blocks)`, at least one block."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a capacity fraction must be in (0, 1], got {fraction}")
    return max(1, math.floor(fraction * unique_blocks))


# -- the benchmark -------------------------------------------------------------------------


def _contenders(include_vllm: bool | None) -> list[_Contender]:
    """kvtier, and vLLM's own manager unless `include_vllm` is False or (None) vLLM cannot
    be imported; True and no vLLM raises RuntimeError saying why."""
    contenders = [_kvtier_contender()]
    if include_vllm is False:
        return contenders
    vllm = import_vllm()
    if isinstance(vllm, VllmClasses):
        contenders.append(_vllm_contender(vllm))
    elif include_vllm:
        raise RuntimeError(vllm)
    return contenders


def _vllm_version(contenders: Sequence[_Contender]) -> str | None:
    """The vLLM version compared with, None when vLLM is not among `contenders`."""
    vllm = import_vllm()
    if not any(c.name == "vllm" for c in contenders) or not isinstance(vllm, VllmClasses):
        return None
    return vllm.version


def run_bookkeeping_benchmark(
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    policies: Sequence[str] = DEFAULT_POLICIES,
    repeats: int = 3,
    limit_requests: int | None = None,
    *,
    include_vllm: bool | None = None,
    trace_path: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Result]:
    """Replay the trace through kvtier (and vLLM's own manager, when it can be imported) for
    every policy and capacity fraction; one `Result` per (policy, fraction, phase), phases
    then `OVERALL`.

    `include_vllm`: None compares with vLLM when it can be imported (`vllm_skipped()` says
    why not); True requires it (raises RuntimeError when missing); False measures kvtier
    alone. `progress` receives a line per configuration.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    contenders = _contenders(include_vllm)
    requests = keys_for(load_requests(limit_requests, trace_path))
    distinct = list(dict.fromkeys(key for keys in requests for key in keys))
    overhead_ns = clock_overhead_ns()
    version = _vllm_version(contenders)

    results: list[Result] = []
    for policy in policies:
        for fraction in fractions:
            capacity = capacity_for(fraction, len(distinct))
            replays: dict[str, list[_Replay]] = {contender.name: [] for contender in contenders}
            for repeat in range(repeats):
                order = contenders if repeat % 2 == 0 else contenders[::-1]
                for contender in order:
                    replay_ = _run_once(contender, policy, capacity, requests, distinct)
                    replays[contender.name].append(replay_)
            kvtier = _measurements(replays["kvtier"], overhead_ns)
            vllm = _measurements(replays["vllm"], overhead_ns) if "vllm" in replays else None
            for phase in (*PHASES, OVERALL):
                results.append(
                    Result(
                        policy=policy,
                        fraction=fraction,
                        capacity=capacity,
                        phase=phase,
                        requests=len(requests),
                        unique_blocks=len(distinct),
                        repeats=repeats,
                        timer_overhead_ns=overhead_ns,
                        kvtier=kvtier[phase],
                        vllm=None if vllm is None else vllm[phase],
                        vllm_version=None if vllm is None else version,
                    )
                )
            if progress is not None:
                progress(_progress_line(results[-1]))
    return results


def _progress_line(row: Result) -> str:
    """One configuration's overall throughput, for the progress lines."""
    line = f"{row.policy} {row.fraction:.0%}: kvtier {row.kvtier_mops:.2f} Mops/s"
    if row.vllm_mops is not None:
        line += f", vLLM {row.vllm_mops:.2f} Mops/s"
    return line


# -- output --------------------------------------------------------------------------------


def _percent(fraction: float) -> str:
    text = f"{fraction * 100:.2f}".rstrip("0").rstrip(".")
    return f"{text}%"


_HEADER = (
    "policy",
    "capacity",
    "blocks",
    "phase",
    "ops",
    "kvtier Mops/s",
    "vLLM Mops/s",
    "kvtier/vLLM",
    "hit ratio kvtier",
    "hit ratio vLLM",
)
_LEFT_COLUMNS = {0, 3}


def _cells(result: Result) -> list[str]:
    """One table row: `result`'s figures as text, "-" where vLLM has none."""
    return [
        result.policy,
        _percent(result.fraction),
        f"{result.capacity:,}",
        result.phase,
        f"{result.kvtier.ops:,}",
        f"{result.kvtier_mops:.3f}",
        "-" if result.vllm_mops is None else f"{result.vllm_mops:.3f}",
        "-" if result.ratio is None else f"{result.ratio:.2f}x",
        f"{result.hit_ratio:.4f}",
        "-" if result.vllm_hit_ratio is None else f"{result.vllm_hit_ratio:.4f}",
    ]


def _table_lines(results: Sequence[Result]) -> list[str]:
    """The header, a rule and a row per result, a blank line between configurations."""
    rows = [_cells(result) for result in results]
    widths = [max(len(row[i]) for row in [list(_HEADER), *rows]) for i in range(len(_HEADER))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i in _LEFT_COLUMNS else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(_HEADER), line(["-" * width for width in widths])]
    previous: tuple[str, float] | None = None
    for result, row in zip(results, rows, strict=True):
        group = (result.policy, result.fraction)
        if previous is not None and group != previous:
            out.append("")
        previous = group
        out.append(line(row))
    return out


def _hit_count_lines(results: Sequence[Result]) -> list[str]:
    """Per configuration, both hit counts and whether they must and do agree (LRU)."""
    out = ["Hit counts (blocks served from the tier):"]
    for result in results:
        if result.phase != OVERALL or result.vllm is None:
            continue
        agree = result.hits_agree
        if agree is None:
            verdict = "not compared (the ARC implementations differ)"
        elif agree:
            verdict = "agree (hit counts and final resident sets)"
        else:
            verdict = "!!! DISAGREE: the LRU replays diverged; the comparison is invalid !!!"
        out.append(
            f"  {result.policy} {_percent(result.fraction):>4}: kvtier "
            f"{result.kvtier.hits:,}  vLLM {result.vllm.hits:,}  {verdict}"
        )
    ratios = [result.ratio for result in results if result.ratio is not None]
    if ratios:
        out.append(f"kvtier/vLLM throughput: min {min(ratios):.2f}x, max {max(ratios):.2f}x")
    return out


def _note_lines(results: Sequence[Result]) -> list[str]:
    """Stores that could not be placed, and the clock overhead subtracted."""
    out = []
    failed = {
        (result.policy, result.fraction): result.kvtier.failed_stores
        for result in results
        if result.phase == OVERALL and result.kvtier.failed_stores
    }
    if failed:
        shown = ", ".join(f"{p} {_percent(f)}: {n}" for (p, f), n in failed.items())
        out.append(f"Requests whose store could not be placed (larger than the tier): {shown}")
    overhead_ns = results[0].timer_overhead_ns
    share = max(
        (
            result.kvtier.intervals * overhead_ns / result.kvtier.raw_ns
            for result in results
            if result.kvtier.raw_ns
        ),
        default=0.0,
    )
    out.append(
        f"Clock overhead {overhead_ns:.0f} ns per timed interval, subtracted "
        f"(at most {share:.0%} of a kvtier phase's raw time)."
    )
    return out


def format_table(results: Sequence[Result], vllm_skipped: str | None = None) -> str:
    """A plain-text table of `results`, a hit-count check, and notes; `vllm_skipped` is why
    there are no vLLM figures, if there are none."""
    if not results:
        return "no results"
    first = results[0]
    out = [
        f"Bookkeeping throughput: {first.requests:,} requests, {first.kvtier.accesses:,} block "
        f"accesses, {first.unique_blocks:,} unique blocks; median of {first.repeats} "
        "replay(s); Mops/s = million block-operations per second",
        *_table_lines(results),
        "",
    ]
    if any(result.vllm is not None for result in results):
        out += _hit_count_lines(results)
    else:
        out.append(f"{VLLM_SKIPPED}: {vllm_skipped or 'no vLLM figures in these results'}.")
    out += _note_lines(results)
    return "\n".join(out)


def lru_disagreements(results: Sequence[Result]) -> list[Result]:
    """The LRU rows whose hit counts or resident sets differ between kvtier and vLLM."""
    return [result for result in results if result.hits_agree is False]


# -- command line --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m kvtier_tools.bench.bookkeeping [--quick] [--json [PATH]] ...`"""
    parser = argparse.ArgumentParser(
        prog="python -m kvtier_tools.bench.bookkeeping",
        description="Bookkeeping throughput (block-operations/s) of kvtier's TierManager "
        "against vLLM's own CPU offloading manager, replaying the shipped Mooncake trace.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"replay the first {QUICK_LIMIT_REQUESTS} requests once (repeats=1)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="replays per figure (3)")
    parser.add_argument("--limit-requests", type=int, default=None, help="trace prefix")
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=list(DEFAULT_FRACTIONS),
        help="capacities as fractions of the unique blocks (0.01 0.1 0.5)",
    )
    parser.add_argument(
        "--policies", nargs="+", default=list(DEFAULT_POLICIES), choices=DEFAULT_POLICIES
    )
    parser.add_argument("--trace", default=None, help="a Mooncake JSONL(.zst) trace")
    parser.add_argument(
        "--no-vllm", action="store_true", help="measure kvtier alone even if vLLM is installed"
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write machine-readable results to PATH (stdout, instead of the table, if no "
        "PATH is given)",
    )
    args = parser.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    limit = args.limit_requests
    if limit is None and args.quick:
        limit = QUICK_LIMIT_REQUESTS
    json_to_stdout = args.json == "-"

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    skipped = vllm_skipped(False if args.no_vllm else None)
    if skipped is not None:
        progress(f"{VLLM_SKIPPED}: {skipped}")
    results = run_bookkeeping_benchmark(
        fractions=tuple(args.fractions),
        policies=tuple(args.policies),
        repeats=repeats,
        limit_requests=limit,
        include_vllm=skipped is None,
        trace_path=args.trace,
        progress=progress,
    )
    if args.json is not None:
        document = results_to_json(results, skipped)
        if json_to_stdout:
            print(document)
        else:
            Path(args.json).write_text(document + "\n", encoding="utf-8")
    if not json_to_stdout:
        print(format_table(results, skipped))
    bad = lru_disagreements(results)
    if bad:
        print(
            "ERROR: kvtier and vLLM disagree on LRU hits at "
            + ", ".join(_percent(result.fraction) for result in bad if result.phase == OVERALL),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
