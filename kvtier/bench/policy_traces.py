"""Hit ratios of cache policies across traces: the shipped conversation trace (its halves by
time and the whole), any other Mooncake trace given on the command line, and generated key
sequences of different regimes, at 1, 5 and 10 % of each workload's distinct blocks.

    .venv/bin/python -m kvtier.bench.policy_traces                   # every workload
    .venv/bin/python -m kvtier.bench.policy_traces --trace synthetic.jsonl --workloads synthetic
    .venv/bin/python -m kvtier.bench.policy_traces --policies lru arc lct path/old_lct.py:Old

Every run is `kvtier.policies.simulate` over block accesses (one access per key, cold
start). Mooncake workloads skip the prompts' partial last blocks (as `kvtier simulate
--skip-partial-blocks` and `kvtier.bench.lct_tuning` do); generated ones have none. A
policy is a registered name or `FILE.py:Class` / `module:Class` (a `CachePolicy` class
built from the capacity alone), so an old version of a policy can be compared with the
new one. The last column of the table is the policy's hit ratio minus ARC's.

Generated workloads (deterministic, seeded; `generate(name)`):
  - `zipf`: 400,000 keys drawn from 100,000 with Zipf(0.8) popularity (a stationary mix
    of frequencies);
  - `scans`: a hot set of 2,000 keys read at random, interleaved with one-off scans of fresh
    keys (60 % of the accesses) and a loop of 6,000 keys read again and again;
  - `long`: a block-I/O-like trace 1,200,000 accesses long (hundreds of capacities even at
    10 %): a Zipf(0.8) hot set over 50,000 keys whose popularity drifts, and files of 8 to
    64 consecutive blocks re-read at random;
  - `regimes`: phases of 100,000 accesses that change regime (Zipf over one universe, a
    scan-heavy phase, Zipf over another universe, a loop), twice over.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvtier.policies import CachePolicy, get_policy_class, partial_block_flags, simulate
from kvtier.workloads.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest, read_mooncake

FRACTIONS = (0.01, 0.05, 0.10)
GENERATED = ("zipf", "scans", "long", "regimes")


@dataclass(frozen=True)
class Workload:
    """A key sequence and, per access, whether it is a partial block (never stored)."""

    name: str
    accesses: list[int]
    partial: list[bool] | None

    @property
    def unique(self) -> int:
        return len(set(self.accesses))


def mooncake_workload(name: str, requests: Sequence[TraceRequest]) -> Workload:
    """A Mooncake trace's block accesses, partial last blocks flagged."""
    ids = [list(r.hash_ids) for r in requests]
    flags = partial_block_flags(ids, [r.input_length for r in requests], MOONCAKE_BLOCK_TOKENS)
    return Workload(name, list(itertools.chain.from_iterable(ids)), flags)


def conversation() -> list[Workload]:
    """The shipped trace's first half, second half (requests by timestamp) and whole."""
    requests = sorted(read_mooncake(), key=lambda r: r.timestamp_ms)
    half = len(requests) // 2
    return [
        mooncake_workload("conv-first", requests[:half]),
        mooncake_workload("conv-second", requests[half:]),
        mooncake_workload("conv-whole", requests),
    ]


def _zipf_sampler(universe: int, skew: float, rng: random.Random) -> Callable[[int], list[int]]:
    """A function drawing `k` ranks in [0, universe) with Zipf(`skew`) popularity."""
    weights = [1.0 / (rank + 1) ** skew for rank in range(universe)]
    cumulative = list(itertools.accumulate(weights))
    population = range(universe)

    def draw(k: int) -> list[int]:
        return rng.choices(population, cum_weights=cumulative, k=k)

    return draw


def zipf(count: int = 400_000, universe: int = 100_000, skew: float = 0.8) -> list[int]:
    """Independent draws, Zipf popularity."""
    return _zipf_sampler(universe, skew, random.Random(11))(count)


def scans(count: int = 400_000) -> list[int]:
    """A random hot set, one-off scans of fresh keys, and a loop of 6,000 keys."""
    rng = random.Random(12)
    keys: list[int] = []
    fresh = 10_000_000
    loop_at = 0
    while len(keys) < count:
        roll = rng.random()
        if roll < 0.55:
            length = rng.randrange(50, 400)
            keys.extend(range(fresh, fresh + length))  # nobody reads it again
            fresh += length
        elif roll < 0.7:
            keys.extend(range(5_000_000 + loop_at, 5_000_000 + loop_at + 200))
            loop_at = (loop_at + 200) % 6_000
        else:
            keys.extend(rng.randrange(2_000) for _ in range(100))
    return keys[:count]


def long_trace(count: int = 1_200_000) -> list[int]:
    """Block-I/O-like and long: a Zipf(0.8) hot set over 50,000 keys whose popularity drifts
    (a few keys move into the top ranks every 64 accesses) and files of 8 to 64 consecutive
    blocks re-read now and then. Every key comes back, so a count since the start puts
    every reused block into the top access class after warm-up."""
    rng = random.Random(13)
    universe = 50_000
    draw = _zipf_sampler(universe, 0.8, rng)
    rank_to_key = list(range(universe))
    files = [(20_000_000 + 100 * i, rng.randrange(8, 65)) for i in range(2_000)]
    file_draw = _zipf_sampler(len(files), 0.8, rng)
    keys: list[int] = []
    while len(keys) < count:
        if rng.random() < 0.85:
            keys.extend(rank_to_key[r] for r in draw(64))
            for _ in range(4):  # popularity drifts: keys move into and out of the top ranks
                a, b = rng.randrange(universe), rng.randrange(2_000)
                rank_to_key[a], rank_to_key[b] = rank_to_key[b], rank_to_key[a]
        else:
            start, length = files[file_draw(1)[0]]
            keys.extend(range(start, start + length))
    return keys[:count]


