"""The raw device row of `kvtier bench`: what the disk under the disk tier does by itself.

A disk row of the data-path benchmark compares kvtier with a baseline of the same bytes in the
same pattern; this row measures the device on its own, the way a device is rated, so that the
disk rows can say which share of the device they reach (issue 33: cpu -> disk >= 70 % of the
device's write, disk -> cpu >= 70 % of its read), all in one run and in the same directory:

``write``: sequential O_DIRECT `os.pwrite`s of `DEVICE_WRITE_CHUNK` (1 MiB) parts of a
preallocated file, front to back, `DEVICE_QUEUE_DEPTH` (16) of them in flight (threads taking
the next part in order), then one `os.fdatasync`: the device's durable sequential write
bandwidth (fio's `rw=write bs=1M iodepth=16 end_fsync=1`).

``read``: random O_DIRECT `os.preadv`s of one block each from that file, every block once in
a random order, `DEVICE_QUEUE_DEPTH` in flight (fio's `rw=randread bs=<block> iodepth=16`).

Where the filesystem refuses O_DIRECT (tmpfs; or a block size that is not a whole number of
4 KiB pages for the reads) the row runs buffered: writes still end in fdatasync, reads come
from the page cache; `DeviceRow.direct_write` / `direct_read` say so.

The row runs once per block size, before the disk rows; the device's rate drifts with load
(on a VM, with what the host's cache holds), so the one-batch disk write rows also time
this row's write pattern beside each of their store calls (`SequentialWriter`, on the same
bytes, in the same directory, O_DIRECT + one fdatasync as here; see
`kvtier_tools.bench.datapath`), and their `of device` pairs each call with the device's write
of the same repeat. Both sides write only extents already written once: the device's warm-up
writes its whole preallocated file, the store's warm-up runs until a call writes under 1 % of
its bytes to space of the store's files never written before (`never_written_bytes`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import gc
import itertools
import mmap
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvtier.tiers.disk.io import PLAIN_IO, preadv_all, pwritev_all

GB = 1e9
PAGE = 4096
DEVICE_WRITE_CHUNK = 1 << 20
"""Bytes per sequential write (what a log-structured store writes at once)."""
DEVICE_QUEUE_DEPTH = 16
"""Writes or reads in flight at once (threads): enough to saturate an SSD or a virtual disk."""

_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """The device's sequential write and random read bandwidth for one block size.

    `nbytes` is what one timed write moves (the file's size; the reads read every block of it
    once); `write_s` / `read_s` are every repeat's seconds (warm-up excluded); `write_chunk`
    is the bytes per write call; `direct_write` / `direct_read` whether O_DIRECT was on (else
    buffered: the filesystem refused it).
    """

    block_size: int
    nbytes: int
    write_chunk: int
    queue_depth: int
    write_s: tuple[float, ...]
    read_s: tuple[float, ...]
    direct_write: bool
    direct_read: bool

    @property
    def write_gbps(self) -> float:
        """Sequential write bandwidth (with the closing fdatasync) from the median time."""
        return _gbps(self.nbytes, statistics.median(self.write_s))

    @property
    def read_gbps(self) -> float:
        """Random read bandwidth at the block size from the median time."""
        return _gbps(self.nbytes, statistics.median(self.read_s))

    @property
    def method(self) -> str:
        """One line saying what was measured and how."""
        write = "O_DIRECT" if self.direct_write else "buffered (O_DIRECT refused)"
        read = "O_DIRECT" if self.direct_read else "buffered (O_DIRECT refused)"
        return (
            f"sequential os.pwrite, {write}, of {self.write_chunk >> 10} KiB parts + one "
            f"os.fdatasync; random os.preadv, {read}, of one block each; queue depth "
            f"{self.queue_depth}, a preallocated file in the same directory"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["write_s"] = list(self.write_s)
        data["read_s"] = list(self.read_s)
        data["write_gbps"] = self.write_gbps
        data["read_gbps"] = self.read_gbps
        data["method"] = self.method
        return data


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB if seconds > 0 else float("inf")


def device_bytes(nbytes: int, block_size: int) -> int:
    """The file's size for `nbytes` at `block_size`: a whole number of blocks and of pages,
    at least one block."""
    unit = block_size * PAGE // _gcd(block_size, PAGE)
    return max(unit, nbytes // unit * unit)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


@contextlib.contextmanager
def page_aligned(nbytes: int) -> Iterator[npt.NDArray[np.uint8]]:
    """`nbytes` of anonymous, page-aligned memory (what O_DIRECT needs), every page touched."""
    mapping = mmap.mmap(-1, nbytes)
    array = np.frombuffer(mapping, dtype=np.uint8)
    try:
        array.fill(0)
        yield array
    finally:
        del array
        with contextlib.suppress(BufferError):  # a view still alive: the GC unmaps it later
            mapping.close()


def _open(path: Path, flags: int, direct: bool) -> tuple[bool, int]:
    """(whether O_DIRECT is on, fd): O_DIRECT when asked for and the filesystem takes it."""
    if direct and _O_DIRECT:
        try:
            return True, os.open(path, flags | _O_DIRECT | _O_CLOEXEC, 0o600)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
    return False, os.open(path, flags | _O_CLOEXEC, 0o600)


def _in_flight(
    executor: ThreadPoolExecutor, count: int, depth: int, work: Callable[[int, int], None]
) -> None:
    """`work(lane, i)` for i in 0..count-1, taken in order by `depth` lanes (threads), each
    taking the next i once it is done with its last."""
    counter = itertools.count()
    lock = threading.Lock()

    def lane(number: int) -> None:
        while True:
            with lock:
                i = next(counter)
            if i >= count:
                return
            work(number, i)

    futures = [executor.submit(lane, number) for number in range(min(depth, count))]
    concurrent.futures.wait(futures)
    for future in futures:
        future.result()


class SequentialWriter:
    """The device row's write pattern over `source`, into a preallocated file at `path`:
    `DEVICE_WRITE_CHUNK` parts front to back, `queue_depth` in flight (threads taking the next
    part in order), then one `os.fdatasync`. O_DIRECT where the filesystem takes it
    (`direct`). Use as a context manager: the file is opened and preallocated on entry, closed
    on exit (not removed: the caller reads or unlinks it)."""

    def __init__(
        self, path: Path, source: npt.NDArray[np.uint8], queue_depth: int = DEVICE_QUEUE_DEPTH
    ) -> None:
        self.path = path
        self.source = source
        self.total = len(source)
        self.chunk = min(DEVICE_WRITE_CHUNK, self.total)
        self.queue_depth = queue_depth
        self.direct = False
        self.executor = ThreadPoolExecutor(queue_depth, thread_name_prefix="kvtier-bench-device")
        self._fd = -1

    def __enter__(self) -> SequentialWriter:
        try:
            self.direct, self._fd = _open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, True)
            PLAIN_IO.allocate(self._fd, self.total)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.executor.shutdown(wait=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _write_part(self, _lane: int, i: int) -> None:
        start = i * self.chunk
        part = self.source[start : min(start + self.chunk, self.total)]
        pwritev_all(self._fd, [part.data], start)

    def write(self) -> float:
        """Seconds to write the whole file once, fdatasync included."""
        begin = time.perf_counter()
        _in_flight(self.executor, -(-self.total // self.chunk), self.queue_depth, self._write_part)
        PLAIN_IO.fsync(self._fd)
        return time.perf_counter() - begin


def never_written_bytes(directory: Path) -> int:
    """Bytes of the regular files under `directory` that were never written: holes and
    preallocated (unwritten) extents, as `SEEK_HOLE` / `SEEK_DATA` report them (0 where the
    filesystem or platform cannot say). A first write there converts an extent, which a
    rewrite does not; the bench warms a store up until its calls no longer lower this."""
    seek_hole: int | None = getattr(os, "SEEK_HOLE", None)
    seek_data: int | None = getattr(os, "SEEK_DATA", None)
    if seek_hole is None or seek_data is None:
        return 0
    total = 0
    for path in sorted(directory.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            offset = 0
            while offset < size:
                try:
                    hole = os.lseek(fd, offset, seek_hole)
                except OSError:  # not supported here: count the file as written
                    break
                if hole >= size:
                    break
                try:
                    data = os.lseek(fd, hole, seek_data)
                except OSError as error:  # ENXIO: no data after the hole
                    if error.errno != errno.ENXIO:
                        raise
                    data = size
                total += data - hole
                offset = data
        finally:
            os.close(fd)
    return total


def measure_device(
    block_size: int,
    nbytes: int,
    repeats: int,
    directory: Path,
    rng: np.random.Generator,
    queue_depth: int = DEVICE_QUEUE_DEPTH,
) -> DeviceRow:
    """The device row for `block_size`: a file of about `nbytes` in `directory` written
    sequentially (+ fdatasync), then read at random one block at a time, each `repeats`
    times after one warm-up; the file is removed afterwards."""
    total = device_bytes(nbytes, block_size)
    count = total // block_size
    path = directory / f"device-{block_size}.bin"
    try:
        with page_aligned(total) as source, page_aligned(block_size * queue_depth) as sink:
            source[:] = rng.integers(0, 256, size=total, dtype=np.uint8)
            landings = list(sink.reshape(queue_depth, block_size))  # one per lane
            with SequentialWriter(path, source, queue_depth) as writer:
                write_s = _timed(writer.write, repeats)
                direct_read, read_fd = _open(path, os.O_RDONLY, block_size % PAGE == 0)
                try:
                    order = rng.permutation(count)

                    def read_block(lane: int, i: int) -> None:
                        preadv_all(read_fd, [landings[lane].data], int(order[i]) * block_size)

                    def read() -> float:
                        begin = time.perf_counter()
                        _in_flight(writer.executor, count, queue_depth, read_block)
                        return time.perf_counter() - begin

                    read_s = _timed(read, repeats)
                finally:
                    os.close(read_fd)
    finally:
        path.unlink(missing_ok=True)
    return DeviceRow(
        block_size,
        total,
        writer.chunk,
        queue_depth,
        write_s,
        read_s,
        writer.direct,
        direct_read,
    )


def _timed(run: Callable[[], float], repeats: int) -> tuple[float, ...]:
    """Seconds of `repeats` runs after one discarded warm-up run."""
    run()
    seconds: list[float] = []
    for _ in range(repeats):
        gc.collect()
        seconds.append(run())
    return tuple(seconds)
