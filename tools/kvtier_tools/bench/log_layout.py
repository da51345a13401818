"""The disk tier's two layouts side by side on the shipped trace: hit ratios and write
amplification (issue 33).

    PYTHONPATH=tools python -m kvtier_tools.bench.log_layout [--limit N] [--out DIR]

Replays the shipped trace through the embedded default chain (16 KiB blocks, as `kvtier
replay`) twice, with the disk tier's `layout = "slots"` and `layout = "log"`, every block
verified, and prints per layout: the hit ratio of each tier (hits / block accesses), the
bytes the disk tier's files were written with (every pwritev of the store: blocks, headers,
moved records; the LMDB index or checkpoint not counted), and the write amplification, that
over the bytes of the blocks the disk tier stored; and the pair into the disk tier's
throughput (its bytes over the seconds its copies took, as `kvtier replay` reports it).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtier.config import HierarchyConfig, load_default_config, parse_config
from kvtier.hierarchy import Hierarchy
from kvtier.tiers.disk.io import FileIO, IOBuffer
from kvtier_tools.workloads.replay import (
    BlockContents,
    Replayer,
    load_replay_trace,
    prepare_disk_dirs,
    replay_config,
)
from kvtier_tools.workloads.simulation.chain import offload_key_of

BLOCK_BYTES = 16 << 10


class CountingIO(FileIO):
    """The real system calls, counting the bytes every pwritev wrote."""

    def __init__(self) -> None:
        self.written = 0
        self._lock = threading.Lock()

    def pwritev(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        done = super().pwritev(fd, buffers, offset)
        with self._lock:
            self.written += done
        return done


def with_layout(given: HierarchyConfig, layout: str) -> HierarchyConfig:
    """`given` with its disk tiers' `layout` set."""
    data = given.model_dump(mode="json", exclude_unset=True)
    for tier in data["tiers"]:
        if tier.get("medium") == "disk":
            tier["layout"] = layout
    return parse_config(data)


async def _replay(config: HierarchyConfig, trace: Any, io: CountingIO) -> dict[str, Any]:
    hierarchy = Hierarchy.from_config(config, flush_on_close=False, disk_options={"io": io})
    started = time.perf_counter()
    async with hierarchy as h:
        replayer = Replayer(h, BlockContents(config.block_size))
        lengths = trace.input_lengths
        for number, request in enumerate(trace.requests):
            keys = [offload_key_of(key) for key in request]
            await replayer.serve(keys, None if lengths is None else lengths[number])
        await h.drain()
        stats = h.stats()
        disks = {info.name for info in stats.info if info.medium == "disk"}
        into = [moved for (_, target), moved in stats.pairs.items() if target in disks]
        disk_bytes = sum(moved[1] for moved in into)
        disk_seconds = sum(moved[2] for moved in into)
    counters = replayer.counters
    return {
        "accesses": counters.accesses,
        "tier_hits": dict(counters.tier_hits),
        "mismatches": counters.mismatches,
        "disk_bytes": disk_bytes,
        "disk_gbps": disk_bytes / disk_seconds / 1e9 if disk_seconds else 0.0,
        "written": io.written,
        "seconds": time.perf_counter() - started,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="first N requests only")
    parser.add_argument("--out", type=Path, default=Path("kvtier-out/log-layout"))
    args = parser.parse_args(argv)
    given = load_default_config()
    trace = load_replay_trace(None, args.limit)
    rows = {}
    for layout in ("slots", "log"):
        config = replay_config(with_layout(given, layout), BLOCK_BYTES, args.out / layout)
        dirs = prepare_disk_dirs(config)
        rows[layout] = asyncio.run(_replay(config, trace, CountingIO()))
        for directory in dirs:
            shutil.rmtree(directory, ignore_errors=True)
    print(f"trace: {len(trace.requests)} requests, 16 KiB blocks, embedded default chain")
    for layout, row in rows.items():
        ratios = ", ".join(
            f"{tier} {hits / row['accesses']:.4f}" for tier, hits in row["tier_hits"].items()
        )
        stored = row["disk_bytes"]
        amplification = row["written"] / stored if stored else float("nan")
        print(
            f"{layout:5s}  hit ratio: {ratios}; blocks into disk {stored / 2**20:.0f} MiB,"
            f" files written {row['written'] / 2**20:.0f} MiB, write amplification"
            f" {amplification:.3f}; into disk {row['disk_gbps']:.2f} GB/s;"
            f" mismatches {row['mismatches']}; {row['seconds']:.1f} s"
        )


if __name__ == "__main__":
    main()
