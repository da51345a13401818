"""The files of a log store: its lock, its regions file (one descriptor, plus an O_DIRECT one
where the filesystem takes it) and the geometry of its regions.

Every byte of a region is moved through here: `write_parts` (a group's header pages and
payloads, straight from the caller's memory, on the write threads), `read_run` (payloads
back to back straight into the caller's buffers), `read_into` (any range: with O_DIRECT
through an aligned staging buffer) and `sync`.

Failing closed (as the per-block store, guard.py): `check_ground`, run by the write lane after
a group's sync and before it indexes anything, finds the lock file or the regions file removed
or replaced under the open store; the files then disable themselves for good (`lost`): one
ERROR line, every later use of a descriptor fails with ESTALE, and once the uses in flight
have ended the descriptors are closed (the lock released, the space of removed files given
back now). Each use of a descriptor is counted while it runs (a lock and a counter: well
under a microsecond), so none is ever closed under a read or a write (nor its number reused
by another file meanwhile).
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from bisect import bisect_left
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.errors import DirectIOError, DiskLockedError, DiskTierError
from kvtier.tiers.disk.io import (
    IOV_MAX,
    FileIO,
    preadv_fill,
    pwritev_all,
    staging_buffer,
)
from kvtier.tiers.disk.log_format import LOCK_FILE, PAGE, REGIONS_FILE
from kvtier.tiers.disk.ops import WriteOp, run_batch

WRITE_PIECE_BYTES = 4 << 20
"""The least a write thread's piece of a part's payloads holds when the part has that much:
a part is cut in `min(WRITE_THREADS, bytes // WRITE_PIECE_BYTES)` pieces (at least one), each
written with one `pwritev` (several only past IOV_MAX buffers). One large O_DIRECT write keeps
many requests in flight by itself (the kernel submits all of its bios, then waits), so the
pieces need not be small: 1 MiB pieces cost 3-4 ms of write-thread CPU a 64 MiB call at
64 KiB blocks against ~2 for 4 MiB ones (docs/BENCHMARKS.md, "Log writes on a fast device")."""

WRITE_THREADS = 4
"""Threads writing a group's payloads (`write_parts`): the writes a device has in flight."""

SPAN_GAP = 128 << 10
"""Records less than this apart are read as one span by `read_records` (reading the gap
costs less than another read)."""

SPAN_BYTES = 1 << 20
"""The largest span `read_records` reads at once (larger runs are read several at once)."""

MIN_REGION_BYTES = 64 << 10
"""The smallest region (a small store's regions shrink to this so it still has several)."""

_log = logging.getLogger("kvtier.disk")


@dataclass(frozen=True, slots=True)
class Geometry:
    """How a store's space is cut: `num_regions` regions of `region_bytes`."""

    region_bytes: int
    num_regions: int

    @property
    def file_bytes(self) -> int:
        """The size of the regions file."""
        return self.region_bytes * self.num_regions


