"""The device's idle time inside a log store's large write call (issue 33 item 7).

    sudo PYTHONPATH=tools python -m kvtier_tools.bench.log_idle --dir DIR \
        [--block-sizes 64KiB,256KiB] [--call-bytes 64MiB] [--calls 8]

The bench's one-batch `cpu -> disk (log layout)` configuration: a `LogStore` exactly one call
large (fsync on, O_DIRECT where the filesystem takes it), written `--calls` times with
fresh keys into the same slots from page-aligned rows; the first call is a warm-up. For each
timed call: its wall time, the process's CPU time (every thread), and the **device's idle
time**: wall time during which none of the process's `pwritev` or `fdatasync` system calls
was in flight. The system calls are seen by the kernel's syscall tracepoints (a tracefs
instance of its own, so root and /sys/kernel/tracing are needed), not by Python wrappers: a
write thread that has returned from `pwritev` and waits for the GIL counts as idle, as the
device sees it. The idle time is split into before the first call's system call, after the
last one (the sync's indexing, the settling, the loop's wake-up), the longest gap between
(the mid-call flush) and the rest (the hand-offs between writes).

With `--gil-probe`, a thread of the process sleeps 0.1 ms again and again during the calls
and records how late it wakes: its lateness is the wait a thread returning from a system
call has for the GIL (what a write thread sees after each `pwritev`); per call its mean and
its longest (the probe's own wake-ups, ~0.1 ms, included; it takes a little CPU and GIL
itself, so the idle figures of a probed run are not those of a plain one).

Prints per block size the medians over the timed calls (ms). Other work on the machine shows
in the figures: compare code versions by interleaving runs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from kvtier.config_fields import parse_size
from kvtier.keys import key_from_int
from kvtier.tiers.disk.io import staging_buffer
from kvtier.tiers.disk.log_store import LogStore

TRACEFS = Path("/sys/kernel/tracing")
SYSCALLS = ("pwritev", "pwritev2", "fdatasync")
"""The system calls that keep the device busy (the payloads' and headers' writes, the sync)."""

_FD = re.compile(r"fd: (0x[0-9a-f]+|\d+)")
_LINE = re.compile(r"^\s*.+?-(\d+)\s+\[\d+\]\s+\S+\s+(\d+\.\d+):\s+(\w+)(.*)$")


@dataclass(frozen=True, slots=True)
class CallIdle:
    """One timed call: wall, CPU and idle time (seconds), the idle time split up."""

    wall: float
    cpu: float
    idle: float
    before: float
    after: float
    longest_gap: float
    late_mean: float = 0.0
    late_max: float = 0.0


class GilProbe:
    """A thread sleeping 0.1 ms again and again, recording (when it slept, how late it woke)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtier-gil-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            time.sleep(1e-4)
            self.samples.append((began, time.perf_counter() - began - 1e-4))

    def lateness(self, first: float, last: float) -> tuple[float, float]:
        """(mean, longest) lateness of the sleeps begun between `first` and `last`."""
        late = [d for at, d in self.samples if first <= at <= last]
        return (statistics.fmean(late), max(late)) if late else (0.0, 0.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Trace:
    """A tracefs instance recording SYSCALLS' entries and exits and the markers written."""

    def __init__(self) -> None:
        if not (TRACEFS / "instances").is_dir() or not os.access(TRACEFS / "instances", os.W_OK):
            raise SystemExit(f"log_idle: needs root and tracefs at {TRACEFS} (mount -t tracefs)")
        self.path = TRACEFS / "instances" / f"kvtier-idle-{os.getpid()}"
        self.path.mkdir()
        (self.path / "buffer_size_kb").write_text("16384")
        for name in SYSCALLS:
            for side in ("enter", "exit"):
                (self.path / "events" / "syscalls" / f"sys_{side}_{name}" / "enable").write_text(
                    "1"
                )
        self._marker = os.open(self.path / "trace_marker", os.O_WRONLY)
        (self.path / "tracing_on").write_text("1")

    def mark(self, text: str) -> None:
        os.write(self._marker, text.encode())

    def lines(self) -> list[str]:
        return (self.path / "trace").read_text().splitlines()

    def close(self) -> None:
        os.close(self._marker)
        (self.path / "tracing_on").write_text("0")
        for name in SYSCALLS:
            for side in ("enter", "exit"):
                (self.path / "events" / "syscalls" / f"sys_{side}_{name}" / "enable").write_text(
                    "0"
                )
        self.path.rmdir()


def idle_of_calls(
    lines: list[str], tids: set[int], fds: set[int], calls: list[tuple[float, float]]
) -> list[CallIdle]:
    """Per call (`calls`: its wall and CPU time; markers `call-start N` / `call-end N`) its
    idle figures: the system calls on descriptors `fds` (the regions file's: not the
    checkpoint's) of threads `tids` in flight, merged."""
    marks: dict[str, float] = {}
    busy: list[tuple[float, float]] = []
    open_at: dict[int, float] = {}
    for line in lines:
        found = _LINE.match(line)
        if found is None:
            continue
        tid, at, event, rest = int(found[1]), float(found[2]), found[3], found[4]
        if event == "tracing_mark_write":
            marks[rest.lstrip(": ").strip()] = at
        elif tid in tids and event.startswith("sys_"):
            if rest.lstrip().startswith("->"):
                began = open_at.pop(tid, None)
                if began is not None:
                    busy.append((began, at))
            else:
                fd = _FD.search(rest)
                if fd is not None and int(fd[1], 0) in fds:
                    open_at[tid] = at
    busy.sort()
    merged: list[list[float]] = []
    for start, stop in busy:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    out = []
    for number, (wall, cpu) in enumerate(calls):
        first, last = marks[f"call-start {number}"], marks[f"call-end {number}"]
        inside = [(max(a, first), min(b, last)) for a, b in merged if b > first and a < last]
        if not inside:
            out.append(CallIdle(wall, cpu, last - first, last - first, 0.0, 0.0))
            continue
        gaps = [b[0] - a[1] for a, b in pairwise(inside)]
        before, after = inside[0][0] - first, last - inside[-1][1]
        idle = before + after + sum(gaps)
        out.append(CallIdle(wall, cpu, idle, before, after, max(gaps, default=0.0)))
    return out


async def run_calls(
    directory: Path, block: int, call_bytes: int, calls: int, trace: Trace, probe: bool = False
) -> list[CallIdle]:
    """`calls` write calls of `call_bytes` in `block` rows into a store one call large."""
    count = call_bytes // block
    pool = staging_buffer(count * block).reshape(count, block)
    pool[:] = np.random.default_rng(0).integers(0, 256, (count, block), dtype=np.uint8)
    rows = [pool[i] for i in range(count)]
    store = await LogStore.open_async(
        directory / f"idle-{block}", block_size=block, num_blocks=count, fsync=True
    )
    timed: list[tuple[float, float]] = []
    windows: list[tuple[float, float]] = []
    gil = GilProbe() if probe else None
    try:
        for number in range(calls):
            keys = [key_from_int(number * count + i) for i in range(count)]
            if number:
                trace.mark(f"call-start {number - 1}")
            wall, cpu = time.perf_counter(), time.process_time()
            failures = await store.write(keys, list(range(count)), rows)
            began, wall, cpu = wall, time.perf_counter() - wall, time.process_time() - cpu
            if number:
                trace.mark(f"call-end {number - 1}")
                timed.append((wall, cpu))
                windows.append((began, began + wall))
            if any(failure is not None for failure in failures):
                raise SystemExit(f"log_idle: a write failed: {failures}")
        tids = {int(name) for name in os.listdir("/proc/self/task")}
        fds = _descriptors_of(store.path / "regions.bin")
    finally:
        if gil is not None:
            gil.stop()
        await store.aclose()
        shutil.rmtree(directory / f"idle-{block}", ignore_errors=True)
    found = idle_of_calls(trace.lines(), tids, fds, timed)
    if gil is not None:
        found = [
            dataclasses.replace(call, late_mean=mean, late_max=longest)
            for call, (mean, longest) in zip(
                found, (gil.lateness(*window) for window in windows), strict=True
            )
        ]
    return found


def _descriptors_of(path: Path) -> set[int]:
    """This process's open descriptors of `path`."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(path):
                fds.add(int(name))
        except OSError:
            continue
    return fds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--block-sizes", default="64KiB,256KiB")
    parser.add_argument("--call-bytes", default="64MiB")
    parser.add_argument("--calls", type=int, default=8, help="the first is a warm-up")
    parser.add_argument("--gil-probe", action="store_true", help="a GIL wait probe thread")
    args = parser.parse_args(argv)
    call_bytes = parse_size(args.call_bytes)
    root = Path(tempfile.mkdtemp(prefix="kvtier-log-idle-", dir=args.dir))
    try:
        late = "  probe late mean / max" if args.gil_probe else ""
        print(
            f"block     wall   GB/s    CPU   idle  before  after  longest gap{late}  (ms, medians)"
        )
        for size in args.block_sizes.split(","):
            block = parse_size(size)
            trace = Trace()
            try:
                found = asyncio.run(
                    run_calls(root, block, call_bytes, args.calls, trace, args.gil_probe)
                )
            finally:
                trace.close()

            def med(name: str, found: list[CallIdle] = found) -> float:
                return float(statistics.median(getattr(call, name) for call in found)) * 1e3

            print(
                f"{size:>7s} {med('wall'):6.1f} {call_bytes / med('wall') / 1e6:6.2f}"
                f" {med('cpu'):6.1f} {med('idle'):6.1f} {med('before'):7.1f}"
                f" {med('after'):6.1f} {med('longest_gap'):12.1f}"
                + (f"  {med('late_mean'):10.2f} / {med('late_max'):.2f}" if args.gil_probe else "")
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
