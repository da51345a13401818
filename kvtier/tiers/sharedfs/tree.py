"""The directory tree of a shared-fs tier, on hostile ground: the namespace directory held
open and its 256 subdirectories, each trusted only as the trust rules say
(`kvtier.tiers.trusted.directory_problem`).

Block `key` lives at `<root>/<h[0:2]>/<h>.kv`, `h` the xxh3-128 of the key (`name_of`):
every node computes the same path. The tree trusts the namespace directory and its
subdirectories only as real directories (`lstat`, never a symlink) owned by this user (or by
the configured `group`) and writable by nobody else (group-writable only with that group). It
creates them with an explicit mode, 0700 (2770 with a group), set again with `fchmod` so a
umask (000 included) does not widen it. A namespace directory that breaks a rule is refused
when the tier opens (a DiskTierError naming the path and what is wrong: it may hold files
another user planted). The namespace directory is then held open and every path is resolved
from it (`openat`-style `dir_fd`, `O_NOFOLLOW`), so swapping it or a subdirectory for a
symlink later never sends a read, a write or a delete outside the tree: a subdirectory that
breaks a rule later raises `Unsafe`, which the storage counts as a miss or a failed store.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import re
import threading
import time
from pathlib import Path

import xxhash

from kvtier.errors import DiskTierError
from kvtier.keys import OffloadKey
from kvtier.tiers.trusted import directory_problem

log = logging.getLogger("kvtier.tiers.sharedfs")

SUFFIX = ".kv"
TEMP_MARK = ".tmp-"
DIR_MODE = 0o700
GROUP_DIR_MODE = 0o2770
"""With a group: its members share the tree (setgid: what is created in it gets the group)."""
FILE_MODE = 0o600
GROUP_FILE_MODE = 0o640
PARENT_MODE = 0o755
"""Missing ancestors of the namespace directory are created with this mode (traversable)."""

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SUBDIR_NAME = re.compile(r"[0-9a-f]{2}")
BLOCK_NAME = re.compile(r"[0-9a-f]{32}" + re.escape(SUFFIX))
TEMP_NAME = re.compile(r"[0-9a-f]{32}" + re.escape(SUFFIX + TEMP_MARK) + r"[0-9]+-[0-9]+")
_NOT_A_DIRECTORY = (errno.ENOTDIR, errno.ELOOP)
"""What `open(O_DIRECTORY | O_NOFOLLOW)` says of a symlink or a file where a directory should
be."""


def name_of(key: OffloadKey) -> str:
    """The 32 hex characters naming `key`'s file (its first two name its directory)."""
    return xxhash.xxh3_128_hexdigest(key)


def resolve_group(group: str | int | None) -> int | None:
    """The gid of a configured `group` (a name or a gid), None without one; DiskTierError
    when it does not exist or this user is not a member (it could not create files of it)."""
    if group is None:
        return None
    try:
        gid = group if isinstance(group, int) else grp.getgrnam(group).gr_gid
    except KeyError:
        raise DiskTierError(f"group {group!r} does not exist") from None
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise DiskTierError(f"this user (uid {os.geteuid()}) is not a member of group {group!r}")
    return gid


def _claim(fd: int, mode: int, gid: int | None) -> None:
    """Give a directory kvtier just created its group and exact mode (a umask narrows or, at
    000, would leave what mkdir was given: set it whole)."""
    if gid is not None:
        os.fchown(fd, -1, gid)
    os.fchmod(fd, mode)


def open_namespace_dir(root: Path, gid: int | None = None) -> int:
    """Create the namespace directory `root` if missing (its missing ancestors PARENT_MODE,
    it 0700, or 2770 of group `gid`), open it without following a symlink and check it
    (`kvtier.tiers.trusted.directory_problem`): its descriptor. DiskTierError naming the
    path and what is wrong."""
    mode = DIR_MODE if gid is None else GROUP_DIR_MODE
    created = False
    try:
        missing = [parent for parent in root.parents if not os.path.lexists(parent)]
        for parent in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(parent, PARENT_MODE)
        os.mkdir(root, mode)
        created = True
    except FileExistsError:
        pass
    except OSError as error:
        raise DiskTierError(f"cannot create {root}: {error.strerror or error}") from None
    try:
        fd = os.open(root, OPEN_DIR)
    except OSError as error:
        if error.errno in _NOT_A_DIRECTORY:
            raise DiskTierError(
                f"the shared-fs directory {root} is a symlink or not a directory; refusing it "
                "(the tier never follows a symlinked directory: remove it, or configure the "
                "directory it points to as `path`)"
            ) from None
        raise DiskTierError(f"cannot open {root}: {error.strerror or error}") from None
    try:
        if created:
            _claim(fd, mode, gid)
        problem = directory_problem(os.fstat(fd), gid=gid)
    except OSError as error:
        os.close(fd)
        raise DiskTierError(f"cannot set up {root}: {error.strerror or error}") from None
    if problem is not None:
        os.close(fd)
        raise DiskTierError(
            f"the shared-fs directory {root} {problem}; refusing to use it (another user could "
            f"plant or change blocks in it): remove it to let kvtier create it, or `chown` it "
            f"to this user and `chmod go-w` it"
            + ("" if gid is None else " (or give it the configured group)")
        )
    return fd


class Unsafe(Exception):
    """A directory of the tree broke a rule (`directory_problem`) after the tier opened."""


