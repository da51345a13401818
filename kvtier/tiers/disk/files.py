"""The file-system safety and space rules of a disk store, as small functions it calls.

A disk store lives in `<tier directory>/kvtier-<fingerprint>/`. What it may trust there, and
how it leaves the file system when an open fails (issue 9, items 4 and 5):

- **No symlink is followed.** Every file and directory is opened with O_NOFOLLOW | O_CLOEXEC
  (`open_file`, `open_or_create`, `open_dir_fd`): a symlink that another user planted for a
  lock or slab name is refused, never resized, overwritten or chmod-ed through.
- **Private directories.** A directory the store creates is created 0700, intermediate ones
  too (`os.makedirs` applies its mode only to the last one). An existing store directory must
  be a real directory owned by this user and writable by nobody else; it is refused, never
  chmod-ed: kvtier changes the mode only of what it created (`ensure_private_dir`).
- **A trusted parent.** The tier directory (the store directory's parent) must be owned by
  this user or root and not writable by group or others unless it has the sticky bit (like
  /tmp): on a directory others can write, another user could plant symlinks or a whole store;
  with the sticky bit they cannot replace our entries, and the store directory's own
  ownership check catches a store directory they made beforehand (`check_parent_dir`).
- **Space.** Before allocating, the bytes still needed are checked against the free space,
  so a shortfall is one clear error naming both sizes (`check_free_space`); `allocated_bytes`
  says how much of a file is already on disk so that only the difference counts.
  `preallocate` reserves a file's bytes, so a full disk shows at open, not at a later write.
- **Roll back.** `CreatedFiles` records what an open created and grew; when the open fails,
  `rollback()` removes the new files and directories and shrinks grown files back, so a tier
  too large for its file system does not leave the file system full.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from types import TracebackType

from kvtier.errors import DiskTierError, InvalidValueError

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "O_CLOEXEC",
    "O_NOFOLLOW",
    "CreatedFiles",
    "allocated_bytes",
    "check_free_space",
    "check_parent_dir",
    "check_private_dir",
    "ensure_private_dir",
    "format_bytes",
    "free_bytes",
    "open_dir_fd",
    "open_file",
    "open_or_create",
    "preallocate",
]

StrPath = str | os.PathLike[str]
"""A file-system path as the `os` functions take it."""

O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
O_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
DIR_MODE = 0o700
"""Mode of every directory a store creates."""
FILE_MODE = 0o600
"""Mode of every file a store creates."""

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""Errors that mean the file system (or the user's quota, or the file size limit) cannot hold
the bytes asked for."""
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)
"""posix_fallocate errors that mean the file system cannot reserve space (not that it is
full): the file is then made sparse instead."""


def format_bytes(count: int) -> str:
    """`count` bytes for people: "16.0 GiB", "512.0 KiB", "12 bytes"."""
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024:
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def _mode(info: os.stat_result) -> str:
    return f"{stat.S_IMODE(info.st_mode):04o}"


def _symlink_error(path: StrPath) -> DiskTierError:
    return DiskTierError(f"{os.fspath(path)} is a symlink; refusing to follow it")


def open_file(path: StrPath, flags: int, mode: int = FILE_MODE) -> int:
    """`os.open(path, flags | O_NOFOLLOW | O_CLOEXEC, mode)`: a symlink at `path` is never
    followed (a DiskTierError; ELOOP from O_NOFOLLOW), and the descriptor does not leak into
    child processes. Other errors (FileNotFoundError, FileExistsError, ...) are raised as
    they are, for the caller to handle. `mode` applies only to a file this call creates, and
    the umask may narrow it (`open_or_create` sets it exactly)."""
    try:
        return os.open(path, flags | O_NOFOLLOW | O_CLOEXEC, mode)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        # ELOOP is also "too many levels of symbolic links" in the directories above `path`.
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(path).st_mode):
                raise _symlink_error(path) from None
        raise DiskTierError(f"cannot open {os.fspath(path)}: {error.strerror}") from None


def open_dir_fd(path: StrPath) -> int:
    """A read-only descriptor of the directory `path` (O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC),
    to fsync its entries or fchmod it; a symlink or a non-directory is a DiskTierError."""
    try:
        return open_file(path, os.O_RDONLY | O_DIRECTORY)
    except NotADirectoryError:
        # Linux reports a symlink opened with O_DIRECTORY | O_NOFOLLOW as ENOTDIR, not ELOOP.
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(path).st_mode):
                raise _symlink_error(path) from None
        raise DiskTierError(f"{os.fspath(path)} is not a directory") from None


