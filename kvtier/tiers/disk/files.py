"""The files one open disk store holds, and the bytes it moves through them.

`StoreFiles` owns the descriptors of a store directory: the lock file (flock'ed), the slab
files (through the store's `FileIO`, so tests count and fault those calls), the header file
and the in-flight log (plain system calls: small metadata beside the slabs). It writes and
reads runs of slots (O_DIRECT staging included), writes and reads slot header entries, syncs,
tells whether its files are still the ones at their paths (`ground_check`, `GroundCheck`), and
closes everything in the right order. The lane's writes, syncs and checks are ops it runs in
batches (ops.py); the methods named `*_op(s)` and `ground_check` make them. Where bytes go
is layout.py's; when they go is the lane's, the reader's and recovery's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtier.errors import DirectIOError, DiskLockedError, DiskTierError
from kvtier.tiers.codec import Stored
from kvtier.tiers.disk.index_check import DATA_FILE, move_aside
from kvtier.tiers.disk.inflight import InflightLog
from kvtier.tiers.disk.io import (
    ALIGNMENT,
    FileIO,
    IOBuffer,
    preadv_fill,
    pwritev_all,
    round_up,
    staging_buffer,
)
from kvtier.tiers.disk.layout import (
    ENTRY_BYTES,
    FILE_HEADER_BYTES,
    HEADERS_FILE,
    INDEX_DIR,
    INFLIGHT_FILE,
    LOCK_FILE,
    Run,
    StoreLayout,
    entry_offset,
    headers_file_bytes,
    pack_file_header,
    slab_file_name,
    unpack_file_header,
)
from kvtier.tiers.disk.ops import Op, StatOp, SyncOp, WriteOp, run_batch
from kvtier.tiers.disk.safety import preallocate
from kvtier.tiers.trusted import FILE_MODE, FileId, create_or_open

if TYPE_CHECKING:
    from kvtier.tiers.disk.catalog import Catalog

O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)


_GONE = (errno.ENOENT, errno.ENOTDIR)
"""A path's stat errors that mean its file was removed (or its directory)."""


class GroundCheck:
    """The stat ops of `StoreFiles.ground_check`, in order, and what they say once run.

    Each check names a file and has one or two stat ops: `held`, an fstat of the descriptor
    the store holds (its file must not be unlinked), and `at`, a stat of its path, which must
    still be that file (or, for a file the store does not hold open, the file `expected`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ops: list[StatOp] = []
        self._checks: list[tuple[str, StatOp | None, StatOp | None, FileId | None]] = []

    def add(
        self,
        name: str,
        *,
        fd: int | None = None,
        path: str | None = None,
        expected: FileId | None = None,
    ) -> None:
        held = None if fd is None else StatOp(fd)
        at = None if path is None else StatOp(path=path)
        self.ops += [op for op in (held, at) if op is not None]
        self._checks.append((name, held, at, expected))

    def problem(self) -> str | None:
        """Why a file is no longer the store's (the first check that fails, in order), or
        None; a file that could not be examined counts as lost too."""
        for name, held, at, expected in self._checks:
            if held is not None and held.error is not None:
                return f"the files in {self.root} cannot be examined: {held.error}"
            if at is not None and at.error is not None:
                if at.error.errno in _GONE:
                    return f"{name} was removed"
                return f"the files in {self.root} cannot be examined: {at.error}"
            held_stat = None if held is None else held.stat
            at_stat = None if at is None else at.stat
            if at_stat is not None:
                identity = expected if held_stat is None else held_stat[:2]
                if at_stat[:2] != identity:
                    return f"{name} was replaced by another file"
            if held_stat is not None and held_stat[2] == 0:
                return f"{name} was removed"
        return None


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symlink"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


def not_a_regular_file(path: Path) -> str | None:
    """What is wrong with the file at `path` when something other than a regular file is
    there ("is a directory, not a regular file"); None for a regular file or nothing (a
    missing file is another problem). Never follows a symlink, never opens (a FIFO would
    block)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    return f"is {kind}, not a regular file"