def geometry(
    num_blocks: int, record_max: int, region_bytes: int, spare: float, *, exact: bool = False
) -> Geometry:
    """Regions enough for `num_blocks` records of at most `record_max` bytes each (each
    counted as whole pages: a group of one block is padded to a page), plus `spare` of that
    for the space reclaiming needs, plus two (the open region and the reserve). Regions of
    `region_size` (with `exact`, of `region_bytes` as given: the size a store's regions were
    written with)."""
    live = num_blocks * _footprint(record_max)
    region = region_bytes if exact else region_size(num_blocks, record_max, region_bytes)
    usable = region - PAGE
    regions = -(-int(live * (1 + spare)) // usable) + 2
    return Geometry(region, regions)


def region_size(num_blocks: int, record_max: int, region_bytes: int) -> int:
    """The size of a store's regions: `region_bytes`, or smaller ones (at least
    MIN_REGION_BYTES) for a store too small for eight of them, never one too small for four
    records of `record_max` bytes (`smallest_region`)."""
    live = num_blocks * _footprint(record_max)
    region = min(region_bytes, max(MIN_REGION_BYTES, -(-live // (8 * PAGE)) * PAGE))
    return max(region, smallest_region(record_max))


def smallest_region(record_max: int) -> int:
    """The smallest region a store of records of at most `record_max` bytes has."""
    return -(-(4 * _footprint(record_max) + PAGE) // PAGE) * PAGE


def _footprint(record_max: int) -> int:
    return -(-record_max // PAGE) * PAGE


def _open(path: Path, readonly: bool, opener: Any) -> int:
    """`path` opened read-write, created if missing; only to read when `readonly` (created
    read-write if missing)."""
    if readonly:
        try:
            return int(opener(str(path), os.O_RDONLY | os.O_CLOEXEC, 0o600))
        except FileNotFoundError:
            pass
    return int(opener(str(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))


class LogFiles:
    """The open files of one log store (the caller holds nothing else)."""

    def __init__(
        self, root: Path, geo: Geometry, io: FileIO, direct_io: bool | str, readonly: bool = False
    ) -> None:
        self.root = root
        self._grounds = (root / REGIONS_FILE, root / LOCK_FILE)
        """The paths `check_ground` stats after every sync (made once: not two joins a sync)."""
        self.readonly = readonly
        """Opened only to read (a store opened to inspect: a read-only filesystem can be
        checked); a file that is missing is still created, as before."""
        self.geo = geo
        self.io = io
        self._writers = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="kvtier-log-write-io")
        self._readers = ThreadPoolExecutor(4, thread_name_prefix="kvtier-log-reclaim-io")
        """Threads of `read_records` (reclaiming), apart from the write threads: a reclaim
        read never waits behind the payloads the group has in flight."""
        self._uses_lock = threading.Lock()
        self._uses = 0
        """Uses of the descriptors in flight (under `_uses_lock`)."""
        self._done_lock = threading.Lock()
        self.writes_done = 0
        """Writes (a write thread's batch, a head thread's header pages) returned so far, each
        numbered in the order it returned (`_done`; under `_done_lock`)."""
        self.synced_through = 0
        """`writes_done` when the last successful fdatasync began: every write numbered up to
        it had returned before that sync, which made it durable (`sync`)."""
        self._lost: str | None = None
        try:
            self._lock_fd = _open(root / LOCK_FILE, readonly, os.open)
        except OSError as error:
            raise DiskTierError(f"cannot open {root / LOCK_FILE}: {error.strerror}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DiskLockedError(f"the log store at {root} is open in another process") from None
        path = str(root / REGIONS_FILE)
        try:
            self.fd = _open(Path(path), readonly, io.open)
        except OSError as error:
            os.close(self._lock_fd)
            raise DiskTierError(f"cannot open {path}: {error.strerror}") from None
        self.found_bytes = io.size(self.fd)
        """The regions file's size when opened (shorter than the geometry: truncated)."""
        self.identity = file_identity(self.fd)
        """The regions file's identity on its filesystem (what a store's id is made for)."""
        self.direct_fd: int | None = None
        if direct_io is not False and not readonly:
            try:
                self.direct_fd = io.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_DIRECT, 0o600)
            except (OSError, AttributeError) as error:
                if direct_io is True:
                    self.close()
                    raise DirectIOError(f"O_DIRECT unavailable for {path}: {error}") from None

    def cut(self, geo: Geometry) -> None:
        """Cut the regions by `geo` instead (the geometry the store was written with): at
        open, before any region is read or written."""
        self.geo = geo

    def allocate(self) -> None:
        """Size the regions file to the geometry (preallocated where the filesystem can)."""
        if self.found_bytes < self.geo.file_bytes:
            self.io.allocate(self.fd, self.geo.file_bytes)

    def base(self, region: int) -> int:
        """The file offset of `region`."""
        return region * self.geo.region_bytes

    def write_parts(
        self,
        region: int,
        start: int,
        buffers: list[Any],
        direct: bool,
        sizes: list[int] | None = None,
        piece_bytes: int = WRITE_PIECE_BYTES,
    ) -> list[Future[int]]:
        """Start writing `buffers` back to back at `start` of `region` (whole pages in all);
        the writes run on the WRITE_THREADS write threads, so a device keeps several in
        flight and the caller goes on (the next part is placed meanwhile). They are cut in
        `pieces` of about equal bytes (whole pages; at least WRITE_PIECE_BYTES each when
        there is that much), one per thread, each written with one `pwritev` in one call
        without the GIL with the compiled core (`ops.run_batch`; see "Write threads and the
        GIL" and "Log writes on a fast device" in docs/BENCHMARKS.md). With O_DIRECT when
        the caller says every buffer is page-aligned memory of whole pages (`direct`, see
        `whole_pages`), else buffered (the kernel's one copy). `buffers` are contiguous
        buffers of any kind (`sizes`: their bytes, when the caller knows them: a part's
        payloads are the caller's arrays, not wrapped in a view each; `piece_bytes`: the least
        a piece holds, less for a group's first part). The caller waits on
        every future returned (each raises its piece's OSError, else gives the write's
        number, `writes_done`) before it syncs."""
        fd = self.direct_fd if direct and self.direct_fd is not None else self.fd
        at = self.base(region) + start
        ops: list[WriteOp] = []
        for piece, nbytes in pieces_sized(buffers, WRITE_THREADS, sizes, piece_bytes):
            ops.append(WriteOp(fd, piece, at, nbytes))
            at += nbytes
        return [self._writers.submit(self._write_batch, batch) for batch in spread(ops)]

    def write_here(self, region: int, start: int, buffers: list[memoryview], direct: bool) -> int:
        """Write `buffers` back to back at `start` of `region` on the calling thread (as
        `write_parts` would, part by part): for a part's header pages, written by the head
        thread that packed them, so that they never wait in the write threads' queue
        behind the payloads (a 3.7 MB group's header write went last, 2 ms after them).
        Returns the write's number (`writes_done`)."""
        fd = self.direct_fd if direct and self.direct_fd is not None else self.fd
        at = self.base(region) + start
        for piece in pieces(buffers, 1):
            nbytes = sum(view.nbytes for view in piece)
            at += self._write(fd, piece, at, nbytes)
        return self._done()

    def _done(self) -> int:
        """Number a write that has returned (`writes_done`)."""
        with self._done_lock:
            self.writes_done += 1
            return self.writes_done

    def _write(self, fd: int, buffers: list[memoryview], at: int, nbytes: int) -> int:
        self._enter()
        try:
            return pwritev_all(fd, buffers, at, io=self.io, nbytes=nbytes)
        finally:
            self._leave()

    def _write_batch(self, parts: list[WriteOp]) -> int:
        """On a write thread: write `parts` in order, each to its end (`ops.run_batch`); the
        batch's number (`writes_done`), or the first part's OSError once every part was
        tried."""
        self._enter()
        try:
            run_batch(self.io, parts)
        finally:
            self._leave()
        for op in parts:
            if op.error is not None:
                raise op.error
        return self._done()

    def _enter(self) -> None:
        """Count a use of the descriptors as in flight; OSError(ESTALE) once lost."""
        with self._uses_lock:
            if self._lost is not None:
                why = f"the disk tier at {self.root} is disabled: {self._lost}"
                raise OSError(errno.ESTALE, why)
            self._uses += 1

    def _leave(self) -> None:
        """A use counted by `_enter` has ended."""
        with self._uses_lock:
            self._uses -= 1

    def read_run(self, region: int, start: int, buffers: list[memoryview], direct: bool) -> int:
        """Fill `buffers`, back to back, from `start` of `region` with one preadv (and more
        only after a short read); the bytes read. With O_DIRECT straight into them when the
        caller says every buffer is page-aligned whole pages (`direct`) and `start` is a page
        boundary; else, with an O_DIRECT descriptor, through an aligned staging buffer and
        one copy (every access to the regions stays O_DIRECT: no page cache to go stale
        under a direct write); buffered without one."""
        self._enter()
        try:
            return self._read_run(region, start, buffers, direct)
        finally:
            self._leave()

    def _read_run(self, region: int, start: int, buffers: list[memoryview], direct: bool) -> int:
        at = self.base(region) + start
        if self.direct_fd is None:
            return preadv_fill(self.fd, buffers, at, io=self.io)
        if direct and at % PAGE == 0:
            return preadv_fill(self.direct_fd, buffers, at, io=self.io)
        total = sum(view.nbytes for view in buffers)
        first = at - at % PAGE
        staging = staging_buffer(-(-(at + total - first) // PAGE) * PAGE)
        got = max(0, preadv_fill(self.direct_fd, [staging.data], first, io=self.io) - (at - first))
        got = min(got, total)
        pos = at - first
        for view in buffers:
            take = min(view.nbytes, got - (pos - (at - first)))
            if take <= 0:
                break
            view[:take] = staging.data[pos : pos + take]
            pos += take
        return got

    def read_records(
        self, region: int, first: int, view: memoryview, records: list[tuple[int, int]]
    ) -> list[int]:
        """Read the records (offset, length; sorted by offset, not overlapping) of `region`
        into `view`, which stands for its bytes from `first` (a page boundary) on: only the
        spans holding them (`record_spans`), several at once on the reclaim threads; per
        record where the bytes read around it end (short of it at the end of a truncated
        file). Raises the first read's OSError, once every read is done. (Reading the whole
        span from the first record to the last took ~11 ms a reclaim in the replay, for
        ~0.7 MB of live records: docs/BENCHMARKS.md.)"""
        spans = record_spans(records)
        reads = [
            self._readers.submit(
                self.read_run, region, start, [view[start - first : stop - first]], True
            )
            for start, stop in spans
        ]
        ends: list[int] = []
        failed: OSError | None = None
        for (start, _), read in zip(spans, reads, strict=True):
            try:  # (every read waited for: none is left writing into `view`)
                ends.append(start + read.result())
            except OSError as error:
                failed = failed or error
        if failed is not None:
            raise failed
        reached: list[int] = []
        span = 0
        for offset, _ in records:
            while spans[span][1] <= offset:
                span += 1
            reached.append(ends[span])
        return reached

    def read_into(self, region: int, start: int, out: Any) -> int:
        """Fill `out` (a writable buffer) from `start` of `region`; the bytes read (fewer at
        the end of the file)."""
        self._enter()
        try:
            return self._read_into(region, start, out)
        finally:
            self._leave()

    def _read_into(self, region: int, start: int, out: Any) -> int:
        view = memoryview(out).cast("B")
        at = self.base(region) + start
        if self.direct_fd is None:
            return preadv_fill(self.fd, [view], at, io=self.io)
        first = at - at % PAGE
        span = -(-(at + view.nbytes - first) // PAGE) * PAGE
        staging = staging_buffer(span)
        got = preadv_fill(self.direct_fd, [staging.data], first, io=self.io)
        usable = max(0, min(view.nbytes, got - (at - first)))
        view[:usable] = staging[at - first : at - first + usable].data
        return usable

    def sync(self) -> None:
        """fdatasync the regions file: every write returned before it began is durable once
        it returns (`synced_through`)."""
        self._enter()
        try:
            with self._done_lock:
                through = self.writes_done
            self.io.fsync(self.fd)
            self.synced_through = max(self.synced_through, through)
        finally:
            self._leave()

    @property
    def lost(self) -> str | None:
        """Why the files were lost (removed or replaced while open), or None."""
        return self._lost

    def check_ground(self) -> str | None:
        """Why the store's files are no longer its own, or None: the regions file, then the
        lock file, each removed (its path gone, or the file held unlinked) or replaced (its
        path now another file); a file that cannot be examined counts as lost too. On the
        first problem found the files disable themselves (see the module; `lose`)."""
        if self.lost is not None:
            return self.lost
        regions, lock = self._grounds
        why = _moved(regions, self.fd, "the regions file")
        if why is None:
            why = _moved(lock, self._lock_fd, "the lock file")
        if why is not None:
            self.lose(why)
        return self.lost

    def lose(self, why: str) -> None:
        """Disable the files for good because `why` (the first reason stays): one ERROR line,
        then, once the uses in flight have ended, every descriptor closed."""
        with self._uses_lock:
            if self._lost is not None:
                return
            self._lost = why
        _log.error(
            "disk tier at %s disabled while open: %s; its writes fail and its reads are misses "
            "from now on (blocks it stored may be gone: open the path again to start from what "
            "is there)",
            self.root,
            why,
        )
        while True:  # (once in a store's life: the uses in flight are single system calls)
            with self._uses_lock:
                if self._uses == 0:
                    break
            time.sleep(0.001)
        self._close_descriptors()

    def close(self) -> None:
        """Close every descriptor (idempotent)."""
        self._writers.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        self._close_descriptors()

    def _close_descriptors(self) -> None:
        for fd in (self.direct_fd, getattr(self, "fd", None)):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    self.io.close(fd)
        self.direct_fd = None
        self.fd = -1
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = -1


FS_IOC_GETVERSION = 0x80087601
"""Linux's ioctl for a file's inode generation (the `_IOR('v', 1, long)` of 64-bit ABIs)."""


def file_identity(fd: int) -> str:
    """The identity of the file `fd` holds, "inode:generation": the generation number (which
    the filesystem changes when an inode number is reused) where the filesystem gives one,
    else 0, and then a new file that got a removed one's inode number looks the same."""
    generation = array.array("l", [0])
    with contextlib.suppress(OSError, OverflowError):
        fcntl.ioctl(fd, FS_IOC_GETVERSION, generation, True)
    return f"{os.fstat(fd).st_ino}:{generation[0] & 0xFFFFFFFF}"


def _moved(path: Path, fd: int, name: str) -> str | None:
    """Why `path` is no longer the file `fd` holds ("the lock file P was removed"), or None."""
    try:
        held = os.fstat(fd)
        here = os.stat(path)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            return f"{name} {path} was removed"
        return f"the files in {path.parent} cannot be examined: {error.strerror}"
    if (here.st_dev, here.st_ino) != (held.st_dev, held.st_ino):
        return f"{name} {path} was replaced by another file"
    if held.st_nlink == 0:
        return f"{name} {path} was removed"
    return None


def spread(parts: list[WriteOp], threads: int = WRITE_THREADS) -> list[list[WriteOp]]:
    """`parts` cut into at most `threads` batches of consecutive parts, their sizes differing
    by at most one part (each batch one write thread's)."""
    count = min(threads, len(parts))
    base, extra = divmod(len(parts), count) if count else (0, 0)
    batches: list[list[WriteOp]] = []
    first = 0
    for number in range(count):
        size = base + (number < extra)
        batches.append(parts[first : first + size])
        first += size
    return batches


def pieces(buffers: list[Any], threads: int = WRITE_THREADS) -> list[list[Any]]:
    """`buffers` (back to back, whole pages in all) cut in at most `threads` pieces of about
    equal bytes, each a multiple of PAGE but the last and at least WRITE_PIECE_BYTES when
    the buffers hold that much (a buffer is cut where a piece ends), and at most IOV_MAX
    buffers each (more pieces then); every byte once, in order. The cuts are found by
    bisection over the buffers' running ends: no Python per buffer but its size."""
    return [piece for piece, _ in pieces_sized(buffers, threads)]


def pieces_sized(
    buffers: list[Any],
    threads: int = WRITE_THREADS,
    sizes: list[int] | None = None,
    piece_bytes: int = WRITE_PIECE_BYTES,
) -> list[tuple[list[Any], int]]:
    """`pieces` with each piece's bytes; `sizes`: each buffer's bytes, when known (else
    taken from flat views of them); `piece_bytes`: the least a piece holds when
    the buffers hold that much. A buffer cut where a piece ends is cut as a flat view of
    its bytes; the others are passed on as they are (any contiguous buffer: a view each
    cost ~0.3-1.3 us a block on the lane thread, docs/BENCHMARKS.md, "The write row's CPU
    per block")."""
    if sizes is None:
        sizes = [memoryview(buffer).nbytes for buffer in buffers]
    ends = list(accumulate(sizes))
    total = ends[-1] if ends else 0
    count = max(1, min(threads, total // piece_bytes))
    each = -(-total // count)
    share = -(-each // PAGE) * PAGE
    out: list[tuple[list[Any], int]] = []
    first = skip = start = 0  # a piece starts `skip` bytes into buffers[first], `start` in all
    while start < total:
        stop = min(start + share, total)
        last = bisect_left(ends, stop, first)
        if last - first >= IOV_MAX:
            last = first + IOV_MAX - 1
            stop = ends[last]
        piece = buffers[first : last + 1]
        over = ends[last] - stop  # bytes of buffers[last] past the piece
        if over:
            piece[-1] = _flat(piece[-1])[: sizes[last] - over]
        if skip:
            piece[0] = _flat(piece[0])[skip:]
        out.append((piece, stop - start))
        if over:
            first, skip = last, sizes[last] - over
        else:
            first, skip = last + 1, 0
        start = stop
    return out


def _flat(buffer: Any) -> memoryview:
    """`buffer`'s bytes as a flat view (what a cut slices)."""
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def record_spans(records: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The page-aligned spans (start, stop) holding `records` (offset, length; sorted by
    offset, not overlapping): records less than SPAN_GAP apart share a span, which grows
    past SPAN_BYTES only to hold a record that starts within it or in its last page (spans
    never overlap: two reads never fill the same memory)."""
    spans: list[tuple[int, int]] = []
    for offset, length in records:
        start, stop = offset // PAGE * PAGE, -(-(offset + length) // PAGE) * PAGE
        if spans:
            begun, ends = spans[-1]
            if start < ends or (start - ends < SPAN_GAP and start - begun < SPAN_BYTES):
                spans[-1] = (begun, max(ends, stop))
                continue
        spans.append((start, stop))
    return spans


def whole_pages(buffer: Any) -> bool:
    """Whether O_DIRECT can move `buffer` (a numpy array or a buffer): page-aligned memory
    of whole pages."""
    array = buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, dtype=np.uint8)
    return array.nbytes % PAGE == 0 and array.__array_interface__["data"][0] % PAGE == 0


def is_enospc(error: BaseException) -> bool:
    """Whether `error` says the disk is full."""
    return isinstance(error, OSError) and error.errno == errno.ENOSPC