def open_or_create(
    path: StrPath,
    flags: int = os.O_RDWR,
    mode: int = FILE_MODE,
    *,
    record: CreatedFiles | None = None,
) -> tuple[int, bool]:
    """Open the regular file `path` (O_NOFOLLOW | O_CLOEXEC), creating it when missing;
    returns (descriptor, whether this call created it).

    A file this call creates gets exactly `mode` (set again with fchmod: a umask such as 0277
    would otherwise leave a store that cannot reopen its own files) and is added to `record`;
    an existing file keeps its mode (kvtier never chmods what it did not create). A symlink
    (even a dangling one: O_CREAT would create its target) or anything but a regular file is
    a DiskTierError. `flags` should not hold O_CREAT / O_EXCL; they are managed here."""
    plain = flags & ~(os.O_CREAT | os.O_EXCL)
    for _ in range(3):  # another process may remove the file between the two opens
        try:
            fd = open_file(path, plain | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            try:
                fd = open_file(path, plain)
            except FileNotFoundError:
                continue
            created = False
        else:
            created = True
            if record is not None:
                record.add(path)
        try:
            if created:
                os.fchmod(fd, mode)
            elif not stat.S_ISREG(os.fstat(fd).st_mode):
                raise DiskTierError(f"{os.fspath(path)} is not a regular file")
        except BaseException:
            os.close(fd)
            if created and record is None:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        return fd, created
    raise DiskTierError(f"cannot open {os.fspath(path)}: it keeps disappearing")


def _missing_dirs(path: Path) -> list[Path]:
    """`path` and its ancestors that do not exist, outermost first (lstat: a symlink, even a
    dangling one, exists)."""
    missing: list[Path] = []
    current = path
    while True:
        try:
            os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):  # (an ancestor is a file: mkdir says)
            missing.append(current)
            if current.parent == current:
                break
            current = current.parent
            continue
        break
    missing.reverse()
    return missing


def _make_dir(directory: Path, record: CreatedFiles | None) -> bool:
    """mkdir `directory` with exactly DIR_MODE, recorded in `record`; False when it appeared
    meanwhile (made by someone else: not ours to chmod)."""
    try:
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        return False
    except OSError as error:
        raise DiskTierError(f"cannot create the directory {directory}: {error.strerror}") from None
    if record is not None:
        record.add_dir(directory)
    # The umask may have narrowed the mode (0277 leaves 0500: no files could be created in
    # it). Through a descriptor, so that a symlink swapped in meanwhile is not followed.
    fd = open_dir_fd(directory)
    try:
        info = os.fstat(fd)
        if stat.S_IMODE(info.st_mode) != DIR_MODE and info.st_uid == os.geteuid():
            os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)
    return True


def check_private_dir(path: StrPath) -> None:
    """DiskTierError unless `path` is a real directory (not a symlink) owned by this user
    (the effective uid) and writable by nobody else. Checks only: changes nothing."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise DiskTierError(f"the directory {os.fspath(path)} does not exist") from None
    if stat.S_ISLNK(info.st_mode):
        raise _symlink_error(path)
    if not stat.S_ISDIR(info.st_mode):
        raise DiskTierError(f"{os.fspath(path)} is not a directory")
    euid = os.geteuid()
    if info.st_uid != euid:
        raise DiskTierError(
            f"the directory {os.fspath(path)} is owned by uid {info.st_uid}, not by this user "
            f"(uid {euid}); choose a directory you own"
        )
    if info.st_mode & _OTHERS_WRITE:
        raise DiskTierError(
            f"the directory {os.fspath(path)} is writable by group or others (mode "
            f"{_mode(info)}); run `chmod go-w {os.fspath(path)}` or choose another directory"
        )


def ensure_private_dir(
    path: StrPath, *, create_parents: bool, record: CreatedFiles | None = None
) -> bool:
    """Make sure `path` is a private directory: create it if missing (0700), then check it
    (`check_private_dir`). Returns whether this call created `path` itself.

    With `create_parents`, missing ancestors are created too, each 0700 (one by one:
    `os.makedirs` gives its mode only to the last directory); without it, a missing parent is
    a DiskTierError, so that a mistyped path does not silently grow a directory tree. Every
    directory this call creates is added to `record`. A directory that already existed, or
    that another process created meanwhile, is never chmod-ed: if it is not private it is
    refused, and the message says what to do."""
    target = Path(path)
    missing = _missing_dirs(target)
    if len(missing) > 1 and not create_parents:
        raise DiskTierError(
            f"cannot create {target}: its parent directory {target.parent} does not exist "
            "(is the path mistyped? create the parent first)"
        )
    created_target = False
    for directory in missing:
        if _make_dir(directory, record):
            created_target = directory == target
    check_private_dir(target)
    return created_target


def check_parent_dir(path: StrPath) -> None:
    """DiskTierError unless the directory `path` (the configured tier directory, parent of
    the store directory) is owned by this user or root, and not writable by group or others
    unless it has the sticky bit. A symlink to such a directory is accepted (a configured
    path may well be one); what it points at is what is checked."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise DiskTierError(f"the disk tier directory {os.fspath(path)} does not exist") from None
    if not stat.S_ISDIR(info.st_mode):
        raise DiskTierError(f"the disk tier path {os.fspath(path)} is not a directory")
    euid = os.geteuid()
    if info.st_uid not in (euid, 0):
        raise DiskTierError(
            f"the disk tier directory {os.fspath(path)} is owned by uid {info.st_uid}, neither "
            f"this user (uid {euid}) nor root; choose a directory you own"
        )
    if info.st_mode & _OTHERS_WRITE and not info.st_mode & stat.S_ISVTX:
        raise DiskTierError(
            f"the disk tier directory {os.fspath(path)} is writable by group or others (mode "
            f"{_mode(info)}) without the sticky bit, so another user could plant files in it; "
            f"run `chmod go-w {os.fspath(path)}` or choose another directory"
        )