def odd_files(root: Path) -> list[tuple[Path, str]]:
    """The slab files (`slab-*.bin`) and the in-flight log of the store in `root` that are
    not regular files (a directory, a symlink, a FIFO, ...), each with what it is: an open
    fails on them (or, to inspect, takes a slab file as missing)."""
    paths = [*sorted(root.glob("slab-*.bin")), root / INFLIGHT_FILE]
    found = []
    for path in paths:
        odd = not_a_regular_file(path)
        if odd is not None:
            found.append((path, odd))
    return found


def move_aside_odd_files(root: Path) -> list[str]:
    """Rename the `odd_files` of the store in `root` out of the way (`<name>.damaged-<time>`,
    kept for inspection), so that the store opens again with a fresh file in each place;
    what was done, one line each (a slab file's blocks are lost). For `kvtier check
    --repair` only: an ordinary open refuses such a store instead."""
    done = []
    for path, odd in odd_files(root):
        aside = move_aside(path)
        lost = "; the blocks of its slots are lost" if path.name.startswith("slab-") else ""
        done.append(f"{path.name} {odd}: moved aside to {aside.name}{lost}")
    return done


class StoreFiles:
    """The open files of the store in `root`; empty until recovery opens them."""

    def __init__(self, root: Path, io: FileIO) -> None:
        self.root = root
        self.io = io
        self.lock_fd: int | None = None
        self.slab_fds: list[int] = []
        """One descriptor per slab file (-1: missing or not a file, when opened to inspect)."""
        self.slab_problems: dict[int, str] = {}
        """Why a slab file has no descriptor (-1): "is missing", "is a directory, not a
        regular file", ..."""
        self.headers_fd: int | None = None
        self.inflight: InflightLog | None = None
        self.direct_io = False
        """Whether the slab descriptors are O_DIRECT ones."""
        self._lock_path = str(root / LOCK_FILE)
        self._index_data_path = str(root / INDEX_DIR / DATA_FILE)

    # -- opening ------------------------------------------------------------------------------

    def take_lock(self, *, create: bool) -> None:
        """Hold the store's lock file (flock), so no two stores open the same directory. With
        `create` false, a store without a lock file is opened unlocked (nothing holds it)."""
        if create:
            fd = create_or_open(self.root / LOCK_FILE)
        else:
            try:
                fd = os.open(self.root / LOCK_FILE, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
            except FileNotFoundError:
                return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DiskLockedError(
                f"the disk tier at {self.root} is already open in another store"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self.lock_fd = fd

    def open_headers(self, *, create: bool) -> dict[str, Any] | None:
        """Open (or create) `headers.bin`; the layout its first page records, or None for a
        new (or unreadable, or with `create` false missing) header file."""
        path = self.root / HEADERS_FILE
        if create:
            fd = create_or_open(path)
        else:
            try:
                fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
            except FileNotFoundError:
                return None
        self.headers_fd = fd
        return unpack_file_header(os.pread(fd, FILE_HEADER_BYTES, 0))

    def write_file_header(self, layout: StoreLayout) -> None:
        """Record `layout` in the first page of the header file."""
        if self.headers_fd is not None:
            pwritev_all(self.headers_fd, [pack_file_header(layout.meta())], 0)

    def open_inflight(self) -> None:
        """Open (or create) the in-flight log."""
        self.inflight = InflightLog(self.root / INFLIGHT_FILE, FILE_MODE)

    def open_slabs(self, layout: StoreLayout, *, create: bool) -> list[int]:
        """Open the slab files of `layout` (creating the missing ones with `create`); their
        sizes before this open. Without `create` a missing file is not created: its
        descriptor is -1 and its size 0."""
        sizes: list[int] = []
        for file in range(layout.num_files):
            path = str(self.root / slab_file_name(file))
            odd = not_a_regular_file(Path(path))
            if odd is not None and create:
                raise DiskTierError(
                    f"cannot open the disk tier at {self.root}: its slab file "
                    f"{slab_file_name(file)} {odd}; `kvtier check --repair` moves it aside "
                    "(the blocks of its slots are lost)"
                )
            if odd is not None:
                self.slab_fds.append(-1)
                self.slab_problems[file] = odd
                sizes.append(0)
                continue
            if create:
                flags = os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW
                fd = self.io.open(path, flags, FILE_MODE)
            else:
                try:
                    fd = self.io.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
                except FileNotFoundError:
                    self.slab_fds.append(-1)
                    self.slab_problems[file] = "is missing"
                    sizes.append(0)
                    continue
            self.slab_fds.append(fd)
            sizes.append(self.io.size(fd))
        return sizes

    def fit(self, layout: StoreLayout, sizes: list[int]) -> None:
        """Size and preallocate the slab files and the header file for `layout` (shrinking
        what is too long), and remove slab files beyond its last."""
        for file, fd in enumerate(self.slab_fds):
            wanted = layout.file_bytes(file)
            if sizes[file] > wanted:
                self.io.truncate(fd, wanted)
            self.io.allocate(fd, wanted)
        if self.headers_fd is not None:
            wanted = headers_file_bytes(layout.num_blocks)
            if os.fstat(self.headers_fd).st_size > wanted:
                os.ftruncate(self.headers_fd, wanted)
            preallocate(self.headers_fd, wanted, self.root / HEADERS_FILE)
        for extra in self.root.glob("slab-*.bin"):
            number = extra.name.removeprefix("slab-").removesuffix(".bin")
            if number.isdigit() and int(number) >= layout.num_files:
                extra.unlink()

    def use_direct_io(self, mode: bool | str, layout: StoreLayout) -> None:
        """Reopen the slab files with O_DIRECT when `mode` (True, False or "auto") asks for it
        and it works here; DirectIOError when it is required (True) and does not."""
        if mode is False:
            return
        reason = self._direct_io_problem(layout)
        fds: list[int] = []
        if reason is None:
            try:
                for file in range(layout.num_files):
                    path = str(self.root / slab_file_name(file))
                    fds.append(self.io.open(path, os.O_RDWR | O_DIRECT | _O_CLOEXEC))
                got = self.io.preadv(fds[0], [staging_buffer(ALIGNMENT).data], 0)
                if got != ALIGNMENT:
                    reason = f"an aligned O_DIRECT read returned {got} bytes, not {ALIGNMENT}"
            except OSError as error:
                reason = f"O_DIRECT does not work in {self.root}: {error}"
        if reason is not None:
            self._close_all(fds)
            if mode is True:
                raise DirectIOError(f"direct_io = true, but {reason}")
            return
        self._close_all(self.slab_fds)
        self.slab_fds = fds
        self.direct_io = True

    @staticmethod
    def _direct_io_problem(layout: StoreLayout) -> str | None:
        if not O_DIRECT:
            return "this platform has no O_DIRECT"
        if layout.block_size % ALIGNMENT:
            return f"block_size {layout.block_size} is not a multiple of {ALIGNMENT}"
        return None

    def _close_all(self, fds: Iterable[int]) -> None:
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    self.io.close(fd)

    # -- slots --------------------------------------------------------------------------------

    def write_runs(
        self,
        runs: Sequence[Run],
        stored: Sequence[Stored],
        lengths: Sequence[int],
        *,
        before: Sequence[Op] = (),
    ) -> list[tuple[Run, OSError | None]]:
        """Write `runs` of consecutive slots (`stored[member]`, `lengths[member]` bytes, for
        each member), one pwritev each (more after a partial write), in one batch (ops.py)
        after the ops `before`; each run with the OSError that failed it, or None.

        Under O_DIRECT, a zstd frame (always the last block of its run) is copied, zero-padded
        to whole pages, into page-aligned staging memory, and raw blocks are written straight
        from the caller's buffers. O_DIRECT refuses (EINVAL, before writing anything) memory
        that is not page-aligned; such a run is then written again from staging memory. That
        costs one failed system call for the rare unaligned buffer, instead of an address
        check of every block of every batch."""
        padded = (
            self._padded(
                [r.members[-1] for r in runs if lengths[r.members[-1]] % ALIGNMENT], stored, lengths
            )
            if self.direct_io
            else {}
        )
        ops: list[WriteOp] = []
        for run in runs:
            members = run.members
            payloads: list[IOBuffer] = [stored[member] for member in members]
            nbytes = sum(lengths[member] for member in members)
            pad = padded.get(members[-1])
            if pad is not None:
                payloads[-1] = pad
                nbytes += pad.nbytes - lengths[members[-1]]
            ops.append(WriteOp(self.slab_fds[run.file], payloads, run.offset, nbytes))
        run_batch(self.io, [*before, *ops])
        outcomes: list[tuple[Run, OSError | None]] = []
        for run, op in zip(runs, ops, strict=True):
            error = op.error
            if error is not None and error.errno == errno.EINVAL and self.direct_io:
                staged = self._staged(list(run.members), stored, lengths)
                try:
                    pwritev_all(op.fd, [staged], run.offset, io=self.io, nbytes=staged.nbytes)
                except OSError as again:
                    error = again
                else:
                    error = None
            outcomes.append((run, error))
        return outcomes

    @classmethod
    def _padded(
        cls, members: list[int], stored: Sequence[Stored], lengths: Sequence[int]
    ) -> dict[int, memoryview]:
        """The stored bytes of each of `members`, zero-padded to whole pages, in one piece of
        this thread's staging memory (valid until the thread stages again)."""
        if not members:
            return {}
        staged = cls._staged(members, stored, lengths)
        pieces: dict[int, memoryview] = {}
        start = 0
        for member in members:
            size = round_up(lengths[member], ALIGNMENT)
            pieces[member] = staged[start : start + size]
            start += size
        return pieces

    @staticmethod
    def _staged(members: list[int], stored: Sequence[Stored], lengths: Sequence[int]) -> memoryview:
        """The stored bytes of `members`, each zero-padded to whole pages (padding: bytes on
        disk that are never read as data), one after another in this thread's page-aligned
        staging memory (valid until the thread stages again)."""
        sizes = [round_up(lengths[member], ALIGNMENT) for member in members]
        staging = staging_buffer(sum(sizes))
        start = 0
        for member, size in zip(members, sizes, strict=True):
            length = lengths[member]
            staging[start : start + length] = np.frombuffer(stored[member], dtype=np.uint8)
            staging[start + length : start + size] = 0
            start += size
        return staging.data

    def read(self, file: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        """Fill `buffers` from `offset` of slab file `file`, resuming after partial reads;
        the bytes read (`io.preadv_fill`: the first call's OSError propagates)."""
        return preadv_fill(self.slab_fds[file], buffers, offset, io=self.io)

    def slab_size(self, file: int) -> int:
        """The length of slab file `file` now; OSError when it cannot be examined."""
        return self.io.size(self.slab_fds[file])

    def sync_slab_op(self, file: int) -> SyncOp:
        """The op that makes the bytes written to slab file `file` durable."""
        return SyncOp(self.slab_fds[file])

    # -- slot headers -------------------------------------------------------------------------

    def entry_ops(
        self, chosen: dict[int, tuple[int | None, bytes | memoryview]]
    ) -> list[tuple[list[int], WriteOp]]:
        """The writes of header entries (`chosen`: slot -> (owner, entry)): one per run of
        consecutive slots, each with its slots; none without a header file."""
        fd = self.headers_fd
        if fd is None:
            return []
        order = sorted(chosen)
        writes: list[tuple[list[int], WriteOp]] = []
        first = 0
        while first < len(order):
            end = first + 1
            while end < len(order) and order[end] == order[end - 1] + 1:
                end += 1
            run = order[first:end]
            payload = b"".join(chosen[slot][1] for slot in run)  # one buffer: no IOV_MAX
            writes.append((run, WriteOp(fd, [payload], entry_offset(run[0]), len(payload), True)))
            first = end
        return writes

    def write_entries(
        self, chosen: dict[int, tuple[int | None, bytes | memoryview]]
    ) -> list[tuple[list[int], OSError]]:
        """Write header entries (`chosen`: slot -> (owner, entry)), one pwrite per run of
        consecutive slots; each failed run's slots with its error."""
        writes = self.entry_ops(chosen)
        run_batch(self.io, [op for _, op in writes])
        return [(run, op.error) for run, op in writes if op.error is not None]

    def read_entries(self, first: int, count: int) -> bytes:
        """The raw header entries of slots [first, first + count) (fewer at the file's end)."""
        if self.headers_fd is None:
            return b""
        buffer = bytearray(count * ENTRY_BYTES)
        got = preadv_fill(self.headers_fd, [buffer], entry_offset(first))
        return bytes(buffer[:got])

    def headers_slots(self) -> int:
        """How many slots the header file has entries for (0 without one)."""
        if self.headers_fd is None:
            return 0
        return max(0, os.fstat(self.headers_fd).st_size - entry_offset(0)) // ENTRY_BYTES

    def sync_headers(self) -> None:
        """Make the header entries written durable (OSError when that fails)."""
        if self.headers_fd is not None:
            os.fdatasync(self.headers_fd)

    def sync_headers_op(self) -> SyncOp | None:
        """The op that makes the header entries written durable (None without a header
        file)."""
        return None if self.headers_fd is None else SyncOp(self.headers_fd, plain=True)

    # -- the ground it stands on --------------------------------------------------------------

    def ground_check(self, files: Iterable[int], index_file: FileId | None) -> GroundCheck:
        """The check that the files this store holds open are still its files on disk: the
        lock file not removed or replaced (its path against the descriptor held), the index's
        data file (`index_file`) not removed or replaced, none of the slab `files` (numbers)
        nor the header file unlinked. Its stat ops run in a batch (the lane's last of a
        group), then `problem()` says; a file that cannot be examined (EACCES, EIO) counts as
        lost too."""
        check = GroundCheck(self.root)
        if self.lock_fd is not None:
            check.add(f"the lock file {self._lock_path}", fd=self.lock_fd, path=self._lock_path)
        if index_file is not None:
            name = f"the index file {self._index_data_path}"
            check.add(name, path=self._index_data_path, expected=index_file)
        for file in sorted(set(files)):
            check.add(f"the slab file {self.root / slab_file_name(file)}", fd=self.slab_fds[file])
        if self.headers_fd is not None:
            check.add(f"the header file {self.root / HEADERS_FILE}", fd=self.headers_fd)
        return check

    # -- closing ------------------------------------------------------------------------------

    def close(self, *, clean: bool, catalog: Catalog | None = None) -> None:
        """Close every file: the slab files, the in-flight log (emptied when `clean`: every
        group has ended), the header file, then the `catalog`'s index (stamped clean when
        `clean`), and the lock last. Idempotent; never raises OSError."""
        self._close_all(self.slab_fds)
        self.slab_fds = []
        if self.inflight is not None:
            with contextlib.suppress(OSError):
                if clean:
                    self.inflight.clear()
                self.inflight.close()
            self.inflight = None
        if self.headers_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.headers_fd)
            self.headers_fd = None
        if catalog is not None:
            catalog.close(clean=clean)
        if self.lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)  # releases the flock
            self.lock_fd = None
