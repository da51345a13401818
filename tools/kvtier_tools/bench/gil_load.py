"""The disk tier beside a busy Python thread: a lone call's wall time when another thread of
the process keeps the GIL (issue 33).

    PYTHONPATH=tools python -m kvtier_tools.bench.gil_load --dir DIR \
        [--block-size 16KiB] [--call-bytes 7MiB] [--read-blocks 16] [--store-bytes 256MiB] \
        [--calls 25] [--loads none,2/0.5,full] [--switch-intervals 5ms,0.5ms]

An engine that embeds kvtier runs Python on threads of its own (a scheduler, a model
runner's input preparation). The disk tier's work runs on its own threads (`LogLane`'s
lane, write, head and sync threads; the read threads), each of which gives the GIL up for
its system calls and needs it back after them. A thread that runs Python keeps the GIL until
it blocks or until another thread has waited the interpreter's switch interval for it
(`sys.getswitchinterval()`, 5 ms by default): every time a tier thread wants the GIL back
while such a thread holds it, the call waits up to one interval.

A `LogStore` (fsync on, O_DIRECT where the filesystem takes it) of `--store-bytes`, filled
first; then, per switch interval and per load, `--calls` lone calls (20 ms apart, the first
dropped): a write of `--call-bytes` of fresh keys over the next slots (a full tier's
demotion), a read of `--read-blocks` held blocks, and a read of a call's worth of held
blocks (a load at a random place). The loads, on one more thread:

- `none`: nothing else runs.
- `full`: a loop of pure Python, never blocking (the worst case: a thread that computes).
- `B/I`: B ms of pure Python, then I ms asleep, repeated (a thread that waits on a device
  or a socket now and then; `2/0.5`: 80 % of its time in Python).

Per row it prints the median and 90th percentile of each call's wall time (ms, from the
caller's event loop: the time a caller waits). Every call must succeed (else it stops with
the first failure). The figures are the product's: nothing in it is patched.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvtier.config_fields import parse_size
from kvtier.keys import OffloadKey, key_from_int
from kvtier.tiers.disk.log_group import aligned_buffer
from kvtier.tiers.disk.log_store import LogStore

PAUSE_S = 0.02
"""Between two timed calls (the device settles; the load runs on)."""


@dataclass(frozen=True, slots=True)
class Load:
    """A thread running Python: `busy_ms` of it, then `idle_ms` asleep (0: never)."""

    name: str
    busy_ms: float
    idle_ms: float


def parse_load(text: str) -> Load | None:
    """`none`, `full` or `B/I` (ms of Python / ms asleep); ValueError naming a bad one."""
    text = text.strip()
    if text == "none":
        return None
    if text == "full":
        return Load("full", float("inf"), 0.0)
    busy, sep, idle = text.partition("/")
    try:
        load = Load(text, float(busy), float(idle))
    except ValueError:
        load = None
    if not sep or load is None or not (load.busy_ms > 0 and load.idle_ms >= 0):
        raise ValueError(f"a load is 'none', 'full' or 'B/I' (ms busy / ms asleep), got {text!r}")
    return load


class Busy:
    """The load's thread (see the module's docstring), started and stopped around a row."""

    def __init__(self, load: Load | None) -> None:
        self.load = load
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gil-load", daemon=True)

    def __enter__(self) -> Busy:
        if self.load is not None:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self.load is not None:
            self._thread.join()

    def _run(self) -> None:
        assert self.load is not None
        busy_s, idle_s = self.load.busy_ms / 1e3, self.load.idle_ms / 1e3
        total = 0
        while not self._stop.is_set():
            until = time.perf_counter() + busy_s
            while time.perf_counter() < until:
                for i in range(200):  # pure Python: the GIL held throughout
                    total += i * i
                if self._stop.is_set():
                    return
            if idle_s:
                time.sleep(idle_s)


@dataclass(slots=True)
class Row:
    """One switch interval and load: each kind of call's wall times (ms)."""

    interval_s: float
    load: str
    write_ms: list[float]
    read_small_ms: list[float]
    read_call_ms: list[float]


class Subject:
    """The full store the calls run against, and which key each slot holds."""

    def __init__(self, store: LogStore, block: int, count: int, capacity: int) -> None:
        self.store, self.block, self.count, self.capacity = store, block, count, capacity
        self.held = np.arange(capacity, dtype=np.int64)  # key number per slot
        self.next_key = capacity
        self.next_slot = 0
        pool = aligned_buffer(count * block).reshape(count, block)
        pool[:] = np.random.default_rng(0).integers(0, 256, (count, block), dtype=np.uint8)
        self.rows = [pool[i] for i in range(count)]
        out = aligned_buffer(count * block).reshape(count, block)
        self.out = [out[i] for i in range(count)]
        self.rng = np.random.default_rng(1)

    async def fill(self) -> None:
        for begin in range(0, self.capacity, self.count):
            slots = list(range(begin, min(begin + self.count, self.capacity)))
            keys = [key_from_int(int(self.held[s])) for s in slots]
            await self._write(keys, slots)

    async def write(self) -> float:
        slots = [(self.next_slot + i) % self.capacity for i in range(self.count)]
        self.next_slot = (self.next_slot + self.count) % self.capacity
        numbers = range(self.next_key, self.next_key + self.count)
        self.next_key += self.count
        keys = [key_from_int(n) for n in numbers]
        start = time.perf_counter()
        await self._write(keys, slots)
        wall = time.perf_counter() - start
        self.held[slots] = list(numbers)
        return wall * 1e3

    async def read(self, blocks: int) -> float:
        first = int(self.rng.integers(0, self.capacity - blocks + 1))
        slots = list(range(first, first + blocks))
        keys = [key_from_int(int(self.held[s])) for s in slots]
        start = time.perf_counter()
        failures = await self.store.read(keys, slots, self.out[:blocks])
        wall = time.perf_counter() - start
        if any(failure is not None for failure in failures):
            raise SystemExit(f"gil_load: a read failed: {failures[:3]}")
        return wall * 1e3

    async def _write(self, keys: list[OffloadKey], slots: list[int]) -> None:
        failures = await self.store.write(keys, slots, self.rows[: len(keys)])
        if any(failure is not None for failure in failures):
            raise SystemExit(f"gil_load: a write failed: {failures[:3]}")


