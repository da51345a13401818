"""Where the disk tier's promotions (disk -> cpu reads) spend their time, both layouts, on the
replay of the shipped trace (issue 33).

    PYTHONPATH=tools python -m kvtier_tools.bench.log_reads [--limit N] [--out DIR] [--layouts L]

Replays the shipped trace through the embedded default chain (16 KiB blocks, as `kvtier
replay`), once with the disk tier's `layout = "log"` and once with `"slots"`, and prints per
layout the `disk -> cpu` pair (GB/s over the seconds its copies were in flight, as the replay
reports it) and, per read call of the disk store (its read threads' `StoreFacade._run`),
the mean and the median of: the hop to a read thread (submitted -> running), the time in
the thread (its CPU time beside), the hop back (done -> the awaiting coroutine resumed);
with the number of `preadv` calls the store's files made (the log's reclaim reads counted
too); `--layouts` runs only those (default `log,slots`). The replay's
promotions are small scattered batches (a request's prefix blocks: ~14 blocks a call, a
third of the calls one block), so the hops weigh as much as the reads. The timing wraps the
read threads' calls for the run's length only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kvtier.config import HierarchyConfig, load_default_config
from kvtier.hierarchy import Hierarchy
from kvtier.tiers.disk.facade import StoreFacade
from kvtier.tiers.disk.io import FileIO, IOBuffer
from kvtier_tools.bench.log_layout import with_layout
from kvtier_tools.workloads.replay import (
    BlockContents,
    Replayer,
    load_replay_trace,
    prepare_disk_dirs,
    replay_config,
)
from kvtier_tools.workloads.simulation.chain import offload_key_of

BLOCK_BYTES = 16 << 10

_T = TypeVar("_T")


@dataclass
class ReadTimes:
    """Each read-thread call's times (seconds) and the preadv calls made."""

    hop_in: list[float] = field(default_factory=list)
    in_thread: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    hop_out: list[float] = field(default_factory=list)
    preadvs: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def calls(self) -> int:
        """Read-thread calls timed."""
        return len(self.hop_in)

    def line(self) -> str:
        """Per call, mean / median microseconds of each part."""

        def us(values: list[float]) -> str:
            if not values:
                return "-"
            return f"{1e6 * statistics.mean(values):.0f} / {1e6 * statistics.median(values):.0f}"

        return (
            f"{self.calls} read calls, mean / median us: hop in {us(self.hop_in)},"
            f" in thread {us(self.in_thread)} (CPU {us(self.cpu)}), hop out {us(self.hop_out)};"
            f" {self.preadvs} preadv"
        )


class CountingIO(FileIO):
    """The real system calls, counting the preadv calls."""

    def __init__(self, times: ReadTimes) -> None:
        self.times = times

    def preadv(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        with self.times.lock:
            self.times.preadvs += 1
        return super().preadv(fd, buffers, offset)


@contextlib.contextmanager
def timed_reads(times: ReadTimes) -> Iterator[None]:
    """Every disk store's read-thread calls timed into `times` while the block runs."""
    original = StoreFacade._run

    async def run(self: StoreFacade, call: Callable[[], _T]) -> _T:
        submitted = time.perf_counter()
        marks: dict[str, float] = {}

        def timed() -> _T:
            marks["start"], cpu = time.perf_counter(), time.thread_time()
            try:
                return call()
            finally:
                marks["end"], marks["cpu"] = time.perf_counter(), time.thread_time() - cpu

        result = await original(self, timed)
        resumed = time.perf_counter()
        times.hop_in.append(marks["start"] - submitted)
        times.in_thread.append(marks["end"] - marks["start"])
        times.cpu.append(marks["cpu"])
        times.hop_out.append(resumed - marks["end"])
        return result

    StoreFacade._run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        StoreFacade._run = original  # type: ignore[method-assign]


async def _replay(config: HierarchyConfig, trace: Any, times: ReadTimes) -> dict[str, float]:
    hierarchy = Hierarchy.from_config(
        config, flush_on_close=False, disk_options={"io": CountingIO(times)}
    )
    async with hierarchy as h:
        replayer = Replayer(h, BlockContents(config.block_size))
        lengths = trace.input_lengths
        with timed_reads(times):
            for number, request in enumerate(trace.requests):
                keys = [offload_key_of(key) for key in request]
                await replayer.serve(keys, None if lengths is None else lengths[number])
            await h.drain()
        stats = h.stats()
        disks = {info.name for info in stats.info if info.medium == "disk"}
        out = [moved for (source, _), moved in stats.pairs.items() if source in disks]
    nbytes, seconds = sum(m[1] for m in out), sum(m[2] for m in out)
    return {
        "gbps": nbytes / seconds / 1e9 if seconds else 0.0,
        "seconds": seconds,
        "mismatches": replayer.counters.mismatches,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="first N requests only")
    parser.add_argument("--out", type=Path, default=Path("kvtier-out/log-reads"))
    parser.add_argument(
        "--layouts", default="log,slots", help="comma list of the layouts to run, in order"
    )
    args = parser.parse_args(argv)
    given = load_default_config()
    trace = load_replay_trace(None, args.limit)
    print(f"trace: {len(trace.requests)} requests, 16 KiB blocks, embedded default chain")
    for layout in args.layouts.split(","):
        config = replay_config(with_layout(given, layout), BLOCK_BYTES, args.out / layout)
        dirs = prepare_disk_dirs(config)
        times = ReadTimes()
        row = asyncio.run(_replay(config, trace, times))
        for directory in dirs:
            shutil.rmtree(directory, ignore_errors=True)
        print(
            f"{layout:5s}  disk -> cpu {row['gbps']:.3f} GB/s ({row['seconds']:.2f} s);"
            f" {times.line()}; mismatches {row['mismatches']}"
        )


if __name__ == "__main__":
    main()
