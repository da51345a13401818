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
- **Bounded.** The sweeper (sweeper.py) keeps the tree within `max_size`: the least
  recently used files go first, by one node at a time, and a node's own writes start a sweep
  early (N writers overshoot `max_size` by at most about N times the watermark's gap).
- File I/O runs on a bounded thread pool (`max_workers`), never on the event loop; `aclose`
  waits for it at most `close_timeout_s` (a hung mount keeps a thread, not the process).

**Trust model: the shared directory is hostile ground.** Anyone who can write in `<path>`
(every user, on a world-writable mount), and any node of the fleet, may plant files,
directories, symlinks, FIFOs or hard links anywhere they can write, and race the tier. So:

- *Directories* (tree.py). The namespace directory and its 256 subdirectories are trusted
  only as real directories owned by this user (or the configured `group`) and writable by
  nobody else (`kvtier.tiers.trusted`); the namespace directory is held open and every path
  resolved from it without following a symlink, so a subdirectory that breaks a rule later
  is a miss or a failed store for its blocks, counted (`stats.unsafe_dirs`) and logged.
- *Files.* A block file is opened `O_NOFOLLOW | O_NONBLOCK` and served only if `fstat` says
  it is a regular file with one link and no larger than a block's value: a symlink, FIFO,
  socket, device, hard link or oversized file is a miss (counted under `stats.problems`,
  never read whole, never blocking), and a FIFO cannot stall the tier. Temporary files are
  created `O_EXCL | O_NOFOLLOW`, 0600 (0640 with a group). Bytes are trusted only once the
  value verifies (`ValueCodec`: key, namespace, length, and the keyed MAC of the tier's key).
- *Deleting.* The sweeper deletes only files it can attribute to the tier (sweeper.py).
  `forget` deletes nothing: a file a reader found bad may be another node's good block (a
  node with a newer key), so deleting on a reader's word would let whoever can make reads
  fail wipe the fleet's blocks. The file found bad is a miss on this node (until a new file
  is at its path), and the next store of its key replaces it by rename.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import itertools
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from kvtier.config_fields import parse_size
from kvtier.errors import DiskTierError, StorageClosedError
from kvtier.keys import MAX_KEY_BYTES, OffloadKey
from kvtier.namespaces import namespace_fingerprint
from kvtier.tiers.codec import BlockCodec
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
from kvtier.tiers.sharedfs.sweeper import Sweeper, SweepReport, allocation
from kvtier.tiers.sharedfs.tree import (
    SUFFIX,
    TEMP_MARK,
    BlockTree,
    Unsafe,
    Warnings,
    name_of,
    open_namespace_dir,
    resolve_group,
)
from kvtier.tiers.storage import HostBuffer, ReadFailure
from kvtier.tiers.trusted import FileVersion, file_version

log = logging.getLogger("kvtier.tiers.sharedfs")

T = TypeVar("T")

DEFAULT_CLOSE_TIMEOUT_S = 5.0
MAX_FORGOTTEN = 65536
"""Files found bad that a node remembers not to read again (least recently found first out)."""

_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_TEMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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


