"""The sweeper of a shared-fs tier: the tree kept within `max_size`, by every node at once.

A sweep takes `.sweep.lock` with a non-blocking `flock` (so one node sweeps at a time) and,
past `max_size` bytes (allocated: `st_blocks * 512`, so a sparse file weighs what it takes),
deletes the least recently used files (by modification time; a read touches its file) down
to `low_watermark` of it; files larger than any value of a block are removed first, and
temporary files left by crashed writers. A node sweeps every `interval_s`, and sooner on its
own writes: once it has written half the gap between the watermark and `max_size` since its
last sweep it starts one, and at the whole gap its writes wait for one (behind another node's
lock if need be), so N writers overshoot `max_size` by at most about N times that gap (1.1x
with two, the watermark at 0.9).

*Deleting.* The sweeper deletes only what it can attribute to the tier: regular files named
`<32 hex>.kv` (or that name's temporary pattern) in the `<2 hex>` subdirectory the name
belongs in, relative to that subdirectory's descriptor, after checking the entry is still the
file it measured; it never descends into a symlink.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from kvtier.tiers.sharedfs.tree import (
    BLOCK_NAME,
    FILE_MODE,
    SUBDIR_NAME,
    TEMP_NAME,
    BlockTree,
    Unsafe,
)

log = logging.getLogger("kvtier.tiers.sharedfs")

LOCK_FILE = ".sweep.lock"
STALE_TEMP_S = 3600.0
"""A temporary file older than this was left by a writer that died: the sweeper removes it."""
GROUP_LOCK_MODE = 0o660
ALLOCATION_UNIT = 4096
"""What a writer counts a file as taking, rounded up (a file system block)."""
LOCK_WAIT_S = 30.0
"""Longest wait of a writer's sweep for another node's sweep lock."""

_OPEN_LOCK = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def allocation(nbytes: int) -> int:
    """What a file of `nbytes` takes, counted as a writer counts it (whole 4 KiB blocks)."""
    return -(-nbytes // ALLOCATION_UNIT) * ALLOCATION_UNIT


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


class SweepCounters(Protocol):
    """The counters a sweep adds to (the storage's stats)."""

    unsafe_dirs: int
    sweeps: int
    early_sweeps: int
    swept_files: int
    swept_oversized: int


class _Entry(NamedTuple):
    mtime_ns: int
    allocated: int
    directory: str
    name: str
    dev: int
    ino: int


class Sweeper:
    """Keeps `tree` within `max_size` (see the module doc). `value_limit`: the largest value
    of a block (a larger file is never served); `run`: runs a blocking call on the storage's
    threads; `counters`: where sweeps are counted; `interval_s`: None for no background
    sweeps and no early ones (sweeps only when asked)."""

    def __init__(
        self,
        tree: BlockTree,
        *,
        max_size: int,
        low_watermark: float,
        value_limit: int,
        interval_s: float | None,
        run: Callable[[Callable[[bool], SweepReport], bool], Awaitable[SweepReport]],
        counters: SweepCounters,
    ) -> None:
        self.tree = tree
        self.max_size = max_size
        self.low_watermark = low_watermark
        self.value_limit = value_limit
        self.interval_s = interval_s
        self._run = run
        self._counters = counters
        self._gap = max(ALLOCATION_UNIT, max_size - int(max_size * low_watermark))
        """Bytes between the watermark and `max_size`: what one writer may add unswept."""
        self._unswept = 0
        """Bytes this node wrote since the start of its last sweep."""
        self.task: asyncio.Task[SweepReport] | None = None
        """The early sweep under way (or done), started by this node's writes."""
        self._task_waits = False
        self._background: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        """Sweep every `interval_s` in the background (call on the event loop)."""
        if self.interval_s is not None and self._background is None:
            self._background = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        interval = self.interval_s
        if interval is None:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep()
            except OSError as error:  # a failed sweep is tried again next time
                log.warning("shared-fs sweep of %s failed: %r", self.tree.root, error)

    async def written(self, nbytes: int) -> None:
        """Account `nbytes` this node wrote; sweep early on them (see the module doc)."""
        if nbytes and self.interval_s is not None:
            await self._keep_the_bound(nbytes)

    async def _keep_the_bound(self, written: int) -> None:
        self._unswept += written
        if self._unswept >= self._gap // 2:
            self._start_sweep(wait_for_lock=False)
        while self._unswept >= self._gap and not self._closed:
            task = self._start_sweep(wait_for_lock=True)
            waits = self._task_waits
            await asyncio.wait([task])  # never cancels the sweep (others may wait on it)
            if task.cancelled() or task.exception() is not None:
                return  # closing, or the sweep failed (logged)
            if waits and not task.result().swept:
                return  # the lock stayed taken: go on, and try again on the next write

    def _start_sweep(self, *, wait_for_lock: bool) -> asyncio.Task[SweepReport]:
        """The early sweep under way, or a new one."""
        task = self.task
        if task is None or task.done():
            self._counters.early_sweeps += 1
            task = asyncio.get_running_loop().create_task(self.sweep(wait_for_lock=wait_for_lock))
            task.add_done_callback(self._sweep_done)
            self.task = task
            self._task_waits = wait_for_lock
        return task

    def _sweep_done(self, task: asyncio.Task[SweepReport]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("shared-fs sweep of %s failed: %r", self.tree.root, task.exception())

    async def sweep(self, *, wait_for_lock: bool = False) -> SweepReport:
        """One sweep now (see the module doc); skipped when another node holds the lock
        (`wait_for_lock`: wait for it, at most LOCK_WAIT_S)."""
        counted = self._unswept
        report: SweepReport = await self._run(self.sweep_now, wait_for_lock)
        self._counters.unsafe_dirs += report.unsafe_dirs
        if report.swept:
            self._counters.sweeps += 1
            self._counters.swept_files += report.removed
            self._counters.swept_oversized += report.oversized
            self._unswept = max(0, self._unswept - counted)
        return report

    def _open_lock(self) -> int:
        """The lock file, created (group-writable with a group: every member flocks it, and
        NFS locks need a descriptor open for writing) when missing."""
        mode = FILE_MODE if self.tree.group is None else GROUP_LOCK_MODE
        try:
            lock = os.open(
                LOCK_FILE, _OPEN_LOCK | os.O_CREAT | os.O_EXCL, mode, dir_fd=self.tree.fd
            )
        except FileExistsError:
            return os.open(LOCK_FILE, _OPEN_LOCK, dir_fd=self.tree.fd)
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
            self.tree.reopen_root()
        except Unsafe as problem:
            self.tree.warn("unsafe_dir", f"{problem}: not swept")
            return None
        lock = self._open_lock()
        try:
            if not stat.S_ISREG(os.fstat(lock).st_mode):
                self.tree.warn("lock", f"{LOCK_FILE} is not a regular file: not swept")
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
        limit = self.value_limit
        now = time.time()
        files: list[_Entry] = []
        unservable: list[_Entry] = []
        with os.scandir(self.tree.fd) as entries:
            subdirectories = [entry.name for entry in entries]
        for directory in subdirectories:
            if SUBDIR_NAME.fullmatch(directory) is None:
                continue  # the lock, or not ours: left alone
            try:
                fd = self.tree.open_subdir(directory)
            except Unsafe as problem:
                report.unsafe_dirs += 1
                self.tree.warn("unsafe_dir", f"{problem}: not swept")
                continue
            if fd is None:
                continue
            directories[directory] = fd
            with os.scandir(fd) as entries:
                names = [entry.name for entry in entries]
            for name in names:
                block = BLOCK_NAME.fullmatch(name) is not None
                if not name.startswith(directory) or not (
                    block or TEMP_NAME.fullmatch(name) is not None
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

    def sweep_now(self, wait_for_lock: bool) -> SweepReport:
        """One sweep, in the calling thread (see the module doc)."""
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

    async def aclose(self) -> None:
        """Stop the background sweeps and the early one under way (no sweep starts after)."""
        self._closed = True
        tasks = [task for task in (self._background, self.task) if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
