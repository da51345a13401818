"""`SharedFSStorage`: a tier of one file per block under a directory many hosts mount (NFS,
CephFS, Lustre, or a local directory).

- **Content-addressed paths.** Block `key` of namespace `ns` lives at
  `<path>/kvtier-<fingerprint of ns>/<h[0:2]>/<h>.kv`, `h` the xxh3-128 of the key (256
  directories: few to create, a few thousand files each per million blocks):
  every node computes the same path, and the value's header (`ValueCodec`) binds the key, so
  two keys that meet on one path read as a miss, never as each other's data.
- **Atomic writes.** A block is written to a temporary file in its directory, optionally
  fsync'ed, then renamed over its path: a reader sees the old value, the new one or none,
  never a torn one, and two nodes writing the same block are harmless (the last rename wins,
  both values are the block). The rename also replaces whatever else was at the path (a
  damaged, forged or planted file): a bad file heals with the next store of its key.
- **Bounded.** A sweep takes `.sweep.lock` with a non-blocking `flock` (so one node sweeps at
  a time) and, past `max_size` bytes (allocated: `st_blocks * 512`, so a sparse file weighs
  what it takes), deletes the least recently used files (by modification time; a read
  touches its file) down to `low_watermark` of it; files larger than any value of a block
  are removed first, and temporary files left by crashed writers. A node sweeps every
  `sweep_interval_s`, and sooner on its own writes: once it has written half the gap between
  the watermark and `max_size` since its last sweep it starts one, and at the whole gap its
  writes wait for one (behind another node's lock if need be), so N writers overshoot
  `max_size` by at most about N times that gap (1.1x with two, the watermark at 0.9).
- File I/O runs on a bounded thread pool (`max_workers`), never on the event loop; `aclose`
  waits for it at most `close_timeout_s` (a hung mount keeps a thread, not the process).

**Trust model: the shared directory is hostile ground.** Anyone who can write in `<path>`
(every user, on a world-writable mount), and any node of the fleet, may plant files,
directories, symlinks, FIFOs or hard links anywhere they can write, and race the tier. So:

- *Directories.* The tier trusts the namespace directory and its 256 subdirectories only as
  real directories (`lstat`, never a symlink) owned by this user (or by the configured
  `group`) and writable by nobody else (group-writable only with that group). It creates
  them with an explicit mode, 0700 (2770 with a group), set again with `fchmod` so a umask
  (000 included) does not widen it. A namespace directory that breaks a rule is refused when
  the tier opens (a DiskTierError naming the path and what is wrong: it may hold files
  another user planted). The namespace directory is then held open and every path is
  resolved from it (`openat`-style `dir_fd`, `O_NOFOLLOW`), so swapping it or a subdirectory
  for a symlink later never sends a read, a write or a delete outside the tree: a
  subdirectory that breaks a rule later is a miss or a failed store for its blocks, counted
  (`stats.unsafe_dirs`) and logged.
- *Files.* A block file is opened `O_NOFOLLOW | O_NONBLOCK` and served only if `fstat` says
  it is a regular file with one link and no larger than a block's value: a symlink, FIFO,
  socket, device, hard link or oversized file is a miss (counted under `stats.problems`,
  never read whole, never blocking), and a FIFO cannot stall the tier. Temporary files are
  created `O_EXCL | O_NOFOLLOW`, 0600 (0640 with a group). Bytes are trusted only once the
  value verifies (`ValueCodec`: key, namespace, length, and the keyed MAC of the tier's key).
- *Deleting.* The sweeper deletes only what it can attribute to the tier: regular files named
  `<32 hex>.kv` (or that name's temporary pattern) in the `<2 hex>` subdirectory the name
  belongs in, relative to that subdirectory's descriptor, after checking the entry is still
  the file it measured; it never descends into a symlink. `forget` deletes nothing: a file a
  reader found bad may be another node's good block (a node with a newer key), so deleting
  on a reader's word would let whoever can make reads fail wipe the fleet's blocks. The file
  found bad is a miss on this node (until a new file is at its path), and the next store of
  its key replaces it by rename.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import fcntl
import grp
import itertools
import logging
import os
import re
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import xxhash

from kvtier.config_fields import parse_size
from kvtier.errors import DiskTierError, StorageClosedError
from kvtier.keys import MAX_KEY_BYTES, OffloadKey
from kvtier.namespaces import namespace_fingerprint
from kvtier.tiers.disk.codec import BlockCodec
from kvtier.tiers.keyed import KeyedStorage, ProbeCache
from kvtier.tiers.registry import TierContext
from kvtier.tiers.shared.auth import ValueAuth, auth_from_config
from kvtier.tiers.shared.value import (
    HEADER_BYTES,
    ValueCodec,
    ValueProblem,
    check_block_buffers,
    record_problem,
    reported_problems,
)
from kvtier.tiers.sharedfs.kind import SharedFSTierConfig
from kvtier.tiers.storage import HostBuffer, ReadFailure

log = logging.getLogger("kvtier.tiers.sharedfs")

T = TypeVar("T")

SUFFIX = ".kv"
TEMP_MARK = ".tmp-"
LOCK_FILE = ".sweep.lock"
STALE_TEMP_S = 3600.0
"""A temporary file older than this was left by a writer that died: the sweeper removes it."""
DIR_MODE = 0o700
GROUP_DIR_MODE = 0o2770
"""With a group: its members share the tree (setgid: what is created in it gets the group)."""
FILE_MODE = 0o600
GROUP_FILE_MODE = 0o640
GROUP_LOCK_MODE = 0o660
PARENT_MODE = 0o755
"""Missing ancestors of the namespace directory are created with this mode (traversable)."""
ALLOCATION_UNIT = 4096
"""What a writer counts a file as taking, rounded up (a file system block)."""
DEFAULT_CLOSE_TIMEOUT_S = 5.0
LOCK_WAIT_S = 30.0
"""Longest wait of a writer's sweep for another node's sweep lock."""
MAX_FORGOTTEN = 65536
"""Files found bad that a node remembers not to read again (least recently found first out)."""

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_TEMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_LOCK = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SUBDIR_NAME = re.compile(r"[0-9a-f]{2}")
_BLOCK_NAME = re.compile(r"[0-9a-f]{32}" + re.escape(SUFFIX))
_TEMP_NAME = re.compile(r"[0-9a-f]{32}" + re.escape(SUFFIX + TEMP_MARK) + r"[0-9]+-[0-9]+")
_NOT_A_DIRECTORY = (errno.ENOTDIR, errno.ELOOP)
"""What `open(O_DIRECTORY | O_NOFOLLOW)` says of a symlink or a file where a directory should
be."""

FileId = tuple[int, int, int, int, int]
"""A file's identity and version: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns); a new
file at a path (a rename over it) or a change to it (ctime) makes another."""


class FileProblem(enum.StrEnum):
    """Why a file at a block's path was not read (counted in `stats.problems`; each a miss).
    An oversized one is `ValueProblem.OVERSIZED`."""

    SYMLINK = "symlink"
    NOT_REGULAR = "not_regular"
    """A FIFO, socket, device or directory."""
    LINKED = "linked"
    """A hard link (more than one name): not a file kvtier wrote."""
    UNSAFE_DIR = "unsafe_dir"
    """Its subdirectory is a symlink, not ours, or writable by others."""
    FORGOTTEN = "forgotten"
    """The file this node found bad before (`forget`, or a failed check): not read again."""


Problem = ValueProblem | FileProblem


def _allocation(nbytes: int) -> int:
    return -(-nbytes // ALLOCATION_UNIT) * ALLOCATION_UNIT


def _file_id(info: os.stat_result) -> FileId:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _name_of(key: OffloadKey) -> str:
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


def directory_problem(info: os.stat_result, gid: int | None) -> str | None:
    """What makes a directory (its `fstat`/`lstat`) unsafe to keep blocks in, or None: it must
    be a real directory owned by this user or the configured group `gid`, writable by nobody
    else (group-writable only with that group)."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    uid = os.geteuid()
    ours = info.st_uid == uid or (gid is not None and info.st_gid == gid)
    if not ours:
        owners = f"this user (uid {uid})" + ("" if gid is None else f" or group {gid}")
        return f"is owned by uid {info.st_uid} and group {info.st_gid}, not by {owners}"
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_IWOTH:
        return f"is writable by every user (mode {mode:o})"
    if mode & stat.S_IWGRP and (gid is None or info.st_gid != gid):
        configured = "no group is configured" if gid is None else f"not group {gid}"
        return f"is writable by its group {info.st_gid} (mode {mode:o}), {configured}"
    return None


