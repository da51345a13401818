"""The file-system rules of a disk store beyond the trust rules every tier with files shares
(`kvtier.tiers.trusted`: trusted directories, no symlink followed, `FileId`): how much space
it needs, and how a failed open leaves the file system as it found it.

- **Trusted directories.** A store lives in `<directory>/kvtier-<fingerprint>/`. The store
  directory must be trusted (`directory_problem`: a real directory owned by this user and
  writable by nobody else); its parent must be owned by this user or root and writable by
  nobody else unless it has the sticky bit (like /tmp, where others cannot replace our
  entries).
- **Space.** Before a store allocates anything, the bytes it still needs (slab files, header
  file, index reserve, less what they already hold) are checked against the free space of the
  file system: a shortfall is one error naming the tier, the size needed and the size free.
- **Roll back.** `OpenFootprint` records what existed before an open; a failed open removes
  what it created and truncates what it grew, so a tier too large for its file system does
  not leave the file system full.
- **The ground it stands on.** An open store holds its files open; if they are removed (the
  directory `rm -rf`ed, a file unlinked) or replaced (a new lock file, so another process
  could open the same directory), the writes it still makes land in files nobody will ever
  read. `StoreFiles.ground_check` (files.py) tells, with a few `stat` calls, whether a held
  file is still the one at its path (`FileId`), so the store can stop reporting such writes
  as stored.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from kvtier.errors import DiskTierError
from kvtier.tiers.trusted import directory_problem

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""Errors meaning the file system, the user's quota or the file size limit cannot hold the
bytes asked for."""
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)
"""posix_fallocate errors meaning the file system cannot reserve space (not that it is full)."""


def format_bytes(count: int) -> str:
    """`count` bytes for people: 16.0 GiB, 512.0 KiB, 12 bytes."""
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def check_store_dir(path: Path) -> None:
    """DiskTierError unless `path` is a trusted directory (`directory_problem`): a real
    directory owned by this user and writable by nobody else."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise DiskTierError(f"{path} does not exist") from None
    problem = directory_problem(info)
    if problem is not None:
        raise DiskTierError(
            f"the store directory {path} {problem}; choose a directory you own, or "
            f"`chmod go-w {path}`"
        )


def check_parent_dir(path: Path) -> None:
    """DiskTierError unless the directory `path` (a store's parent, the configured tier
    directory, a symlink followed) is owned by this user or root and writable by nobody else,
    or sticky."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise DiskTierError(f"{path} does not exist") from None
    problem = directory_problem(info, root_ok=True, sticky_ok=True)
    if problem is not None:
        raise DiskTierError(
            f"the disk tier path {path} {problem}: another user could plant files there; "
            f"choose a directory you own, or `chmod go-w {path}`"
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
    """Reserve `size` bytes for the file (its size grows to at least `size`), so a full disk
    shows at open, not as a failed write later; a file system without fallocate gets a sparse
    file instead. No space (ENOSPC, a quota, a file size limit) is a DiskTierError naming the
    file, and the file's size is put back as it was, giving back what a partial allocation
    took beyond it."""
    old_size = os.fstat(fd).st_size
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as error:
            if error.errno not in _NO_FALLOCATE:
                raise
            if old_size < size:
                os.ftruncate(fd, size)
    except OSError as error:
        if error.errno not in _NO_SPACE:
            raise
        with contextlib.suppress(OSError):
            os.ftruncate(fd, old_size)
        raise DiskTierError(
            f"no space left to allocate {format_bytes(size)} for {path} ({error.strerror})"
        ) from None


class OpenFootprint:
    """What a store directory held before an open, to undo the open's changes if it fails:
    `rollback()` removes the directories and files the open created (slabs, the header file,
    the lock, the in-flight log, the index and its files) and truncates the files it grew
    back to their size. Files that existed before are never removed, and nothing is followed
    through a symlink."""

    def __init__(self, store_dir: Path, created_dirs: list[Path]) -> None:
        self.store_dir = store_dir
        self.created_dirs = list(created_dirs)
        self.sizes: dict[Path, int] = {}
        self.index_existed = False
        if store_dir not in self.created_dirs:
            index_dir = store_dir / "index"
            self.index_existed = index_dir.is_dir() and not index_dir.is_symlink()
            for directory in (store_dir, index_dir) if self.index_existed else (store_dir,):
                for path in directory.iterdir():
                    if path.is_file() and not path.is_symlink():
                        self.sizes[path] = path.stat().st_size

    def _new_files(self, directory: Path) -> list[Path]:
        with contextlib.suppress(OSError):
            return [
                path
                for path in directory.iterdir()
                if path not in self.sizes and path.is_file() and not path.is_symlink()
            ]
        return []

    def rollback(self) -> None:
        """Undo the open: best effort, never raises."""
        if self.created_dirs:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.created_dirs[0])
            return
        index_dir = self.store_dir / "index"
        for path in self._new_files(self.store_dir) + self._new_files(index_dir):
            with contextlib.suppress(OSError):
                path.unlink()
        if not self.index_existed:
            with contextlib.suppress(OSError):
                index_dir.rmdir()  # only if empty: what the open put there is gone
        for path, size in self.sizes.items():
            with contextlib.suppress(OSError):
                if not path.is_symlink() and path.stat().st_size > size:
                    os.truncate(path, size)