class Warnings:
    """Logs each kind of trouble at most once per `interval_s`, with how many were not logged
    since: a directory full of planted files must not flood the log."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}

    def warn(self, kind: str, message: str) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last[0] < self.interval_s:
                self._last[kind] = (last[0], last[1] + 1)
                return
            self._last[kind] = (now, 0)
        more = f" ({last[1]} more since the last report)" if last is not None and last[1] else ""
        log.warning("%s%s", message, more)


class BlockTree:
    """The namespace directory `root` (created if missing, and checked: DiskTierError when it
    breaks the rules), held open, and its subdirectories, opened from it and checked on
    every use. `group`: the gid sharing the tree (`resolve_group`), None for this user only."""

    def __init__(self, root: Path, group: int | None, warnings: Warnings) -> None:
        self.root = root
        self.group = group
        self.dir_mode = DIR_MODE if group is None else GROUP_DIR_MODE
        self.file_mode = FILE_MODE if group is None else GROUP_FILE_MODE
        self._root = os.fspath(root)
        self._warnings = warnings
        self._lock = threading.Lock()
        self._retired: list[int] = []
        self.fd = open_namespace_dir(root, group)
        """The namespace directory, held open: every path is resolved from it."""

    def path_of(self, key: OffloadKey) -> Path:
        """Where block `key` lives (every node computes the same path)."""
        name = name_of(key)
        return Path(f"{self._root}/{name[:2]}/{name}{SUFFIX}")

    def warn(self, kind: str, message: str) -> None:
        """Log a trouble of the tree, at most once a minute per kind."""
        self._warnings.warn(kind, f"shared-fs {self.root}: {message}")

    def reopen_root(self) -> bool:
        """Open the namespace directory again if the one held was removed (`rm -rf` of the
        cache while nodes run); whether it was. The old descriptor is kept until close (a
        thread may still use it). Raises Unsafe when the new one breaks the rules."""
        with self._lock:
            if os.fstat(self.fd).st_nlink != 0:
                return False
            try:
                fd = open_namespace_dir(self.root, self.group)
            except DiskTierError as error:
                raise Unsafe(str(error)) from None
            self._retired.append(self.fd)
            self.fd = fd
            log.warning("shared-fs %s was removed while open; created it again", self.root)
            return True

    def _checked_dir(self, fd: int, name: str, *, created: bool) -> int:
        """`fd` (subdirectory `name`, just opened) once it passes `directory_problem`; closed
        and Unsafe when it does not."""
        try:
            if created:
                _claim(fd, self.dir_mode, self.group)
            problem = directory_problem(os.fstat(fd), gid=self.group)
        except BaseException:
            os.close(fd)
            raise
        if problem is not None:
            os.close(fd)
            raise Unsafe(f"{self.root}/{name} {problem}")
        return fd

    def open_subdir(self, name: str) -> int | None:
        """Subdirectory `name` of the tree, checked; None when it does not exist (yet).
        Unsafe when it is a symlink, a file, not ours or writable by others."""
        try:
            fd = os.open(name, OPEN_DIR, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno in _NOT_A_DIRECTORY:
                raise Unsafe(f"{self.root}/{name} is a symlink or not a directory") from None
            raise
        return self._checked_dir(fd, name, created=False)

    def make_subdir(self, name: str) -> int:
        """`open_subdir`, creating it (mode 0700 / 2770, exactly) when missing."""
        for attempt in range(2):
            fd = self.open_subdir(name)
            if fd is not None:
                return fd
            try:
                os.mkdir(name, self.dir_mode, dir_fd=self.fd)
            except FileExistsError:
                continue  # another node made it: open theirs (checked)
            except FileNotFoundError:
                if attempt == 0 and self.reopen_root():
                    continue
                raise
            try:
                fd = os.open(name, OPEN_DIR, dir_fd=self.fd)
            except OSError as error:
                if error.errno in _NOT_A_DIRECTORY:
                    raise Unsafe(f"{self.root}/{name} was replaced while created") from None
                raise
            return self._checked_dir(fd, name, created=True)
        raise OSError(errno.ENOENT, "cannot create the block directory", f"{self.root}/{name}")

    def stat_keys(self, keys: list[OffloadKey]) -> tuple[list[os.stat_result | None], int]:
        """`lstat` of each key's file (None: none there, or its directory is unsafe), and how
        many directories were unsafe. One subdirectory descriptor per directory asked."""
        found: list[os.stat_result | None] = [None] * len(keys)
        by_dir: dict[str, list[tuple[int, str]]] = {}
        for i, key in enumerate(keys):
            name = name_of(key)
            by_dir.setdefault(name[:2], []).append((i, name + SUFFIX))
        unsafe = 0
        for directory, files in by_dir.items():
            try:
                fd = self.open_subdir(directory)
            except Unsafe as problem:
                unsafe += 1
                self.warn("unsafe_dir", f"{problem}: its blocks are misses")
                continue
            if fd is None:
                continue
            try:
                for i, file in files:
                    with contextlib.suppress(FileNotFoundError):
                        found[i] = os.stat(file, dir_fd=fd, follow_symlinks=False)
            finally:
                os.close(fd)
        return found, unsafe

    def close(self) -> None:
        """Close the namespace directory (and those it replaced)."""
        for fd in [self.fd, *self._retired]:
            with contextlib.suppress(OSError):
                os.close(fd)
