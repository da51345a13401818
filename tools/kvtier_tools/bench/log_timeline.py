"""A log store's write call in wall time: when each thread does what, and where the device
waits (issue 33 item 7).

    PYTHONPATH=tools python -m kvtier_tools.bench.log_timeline --dir DIR \
        [--block-sizes 64KiB,256KiB] [--call-bytes 64MiB] [--calls 12] [--events] \
        [--pause-ms MS] [--in-bench]

The bench's `cpu -> disk (log layout)` configuration (`kvtier bench --pairs disk`): a
`LogStore` exactly one call large (fsync on, O_DIRECT where the filesystem takes it), one
write of fresh keys into every slot a call, from the bench's host pool in a random order; the
first call is a warm-up. The store's functions are wrapped here (monkeypatching: nothing in
the product traces) to note the wall-clock time (`time.perf_counter`) of: the caller's
`write` and its resumption, the job queued, the lane's group (start, each region opened, each
part's hand-off, a mid-group flush), each payload write piece on the write threads, each head
thread's checksums and header write, the sync thread's wait, fdatasync and index apply, and
the futures settled on the event loop. Per block size it prints the median over the calls of
each event's start and end (ms from the call), then the device's busy time (the union of the
call's writes and fdatasyncs) and its idle gaps, and the critical path after the last payload
byte; beside them the raw one-call write (one O_DIRECT `pwritev` of the call's bytes +
`fdatasync`) and the device row's pattern (1 MiB O_DIRECT writes at queue depth 16 +
`fdatasync`), timed in the same rounds.

With `--in-bench`, the calls timed are those of the bench's own row instead
(`datapath.measure_disk`, layout "log", `--calls` - 1 repeats after its warm-up calls: the
store's calls sit between the bench's raw baseline and its device pattern, and the bench's
figures are printed first).

Wrapping costs ~1-2 us an event (a few hundred events a call): the store's figures here are a
little slower than the bench's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.config_fields import parse_size
from kvtier.keys import key_from_int
from kvtier.tiers.disk import jobs, log_group, log_lane
from kvtier.tiers.disk.io import pwritev_all
from kvtier.tiers.disk.log_files import LogFiles
from kvtier.tiers.disk.log_group import Pending, aligned_buffer
from kvtier.tiers.disk.log_lane import LogLane
from kvtier.tiers.disk.log_store import LogStore

Event = tuple[str, str, float, float, int]
"""(what, thread kind, start, end, bytes); start == end for an instant."""


class Recorder:
    """The events of the call being timed (all threads append; a list's append is atomic)."""

    def __init__(self) -> None:
        self.on = False
        self.events: list[Event] = []

    def note(self, what: str, start: float, end: float | None = None, nbytes: int = 0) -> None:
        if self.on:
            name = threading.current_thread().name.rstrip("0123456789").rstrip("_")
            self.events.append((what, name, start, start if end is None else end, nbytes))


def _span(rec: Recorder, what: str, fn: Callable[..., Any], size: Callable[..., int]) -> Any:
    """`fn` wrapped: its start and end noted as `what` (with `size(*args)` bytes)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            rec.note(what, start, time.perf_counter(), size(*args, **kwargs))

    return wrapped


def _none(*_args: Any, **_kwargs: Any) -> int:
    return 0


def install(rec: Recorder) -> Callable[[], None]:
    """Wrap the write path's functions (see the module's docstring); returns the undo."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, what: str, size: Callable[..., int] = _none) -> None:
        original = getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, _span(rec, what, original, size))

    patch(LogLane, "submit", "job queued")
    patch(LogLane, "_take_group", "lane: take group")
    patch(LogLane, "_run_group", "lane: group")
    patch(log_lane, "call_columns", "lane: call columns")
    patch(LogLane, "_open_region", "lane: open region")
    patch(LogLane, "_flush", "lane: mid-group flush")
    patch(LogLane, "_flush_early", "lane: early flush start")
    patch(LogLane, "_join", "lane: join early flush")
    patch(LogLane, "_reclaim", "lane: reclaim")
    patch(LogLane, "_finish", "sync: finish")
    patch(LogLane, "_flushed", "sync: early flush")
    patch(LogLane, "_plan", "sync: plan")
    patch(LogLane, "_apply", "sync: index apply")
    patch(Pending, "wait", "wait writes")
    patch(LogFiles, "sync", "fdatasync")
    patch(
        LogFiles,
        "_write_batch",
        "payload write",
        lambda _self, ops: sum(op.nbytes for op in ops),
    )
    patch(
        LogFiles,
        "write_here",
        "head write",
        lambda _self, _r, _s, buffers, *_: sum(b.nbytes for b in buffers),
    )
    patch(log_group, "bound_checksums", "head: checksums")
    for name in ("write_front", "write_part"):  # (before / after the head writes a part)
        if hasattr(log_lane, name):
            patch(log_lane, name, f"head: {name}")
    patch(log_lane, "settle_by_loop", "sync: settle (hand to loop)")
    patch(jobs, "settle", "loop: futures settled")

    original_close = LogLane._close

    def close(self: LogLane, pending: Pending) -> None:
        start = time.perf_counter()
        before = pending.closed
        original_close(self, pending)
        if pending.closed != before:
            part = pending.parts[pending.closed - 1]
            rec.note("lane: part handed over", start, time.perf_counter(), round(part.end))

    saved.append((LogLane, "_close", original_close))
    LogLane._close = close  # type: ignore[method-assign]

    def undo() -> None:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)

    return undo


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def idle_gaps(t0: float, t1: float, events: list[Event]) -> list[str]:
    """One call's device idle gaps of 0.1 ms or more (no write or fdatasync running): when,
    how long, and the I/O that ended before and started after each."""
    io = sorted(
        (s, e, what)
        for what, _, s, e, _ in events
        if what in ("payload write", "head write", "fdatasync")
    )
    out: list[str] = []
    edge, last = t0, "the call"
    for start, end, what in io:
        if start - edge >= 1e-4:
            out.append(
                f"{(edge - t0) * 1e3:6.2f} ms: idle {(start - edge) * 1e3:5.2f} ms, "
                f"after {last}, before {what}"
            )
        if end > edge:
            edge, last = end, what
    if t1 - edge >= 1e-4:
        out.append(
            f"{(edge - t0) * 1e3:6.2f} ms: idle {(t1 - edge) * 1e3:5.2f} ms, after {last}, "
            "to the caller"
        )
    return out


