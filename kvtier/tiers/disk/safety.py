"""The file-system rules of a disk store: whose directories it trusts, how it opens files,
how much space it needs, and how a failed open leaves the file system as it found it.

- **Trusted directories.** A store lives in `<directory>/kvtier-<fingerprint>/`. The store
  directory must be a real directory (not a symlink) owned by this user and writable by
  nobody else; its parent must be owned by this user or root and writable by nobody else
  unless it has the sticky bit (like /tmp, where others cannot replace our entries). Run as
  root on a directory others can write, kvtier would otherwise follow symlinks they planted
  and serve a store they built.
- **No symlinks followed.** Every file is opened with O_NOFOLLOW | O_CLOEXEC; a directory
  kvtier creates is created 0700 (intermediate ones too), and kvtier never chmods a file or
  directory it did not create.
- **Space.** Before a store allocates anything, the bytes it still needs (slab files, header
  file, index reserve, less what they already hold) are checked against the free space of the
  file system: a shortfall is one error naming the tier, the size needed and the size free.
- **Roll back.** `OpenFootprint` records what existed before an open; a failed open removes
  what it created and truncates what it grew, so a tier too large for its file system does
  not leave the file system full.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path

from kvtier.errors import DiskTierError

O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
DIR_MODE = 0o700
FILE_MODE = 0o600


def format_bytes(count: int) -> str:
    """`count` bytes for people: 16.0 GiB, 512.0 KiB, 12 bytes."""
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def open_file(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """`os.open` with O_NOFOLLOW | O_CLOEXEC; a symlink at `path` is a DiskTierError."""
    try:
        return os.open(path, flags | O_NOFOLLOW | O_CLOEXEC, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise DiskTierError(f"{path} is a symlink; refusing to follow it") from None
        raise


def create_or_open(path: Path) -> int:
    """Open `path` read-write, creating it with exactly FILE_MODE if missing (a file kvtier
    did not create keeps its mode); a symlink is refused."""
    try:
        fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return open_file(path, os.O_RDWR)
    try:
        os.fchmod(fd, FILE_MODE)  # a umask may have narrowed it
    except BaseException:
        os.close(fd)
        raise
    return fd


def refuse_symlink(path: Path) -> None:
    """DiskTierError if `path` is a symlink (for files a library opens, e.g. LMDB's)."""
    if path.is_symlink():
        raise DiskTierError(f"{path} is a symlink; refusing to follow it")


def _owner_problem(path: Path, info: os.stat_result, *, allow_root: bool) -> str | None:
    owners = {os.geteuid(), 0} if allow_root else {os.geteuid()}
    if info.st_uid not in owners:
        return f"is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    return None


def make_dirs(path: Path, *, create_parents: bool) -> list[Path]:
    """Create `path` (and, with `create_parents`, its missing ancestors), each 0700; the
    directories created, outermost first. Without `create_parents` a missing parent is a
    DiskTierError (a mistyped path should not silently grow a directory tree)."""
    missing: list[Path] = []
    current = path
    while not current.exists() and not current.is_symlink():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    if len(missing) > 1 and not create_parents:
        raise DiskTierError(
            f"cannot create {path}: its parent directory {path.parent} does not exist (is the "
            "path mistyped? create the parent first)"
        )
    created: list[Path] = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(directory, DIR_MODE)  # ours: a umask may have narrowed it
        created.append(directory)
    return created


def check_store_dir(path: Path) -> None:
    """DiskTierError unless `path` is a real directory owned by this user and writable by
    nobody else."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise DiskTierError(f"{path} does not exist") from None
    if stat.S_ISLNK(info.st_mode):
        raise DiskTierError(f"{path} is a symlink; refusing to follow it")
    if not stat.S_ISDIR(info.st_mode):
        raise DiskTierError(f"{path} is not a directory")
    problem = _owner_problem(path, info, allow_root=False)
    if problem is not None:
        raise DiskTierError(f"the store directory {path} {problem}; choose a directory you own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DiskTierError(
            f"the store directory {path} is writable by others (mode "
            f"{stat.S_IMODE(info.st_mode):o}); `chmod go-w {path}`, or choose another directory"
        )


def check_parent_dir(path: Path) -> None:
    """DiskTierError unless the directory `path` (a store's parent, the configured tier
    directory) is owned by this user or root and writable by nobody else, or sticky."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise DiskTierError(f"{path} does not exist") from None
    if not stat.S_ISDIR(info.st_mode):
        raise DiskTierError(f"the disk tier path {path} is not a directory")
    problem = _owner_problem(path, info, allow_root=True)
    if problem is not None:
        raise DiskTierError(f"the disk tier path {path} {problem}; choose a directory you own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise DiskTierError(
            f"the disk tier path {path} is writable by others (mode "
            f"{stat.S_IMODE(info.st_mode):o}) without the sticky bit: another user could plant "
            f"files there; `chmod go-w {path}`, or choose another directory"
        )


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged user may still allocate on the file system holding `path`."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def allocated_bytes(path: Path) -> int:
    """Bytes the file at `path` occupies on disk (0 when it does not exist)."""
    try:
        return os.lstat(path).st_blocks * 512
    except (FileNotFoundError, NotADirectoryError):
        return 0


def check_free_space(path: Path, needed: int, what: str) -> None:
    """DiskTierError when the file system holding `path` has fewer than `needed` free bytes."""
    if needed <= 0:
        return
    free = free_bytes(path)
    if needed > free:
        raise DiskTierError(
            f"{what}: needs {format_bytes(needed)} more on the file system of {path}, only "
            f"{format_bytes(free)} free; free some space or lower the tier's capacity"
        )


def preallocate(fd: int, size: int, path: Path) -> None:
    """Reserve `size` bytes for the file (its size grows to at least `size`); a file system
    without fallocate gets a sparse file instead. ENOSPC is a DiskTierError naming the file."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise DiskTierError(
                f"no space left to allocate {format_bytes(size)} for {path}"
            ) from None
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)


class OpenFootprint:
    """What a store directory held before an open, to undo the open's changes if it fails:
    `rollback()` removes the directories and files the open created and truncates the
    files it grew back to their size."""

    def __init__(self, store_dir: Path, created_dirs: list[Path]) -> None:
        self.store_dir = store_dir
        self.created_dirs = list(created_dirs)
        self.sizes: dict[Path, int] = {}
        if store_dir not in self.created_dirs:
            for path in store_dir.iterdir():
                if path.is_file() and not path.is_symlink():
                    self.sizes[path] = path.stat().st_size
            index = store_dir / "index" / "data.mdb"
            if index.is_file() and not index.is_symlink():
                self.sizes[index] = index.stat().st_size

    def rollback(self) -> None:
        """Undo the open: best effort, never raises."""
        if self.created_dirs:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.created_dirs[0])
            return
        with contextlib.suppress(OSError):
            for path in sorted(self.store_dir.glob("slab-*.bin")):
                if path not in self.sizes and not path.is_symlink():
                    path.unlink()
        for path, size in self.sizes.items():
            with contextlib.suppress(OSError):
                if not path.is_symlink() and path.stat().st_size > size:
                    os.truncate(path, size)
