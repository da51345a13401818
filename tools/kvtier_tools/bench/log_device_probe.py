"""What a device does with the log store's write pattern (issue 33 item 7): whether an
`fdatasync` waits for the writes in flight, whether a small write issued during a stream of
writes waits for the stream, and the stream's speed by piece size and queue depth.

    PYTHONPATH=tools python -m kvtier_tools.bench.log_device_probe --dir DIR \
        [--stream-bytes 64MiB] [--rounds 5]

One file in DIR (O_DIRECT where the filesystem takes it, preallocated and written once
before the timed rounds), a stream of `--stream-bytes` written as 4 MiB pieces by four
threads (the store's write threads' pattern, `log_files.WRITE_PIECE_BYTES`, `WRITE_THREADS`),
then per round (medians printed, ms from the stream's start):

- **sync during the stream**: an `fdatasync` issued 4 ms into the stream: when it returns
  against when the stream's last write returns, and an `fdatasync` with nothing in flight.
  A device that makes a sync wait for every write in flight drains before a log store's
  mid-call flush can index anything (`LogLane._flush_early`): overlap buys nothing there.
- **a small write during the stream** (8 KiB, what a part's header pages are) 1 ms into the
  stream, below the stream's range, inside it (where the stream has just been) and above
  it: when it returns. An elevator that serves requests in one direction (mq-deadline)
  keeps a write below the stream's position waiting until the stream is done: a part's
  header pages, written after its payloads at a lower offset, are such writes.
- **patterns**: the same bytes as one `pwritev`, 1 MiB pieces at queue depth 16 (the
  `kvtier bench` device row's) and 4 MiB pieces at queue depth 4 (the store's), each with
  its `fdatasync`; and **as the store places them** (`regions`): parts of two pieces at
  shuffled places of a file of region-sized slots (8 MiB and a header's 16 KiB each, four
  more slots than parts), each part's pieces on the four write threads and then its 8 KiB
  header at the part's start from one of two more threads (the head threads), one
  `fdatasync`. When that runs as fast as one call, the store's gap to the device is not
  the device's answer to its pattern.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvtier.config_fields import parse_size
from kvtier.tiers.disk.io import pwritev_all
from kvtier.tiers.disk.log_group import aligned_buffer

PIECE = 4 << 20
THREADS = 4
SMALL = 8 << 10
HEAD = 16 << 10  # a region slot's header room in the `regions` pattern


class Probe:
    """A file of `below + stream + above` bytes and a source buffer of the stream's bytes."""

    def __init__(self, path: Path, stream: int) -> None:
        self.stream = stream
        self.gap = 16 << 20  # bytes below and above the stream's range
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
        except OSError:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.parts = -(-stream // (2 * PIECE))
        self.slot = 2 * PIECE + HEAD
        size = max(self.gap + stream + self.gap, (self.parts + 4) * self.slot)
        os.posix_fallocate(self.fd, 0, size)
        self.source = aligned_buffer(stream)
        self.source[:] = 7
        self.small = aligned_buffer(SMALL)
        self.pool = ThreadPoolExecutor(16)
        self.writers = ThreadPoolExecutor(THREADS)
        self.heads = ThreadPoolExecutor(2)
        self.places = random.Random(0)
        everything = aligned_buffer(size)
        pwritev_all(self.fd, [everything.data], 0)  # written once: no unwritten extents
        os.fdatasync(self.fd)

    def close(self) -> None:
        self.pool.shutdown()
        self.writers.shutdown()
        self.heads.shutdown()
        os.close(self.fd)

    def start_stream(self, piece: int = PIECE, threads: int = THREADS) -> list[Future[float]]:
        """The stream's writes started (each thread its share of pieces, in order); each
        future gives when its thread's last write returned."""
        pieces = -(-self.stream // piece)

        def lane(first: int) -> float:
            for i in range(first, pieces, threads):
                start = i * piece
                view = self.source[start : min(start + piece, self.stream)].data
                pwritev_all(self.fd, [view], self.gap + start)
            return time.perf_counter()

        return [self.pool.submit(lane, k) for k in range(threads)]

    def sync_during(self) -> tuple[float, float, float]:
        """(sync returned, stream's last write returned, an idle sync's ms)."""
        began = time.perf_counter()
        writes = self.start_stream()
        time.sleep(0.004)
        os.fdatasync(self.fd)
        synced = time.perf_counter()
        ended = max(future.result() for future in writes)
        idle = time.perf_counter()
        os.fdatasync(self.fd)
        return (synced - began) * 1e3, (ended - began) * 1e3, (time.perf_counter() - idle) * 1e3

    def small_during(self, where: str) -> tuple[float, float]:
        """(the small write returned, the stream's last write returned), ms."""
        offset = {
            "below": 0,
            "inside": self.gap + 2 * PIECE,
            "above": self.gap + self.stream + SMALL,
        }[where]
        began = time.perf_counter()
        writes = self.start_stream()
        time.sleep(0.001)
        pwritev_all(self.fd, [self.small.data], offset)
        wrote = time.perf_counter()
        ended = max(future.result() for future in writes)
        os.fdatasync(self.fd)
        return (wrote - began) * 1e3, (ended - began) * 1e3

    def pattern(self, piece: int, threads: int) -> float:
        """ms to write the stream as `piece`-byte pieces from `threads` threads + sync."""
        began = time.perf_counter()
        for future in self.start_stream(piece, threads):
            future.result()
        os.fdatasync(self.fd)
        return (time.perf_counter() - began) * 1e3

    def regions(self) -> float:
        """ms to write the stream as the store places it (see the module's docstring)."""
        slots = self.places.sample(range(self.parts + 4), self.parts)
        began = time.perf_counter()
        writes: list[Future[Any]] = []
        for part, slot in enumerate(slots):
            base = slot * self.slot
            for k in range(2):
                start = (2 * part + k) * PIECE
                if start < self.stream:
                    view = self.source[start : min(start + PIECE, self.stream)].data
                    at = base + HEAD + k * PIECE
                    writes.append(self.writers.submit(pwritev_all, self.fd, [view], at))
            writes.append(self.heads.submit(pwritev_all, self.fd, [self.small.data], base))
        for future in writes:
            future.result()
        os.fdatasync(self.fd)
        return (time.perf_counter() - began) * 1e3


def _medians(rounds: list[tuple[float, ...]]) -> list[float]:
    return [statistics.median(column) for column in zip(*rounds, strict=True)]


def run(directory: Path, stream: int, rounds: int) -> dict[str, Any]:
    """The probe's medians (see the module's docstring), printed and returned."""
    probe = Probe(directory / "probe.bin", stream)
    try:
        runs: dict[str, Callable[[], tuple[float, ...]]] = {
            "sync": probe.sync_during,
            "below": lambda: probe.small_during("below"),
            "inside": lambda: probe.small_during("inside"),
            "above": lambda: probe.small_during("above"),
            "one call": lambda: (probe.pattern(stream, 1),),
            "1 MiB x 16": lambda: (probe.pattern(1 << 20, 16),),
            "4 MiB x 4": lambda: (probe.pattern(PIECE, THREADS),),
            "regions": lambda: (probe.regions(),),
        }
        for run_once in runs.values():  # a warm-up each
            run_once()
        seen: dict[str, list[tuple[float, ...]]] = {name: [] for name in runs}
        for number in range(rounds):
            names = list(runs) if number % 2 == 0 else list(reversed(runs))
            for name in names:
                seen[name].append(runs[name]())
    finally:
        probe.close()
    out = {name: _medians(values) for name, values in seen.items()}
    mib = stream >> 20
    synced, ended, idle = out["sync"]
    print(f"A stream of {mib} MiB as 4 MiB pieces from 4 threads ({rounds} rounds, medians):")
    print(
        f"  fdatasync issued at 4 ms returned at {synced:.2f} ms, the stream's last write at "
        f"{ended:.2f}; with nothing in flight: {idle:.2f} ms"
    )
    for where in ("below", "inside", "above"):
        wrote, ended = out[where]
        print(
            f"  an 8 KiB write {where} the stream, issued at 1 ms: returned at {wrote:.2f} ms "
            f"(the stream's last write at {ended:.2f})"
        )
    for name in ("one call", "1 MiB x 16", "4 MiB x 4", "regions"):
        (ms,) = out[name]
        print(f"  {name:10}: {ms:6.2f} ms with fdatasync, {stream / ms / 1e6:.2f} GB/s")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--stream-bytes", default="64MiB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    stream = parse_size(args.stream_bytes)
    if stream < PIECE or stream % PIECE:
        raise SystemExit("log_device_probe: --stream-bytes must be a multiple of 4 MiB")
    root = Path(tempfile.mkdtemp(prefix="kvtier-log-probe-", dir=args.dir))
    try:
        run(root, stream, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