def _claim(fd: int, mode: int, gid: int | None) -> None:
    """Give a directory kvtier just created its group and exact mode (a umask narrows or, at
    000, would leave what mkdir was given: set it whole)."""
    if gid is not None:
        os.fchown(fd, -1, gid)
    os.fchmod(fd, mode)


def open_namespace_dir(root: Path, gid: int | None = None) -> int:
    """Create the namespace directory `root` if missing (its missing ancestors PARENT_MODE,
    it 0700, or 2770 of group `gid`), open it without following a symlink and check it
    (`directory_problem`): its descriptor. DiskTierError naming the path and what is wrong."""
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
        fd = os.open(root, _OPEN_DIR)
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
        problem = directory_problem(os.fstat(fd), gid)
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


class _Unsafe(Exception):
    """A directory of the tree broke a rule (`directory_problem`) after the tier opened."""


@dataclass(slots=True)
class SweepReport:
    """What one sweep found and did (bytes are allocated bytes)."""

    swept: bool = False
    """False when another node held the lock (it sweeps instead)."""
    files: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    removed: int = 0
    oversized: int = 0
    """Files larger than a block's value, or hard links (never served), removed first."""
    stale_temps: int = 0
    ignored: int = 0
    """Entries the tier cannot attribute to itself (another name, not a regular file):
    left alone."""
    unsafe_dirs: int = 0