def summarize(calls: list[tuple[float, float, list[Event]]]) -> dict[str, Any]:
    """Per event (its n-th occurrence in a call) the medians over the calls of its start,
    end and bytes (ms from the call); the device's busy and idle time; the tail."""
    rows: dict[tuple[str, str, int], list[tuple[float, float, int]]] = collections.defaultdict(list)
    busy, idle, tail, total, last_payload = [], [], [], [], []
    for t0, t1, events in calls:
        seen: collections.Counter[str] = collections.Counter()
        for what, thread, start, end, nbytes in sorted(events, key=lambda e: e[2]):
            seen[what] += 1
            rows[what, thread, seen[what]].append(((start - t0) * 1e3, (end - t0) * 1e3, nbytes))
        io = [(s, e) for what, _, s, e, _ in events if what in ("payload write", "head write")] + [
            (s, e) for what, _, s, e, _ in events if what == "fdatasync"
        ]
        merged = _union(io)
        on = sum(e - s for s, e in merged)
        busy.append(on * 1e3)
        idle.append(((t1 - t0) - on) * 1e3)
        payload_end = max((e for what, _, _, e, _ in events if what == "payload write"), default=t0)
        last_payload.append((payload_end - t0) * 1e3)
        tail.append((t1 - payload_end) * 1e3)
        total.append((t1 - t0) * 1e3)
    table = []
    for (what, thread, n), values in rows.items():
        if len(values) < len(calls) // 2:  # an event of some calls only
            continue
        table.append(
            (
                statistics.median(v[0] for v in values),
                statistics.median(v[1] for v in values),
                what,
                thread,
                n,
                int(statistics.median(v[2] for v in values)),
                len(values),
            )
        )
    table.sort()
    middle = sorted(calls, key=lambda call: call[1] - call[0])[len(calls) // 2]
    return {
        "gaps": idle_gaps(*middle),
        "middle": middle,
        "table": table,
        "call_ms": statistics.median(total),
        "busy_ms": statistics.median(busy),
        "idle_ms": statistics.median(idle),
        "last_payload_ms": statistics.median(last_payload),
        "tail_ms": statistics.median(tail),
    }


def raw_one_call(fd: int, source: np.ndarray[Any, Any]) -> tuple[float, float]:
    """One O_DIRECT pwritev of `source` + fdatasync: (write end, sync end) in ms."""
    t0 = time.perf_counter()
    pwritev_all(fd, [source.data], 0)
    t1 = time.perf_counter()
    os.fdatasync(fd)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


def raw_device(
    fd: int, source: np.ndarray[Any, Any], pool: ThreadPoolExecutor
) -> tuple[float, float]:
    """The device row's pattern: 1 MiB O_DIRECT writes at queue depth 16 + fdatasync."""
    chunk = 1 << 20
    t0 = time.perf_counter()
    ends: list[float] = []

    def one(i: int) -> None:
        pwritev_all(fd, [source[i * chunk : (i + 1) * chunk].data], i * chunk)
        ends.append(time.perf_counter())

    list(pool.map(one, range(source.nbytes // chunk)))
    t1 = max(ends)
    os.fdatasync(fd)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


async def measure(
    directory: Path,
    block: int,
    call_bytes: int,
    calls: int,
    events: bool = False,
    pause: float = 0.0,
    store_bytes: int = 0,
) -> dict[str, float]:
    """Print one block size's timeline (see the module's docstring); its figures (ms: the
    call's median, the raw one-call write's and the device row pattern's, with fdatasync);
    `pause` seconds between any two timed writes (the host of a virtual disk writes back
    behind them: without a pause, what one writes slows the next). `store_bytes`: a store
    of that many bytes (default: one call), filled whole before the timed calls, each call
    writing over the next `call_bytes` of its slots in turn (the replay's disk tier: lone
    calls of a few MB into a full store, its oldest blocks evicted)."""
    count = call_bytes // block
    capacity = max(count, store_bytes // block)
    pool = aligned_buffer(count * block).reshape(count, block)
    pool[:] = np.random.default_rng(0).integers(0, 256, (count, block), dtype=np.uint8)
    order = np.random.default_rng(1).permutation(count)
    rows = [pool[i] for i in order]
    source = aligned_buffer(count * block)
    source[:] = pool.reshape(-1)
    path = directory / f"timeline-{block}"
    store = await LogStore.open_async(path, block_size=block, num_blocks=capacity, fsync=True)
    for begin in range(0, capacity - count, count):  # filled (untimed): a full tier
        fill = [key_from_int((1 << 63) + begin + i) for i in range(count)]
        await store.write(fill, list(range(begin, begin + count)), rows)
    raw = directory / f"raw-{block}.bin"
    try:
        fd = os.open(raw, os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
    except OSError:
        fd = os.open(raw, os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, count * block)
    rec = Recorder()
    undo = install(rec)
    threads = ThreadPoolExecutor(16)
    timed: list[tuple[float, float, list[Event]]] = []
    raws: list[tuple[float, float]] = []
    devices: list[tuple[float, float]] = []
    try:
        for number in range(calls):
            keys = [key_from_int(number * count + i) for i in range(count)]
            begin = (capacity - count + number * count) % capacity
            slots = [(begin + i) % capacity for i in range(count)]
            rec.events = []
            rec.on = True
            t0 = time.perf_counter()
            failures = await store.write(keys, slots, rows)
            t1 = time.perf_counter()
            rec.on = False
            if any(failure is not None for failure in failures):
                raise SystemExit(f"log_timeline: a write failed: {failures[:3]}")
            await asyncio.sleep(pause)
            raws.append(raw_one_call(fd, source))
            await asyncio.sleep(pause)
            devices.append(raw_device(fd, source, threads))
            await asyncio.sleep(pause)
            if number:
                timed.append((t0, t1, rec.events))
        region_bytes, num_regions = store.region_bytes, store.num_regions
    finally:
        undo()
        threads.shutdown()
        os.close(fd)
        raw.unlink(missing_ok=True)
        await store.aclose()
        shutil.rmtree(path, ignore_errors=True)
    regions = f", {num_regions} regions of {region_bytes / (1 << 20):g} MiB"
    held = f", a store of {capacity} blocks" if capacity > count else ""
    mib = f"{call_bytes / (1 << 20):g} MiB"
    print(f"\n{block >> 10} KiB blocks, {count} a call of {mib}{regions}{held}:")
    out = report(timed, events)
    raw_w, raw_s = (statistics.median(v) for v in zip(*raws, strict=True))
    dev_w, dev_s = (statistics.median(v) for v in zip(*devices, strict=True))
    print(
        f"  raw one call: written {raw_w:.2f} ms, synced {raw_s:.2f} "
        f"({call_bytes / raw_s / 1e6:.2f} GB/s); device row's pattern (1 MiB at qd16): "
        f"written {dev_w:.2f}, synced {dev_s:.2f} ({call_bytes / dev_s / 1e6:.2f} GB/s); "
        f"the store {call_bytes / out['call_ms'] / 1e6:.2f} GB/s"
    )
    first = next((row[0] for row in out["table"] if row[2:5] == ("payload write", row[3], 1)), 0.0)
    return {
        "call": out["call_ms"],
        "idle": out["idle_ms"],
        "tail": out["tail_ms"],
        "first_write": first,
        "raw": raw_s,
        "device": dev_s,
    }


async def measure_in_bench(
    directory: Path, block: int, call_bytes: int, calls: int, events: bool = False
) -> dict[str, Any]:
    """The timeline of the bench's own `cpu -> disk (log layout)` row (`datapath.measure_disk`
    with `layout="log"`, `calls - 1` repeats: its warm-up calls, then the timed ones, each
    beside its raw one-call write and the device pattern), printed with the bench's figures;
    the summary."""
    from kvtier_tools.bench import datapath

    rec = Recorder()
    undo = install(rec)
    seen: list[tuple[float, float, list[Event]]] = []
    original = LogStore.write

    async def write(store: LogStore, keys: Any, slots: Any, buffers: Any) -> Any:
        rec.events = []
        rec.on = True
        began = time.perf_counter()
        try:
            return await original(store, keys, slots, buffers)
        finally:
            rec.on = False
            seen.append((began, time.perf_counter(), rec.events))

    LogStore.write = write  # type: ignore[method-assign, assignment]
    try:
        rows, _ = await datapath.measure_disk(
            block, call_bytes, calls - 1, directory, np.random.default_rng(0), layout="log"
        )
    finally:
        LogStore.write = original  # type: ignore[method-assign]
        undo()
    row = next(row for row in rows if row.pair == "cpu -> disk")
    print(f"\n{block >> 10} KiB blocks, the bench's `cpu -> disk (log layout)` row:")
    store_ms = ", ".join(f"{seconds * 1e3:.1f}" for seconds in row.kvtier_s)
    raw_ms = ", ".join(f"{seconds * 1e3:.1f}" for seconds in row.baseline_s)
    print(f"  its store calls {store_ms} ms; its raw one-call writes {raw_ms} ms")
    first = row.warmup_calls  # the store's calls before the timed ones
    return report(seen[first : first + calls - 1], events)


def report(timed: list[tuple[float, float, list[Event]]], events: bool) -> dict[str, Any]:
    """Print the timeline of `timed` calls (`summarize`; with `events`, the median call's
    events); the summary."""
    out = summarize(timed)
    print(f"  {'ms from the call: start':>24} {'end':>7}  {'MiB':>6}  event (n-th), thread")
    for start, end, what, thread, n, nbytes, seen in out["table"]:
        mib = f"{nbytes / (1 << 20):6.2f}" if nbytes else " " * 6
        span = f"{end:7.2f}" if end > start else " " * 7
        rare = "" if seen == len(timed) else f" [{seen} of {len(timed)} calls]"
        print(f"  {start:24.2f} {span}  {mib}  {what} ({n}), {thread}{rare}")
    print(
        f"  call {out['call_ms']:.2f} ms: device busy (writes, fdatasync) {out['busy_ms']:.2f}, "
        f"idle {out['idle_ms']:.2f}; last payload byte written at {out['last_payload_ms']:.2f}, "
        f"then {out['tail_ms']:.2f} to the caller"
    )
    print("  the median call's device idle gaps:")
    for line in out["gaps"]:
        print(f"    {line}")
    if events:
        t0, _, middle = out["middle"]
        print("  the median call's events (ms from the call: start-end, what, thread, MiB):")
        for what, thread, start, end, nbytes in sorted(middle, key=lambda e: e[2]):
            mib = f" {nbytes / (1 << 20):.2f}" if nbytes else ""
            print(f"    {(start - t0) * 1e3:6.2f}-{(end - t0) * 1e3:6.2f} {what}, {thread}{mib}")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--block-sizes", default="64KiB,256KiB")
    parser.add_argument("--call-bytes", default="64MiB")
    parser.add_argument("--calls", type=int, default=12, help="the first is a warm-up")
    parser.add_argument("--events", action="store_true", help="print the median call's events")
    parser.add_argument("--pause-ms", type=float, default=0.0, help="between timed writes")
    parser.add_argument(
        "--store-bytes", default=None, help="the store's size (default: one call), filled first"
    )
    parser.add_argument(
        "--in-bench", action="store_true", help="the bench's own row (its calls and baseline)"
    )
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kvtier-log-timeline-", dir=args.dir))
    try:
        for size in args.block_sizes.split(","):
            if args.in_bench:
                call_bytes = parse_size(args.call_bytes)
                asyncio.run(
                    measure_in_bench(root, parse_size(size), call_bytes, args.calls, args.events)
                )
                continue
            asyncio.run(
                measure(
                    root,
                    parse_size(size),
                    parse_size(args.call_bytes),
                    args.calls,
                    args.events,
                    args.pause_ms / 1e3,
                    parse_size(args.store_bytes) if args.store_bytes else 0,
                )
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
