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
  both values are the block).
- **Bounded.** A background sweeper (`sweep_interval_s`) takes `.sweep.lock` with a
  non-blocking `flock` (so one node sweeps at a time) and, past `max_size` bytes, deletes the
  least recently used files (by modification time; a read touches its file) down to
  `low_watermark` of it, and temporary files left by crashed writers.
- File I/O runs on a bounded thread pool (`max_workers`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import xxhash

from kvtier.config import parse_size
from kvtier.errors import DiskTierError
from kvtier.keys import OffloadKey
from kvtier.namespaces import namespace_fingerprint
from kvtier.tiers.disk.codec import BlockCodec
from kvtier.tiers.keyed import KeyedStorage, ProbeCache
from kvtier.tiers.registry import TierContext
from kvtier.tiers.remote.config import SharedFSTierConfig
from kvtier.tiers.remote.value import (
    HEADER_BYTES,
    ValueCodec,
    ValueProblem,
    check_block_buffers,
    record_problem,
)
from kvtier.tiers.storage import HostBuffer, ReadFailure

log = logging.getLogger("kvtier.tiers.sharedfs")

T = TypeVar("T")

SUFFIX = ".kv"
TEMP_MARK = ".tmp-"
LOCK_FILE = ".sweep.lock"
STALE_TEMP_S = 3600.0
"""A temporary file older than this was left by a writer that died: the sweeper removes it."""


@dataclass(slots=True)
class SweepReport:
    """What one sweep found and did."""

    swept: bool = False
    """False when another node held the lock (it sweeps instead)."""
    files: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    removed: int = 0
    stale_temps: int = 0


@dataclass(slots=True)
class SharedFSStats:
    """What the tier did (each failure a miss or a failed store)."""

    write_errors: int = 0
    read_errors: int = 0
    problems: dict[str, int] = field(default_factory=dict)
    sweeps: int = 0
    swept_files: int = 0


class SharedFSStorage(KeyedStorage):
    """Blocks as files under `root` (the namespace's directory); see the module doc."""

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
    ) -> None:
        self.root = root
        self._root = os.fspath(root)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_size = max_size
        self.low_watermark = low_watermark
        self.fsync = fsync
        self.values = ValueCodec(namespace, block_size, codec or BlockCodec())
        self.stats = SharedFSStats()
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="kvtier-sharedfs")
        self._cache = ProbeCache(
            self._exists, on_answer=self._answered, negative_ttl_s=negative_ttl_s
        )
        self._sweep_interval_s = sweep_interval_s
        self._temp_ids = itertools.count(time.monotonic_ns())
        self.touch_after_s = 60.0
        """A read marks its file used (mtime) when the mark is older than this."""
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def persistent(self) -> bool:
        return True

    def path_of(self, key: OffloadKey) -> Path:
        """Where block `key` lives (every node computes the same path)."""
        return Path(self._path(key))

    def _path(self, key: OffloadKey) -> str:
        name = xxhash.xxh3_128_hexdigest(key)
        return f"{self._root}/{name[:2]}/{name}{SUFFIX}"

    async def _run(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on the tier's bounded thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)

    def start_sweeper(self) -> None:
        """Sweep every `sweep_interval_s` in the background (call on the event loop)."""
        if self._sweep_interval_s is not None and self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        assert self._sweep_interval_s is not None
        while True:
            await asyncio.sleep(self._sweep_interval_s)
            try:
                await self.sweep()
            except OSError as error:  # a failed sweep is tried again next time
                log.warning("shared-fs sweep of %s failed: %r", self.root, error)

    # -- BlockStorage ------------------------------------------------------------------------

    def probe(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        return self._cache.probe(keys)

    async def _exists(self, keys: list[OffloadKey]) -> list[bool]:
        paths = [self._path(key) for key in keys]
        return await self._run(lambda: [os.path.isfile(path) for path in paths])

    def _write_one(self, key: OffloadKey, block: HostBuffer) -> OSError | None:
        path = self._path(key)
        head, stored = self.values.encode_parts(key, block)
        temp = f"{path}{TEMP_MARK}{os.getpid()}-{next(self._temp_ids)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            try:
                fd = os.open(temp, flags, 0o600)
            except FileNotFoundError:  # the block's directory is new
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(temp, flags, 0o600)
            try:
                parts = [memoryview(head), memoryview(stored).cast("B")]
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
            os.replace(temp, path)
            if self.fsync:
                directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return error
        return None

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        check_block_buffers(buffers, self.block_size)
        results: list[OSError | None] = await asyncio.gather(
            *(self._run(self._write_one, key, buffer) for key, buffer in zip(keys, buffers,
                                                                             strict=True))
        )
        for key, result in zip(keys, results, strict=True):
            if result is not None:
                self.stats.write_errors += 1
            self._cache.note(key, result is None)
        return results

    def _read_one(
        self, key: OffloadKey, buffer: HostBuffer
    ) -> tuple[ReadFailure | None, ValueProblem | None]:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return ReadFailure.NOT_INDEXED, ValueProblem.MISSING
        except OSError:
            self.stats.read_errors += 1
            return ReadFailure.IO_ERROR, None
        try:
            info = os.fstat(fd)
            value = os.read(fd, min(info.st_size, HEADER_BYTES + 256 + self.block_size + 64))
            result = self.values.decode_into(key, value, buffer)
            if result[0] is None and time.time() - info.st_mtime > self.touch_after_s:
                # Recently used: the sweeper keeps it longer (not on every read: a metadata
                # write per read is costly on a network filesystem).
                with contextlib.suppress(OSError):
                    os.utime(fd)
            return result
        except OSError:
            self.stats.read_errors += 1
            return ReadFailure.IO_ERROR, None
        finally:
            os.close(fd)

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        outcomes = await asyncio.gather(
            *(self._run(self._read_one, key, buffer) for key, buffer in zip(keys, buffers,
                                                                            strict=True))
        )
        results: list[ReadFailure | None] = []
        for key, (failure, problem) in zip(keys, outcomes, strict=True):
            results.append(failure)
            if problem is not None:
                record_problem(self.stats.problems, problem, key, f"shared-fs {self.root}")
                self._cache.note(key, False)
        return results

    async def forget(self, keys: Sequence[OffloadKey]) -> None:
        """Remove files found bad (never good ones: other nodes share them)."""
        for key in keys:
            self._cache.forget(key)
        paths = [self.path_of(key) for key in keys]

        def remove() -> None:
            for path in paths:
                with contextlib.suppress(OSError):
                    path.unlink()

        await self._run(remove)

    # -- the sweeper -------------------------------------------------------------------------

    async def sweep(self) -> SweepReport:
        """One sweep now (see the module doc); skipped when another node holds the lock."""
        report: SweepReport = await self._run(self._sweep)
        if report.swept:
            self.stats.sweeps += 1
            self.stats.swept_files += report.removed
        return report

    def _sweep(self) -> SweepReport:
        report = SweepReport()
        self.root.mkdir(parents=True, exist_ok=True)
        lock = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return report  # another node is sweeping
            report.swept = True
            files: list[tuple[float, int, str]] = []
            now = time.time()
            for directory, _, names in os.walk(self.root):
                for name in names:
                    path = os.path.join(directory, name)
                    try:
                        info = os.lstat(path)
                    except FileNotFoundError:
                        continue
                    if TEMP_MARK in name:
                        if now - info.st_mtime > STALE_TEMP_S:
                            with contextlib.suppress(OSError):
                                os.unlink(path)
                                report.stale_temps += 1
                        continue
                    if name.endswith(SUFFIX):
                        files.append((info.st_mtime, info.st_size, path))
            total = sum(size for _, size, _ in files)
            report.files = len(files)
            report.bytes_before = total
            if total > self.max_size:
                target = int(self.max_size * self.low_watermark)
                files.sort()
                for _, size, path in files:
                    if total <= target:
                        break
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass  # another node removed it (or is rewriting it)
                    except OSError:
                        continue
                    total -= size
                    report.removed += 1
            report.bytes_after = total
            return report
        finally:
            os.close(lock)  # releases the flock

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self._cache.aclose()
        self._pool.shutdown(wait=True)

    def __repr__(self) -> str:
        return f"SharedFSStorage({self.root})"


async def open_sharedfs_tier(config: SharedFSTierConfig, context: TierContext) -> SharedFSStorage:
    """The opener of `medium = "shared-fs"`."""
    namespace = context.namespace
    root = config.path / f"kvtier-{namespace_fingerprint(namespace)}"
    try:
        await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    except OSError as error:
        raise DiskTierError(
            f"tier {config.name!r}: cannot create {root}: {error.strerror or error}"
        ) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise DiskTierError(f"tier {config.name!r}: {root} is not writable by this user")
    max_size = (
        parse_size(config.max_size)
        if config.max_size is not None
        else config.num_blocks * (context.block_size + HEADER_BYTES + 64)
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
    )
    storage.start_sweeper()
    return storage