@dataclass(slots=True)
class SharedFSStats:
    """What the tier did (each failure a miss or a failed store)."""

    write_errors: int = 0
    read_errors: int = 0
    problems: dict[str, int] = field(default_factory=dict)
    """Values and files not served, by `ValueProblem` / `FileProblem`."""
    unsafe_dirs: int = 0
    """Operations refused because a subdirectory broke the rules (a symlink, not ours)."""
    sweeps: int = 0
    early_sweeps: int = 0
    """Sweeps this node's own writes started (see the module doc)."""
    swept_files: int = 0
    swept_oversized: int = 0


class _Entry(NamedTuple):
    mtime_ns: int
    allocated: int
    directory: str
    name: str
    dev: int
    ino: int


class _ReadOutcome(NamedTuple):
    failure: ReadFailure | None
    problem: Problem | None = None
    bad: FileId | None = None
    """The file found bad (not to be read again while it is at the path)."""


class _WriteOutcome(NamedTuple):
    error: OSError | None
    unsafe: bool = False
    allocated: int = 0


class _CopyGate:
    """Lets the threads of one `read` copy into the caller's buffers only while the caller
    still waits: once shut (the read was cancelled, or the storage closed), a read that ends
    late copies nothing (its buffer may be someone else's by then)."""

    def __init__(self) -> None:
        self._done = threading.Condition()
        self._open = True
        self._copying = 0

    def enter(self) -> bool:
        with self._done:
            if self._open:
                self._copying += 1
            return self._open

    def leave(self) -> None:
        with self._done:
            self._copying -= 1
            if self._copying == 0:
                self._done.notify_all()

    def shut(self, timeout_s: float = 1.0) -> None:
        """No copy from now on; wait (briefly: a copy is a memcpy) for those under way."""
        with self._done:
            self._open = False
            self._done.wait_for(lambda: self._copying == 0, timeout_s)


class _Warnings:
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


def _read_up_to(fd: int, size: int) -> memoryview:
    """At most `size` bytes from the start of `fd` (fewer if it ends first)."""
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        count = os.readv(fd, [view[got:]])
        if count == 0:
            break
        got += count
    return view[:got]


