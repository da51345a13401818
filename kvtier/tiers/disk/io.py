"""The system calls of a disk store, behind one replaceable object, and the loops around them.

`FileIO` is the real thing (thin wrappers of `os`); `FaultyIO` is a `FileIO` that raises
chosen errors (ENOSPC, EIO, EINVAL, ...) on chosen files, offsets or calls, so tests exercise
the failure paths of a store without monkeypatching `os` and without a broken disk.

A `pwritev` / `preadv` may move fewer bytes than asked (a signal, a file system's limit per
call, the end of a file). The loops that resume such a call where it stopped live here, once:
`pwritev_all`, `preadv_fill` and `preadv_all`; the store's write lane, its reader, its check
and the benchmarks all call them. `staging_buffer` is the page-aligned memory that O_DIRECT
needs.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from kvtier.errors import InvalidValueError

_O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)

IOBuffer = bytes | bytearray | memoryview
"""One buffer of a `pwritev` / `preadv` call (a numpy array is passed as its `.data`)."""

ALIGNMENT = 4096
"""Alignment of O_DIRECT buffers, offsets and lengths (the page size; enough on every disk)."""


def _iov_max() -> int:
    try:
        value = os.sysconf("SC_IOV_MAX")
    except (ValueError, OSError):
        return 1024
    return value if value > 0 else 1024


IOV_MAX = _iov_max()
"""The most buffers one `pwritev` / `preadv` takes."""

Operation = Literal["open", "pwritev", "preadv", "fsync", "allocate"]
OPERATIONS: tuple[Operation, ...] = ("open", "pwritev", "preadv", "fsync", "allocate")


class FileIO:
    """The system calls of a disk store, as methods a test can override.

    Every method may raise `OSError`; the store turns an error during a read or a write into a
    per-block failure value, and one while opening into a `DiskTierError`.
    """

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        """`os.open`, never following a symlink (O_NOFOLLOW) and closed on exec; a file that
        it creates gets exactly `mode` (set again with fchmod, so the umask cannot widen or
        narrow it), and a file that already existed keeps its mode."""
        flags |= _O_NOFOLLOW | _O_CLOEXEC
        if flags & os.O_CREAT and not flags & os.O_EXCL:
            try:
                fd = os.open(path, flags | os.O_EXCL, mode)
            except FileExistsError:
                return os.open(path, flags & ~os.O_CREAT)
        else:
            fd = os.open(path, flags, mode)
        if flags & os.O_CREAT:
            try:
                os.fchmod(fd, mode)
            except BaseException:
                os.close(fd)
                raise
        return fd

    def close(self, fd: int) -> None:
        """`os.close`."""
        os.close(fd)

    def size(self, fd: int) -> int:
        """The file's length in bytes."""
        return os.fstat(fd).st_size

    def allocate(self, fd: int, size: int) -> None:
        """Make the file at least `size` bytes long, reserving the disk space where the
        filesystem can (`posix_fallocate`), so that a full disk shows up at open rather than
        as a failed write later. Filesystems without fallocate get a sparse file."""
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)

    def truncate(self, fd: int, size: int) -> None:
        """`os.ftruncate`: used to shrink a slab file when a store is reopened smaller."""
        os.ftruncate(fd, size)

    def pwritev(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        """`os.pwritev`: bytes written, which may be fewer than asked."""
        return os.pwritev(fd, buffers, offset)

    def preadv(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        """`os.preadv`: bytes read; fewer than asked at the end of the file."""
        return os.preadv(fd, buffers, offset)

    def fsync(self, fd: int) -> None:
        """Make the file's written data durable. `fdatasync` suffices: slab files are
        preallocated, so a write changes no metadata that a later read needs except the
        allocation of a sparse file, which fdatasync also flushes."""
        os.fdatasync(fd)


@dataclass
class Fault:
    """One rule of a `FaultyIO`: calls of `operation` that match raise `OSError(errno_)`.

    A call matches when the file's name ends with `path_suffix` (if given), when its byte
    range [offset, offset + length) contains `offset` (if given; pwritev and preadv only),
    and when `flags` are all set in an open call's flags (if given). `times` is how many more
    matching calls fail (None: all of them); `fired` counts the failures so far.
    """

    operation: Operation
    errno_: int
    path_suffix: str | None = None
    offset: int | None = None
    flags: int | None = None
    times: int | None = None
    fired: int = 0


class FaultyIO(FileIO):
    """A `FileIO` that fails the calls its `Fault` rules match, and counts every call.

    Thread-safe: a store calls it from its worker threads.
    """

    def __init__(self) -> None:
        self.faults: list[Fault] = []
        self.calls: Counter[str] = Counter()
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()

    def inject(
        self,
        operation: Operation,
        errno_: int,
        *,
        path_suffix: str | None = None,
        offset: int | None = None,
        flags: int | None = None,
        times: int | None = None,
    ) -> Fault:
        """Add a rule (see `Fault`) and return it; `clear()` removes all rules."""
        if operation not in OPERATIONS:
            raise InvalidValueError(f"operation must be one of {OPERATIONS}, got {operation!r}")
        fault = Fault(operation, errno_, path_suffix, offset, flags, times)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove every rule; later calls succeed."""
        with self._lock:
            self.faults.clear()

    def _check(
        self,
        operation: Operation,
        path: str,
        *,
        start: int | None = None,
        length: int = 0,
        flags: int = 0,
    ) -> None:
        with self._lock:
            self.calls[operation] += 1
            for fault in self.faults:
                if fault.operation != operation:
                    continue
                if fault.times is not None and fault.fired >= fault.times:
                    continue
                if fault.path_suffix is not None and not path.endswith(fault.path_suffix):
                    continue
                if fault.offset is not None and (
                    start is None or not start <= fault.offset < start + length
                ):
                    continue
                if fault.flags is not None and flags & fault.flags != fault.flags:
                    continue
                fault.fired += 1
                raise OSError(fault.errno_, f"injected: {os.strerror(fault.errno_)}", path)

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        self._check("open", path, flags=flags)
        fd = super().open(path, flags, mode)
        with self._lock:
            self._paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        super().close(fd)

    def _path(self, fd: int) -> str:
        with self._lock:
            return self._paths.get(fd, "")

    def allocate(self, fd: int, size: int) -> None:
        self._check("allocate", self._path(fd))
        super().allocate(fd, size)

    def pwritev(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        length = sum(memoryview(buffer).nbytes for buffer in buffers)
        self._check("pwritev", self._path(fd), start=offset, length=length)
        return super().pwritev(fd, buffers, offset)

    def preadv(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        length = sum(memoryview(buffer).nbytes for buffer in buffers)
        self._check("preadv", self._path(fd), start=offset, length=length)
        return super().preadv(fd, buffers, offset)

    def fsync(self, fd: int) -> None:
        self._check("fsync", self._path(fd))
        super().fsync(fd)


PLAIN_IO = FileIO()
"""The real system calls, for callers with no `FileIO` of their own (the header file, the
benchmarks)."""


def round_up(value: int, multiple: int) -> int:
    """`value` rounded up to a multiple of `multiple`."""
    return -(-value // multiple) * multiple


def byte_views(buffers: Sequence[IOBuffer]) -> list[memoryview]:
    """Each buffer as a flat memoryview of bytes (what the loops below slice)."""
    return [memoryview(buffer).cast("B") for buffer in buffers]


def advance(views: list[memoryview], done: int) -> list[memoryview]:
    """What is left of `views` (flat byte views, back to back) once their first `done` bytes
    have been moved: whole views dropped, the first one left cut."""
    first = 0
    while first < len(views) and done >= views[first].nbytes:
        done -= views[first].nbytes
        first += 1
    rest = views[first:]
    if rest and done:
        rest[0] = rest[0][done:]
    return rest


def pwritev_all(
    fd: int,
    buffers: Sequence[IOBuffer],
    offset: int,
    *,
    io: FileIO = PLAIN_IO,
    nbytes: int | None = None,
) -> int:
    """Write all of `buffers`, back to back, at `offset` of `fd`, resuming after a partial
    write until every byte is written; the bytes written. `nbytes` (their total, when the
    caller knows it) lets a write that completes in one call skip building views. Raises the
    OSError of a failed call, and OSError(EIO) when a call writes nothing (a write that cannot
    progress would otherwise loop for ever)."""
    written = io.pwritev(fd, buffers, offset)
    views = byte_views(buffers) if nbytes is None or written != nbytes else []
    total = sum(view.nbytes for view in views) if views else written
    done = written
    while True:
        if done >= total:
            return total
        if written <= 0:
            raise OSError(errno.EIO, f"pwritev wrote nothing at offset {offset + done}")
        views = advance(views, written)
        written = io.pwritev(fd, views, offset + done)
        done += max(written, 0)


def preadv_fill(fd: int, buffers: Sequence[IOBuffer], offset: int, *, io: FileIO = PLAIN_IO) -> int:
    """Read into all of `buffers`, back to back, from `offset` of `fd`, resuming after a
    partial read until they are full or the file ends (a call that reads nothing); the bytes
    read, fewer than asked only at the end of the file or after an error. The first call's
    OSError propagates (nothing was read); a later call's ends the read, so the caller sees
    a short read and can tell which buffers were filled."""
    views = byte_views(buffers)
    total = 0
    while views:
        try:
            got = io.preadv(fd, views, offset + total)
        except OSError:
            if total == 0:
                raise
            break
        if got <= 0:
            break
        total += got
        views = advance(views, got)
    return total


def preadv_all(fd: int, buffers: Sequence[IOBuffer], offset: int, *, io: FileIO = PLAIN_IO) -> None:
    """Fill all of `buffers`, back to back, from `offset` of `fd` (`preadv_fill`); raises
    OSError(EIO) when the file ends first, and the OSError of a failed call."""
    wanted = sum(memoryview(buffer).nbytes for buffer in buffers)
    got = preadv_fill(fd, buffers, offset, io=io)
    if got < wanted:
        raise OSError(errno.EIO, f"short read: {got} of {wanted} bytes at offset {offset}")


_STAGING_CACHE_BYTES = 64 << 20
"""Largest staging buffer a thread keeps for its next call."""
_staging_cache = threading.local()


def staging_buffer(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A page-aligned uint8 buffer of `nbytes` bytes (anonymous mmap memory), as O_DIRECT
    needs. Each thread reuses one buffer (up to 64 MiB) from call to call, so staging does not
    pay an mmap and a page fault per page every time: the buffer is this thread's until it
    stages again, and holds what earlier use left."""
    if nbytes > _STAGING_CACHE_BYTES:
        return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)
    cached: np.ndarray[Any, np.dtype[np.uint8]] | None = getattr(_staging_cache, "buffer", None)
    if cached is None or cached.nbytes < nbytes:
        size = min(max(round_up(nbytes, 1 << 20), 1 << 20), _STAGING_CACHE_BYTES)
        cached = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)
        _staging_cache.buffer = cached
    return cached[:nbytes]


def is_aligned(buffer: np.ndarray[Any, Any]) -> bool:
    """Whether `buffer`'s memory starts on an ALIGNMENT boundary (O_DIRECT can use it)."""
    return int(buffer.ctypes.data) % ALIGNMENT == 0
