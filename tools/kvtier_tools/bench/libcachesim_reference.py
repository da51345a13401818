"""Reference hit ratios from libCacheSim (Yang et al.) for the traces of
`kvtier_tools.bench.policy_traces`: its LRU and ARC (to calibrate against kvtier's: they
must agree within 0.002) and its strongest policies (S3-FIFO, SIEVE, W-TinyLFU, LIRS,
Cacheus, LeCaR), unit-size objects, at 1, 5, 10 and 25 % of each trace's distinct keys.

libCacheSim is a reference, never a dependency of kvtier: it comes with the `bench` extra of
kvtier-tools, or in a virtual environment of its own (this module imports nothing of
kvtier, so it runs in one that has only libCacheSim):

    python -m venv /tmp/lcs && /tmp/lcs/bin/pip install libcachesim
    /tmp/lcs/bin/python tools/kvtier_tools/bench/libcachesim_reference.py \
        cloudphysics=/tmp/keys_cloudphysics.txt zipf=/tmp/keys_zipf.txt --json ref.json

Each trace is a text file of one integer key per line (`policy_traces --keys-out DIR`
writes them from its workloads). `--calibrate FILE` checks the calibration: FILE is
`policy_traces --json`'s output for the same workloads, and each trace's LRU and ARC must
equal kvtier's there within `TOLERANCE` at every fraction (exit status 1 and a line per
cell otherwise):

    python -m kvtier_tools.bench.policy_traces --trace-dir /tmp/traces --workloads oltp \
        --json kvtier.json --keys-out /tmp/keys
    /tmp/lcs/bin/python tools/kvtier_tools/bench/libcachesim_reference.py \
        oltp=/tmp/keys/oltp.txt --calibrate kvtier.json
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FRACTIONS = (0.01, 0.05, 0.10, 0.25)
ALGORITHMS = ("LRU", "ARC", "S3FIFO", "Sieve", "WTinyLFU", "LIRS", "Cacheus", "LeCaR")
"""libCacheSim's classes, by their names in the `libcachesim` package."""
_UINT64 = (1 << 64) - 1
TOLERANCE = 0.002
"""The most libCacheSim's LRU or ARC may differ from kvtier's in a cell (issue 34)."""
CALIBRATED = {"LRU": "lru", "ARC": "arc"}
"""libCacheSim's class -> kvtier's policy it must equal."""


def _libcachesim() -> Any:
    """The `libcachesim` module, or SystemExit with one line saying how to get it."""
    try:
        import libcachesim  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise SystemExit(
            "libcachesim is not installed: pip install 'kvtier-tools[bench]' (or libcachesim)"
        ) from None
    return libcachesim


def hit_ratios(keys: Sequence[int], capacity: int, algorithm: str) -> float:
    """libCacheSim's `algorithm` at `capacity` unit-size objects over `keys`: its hit ratio.
    Keys are 64-bit integers, signed or not (a negative one is taken modulo 2**64, so
    distinct signed keys stay distinct: scarab's are signed)."""
    lcs = _libcachesim()
    cache = getattr(lcs, algorithm)(cache_size=capacity)
    request = lcs.Request()
    request.obj_size = 1
    hits = 0
    for key in keys:
        request.obj_id = key & _UINT64  # its ids are unsigned: a signed 64-bit key wraps
        hits += bool(cache.get(request))
    return hits / len(keys) if keys else 0.0


def reference(
    keys: Sequence[int], algorithms: Sequence[str] = ALGORITHMS
) -> dict[str, list[float]]:
    """Per algorithm, its hit ratios at each of `FRACTIONS` of the distinct keys."""
    distinct = len(set(keys))
    capacities = [max(1, math.floor(f * distinct)) for f in FRACTIONS]
    return {name: [hit_ratios(keys, c, name) for c in capacities] for name in algorithms}


def read_keys(path: str) -> list[int]:
    """One integer key per line; blank lines skipped."""
    return [int(line) for line in Path(path).read_text().split() if line]


def calibration(
    found: dict[str, dict[str, list[float]]], kvtier: dict[str, dict[str, Any]]
) -> tuple[list[str], list[str]]:
    """libCacheSim's LRU and ARC against kvtier's figures (`policy_traces --json`) on the
    traces both have: a summary line per trace and policy (the largest difference), and a
    line per cell where they differ by more than `TOLERANCE`."""
    summary: list[str] = []
    misses: list[str] = []
    for name in sorted(found.keys() & kvtier.keys()):
        for theirs, ours in CALIBRATED.items():
            if theirs not in found[name] or ours not in kvtier[name]:
                continue
            pairs = zip(found[name][theirs], kvtier[name][ours]["hit_ratios"], strict=True)
            gaps = [abs(a - b) for a, b in pairs]
            summary.append(f"{name} {theirs}: largest difference from kvtier {max(gaps):.4f}")
            misses += [
                f"{name} {theirs} at {fraction:.0%}: libCacheSim and kvtier differ by {gap:.4f}"
                for fraction, gap in zip(FRACTIONS, gaps, strict=True)
                if gap > TOLERANCE
            ]
    return summary, misses


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", help="NAME=PATH, a text file of integer keys")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--calibrate", help="policy_traces --json output: LRU and ARC must match it"
    )
    args = parser.parse_args(argv)
    found: dict[str, dict[str, list[float]]] = {}
    for spec in args.traces:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"a trace is NAME=PATH, got {spec!r}")
        found[name] = reference(read_keys(path), args.algorithms)
        for algorithm, ratios in found[name].items():
            print(f"{name:<12} {algorithm:<9}" + "".join(f"{v:>9.4f}" for v in ratios), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    if args.calibrate:
        summary, misses = calibration(found, json.loads(Path(args.calibrate).read_text()))
        for line in summary:
            print("calibration:", line)
        for line in misses:
            print("calibration fails:", line)
        if not summary:
            print("calibration: no trace with LRU or ARC in both")
            return 1
        return 1 if misses else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
