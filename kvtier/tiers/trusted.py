"""The file-system trust rules of every tier that keeps files (disk, shared-fs): which
directories it trusts, how it opens files, and how it tells that a file is still the one it
opened.

- **Trusted directories** (`directory_problem`, the one rule): a real directory (never a
  symlink) owned by this user (or root, for a parent; or the configured group, for a shared
  tree), writable by nobody else (by its group only when that is the configured group; by
  others only with the sticky bit where `sticky_ok`, as /tmp, where others cannot replace our
  entries). Run as root on a directory others can write, kvtier would otherwise follow
  symlinks they planted and serve a store they built.
- **No symlinks followed.** Files are opened with O_NOFOLLOW | O_CLOEXEC (`open_file`); a
  directory kvtier creates gets an explicit mode whatever the umask (`make_dirs`: 0700), and
  kvtier never chmods a file or directory it did not create.
- **Identity.** `FileId` (st_dev, st_ino) names a file: a held file whose path now names
  another was removed or replaced. `FileVersion` adds what a change to it changes (size,
  mtime, ctime): a shared-fs tier remembers the version of a file it found bad.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import NamedTuple

from kvtier.errors import DiskTierError

O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
DIR_MODE = 0o700
FILE_MODE = 0o600

FileId = tuple[int, int]
"""A file's identity: (st_dev, st_ino)."""


class FileVersion(NamedTuple):
    """A file's identity and version: a new file at a path (a rename over it) or a change to
    it (its ctime) makes another."""

    file: FileId
    size: int
    mtime_ns: int
    ctime_ns: int


def file_id_of(info: os.stat_result) -> FileId:
    """The identity of the file `info` describes."""
    return info.st_dev, info.st_ino


def file_id(path: str | os.PathLike[str]) -> FileId:
    """The identity of the file at `path` (not following a symlink); raises OSError."""
    return file_id_of(os.stat(path, follow_symlinks=False))


def file_version(info: os.stat_result) -> FileVersion:
    """The identity and version of the file `info` describes."""
    return FileVersion(file_id_of(info), info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def directory_problem(
    info: os.stat_result,
    *,
    gid: int | None = None,
    root_ok: bool = False,
    sticky_ok: bool = False,
) -> str | None:
    """What makes a directory (its `lstat` or `fstat`) untrusted, in words after its path
    ("is a symlink", "is owned by uid ..."), or None. It must be a real directory owned by
    this user (also root with `root_ok`, also group `gid` when one is configured) and
    writable by nobody else: group-writable only when its group is `gid`, others-writable
    only with the sticky bit and `sticky_ok`."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    uid = os.geteuid()
    owners = {uid, 0} if root_ok else {uid}
    if info.st_uid not in owners and (gid is None or info.st_gid != gid):
        who = f"this user (uid {uid})" + (" or root" if root_ok else "")
        who += "" if gid is None else f" or group {gid}"
        return f"is owned by uid {info.st_uid} and group {info.st_gid}, not by {who}"
    mode = stat.S_IMODE(info.st_mode)
    if sticky_ok and mode & stat.S_ISVTX:
        return None
    sticky = " without the sticky bit" if sticky_ok else ""
    if mode & stat.S_IWOTH:
        return f"is writable by every user (mode {mode:o}){sticky}"
    if mode & stat.S_IWGRP and (gid is None or info.st_gid != gid):
        configured = "no group is configured" if gid is None else f"not group {gid}"
        return f"is writable by its group {info.st_gid} (mode {mode:o}){sticky}, {configured}"
    return None


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