async def measure(
    directory: Path,
    block: int,
    call_bytes: int,
    read_blocks: int,
    store_bytes: int,
    calls: int,
    loads: list[Load | None],
    intervals: list[float],
) -> list[Row]:
    """Every row (see the module's docstring), printed as it is measured."""
    count = max(1, call_bytes // block)
    capacity = max(2 * count, store_bytes // block)
    if not 0 < read_blocks <= count:
        raise SystemExit(f"gil_load: --read-blocks must be 1..{count} (a call's blocks)")
    store = await LogStore.open_async(
        directory / "store", block_size=block, num_blocks=capacity, fsync=True
    )
    subject = Subject(store, block, count, capacity)
    saved = sys.getswitchinterval()
    rows: list[Row] = []
    try:
        await subject.fill()
        print(
            f"gil_load: {capacity} blocks of {block >> 10} KiB, writes of {count} blocks "
            f"({count * block / 2**20:g} MiB), reads of {read_blocks} and {count}; "
            f"{calls} calls a row, medians / 90th percentiles in ms"
        )
        print(f"{'interval':>9} {'load':>8} {'write':>15} {'read small':>15} {'read call':>15}")
        for interval in intervals:
            sys.setswitchinterval(interval)
            for load in loads:
                row = Row(interval, "none" if load is None else load.name, [], [], [])
                with Busy(load):
                    for number in range(calls):
                        for kind, times in (
                            (None, row.write_ms),
                            (read_blocks, row.read_small_ms),
                            (count, row.read_call_ms),
                        ):
                            wall = await (subject.write() if kind is None else subject.read(kind))
                            if number:  # the first: a warm-up
                                times.append(wall)
                            await asyncio.sleep(PAUSE_S)
                rows.append(row)
                print(
                    f"{interval * 1e3:7.2g}ms {row.load:>8} "
                    + " ".join(f"{_summary(t):>15}" for t in _columns(row)),
                    flush=True,
                )
    finally:
        sys.setswitchinterval(saved)
        await store.aclose()
    return rows


def _columns(row: Row) -> tuple[list[float], list[float], list[float]]:
    return row.write_ms, row.read_small_ms, row.read_call_ms


def _summary(times: list[float]) -> str:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"{statistics.median(ordered):6.2f} / {p90:6.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="directory of the store (a real disk)")
    parser.add_argument("--block-size", default="16KiB")
    parser.add_argument("--call-bytes", default="7MiB", help="a write's (and a large read's)")
    parser.add_argument("--read-blocks", type=int, default=16, help="a small read's blocks")
    parser.add_argument("--store-bytes", default="256MiB", help="the store, filled first")
    parser.add_argument("--calls", type=int, default=25, help="calls a row (>= 2)")
    parser.add_argument("--loads", default="none,2/0.5,full", help="none, full or B/I (ms)")
    parser.add_argument("--switch-intervals", default="5ms,0.5ms", help="sys.setswitchinterval")
    args = parser.parse_args(argv)
    try:
        loads = [parse_load(text) for text in args.loads.split(",")]
        intervals = [_interval(text) for text in args.switch_intervals.split(",")]
    except ValueError as error:
        parser.error(str(error))
    if args.calls < 2:
        parser.error(f"--calls must be at least 2 (the first is a warm-up), got {args.calls}")
    root = Path(tempfile.mkdtemp(prefix="kvtier-gil-load-", dir=args.dir))
    try:
        asyncio.run(
            measure(
                root,
                parse_size(args.block_size),
                parse_size(args.call_bytes),
                args.read_blocks,
                parse_size(args.store_bytes),
                args.calls,
                loads,
                intervals,
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _interval(text: str) -> float:
    """`5ms`, `500us` or seconds; ValueError naming a bad one."""
    text = text.strip()
    for suffix, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(suffix):
            try:
                value = float(text[: -len(suffix)]) * scale
            except ValueError:
                break
            if value > 0:
                return value
            break
    raise ValueError(f"a switch interval is like '5ms' or '500us' (> 0), got {text!r}")


if __name__ == "__main__":
    main()