def free_bytes(path: StrPath) -> int:
    """Bytes this (unprivileged) user may still allocate on the file system that holds
    `path` (statvfs: f_bavail * f_frsize). A `path` not created yet is measured at its
    nearest existing ancestor, so that space can be checked before anything is created."""
    current = Path(path)
    while True:
        try:
            info = os.statvfs(current)
        except FileNotFoundError:
            if current.parent == current:
                raise
            current = current.parent
            continue
        return info.f_bavail * info.f_frsize


def check_free_space(path: StrPath, needed: int, what: str) -> None:
    """DiskTierError when the file system holding `path` has fewer than `needed` free bytes
    (`needed` is what is still to be allocated: wanted sizes less `allocated_bytes`; zero or
    less always fits). The message names `what` (e.g. "at /data/kvtier-ab12"), both sizes
    and the path."""
    if needed <= 0:
        return
    free = free_bytes(path)
    if needed > free:
        raise DiskTierError(
            f"disk tier {what}: needs {needed} more bytes ({format_bytes(needed)}) in "
            f"{os.fspath(path)}, only {free} bytes ({format_bytes(free)}) free; free some "
            "space or lower the tier's capacity"
        )


def allocated_bytes(fd_or_path: int | StrPath) -> int:
    """Bytes a file occupies on disk (st_blocks * 512), by descriptor or path; a missing path
    is 0, and a symlink counts as itself, not its target. The caller subtracts it from the
    size it wants, to check only the space a preallocation will still take."""
    if isinstance(fd_or_path, int):
        return os.fstat(fd_or_path).st_blocks * 512
    try:
        return os.lstat(fd_or_path).st_blocks * 512
    except (FileNotFoundError, NotADirectoryError):
        return 0


def _fd_name(fd: int) -> str:
    """What to call the file of `fd` in a message: its path where /proc knows it."""
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/self/fd/{fd}")
    return f"file descriptor {fd}"


def preallocate(fd: int, nbytes: int, *, name: StrPath | None = None) -> bool:
    """Make the file of `fd` at least `nbytes` long with its bytes reserved on disk
    (posix_fallocate), so that a full disk shows up now, not as a failed write later. Never
    shrinks the file. Returns True when the space is reserved; False when the file system
    cannot reserve it (EOPNOTSUPP / EINVAL), in which case the file is only extended
    (sparse) with ftruncate.

    No space (ENOSPC, a quota, a file size limit) is a DiskTierError naming the file (`name`,
    else its /proc path) and the size; the file's size is then put back as it was, giving
    back what a partial allocation took beyond it."""
    if nbytes < 0:
        raise InvalidValueError(f"cannot preallocate a negative size ({nbytes} bytes)")
    if nbytes == 0:
        return True
    old_size = os.fstat(fd).st_size
    reserved = True
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as error:
            if error.errno not in _NO_FALLOCATE:
                raise
            reserved = False
            if old_size < nbytes:
                os.ftruncate(fd, nbytes)
    except OSError as error:
        if error.errno not in _NO_SPACE:
            raise
        with contextlib.suppress(OSError):
            os.ftruncate(fd, old_size)
        what = os.fspath(name) if name is not None else _fd_name(fd)
        raise DiskTierError(
            f"cannot allocate {nbytes} bytes ({format_bytes(nbytes)}) for {what}: {error.strerror}"
        ) from None
    return reserved