def regimes(phase: int = 100_000) -> list[int]:
    """Zipf, scans, another Zipf, a loop; twice (a regime change every `phase` accesses)."""
    rng = random.Random(14)
    keys: list[int] = []
    fresh = 90_000_000
    first = _zipf_sampler(40_000, 0.9, rng)
    second = _zipf_sampler(20_000, 0.7, rng)
    for round_ in range(2):
        keys.extend(first(phase))
        scan_phase: list[int] = []
        while len(scan_phase) < phase:
            if rng.random() < 0.7:
                length = rng.randrange(100, 1_000)
                scan_phase.extend(range(fresh, fresh + length))
                fresh += length
            else:
                scan_phase.extend(1_000_000 + rng.randrange(1_500) for _ in range(200))
        keys.extend(scan_phase[:phase])
        keys.extend(2_000_000 + k for k in second(phase))
        loop = [3_000_000 + round_ * 100_000 + i for i in range(8_000)]
        keys.extend(itertools.islice(itertools.cycle(loop), phase))
    return keys


def generate(name: str) -> Workload:
    """A generated workload by name (see the module doc)."""
    makers: dict[str, Callable[[], list[int]]] = {
        "zipf": zipf,
        "scans": scans,
        "long": long_trace,
        "regimes": regimes,
    }
    return Workload(name, makers[name](), None)


def load_policy(spec: str) -> Callable[[int], CachePolicy]:
    """A registered policy name, or `FILE.py:Class` / `module:Class`."""
    if ":" not in spec:
        return get_policy_class(spec)
    where, _, cls = spec.rpartition(":")
    if where.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        if module_spec is None or module_spec.loader is None:
            raise SystemExit(f"cannot load {where}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    policy: Callable[[int], CachePolicy] = getattr(module, cls)
    return policy


def hit_ratios(policy: Callable[[int], CachePolicy], workload: Workload) -> list[float]:
    """Hit ratios at each fraction of the workload's distinct blocks."""
    unique = workload.unique
    return [
        simulate(
            policy, max(1, math.floor(f * unique)), workload.accesses, workload.partial
        ).hit_ratio
        for f in FRACTIONS
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", nargs="+", default=["lru", "arc", "lct", "auto"])
    parser.add_argument(
        "--trace",
        action="append",
        default=[],
        help="another Mooncake trace (JSONL, plain or .zst); its workload is the file's stem "
        "after its last '_' (mooncake_fast25_synthetic_trace.jsonl: 'synthetic')",
    )
    parser.add_argument(
        "--workloads", nargs="+", help="only these (conv-first, conv-second, conv-whole, ...)"
    )
    parser.add_argument("--limit", type=int, help="only the first N accesses of each workload")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    wanted = set(args.workloads) if args.workloads else None

    def selected(name: str) -> bool:
        return wanted is None or name in wanted

    workloads: list[Workload] = []
    if any(selected(n) for n in ("conv-first", "conv-second", "conv-whole")):
        workloads += [w for w in conversation() if selected(w.name)]
    for path in args.trace:
        stem = Path(path).name.split(".")[0].removesuffix("_trace")
        name = stem.rsplit("_", 1)[-1]
        if selected(name):
            workloads.append(mooncake_workload(name, list(read_mooncake(path))))
    workloads += [generate(name) for name in GENERATED if selected(name)]
    if args.limit is not None:
        workloads = [
            Workload(
                w.name,
                w.accesses[: args.limit],
                None if w.partial is None else w.partial[: args.limit],
            )
            for w in workloads
        ]
    policies = {spec: load_policy(spec) for spec in args.policies}
    labels = {  # a policy from a file is named by the file: old_lct.py:LCTCachePolicy, old_lct
        spec: Path(spec.rpartition(":")[0]).stem if ":" in spec else spec for spec in policies
    }
    figures: dict[str, dict[str, list[float]]] = {}
    print(f"{'workload':<12} {'accesses':>9} {'distinct':>8} {'policy':<10}", end="")
    print("".join(f"{f:>9.0%}" for f in FRACTIONS), "  vs ARC", flush=True)
    for workload in workloads:
        figures[workload.name] = {}
        arc = hit_ratios(get_policy_class("arc"), workload)
        for spec, policy in policies.items():
            started = time.perf_counter()
            found = arc if spec == "arc" else hit_ratios(policy, workload)
            figures[workload.name][labels[spec]] = found
            delta = " ".join(f"{v - a:+.4f}" for v, a in zip(found, arc, strict=True))
            print(
                f"{workload.name:<12} {len(workload.accesses):>9} {workload.unique:>8} "
                f"{labels[spec][:10]:<10}" + "".join(f"{v:>9.4f}" for v in found),
                f"  {delta}  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
