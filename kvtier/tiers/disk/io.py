"""The few system calls a disk store makes on its slab files, behind one replaceable object.

`FileIO` is the real thing (thin wrappers of `os`); `FaultyIO` is a `FileIO` that raises
chosen errors (ENOSPC, EIO, EINVAL, ...) on chosen files, offsets or calls, so tests exercise
the failure paths of a store without monkeypatching `os` and without a broken disk.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvtier.errors import InvalidValueError

_O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)

IOBuffer = bytes | bytearray | memoryview
"""One buffer of a `pwritev` / `preadv` call (a numpy array is passed as its `.data`)."""

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
