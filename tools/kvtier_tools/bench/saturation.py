"""Loads first under saturation: get latency while a put stream saturates the chain.

A CPU tier over a disk tier (and over Redis, when one is given) of small blocks. A hot set
of blocks is stored first (about twice the CPU tier, so gets find some at the top and
promote the rest from the tier below). Then, for `--seconds` each, in the same chain:

- idle: `--getters` (32) tasks call `get` on random groups of `--blocks` (4) hot keys, as
  fast as they can;
- loaded: the same tasks each `put` a group of `--blocks` new blocks, then `get` a random
  group of those stored so far (the hot set and the groups put since), as fast as they can
  (a saturating put stream: the machine's cores are the limit). `--split`: `--putters`
  tasks that only put run beside getters that only get instead.

Prints, per tier below the CPU one and per phase, the medians over `--repeats` of the get
p50 / p99, gets and puts per second, put p50 / p99, and the gets that were short (a block
not served) or hit the deadline (`stats().calls.get_timeouts`). The goal (issue 23, item 3):
loaded get p99 <= 5x idle get p99, and no get reaching the deadline; puts are the ones that
wait (`put_admission_waits`: puts that queued for the chain's in-flight bound).

    .venv/bin/python -m kvtier_tools.bench.saturation                      # cpu -> disk
    scripts/redis.sh start && eval "$(scripts/redis.sh env)"
    .venv/bin/python -m kvtier_tools.bench.saturation --tiers disk redis   # and cpu -> Redis
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvtier.config import parse_size
from kvtier.hierarchy import Hierarchy
from kvtier.keys import OffloadKey, key_from_int

LOAD_TIMEOUT_S = 5.0
"""The gets' deadline (the hierarchy's default `load_timeout_s`)."""


@dataclass(slots=True)
class Phase:
    """What one phase measured."""

    get_s: list[float] = field(default_factory=list)
    put_s: list[float] = field(default_factory=list)
    short_gets: int = 0
    get_timeouts: int = 0
    admission_waits: int = 0
    refused: int = 0
    seconds: float = 0.0

    def pct(self, samples: list[float], q: float) -> float:
        """The q-th percentile of `samples` in milliseconds (nan when there are none)."""
        if not samples:
            return float("nan")
        ordered = sorted(samples)
        return 1e3 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def keys_of(first: int, count: int) -> list[OffloadKey]:
    return [key_from_int(first + i) for i in range(count)]


def tier_config(tier: str, directory: Path, capacity: int) -> dict[str, Any]:
    """The `[[tiers]]` table of the tier below the CPU one."""
    if tier == "disk":
        return {
            "name": "disk",
            "medium": "disk",
            "capacity": capacity,
            "path": str(directory),
            "fsync": True,
            "direct_io": "auto",
        }
    url = os.environ.get("KVTIER_REDIS_URL")
    if not url:
        raise SystemExit('a Redis tier needs KVTIER_REDIS_URL: eval "$(scripts/redis.sh env)"')
    return {
        "name": "redis",
        "medium": "redis",
        "capacity": capacity,
        "url": url,
        "password_env": "KVTIER_REDIS_PASSWORD",
        "auth_key_file": os.environ["KVTIER_AUTH_KEY_FILE"],
        "key_prefix": f"kvtier-sat-{os.getpid()}-{time.monotonic_ns()}:",
        "ttl_s": 600,
    }


async def _get_one(hierarchy: Hierarchy, first: int, group: int, phase: Phase) -> None:
    began = time.perf_counter()
    got = await hierarchy.get(keys_of(first, group), timeout_s=LOAD_TIMEOUT_S)
    phase.get_s.append(time.perf_counter() - began)
    phase.short_gets += got.shape[0] < group


async def _getter(
    hierarchy: Hierarchy, hot: int, group: int, until: float, phase: Phase, rng: random.Random
) -> None:
    while time.perf_counter() < until:
        await _get_one(hierarchy, rng.randrange(hot // group) * group, group, phase)


async def _mixed(
    hierarchy: Hierarchy,
    hot: int,
    blocks: torch.Tensor,
    next_key: list[int],
    stored: list[int],
    until: float,
    phase: Phase,
    rng: random.Random,
) -> None:
    """Put a new group, then get a random group of those stored so far (the hot set or
    the groups put since, `stored`: their first keys), as fast as it can."""
    group = blocks.shape[0]
    while time.perf_counter() < until:
        stored.append(await _put_next(hierarchy, blocks, next_key, phase))
        pick = rng.randrange(hot // group + len(stored))
        target = pick * group if pick < hot // group else stored[pick - hot // group]
        await _get_one(hierarchy, target, group, phase)


async def _putter(
    hierarchy: Hierarchy, blocks: torch.Tensor, next_key: list[int], until: float, phase: Phase
) -> None:
    while time.perf_counter() < until:
        await _put_next(hierarchy, blocks, next_key, phase)


async def _put_next(
    hierarchy: Hierarchy, blocks: torch.Tensor, next_key: list[int], phase: Phase
) -> int:
    """Put the next group of new keys, timed into `phase`; its first key."""
    group = blocks.shape[0]
    first = next_key[0]
    next_key[0] += group
    began = time.perf_counter()
    await hierarchy.put(keys_of(first, group), blocks)
    phase.put_s.append(time.perf_counter() - began)
    return first


async def run_phase(
    hierarchy: Hierarchy,
    args: argparse.Namespace,
    hot: int,
    blocks: torch.Tensor,
    next_key: list[int],
    putters: int,
    seed: int,
) -> Phase:
    """`args.getters` getters (and `putters` putters) for `args.seconds`."""
    phase = Phase()
    before = hierarchy.stats().calls
    waits_before = before.put_admission_waits
    until = time.perf_counter() + args.seconds
    started = time.perf_counter()
    stored: list[int] = []
    async with asyncio.TaskGroup() as group:
        for index in range(args.getters):
            rng = random.Random(seed * 1000 + index)
            if putters and args.mixed:
                group.create_task(
                    _mixed(hierarchy, hot, blocks, next_key, stored, until, phase, rng)
                )
            else:
                group.create_task(_getter(hierarchy, hot, args.blocks, until, phase, rng))
        for _ in range(0 if args.mixed else putters):
            group.create_task(_putter(hierarchy, blocks, next_key, until, phase))
    phase.seconds = time.perf_counter() - started
    after = hierarchy.stats().calls
    phase.get_timeouts = after.get_timeouts - before.get_timeouts
    phase.admission_waits = after.put_admission_waits - waits_before
    phase.refused = after.put_refused - before.put_refused
    await hierarchy.drain()
    return phase


async def one_repeat(args: argparse.Namespace, tier: str, seed: int) -> tuple[Phase, Phase]:
    """Open a chain, store the hot set, measure idle then loaded; close."""
    block_size = parse_size(args.block_size)
    with tempfile.TemporaryDirectory(prefix="kvtier-sat-", dir=args.dir) as directory:
        config = {
            "block_size": block_size,
            "model_id": "saturation-bench",
            "write_policy": args.write_policy,
            "tiers": [
                {"name": "cpu", "medium": "cpu", "capacity": args.cpu_blocks, "policy": "lru"},
                tier_config(tier, Path(directory), args.lower_blocks),
            ],
        }
        hierarchy = Hierarchy.from_config(config, flush_on_close=False)
        async with hierarchy:
            hot = 2 * args.cpu_blocks // args.blocks * args.blocks
            gen = torch.Generator().manual_seed(seed)
            data = torch.randint(
                0, 256, (args.blocks, block_size), dtype=torch.uint8, generator=gen
            )
            for first in range(0, hot, args.blocks):
                await hierarchy.put(keys_of(first, args.blocks), data)
            await hierarchy.drain()
            next_key = [1 << 40]
            idle = await run_phase(hierarchy, args, hot, data, next_key, 0, seed)
            loaded = await run_phase(hierarchy, args, hot, data, next_key, args.putters, seed)
    return idle, loaded


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else float("nan")


def report(tier: str, runs: list[tuple[Phase, Phase]]) -> None:
    """One table per tier: medians over the repeats."""
    print(f"\ncpu -> {tier}: medians of {len(runs)} repeats")
    header = (
        f"{'phase':8} {'get p50':>9} {'get p99':>9} {'gets/s':>8} {'puts/s':>8} "
        f"{'put p50':>9} {'put p99':>9} {'short':>6} {'timeouts':>8} {'adm.waits':>9} "
        f"{'refused':>8}"
    )
    print(header)
    for index, name in enumerate(("idle", "loaded")):
        phases = [run[index] for run in runs]

        def med(values: list[float]) -> float:
            return _median(values)

        print(
            f"{name:8} {med([p.pct(p.get_s, 50) for p in phases]):8.1f}m "
            f"{med([p.pct(p.get_s, 99) for p in phases]):8.1f}m "
            f"{med([len(p.get_s) / p.seconds for p in phases]):8.0f} "
            f"{med([len(p.put_s) / p.seconds for p in phases]):8.0f} "
            f"{med([p.pct(p.put_s, 50) for p in phases]):8.1f}m "
            f"{med([p.pct(p.put_s, 99) for p in phases]):8.1f}m "
            f"{sum(p.short_gets for p in phases):6d} {sum(p.get_timeouts for p in phases):8d} "
            f"{sum(p.admission_waits for p in phases):9d} {sum(p.refused for p in phases):8d}"
        )
    ratios = [
        loaded.pct(loaded.get_s, 99) / idle.pct(idle.get_s, 99)
        for idle, loaded in runs
        if idle.get_s and loaded.get_s
    ]
    worst = max((max(loaded.get_s, default=0.0) for _, loaded in runs), default=0.0)
    print(
        f"loaded / idle get p99: {_median(ratios):.2f}x (goal <= 5x; per repeat "
        f"{', '.join(f'{r:.2f}' for r in ratios)}); slowest loaded get {1e3 * worst:.0f} ms "
        f"(deadline {1e3 * LOAD_TIMEOUT_S:.0f} ms)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the options and print the table of each tier."""
    parser = argparse.ArgumentParser(
        prog="python -m kvtier_tools.bench.saturation", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tiers", nargs="+", default=["disk"], choices=["disk", "redis"])
    parser.add_argument("--block-size", default="16KiB")
    parser.add_argument("--blocks", type=int, default=4, help="blocks per put and per get")
    parser.add_argument("--getters", type=int, default=32)
    parser.add_argument("--putters", type=int, default=16)
    parser.add_argument(
        "--split",
        dest="mixed",
        action="store_false",
        help="loaded phase: --putters tasks that only put beside the getters (default: each "
        "getter alternates a put and a get)",
    )
    parser.add_argument("--cpu-blocks", type=int, default=256)
    parser.add_argument("--lower-blocks", type=int, default=16384)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write-policy", default="write-back")
    parser.add_argument("--dir", default=None, help="parent directory of the disk tier")
    args = parser.parse_args(argv)
    for tier in args.tiers:
        runs = [asyncio.run(one_repeat(args, tier, seed)) for seed in range(args.repeats)]
        report(tier, runs)


if __name__ == "__main__":
    main()
