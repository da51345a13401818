"""The calls a disk store queues on its write lane (lane.py, log_lane.py): a `WriteJob` per
`write`, a `ForgetJob` per `forget`, the queue that drains them in groups on the lane's one
thread (`JobQueue`), and how their futures are settled once their group is done."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import StorageClosedError
from kvtier.keys import OffloadKey
from kvtier.tiers.storage import HostBuffer

Results = list[OSError | None]


@dataclass(eq=False, slots=True)
class WriteJob:
    """One `write` call (validated); its future (None for `write_now`) gets one result per
    block."""

    keys: list[OffloadKey]
    slots: list[int]
    buffers: list[HostBuffer]
    future: asyncio.Future[Results] | None


@dataclass(eq=False, slots=True)
class ForgetJob:
    """One `forget` call (validated, keys distinct)."""

    keys: list[OffloadKey]
    future: asyncio.Future[None]


Job = WriteJob | ForgetJob
Settlement = tuple["asyncio.Future[Any]", Any, BaseException | None]


def settle(settlements: list[Settlement]) -> None:
    """Resolve the futures of a group (on their event loop); a caller that was cancelled
    meanwhile has a done future, which is left alone."""
    for future, result, error in settlements:
        if future.done():
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


def take_group(queue: deque[Job], max_bytes: int, *, distinct_slots: bool) -> list[Job]:
    """Pop the jobs of the next group from `queue`: queued jobs in order, up to `max_bytes`
    of blocks (at least one job), stopping before a job that touches a key the group already
    touches (and, with `distinct_slots`, a slot), so that merging never reorders two
    operations on one key or slot. Jobs cancelled while queued are dropped (a caller
    cancelled after this point finds its group run anyway). A job's keys and slots go into
    the group's sets only when another job is queued behind it: a lone job, the common case
    when calls do not queue, builds no sets (~60 us of a 1024-block call before its first
    write, docs/BENCHMARKS.md, "Log writes on a fast device, third round")."""
    jobs: list[Job] = []
    slots: set[int] = set()
    keys: set[OffloadKey] = set()
    nbytes = 0
    while queue:
        job = queue[0]
        # the slots a write would add to the group (none for a forget, or when slots may repeat)
        touched = job.slots if distinct_slots and isinstance(job, WriteJob) else ()
        size = sum(b.nbytes for b in job.buffers) if isinstance(job, WriteJob) else 0
        if jobs and (
            nbytes + size > max_bytes
            or not keys.isdisjoint(job.keys)
            or not slots.isdisjoint(touched)
        ):
            break
        queue.popleft()
        if job.future is not None and job.future.cancelled():
            continue
        jobs.append(job)
        nbytes += size
        if queue:  # (the caller holds the queue's lock: nothing joins it meanwhile)
            keys.update(job.keys)
            slots.update(touched)
    return jobs


def settle_by_loop(settlements: list[Settlement]) -> None:
    """Settle a group's futures with one callback per event loop (not one wake-up per
    call); a loop already closed has nobody waiting and is skipped."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Settlement]] = {}
    for settlement in settlements:
        by_loop.setdefault(settlement[0].get_loop(), []).append(settlement)
    for loop, some in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, some)


def _nothing() -> None:
    return None


class JobQueue:
    """The queue of one write lane and its one thread: `submit` queues a job and starts a
    drain task unless one is queued or running; the task takes groups (`take_group`, under
    the queue's lock) and runs each (`run_group`, outside it) until the queue is empty,
    calling `before_group` before each. `_closed` is set under the lock too, so nothing is
    queued after `close()` drains."""

    def __init__(
        self,
        where: Path,
        thread_name: str,
        take_group: Callable[[deque[Job]], list[Job]],
        run_group: Callable[[list[Job]], None],
        before_group: Callable[[], None] = _nothing,
    ) -> None:
        self._where = where
        self._take_group = take_group
        self._run_group = run_group
        self._before_group = before_group
        self._queue: deque[Job] = deque()
        self._lock = threading.Lock()
        self._draining = False
        self._closed = False
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=thread_name)

    @property
    def queued(self) -> int:
        """Calls waiting in the queue (not counting the group running)."""
        with self._lock:
            return len(self._queue)

    def submit(self, job: Job) -> None:
        """Queue `job`; StorageClosedError once the lane is closing."""
        with self._lock:
            if self._closed:
                raise StorageClosedError(f"the disk tier at {self._where} is closed")
            self._queue.append(job)
            if not self._draining:
                self._thread.submit(self._drain)
                self._draining = True

    def close(self) -> None:
        """Refuse new calls and run every group queued before (blocking)."""
        with self._lock:
            self._closed = True
        self._thread.shutdown(wait=True)

    def _drain(self) -> None:
        while True:
            self._before_group()
            with self._lock:
                jobs = self._take_group(self._queue)
                if not jobs:
                    self._draining = False
                    return
            self._run_group(jobs)