class CreatedFiles:
    """What an open created and grew, to leave the file system as it was if the open fails.

    Record with `add` (a new file), `add_dir` (a new directory) and `grown` (a file the open
    may make longer, with its size before); then `commit()` once the open has succeeded, or
    `rollback()` when it failed. As a context manager: commit on a normal exit, roll back on
    an exception (which still propagates).

    `rollback()` truncates the grown files back to their old size, removes the new files,
    then the new directories (deepest first, and only while empty: a directory that holds
    something not recorded here is left, and reported). It never follows a symlink, never
    truncates a file that is not the one recorded (same device and inode: a file removed
    meanwhile may have its inode number reused, which only a check of that kind cannot
    tell), and never raises: it returns what it could not undo, for the caller to log.
    """

    def __init__(self) -> None:
        self._files: dict[str, None] = {}
        self._dirs: dict[str, None] = {}
        self._grown: dict[tuple[int, int], _Grown] = {}

    @property
    def files(self) -> tuple[str, ...]:
        """The new files recorded so far (absolute paths, in order)."""
        return tuple(self._files)

    @property
    def dirs(self) -> tuple[str, ...]:
        """The new directories recorded so far (absolute paths, in order)."""
        return tuple(self._dirs)

    def add(self, path: StrPath) -> None:
        """Record a file this open created (removed by `rollback`)."""
        self._files[os.path.abspath(path)] = None

    def add_dir(self, path: StrPath) -> None:
        """Record a directory this open created (removed by `rollback` if empty by then)."""
        self._dirs[os.path.abspath(path)] = None

    def grown(self, fd_or_path: int | StrPath, old_size: int) -> None:
        """Record that the open may grow this existing file beyond `old_size` bytes (call it
        before growing). The file is identified now (device, inode; by descriptor or by path,
        not following a symlink), so that `rollback` truncates this file and no other, even
        once the descriptor is closed or reused. The first size recorded for a file wins."""
        if old_size < 0:
            raise InvalidValueError(f"old_size must be at least 0, got {old_size}")
        if isinstance(fd_or_path, int):
            info = os.fstat(fd_or_path)
            label = _fd_name(fd_or_path)
            path = "" if not os.path.isabs(label) or label.endswith(" (deleted)") else label
        else:
            info = os.lstat(fd_or_path)
            label = path = os.path.abspath(fd_or_path)
        if not stat.S_ISREG(info.st_mode):
            raise DiskTierError(f"{label} is not a regular file; cannot record it as grown")
        identity = (info.st_dev, info.st_ino)
        if identity not in self._grown:
            fd = fd_or_path if isinstance(fd_or_path, int) else None
            self._grown[identity] = _Grown(path, fd, old_size)

    def commit(self) -> None:
        """The open succeeded: forget everything (a later `rollback` does nothing)."""
        self._files.clear()
        self._dirs.clear()
        self._grown.clear()

    def rollback(self) -> list[str]:
        """Undo what was recorded (see the class); what could not be undone, one line each.
        Idempotent: the records are cleared."""
        problems: list[str] = []
        for identity, grown in self._grown.items():
            problem = grown.shrink(identity)
            if problem is not None:
                problems.append(problem)
        for path in reversed(self._files):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as error:
                problems.append(f"cannot remove {path}: {error.strerror}")
        for path in sorted(self._dirs, key=lambda item: -len(Path(item).parts)):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as error:
                problems.append(f"cannot remove the directory {path}: {error.strerror}")
        self.commit()
        return problems

    def __enter__(self) -> CreatedFiles:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if error is None:
            self.commit()
        else:
            self.rollback()


class _Grown:
    """A file `CreatedFiles` may shrink back: its path ("" if unknown), the descriptor it
    was recorded by (None for a path) and its size before the open."""

    __slots__ = ("fd", "old_size", "path")

    def __init__(self, path: str, fd: int | None, old_size: int) -> None:
        self.path = path
        self.fd = fd
        self.old_size = old_size

    def shrink(self, identity: tuple[int, int]) -> str | None:
        """Truncate the file back to its old size if it is longer and is still the file
        recorded (`identity`: device and inode); what went wrong, or None."""
        fd = -1
        opened = False
        try:
            if self.path:
                try:
                    fd = open_file(self.path, os.O_WRONLY)
                except FileNotFoundError:
                    return None  # gone: nothing left to shrink
                opened = True
            elif self.fd is not None:
                fd = self.fd
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != identity:
                return f"not shrinking {self.path or _fd_name(fd)}: it is no longer the same file"
            if info.st_size > self.old_size:
                os.ftruncate(fd, self.old_size)
            return None
        except (OSError, DiskTierError) as error:
            where = self.path or f"file descriptor {self.fd}"
            return f"cannot shrink {where} back to {self.old_size} bytes: {error}"
        finally:
            if opened:
                os.close(fd)