class _ReadOutcome(NamedTuple):
    failure: ReadFailure | None
    problem: Problem | None = None
    bad: FileVersion | None = None
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
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_size = max_size
        self.low_watermark = low_watermark
        self.fsync = fsync
        self.values = ValueCodec(namespace, block_size, codec or BlockCodec(), auth)
        self.stats = SharedFSStats()
        self.group = group
        self.close_timeout_s = close_timeout_s
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="kvtier-sharedfs")
        self._inflight: set[Future[Any]] = set()
        self._inflight_lock = threading.Lock()
        self._cache = ProbeCache(
            self._exists, on_answer=self._answered, negative_ttl_s=negative_ttl_s
        )
        self._temp_ids = itertools.count(time.monotonic_ns())
        self.touch_after_s = 60.0
        """A read marks its file used (mtime) when the mark is older than this."""
        self._forgotten: OrderedDict[OffloadKey, FileVersion] = OrderedDict()
        """Files found bad, by key: not read again while they are at the key's path."""
        self._forgotten_lock = threading.Lock()
        self._gates: set[_CopyGate] = set()
        self._closed = False
        self.tree = BlockTree(root, group, Warnings())  # last: nothing to undo if it fails
        """The namespace directory and its subdirectories (tree.py)."""
        self.sweeper = Sweeper(
            self.tree,
            max_size=max_size,
            low_watermark=low_watermark,
            value_limit=self.values.max_value_bytes(MAX_KEY_BYTES),
            interval_s=sweep_interval_s,
            run=self._run,
            counters=self.stats,
        )

    @property
    def persistent(self) -> bool:
        return True

    def path_of(self, key: OffloadKey) -> Path:
        """Where block `key` lives (every node computes the same path)."""
        return self.tree.path_of(key)

    def start_sweeper(self) -> None:
        """Sweep every `sweep_interval_s` in the background (call on the event loop)."""
        self.sweeper.start()

    async def sweep(self, *, wait_for_lock: bool = False) -> SweepReport:
        """One sweep now (sweeper.py); skipped when another node holds the lock
        (`wait_for_lock`: wait for it, at most LOCK_WAIT_S)."""
        return await self.sweeper.sweep(wait_for_lock=wait_for_lock)

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
            if self._forgotten.get(key) == file_version(info):
                return FileProblem.FORGOTTEN
        return None

    def _forget_file(self, key: OffloadKey, file: FileVersion) -> None:
        with self._forgotten_lock:
            self._forgotten[key] = file
            self._forgotten.move_to_end(key)
            while len(self._forgotten) > MAX_FORGOTTEN:
                self._forgotten.popitem(last=False)

    # -- BlockStorage ------------------------------------------------------------------------

    def probe(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        return self._cache.probe(keys)

    async def _exists(self, keys: list[OffloadKey]) -> list[bool]:
        found, unsafe = await self._run(self.tree.stat_keys, keys)
        self.stats.unsafe_dirs += unsafe
        return [
            info is not None and self._file_problem(key, info) is None
            for key, info in zip(keys, found, strict=True)
        ]

    def _write_one(self, key: OffloadKey, block: HostBuffer) -> _WriteOutcome:
        name = name_of(key)
        try:
            directory = self.tree.make_subdir(name[:2])
        except Unsafe as problem:
            self.tree.warn("unsafe_dir", f"{problem}: stores of its blocks fail")
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
            fd = os.open(temp, _CREATE_TEMP, self.tree.file_mode, dir_fd=directory)
            created = True
            try:
                if self.group is not None:
                    os.fchmod(fd, self.tree.file_mode)  # group-readable whatever the umask
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
        return _WriteOutcome(None, allocated=allocation(size))

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
        await self.sweeper.written(written)
        return results

    def _read_one(self, key: OffloadKey, buffer: HostBuffer, gate: _CopyGate) -> _ReadOutcome:
        name = name_of(key)
        try:
            directory = self.tree.open_subdir(name[:2])
        except Unsafe as problem:
            self.tree.warn("unsafe_dir", f"{problem}: its blocks are misses")
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
                bad = None if problem is FileProblem.FORGOTTEN else file_version(info)
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
            bad = None if found in (None, ValueProblem.MISSING) else file_version(info)
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
            self.tree.warn(problem, f"the file of key {key.hex()[:24]} is {problem.value}: a miss")

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
        found, _ = await self._run(self.tree.stat_keys, keys)
        for key, info in zip(keys, found, strict=True):
            if info is not None:
                self._forget_file(key, file_version(info))

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
        await self.sweeper.aclose()
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
        self.tree.close()

    def describe(self) -> str:
        """Where the values live, for `Hierarchy.tiers`: the shared directory."""
        return f"shared directory {self.root}"

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
        else config.num_blocks * allocation(context.block_size + HEADER_BYTES + 64)
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