class SharedFSStorage(KeyedStorage):
    """Blocks as files under `root` (the namespace's directory); see the module doc.

    The constructor creates `root` if missing and opens it (DiskTierError when it breaks the
    rules of the module doc). `group`: the gid sharing the tree (`resolve_group`), None for
    this user only. `close_timeout_s`: how long `aclose` waits for file I/O under way."""

    def __init__(
        self,
        root: Path,
        *,
        block_size: int,
        num_blocks: int,
        namespace: str,
        max_size: int,
        low_watermark: float = 0.9,
        fsync: bool = False,
        codec: BlockCodec | None = None,
        max_workers: int = 8,
        sweep_interval_s: float | None = 10.0,
        negative_ttl_s: float = 0.2,
        auth: ValueAuth | None = None,
        group: int | None = None,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
    ) -> None:
        self.root = root
        self._root = os.fspath(root)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_size = max_size
        self.low_watermark = low_watermark
        self.fsync = fsync
        self.values = ValueCodec(namespace, block_size, codec or BlockCodec(), auth)
        self.stats = SharedFSStats()
        self.group = group
        self._dir_mode = DIR_MODE if group is None else GROUP_DIR_MODE
        self._file_mode = FILE_MODE if group is None else GROUP_FILE_MODE
        self._root_lock = threading.Lock()
        self._retired_fds: list[int] = []
        self.close_timeout_s = close_timeout_s
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="kvtier-sharedfs")
        self._inflight: set[Future[Any]] = set()
        self._inflight_lock = threading.Lock()
        self._cache = ProbeCache(
            self._exists, on_answer=self._answered, negative_ttl_s=negative_ttl_s
        )
        self._sweep_interval_s = sweep_interval_s
        self._sweep_gap = max(ALLOCATION_UNIT, max_size - int(max_size * low_watermark))
        """Bytes between the watermark and `max_size`: what one writer may add unswept."""
        self._unswept = 0
        """Bytes this node wrote since the start of its last sweep."""
        self._sweep_task: asyncio.Task[SweepReport] | None = None
        self._sweep_task_waits = False
        self._temp_ids = itertools.count(time.monotonic_ns())
        self.touch_after_s = 60.0
        """A read marks its file used (mtime) when the mark is older than this."""
        self._forgotten: OrderedDict[OffloadKey, FileId] = OrderedDict()
        """Files found bad, by key: not read again while they are at the key's path."""
        self._forgotten_lock = threading.Lock()
        self._gates: set[_CopyGate] = set()
        self._warnings = _Warnings()
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        self._root_fd = open_namespace_dir(root, group)  # last: nothing to undo if it fails
        """The namespace directory, held open: every path is resolved from it."""

    @property
    def persistent(self) -> bool:
        return True

    def path_of(self, key: OffloadKey) -> Path:
        """Where block `key` lives (every node computes the same path)."""
        name = _name_of(key)
        return Path(f"{self._root}/{name[:2]}/{name}{SUFFIX}")

    async def _run(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on the tier's bounded thread pool (tracked, so `aclose` can wait
        for what is under way, and only so long)."""
        if self._closed:
            raise StorageClosedError(f"{self!r} is closed")
        future = self._pool.submit(function, *args)
        with self._inflight_lock:
            self._inflight.add(future)
        future.add_done_callback(self._settled)
        return await asyncio.wrap_future(future)

    def _settled(self, future: Future[Any]) -> None:
        with self._inflight_lock:
            self._inflight.discard(future)

    def start_sweeper(self) -> None:
        """Sweep every `sweep_interval_s` in the background (call on the event loop)."""
        if self._sweep_interval_s is not None and self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        interval = self._sweep_interval_s
        if interval is None:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep()
            except OSError as error:  # a failed sweep is tried again next time
                log.warning("shared-fs sweep of %s failed: %r", self.root, error)

    # -- the tree ------------------------------------------------------------------------------

    def _warn(self, kind: str, message: str) -> None:
        self._warnings.warn(kind, f"shared-fs {self.root}: {message}")

    def _reopen_root(self) -> bool:
        """Open the namespace directory again if the one held was removed (`rm -rf` of the
        cache while nodes run); whether it was. The old descriptor is kept until close (a
        thread may still use it). Raises _Unsafe when the new one breaks the rules."""
        with self._root_lock:
            if os.fstat(self._root_fd).st_nlink != 0:
                return False
            try:
                fd = open_namespace_dir(self.root, self.group)
            except DiskTierError as error:
                raise _Unsafe(str(error)) from None
            self._retired_fds.append(self._root_fd)
            self._root_fd = fd
            log.warning("shared-fs %s was removed while open; created it again", self.root)
            return True

    def _checked_dir(self, fd: int, name: str, *, created: bool) -> int:
        """`fd` (subdirectory `name`, just opened) once it passes `directory_problem`; closed
        and _Unsafe when it does not."""
        try:
            if created:
                _claim(fd, self._dir_mode, self.group)
            problem = directory_problem(os.fstat(fd), self.group)
        except BaseException:
            os.close(fd)
            raise
        if problem is not None:
            os.close(fd)
            raise _Unsafe(f"{self.root}/{name} {problem}")
        return fd

    def _open_subdir(self, name: str) -> int | None:
        """Subdirectory `name` of the tree, checked; None when it does not exist (yet).
        _Unsafe when it is a symlink, a file, not ours or writable by others."""
        try:
            fd = os.open(name, _OPEN_DIR, dir_fd=self._root_fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno in _NOT_A_DIRECTORY:
                raise _Unsafe(f"{self.root}/{name} is a symlink or not a directory") from None
            raise
        return self._checked_dir(fd, name, created=False)

    def _make_subdir(self, name: str) -> int:
        """`_open_subdir`, creating it (mode 0700 / 2770, exactly) when missing."""
        for attempt in range(2):
            fd = self._open_subdir(name)
            if fd is not None:
                return fd
            try:
                os.mkdir(name, self._dir_mode, dir_fd=self._root_fd)
            except FileExistsError:
                continue  # another node made it: open theirs (checked)
            except FileNotFoundError:
                if attempt == 0 and self._reopen_root():
                    continue
                raise
            try:
                fd = os.open(name, _OPEN_DIR, dir_fd=self._root_fd)
            except OSError as error:
                if error.errno in _NOT_A_DIRECTORY:
                    raise _Unsafe(f"{self.root}/{name} was replaced while created") from None
                raise
            return self._checked_dir(fd, name, created=True)
        raise OSError(errno.ENOENT, "cannot create the block directory", f"{self.root}/{name}")

    def _file_problem(self, key: OffloadKey, info: os.stat_result) -> Problem | None:
        """Why the file `info` describes is not served as `key`'s block, or None."""
        if stat.S_ISLNK(info.st_mode):
            return FileProblem.SYMLINK
        if not stat.S_ISREG(info.st_mode):
            return FileProblem.NOT_REGULAR
        if info.st_nlink != 1:
            return FileProblem.LINKED
        if info.st_size > self.values.max_value_bytes(len(key)):
            return ValueProblem.OVERSIZED
        with self._forgotten_lock:
            if self._forgotten.get(key) == _file_id(info):
                return FileProblem.FORGOTTEN
        return None

    def _forget_file(self, key: OffloadKey, file: FileId) -> None:
        with self._forgotten_lock:
            self._forgotten[key] = file
            self._forgotten.move_to_end(key)
            while len(self._forgotten) > MAX_FORGOTTEN:
                self._forgotten.popitem(last=False)

    def _stat_keys(self, keys: Sequence[OffloadKey]) -> tuple[list[os.stat_result | None], int]:
        """`lstat` of each key's file (None: none there, or its directory is unsafe), and how
        many directories were unsafe. One subdirectory descriptor per directory asked."""
        found: list[os.stat_result | None] = [None] * len(keys)
        by_dir: dict[str, list[tuple[int, str]]] = {}
        for i, key in enumerate(keys):
            name = _name_of(key)
            by_dir.setdefault(name[:2], []).append((i, name + SUFFIX))
        unsafe = 0
        for directory, files in by_dir.items():
            try:
                fd = self._open_subdir(directory)
            except _Unsafe as problem:
                unsafe += 1
                self._warn("unsafe_dir", f"{problem}: its blocks are misses")
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

    # -- BlockStorage ------------------------------------------------------------------------

    def probe(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        return self._cache.probe(keys)

    async def _exists(self, keys: list[OffloadKey]) -> list[bool]:
        found, unsafe = await self._run(self._stat_keys, keys)
        self.stats.unsafe_dirs += unsafe
        return [
            info is not None and self._file_problem(key, info) is None
            for key, info in zip(keys, found, strict=True)
        ]

    def _write_one(self, key: OffloadKey, block: HostBuffer) -> _WriteOutcome:
        name = _name_of(key)
        try:
            directory = self._make_subdir(name[:2])
        except _Unsafe as problem:
            self._warn("unsafe_dir", f"{problem}: stores of its blocks fail")
            return _WriteOutcome(OSError(errno.EPERM, f"refusing to write there: {problem}"), True)
        except OSError as error:
            return _WriteOutcome(error)
        final = name + SUFFIX
        temp = f"{final}{TEMP_MARK}{os.getpid()}-{next(self._temp_ids)}"
        created = False
        try:
            head, stored = self.values.encode_parts(key, block)
            parts = [memoryview(head), memoryview(stored).cast("B")]
            size = sum(part.nbytes for part in parts)
            fd = os.open(temp, _CREATE_TEMP, self._file_mode, dir_fd=directory)
            created = True
            try:
                if self.group is not None:
                    os.fchmod(fd, self._file_mode)  # group-readable whatever the umask
                while parts:
                    written = os.writev(fd, parts)
                    while parts and written >= parts[0].nbytes:
                        written -= parts[0].nbytes
                        parts.pop(0)
                    if parts:
                        parts[0] = parts[0][written:]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, final, src_dir_fd=directory, dst_dir_fd=directory)
            created = False
            if self.fsync:
                os.fsync(directory)
        except OSError as error:
            if created:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=directory)
            return _WriteOutcome(error)
        finally:
            os.close(directory)
        return _WriteOutcome(None, allocated=_allocation(size))

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        check_block_buffers(buffers, self.block_size)
        outcomes = await asyncio.gather(
            *(
                self._run(self._write_one, key, buffer)
                for key, buffer in zip(keys, buffers, strict=True)
            )
        )
        results: list[OSError | None] = []
        written = 0
        for key, outcome in zip(keys, outcomes, strict=True):
            results.append(outcome.error)
            if outcome.error is None:
                written += outcome.allocated
                with self._forgotten_lock:
                    self._forgotten.pop(key, None)  # a new file is at its path
            else:
                self.stats.write_errors += 1
                self.stats.unsafe_dirs += outcome.unsafe
            self._cache.note(key, outcome.error is None)
        if written and self._sweep_interval_s is not None:
            await self._keep_the_bound(written)
        return results

    def _read_one(self, key: OffloadKey, buffer: HostBuffer, gate: _CopyGate) -> _ReadOutcome:
        name = _name_of(key)
        try:
            directory = self._open_subdir(name[:2])
        except _Unsafe as problem:
            self._warn("unsafe_dir", f"{problem}: its blocks are misses")
            return _ReadOutcome(ReadFailure.NOT_INDEXED, FileProblem.UNSAFE_DIR)
        except OSError:
            return _ReadOutcome(ReadFailure.IO_ERROR)
        if directory is None:
            return _ReadOutcome(ReadFailure.NOT_INDEXED, ValueProblem.MISSING)
        try:
            return self._read_file(directory, name + SUFFIX, key, buffer, gate)
        finally:
            os.close(directory)

    def _read_file(
        self, directory: int, name: str, key: OffloadKey, buffer: HostBuffer, gate: _CopyGate
    ) -> _ReadOutcome:
        try:
            fd = os.open(name, _OPEN_FILE, dir_fd=directory)
        except FileNotFoundError:
            return _ReadOutcome(ReadFailure.NOT_INDEXED, ValueProblem.MISSING)
        except OSError as error:
            if error.errno == errno.ELOOP:
                return _ReadOutcome(ReadFailure.NOT_INDEXED, FileProblem.SYMLINK)
            if error.errno in (errno.ENXIO, errno.EAGAIN, errno.EISDIR):
                return _ReadOutcome(ReadFailure.NOT_INDEXED, FileProblem.NOT_REGULAR)
            return _ReadOutcome(ReadFailure.IO_ERROR)
        try:
            info = os.fstat(fd)
            problem = self._file_problem(key, info)
            if problem is not None:
                bad = None if problem is FileProblem.FORGOTTEN else _file_id(info)
                return _ReadOutcome(ReadFailure.NOT_INDEXED, problem, bad)
            value = _read_up_to(fd, info.st_size)  # at most one value: checked above
            if not gate.enter():
                return _ReadOutcome(ReadFailure.IO_ERROR)  # nobody waits for it any more
            try:
                failure, found = self.values.decode_into(key, value, buffer)
            finally:
                gate.leave()
            if failure is None and time.time() - info.st_mtime > self.touch_after_s:
                # Recently used: the sweeper keeps it longer (not on every read: a metadata
                # write per read is costly on a network filesystem).
                with contextlib.suppress(OSError):
                    os.utime(fd)
            bad = None if found in (None, ValueProblem.MISSING) else _file_id(info)
            return _ReadOutcome(failure, found, bad)
        except OSError:
            return _ReadOutcome(ReadFailure.IO_ERROR)
        finally:
            os.close(fd)

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        gate = _CopyGate()
        self._gates.add(gate)
        try:
            outcomes = await asyncio.gather(
                *(
                    self._run(self._read_one, key, buffer, gate)
                    for key, buffer in zip(keys, buffers, strict=True)
                )
            )
        finally:
            self._gates.discard(gate)
            gate.shut()  # a thread that finishes after a cancellation copies nothing
        results: list[ReadFailure | None] = []
        for key, outcome in zip(keys, outcomes, strict=True):
            results.append(outcome.failure)
            if outcome.failure is ReadFailure.IO_ERROR:
                self.stats.read_errors += 1
            if outcome.problem is not None:
                self._count(outcome.problem, key)
                self._cache.note(key, False)
            if outcome.bad is not None:
                self._forget_file(key, outcome.bad)
        return results

    def _count(self, problem: Problem, key: OffloadKey) -> None:
        if isinstance(problem, ValueProblem):
            record_problem(self.stats.problems, problem, key, f"shared-fs {self.root}")
            return
        self.stats.problems[problem] = self.stats.problems.get(problem, 0) + 1
        if problem is not FileProblem.FORGOTTEN:
            self._warn(problem, f"the file of key {key.hex()[:24]} is {problem.value}: a miss")

    async def forget(self, keys: Sequence[OffloadKey]) -> None:
        """Keys a reader found bad: this node answers "absent" for them and does not read the
        file now at their path again (a new file there is read), so the next store of such a
        key rewrites it by rename. Deletes nothing (see the module doc: a bad file may be
        another node's good block, and a reader's word must not delete the fleet's blocks)."""
        keys = list(keys)
        for key in keys:
            self._cache.note(key, False)
        with self._forgotten_lock:
            keys = [key for key in keys if key not in self._forgotten]  # found bad by a read
        if not keys or self._closed:
            return
        found, _ = await self._run(self._stat_keys, keys)
        for key, info in zip(keys, found, strict=True):
            if info is not None:
                self._forget_file(key, _file_id(info))

    # -- the sweeper -------------------------------------------------------------------------

    async def _keep_the_bound(self, written: int) -> None:
        """Account `written` bytes; sweep early on them (see the module doc)."""
        self._unswept += written
        if self._unswept >= self._sweep_gap // 2:
            self._start_sweep(wait_for_lock=False)
        while self._unswept >= self._sweep_gap and not self._closed:
            task = self._start_sweep(wait_for_lock=True)
            waits = self._sweep_task_waits
            await asyncio.wait([task])  # never cancels the sweep (others may wait on it)
            if task.cancelled() or task.exception() is not None:
                return  # closing, or the sweep failed (logged)
            if waits and not task.result().swept:
                return  # the lock stayed taken: go on, and try again on the next write

    def _start_sweep(self, *, wait_for_lock: bool) -> asyncio.Task[SweepReport]:
        """The early sweep under way, or a new one."""
        task = self._sweep_task
        if task is None or task.done():
            self.stats.early_sweeps += 1
            task = asyncio.get_running_loop().create_task(self.sweep(wait_for_lock=wait_for_lock))
            task.add_done_callback(self._sweep_done)
            self._sweep_task = task
            self._sweep_task_waits = wait_for_lock
        return task

    def _sweep_done(self, task: asyncio.Task[SweepReport]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("shared-fs sweep of %s failed: %r", self.root, task.exception())

    async def sweep(self, *, wait_for_lock: bool = False) -> SweepReport:
        """One sweep now (see the module doc); skipped when another node holds the lock
        (`wait_for_lock`: wait for it, at most LOCK_WAIT_S)."""
        counted = self._unswept
        report: SweepReport = await self._run(self._sweep, wait_for_lock)
        self.stats.unsafe_dirs += report.unsafe_dirs
        if report.swept:
            self.stats.sweeps += 1
            self.stats.swept_files += report.removed
            self.stats.swept_oversized += report.oversized
            self._unswept = max(0, self._unswept - counted)
        return report

    def _open_lock(self) -> int:
        """The lock file, created (group-writable with a group: every member flocks it, and
        NFS locks need a descriptor open for writing) when missing."""
        mode = FILE_MODE if self.group is None else GROUP_LOCK_MODE
        try:
            lock = os.open(
                LOCK_FILE, _OPEN_LOCK | os.O_CREAT | os.O_EXCL, mode, dir_fd=self._root_fd
            )
        except FileExistsError:
            return os.open(LOCK_FILE, _OPEN_LOCK, dir_fd=self._root_fd)
        try:
            os.fchmod(lock, mode)
        except BaseException:
            os.close(lock)
            raise
        return lock

    def _lock(self, wait: bool) -> int | None:
        """The sweep lock's descriptor, flock'ed; None when another node holds it (or the lock
        file is not a regular file)."""
        try:
            self._reopen_root()
        except _Unsafe as problem:
            self._warn("unsafe_dir", f"{problem}: not swept")
            return None
        lock = self._open_lock()
        try:
            if not stat.S_ISREG(os.fstat(lock).st_mode):
                self._warn("lock", f"{LOCK_FILE} is not a regular file: not swept")
                os.close(lock)
                return None
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return lock
                except BlockingIOError:
                    if not wait or self._closed or time.monotonic() > deadline:
                        os.close(lock)
                        return None
                    time.sleep(0.01)
        except BaseException:
            os.close(lock)
            raise

    def _scan(
        self, report: SweepReport, directories: dict[str, int]
    ) -> tuple[list[_Entry], list[_Entry]]:
        """The block files of the tree (servable ones, and oversized or hard-linked ones);
        stale temporary files removed on the way. Opens each subdirectory into
        `directories`."""
        limit = self.values.max_value_bytes(MAX_KEY_BYTES)
        now = time.time()
        files: list[_Entry] = []
        unservable: list[_Entry] = []
        with os.scandir(self._root_fd) as entries:
            subdirectories = [entry.name for entry in entries]
        for directory in subdirectories:
            if _SUBDIR_NAME.fullmatch(directory) is None:
                continue  # the lock, or not ours: left alone
            try:
                fd = self._open_subdir(directory)
            except _Unsafe as problem:
                report.unsafe_dirs += 1
                self._warn("unsafe_dir", f"{problem}: not swept")
                continue
            if fd is None:
                continue
            directories[directory] = fd
            with os.scandir(fd) as entries:
                names = [entry.name for entry in entries]
            for name in names:
                block = _BLOCK_NAME.fullmatch(name) is not None
                if not name.startswith(directory) or not (
                    block or _TEMP_NAME.fullmatch(name) is not None
                ):
                    report.ignored += 1
                    continue
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(info.st_mode):
                    report.ignored += 1
                    continue
                entry = _Entry(
                    info.st_mtime_ns,
                    info.st_blocks * 512,
                    directory,
                    name,
                    info.st_dev,
                    info.st_ino,
                )
                if not block:
                    if now - info.st_mtime > STALE_TEMP_S and self._remove(fd, entry):
                        report.stale_temps += 1
                    continue
                if info.st_size > limit or info.st_nlink != 1:
                    unservable.append(entry)
                else:
                    files.append(entry)
        return files, unservable

    def _remove(self, directory: int, entry: _Entry) -> bool:
        """Unlink `entry` if it is still the regular file the scan measured (not a file
        renamed over it since: the newest block)."""
        try:
            info = os.stat(entry.name, dir_fd=directory, follow_symlinks=False)
            if (info.st_dev, info.st_ino) != (entry.dev, entry.ino) or not stat.S_ISREG(
                info.st_mode
            ):
                return False
            os.unlink(entry.name, dir_fd=directory)
        except OSError:
            return False  # gone already (another node), or not ours to remove
        return True

    def _sweep(self, wait_for_lock: bool) -> SweepReport:
        report = SweepReport()
        lock = self._lock(wait_for_lock)
        if lock is None:
            return report
        directories: dict[str, int] = {}
        try:
            report.swept = True
            files, unservable = self._scan(report, directories)
            total = sum(entry.allocated for entry in files + unservable)
            report.files = len(files) + len(unservable)
            report.bytes_before = total
            for entry in unservable:  # never served: first out, whatever the total
                if self._remove(directories[entry.directory], entry):
                    report.oversized += 1
                    total -= entry.allocated
            if total > self.max_size:
                target = int(self.max_size * self.low_watermark)
                files.sort()
                for entry in files:
                    if total <= target:
                        break
                    if self._remove(directories[entry.directory], entry):
                        total -= entry.allocated
                        report.removed += 1
            report.bytes_after = total
            return report
        finally:
            for fd in directories.values():
                os.close(fd)
            os.close(lock)  # releases the flock

    def value_problems(self) -> dict[str, int]:
        """Values and files read and not served, by `ValueProblem` / `FileProblem` (see
        `BlockStorage`)."""
        return reported_problems(self.stats.problems)

    def unencrypted_served(self) -> int:
        """MAC-only values served by this `encrypt = true` tier (see `BlockStorage`)."""
        return self.values.unencrypted_served

    async def aclose(self) -> None:
        """Stop the sweeper and the lookups, wait for file I/O under way at most
        `close_timeout_s` (a read stuck on a hung mount is left to its thread: it copies
        nothing into a caller's buffer any more), then release the pool and the directory."""
        if self._closed:
            return
        self._closed = True
        for gate in list(self._gates):
            gate.shut()
        tasks = [task for task in (self._sweeper, self._sweep_task) if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self._cache.aclose()
        with self._inflight_lock:
            pending = [future for future in self._inflight if not future.done()]
        stuck: set[asyncio.Future[Any]] = set()
        if pending:
            _, stuck = await asyncio.wait(
                [asyncio.wrap_future(future) for future in pending], timeout=self.close_timeout_s
            )
        self._pool.shutdown(wait=False, cancel_futures=True)
        if stuck:
            log.warning(
                "shared-fs %s: %d file operations still running %.1f s after close (a hung "
                "mount?); left to their threads",
                self.root,
                len(stuck),
                self.close_timeout_s,
            )
            return  # the directory descriptors stay open: those threads may still use them
        for fd in [self._root_fd, *self._retired_fds]:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __repr__(self) -> str:
        return f"SharedFSStorage({self.root})"


async def open_sharedfs_tier(config: SharedFSTierConfig, context: TierContext) -> SharedFSStorage:
    """The opener of `medium = "shared-fs"`."""
    namespace = context.namespace
    auth = auth_from_config(config, namespace)  # the keys first: nothing created without them
    root = config.path / f"kvtier-{namespace_fingerprint(namespace)}"
    try:
        group = resolve_group(config.group)
        # Created and checked off the event loop (the storage opens it again, at once).
        os.close(await asyncio.to_thread(open_namespace_dir, root, group))
    except DiskTierError as error:
        raise DiskTierError(f"tier {config.name!r}: {error}") from None
    max_size = (
        parse_size(config.max_size)
        if config.max_size is not None
        else config.num_blocks * _allocation(context.block_size + HEADER_BYTES + 64)
    )
    storage = SharedFSStorage(
        root,
        block_size=context.block_size,
        num_blocks=config.num_blocks,
        namespace=namespace,
        max_size=max_size,
        low_watermark=config.sweep_low_watermark,
        fsync=config.fsync,
        codec=BlockCodec(config.compression, config.zstd_level),
        max_workers=config.max_workers,
        sweep_interval_s=config.sweep_interval_s,
        negative_ttl_s=config.negative_ttl_ms / 1000,
        auth=auth,
        group=group,
    )
    storage.start_sweeper()
    return storage
