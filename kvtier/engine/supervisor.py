"""`JobSupervisor`: owns every background task of a hierarchy and settles every job once.

A serving engine calls `put` and `get` on its critical path, so nothing that goes wrong in
the background may reach it: the supervisor's tasks are its own (never children of the
caller's task or task group), an exception of any class from a job is caught, logged and
counted, and a job whose task was cancelled before it ever ran (or that broke before it
settled) is settled here as failed: its pending blocks are dropped, its pins and drained
slots given back. So a caller sees a failure only as a miss, and no pin or pending slot leaks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtier.engine.engine import TransferEngine
from kvtier.manager.jobs import TransferJob

log = logging.getLogger("kvtier.supervisor")


@dataclass(slots=True)
class SupervisorCounters:
    """What went wrong in the background (every case is also a miss or a failed store)."""

    jobs_started: int = 0
    job_errors: int = 0
    """Jobs whose task raised (a bug or a tier's unexpected error); settled as failed."""
    jobs_abandoned: int = 0
    """Jobs settled by the supervisor because their task ended without settling them."""
    error_types: dict[str, int] = field(default_factory=dict)


class JobSupervisor:
    """Runs transfer jobs as tasks it owns, on the running event loop."""

    def __init__(self, engine: TransferEngine, on_done: Callable[[], None]) -> None:
        """`on_done` is called (on the loop) after each job's task ends, e.g. to wake
        readers waiting for a promotion."""
        self.engine = engine
        self.counters = SupervisorCounters()
        self._on_done = on_done
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._started: set[int] = set()

    def spawn(
        self, job: TransferJob, staged: asyncio.Future[None] | None = None
    ) -> asyncio.Task[None]:
        """Start `job` in the background; `staged` is resolved once it no longer reads its
        sources (or once it is settled, whichever comes first)."""
        task = asyncio.get_running_loop().create_task(
            self._run(job, staged), name=f"kvtier-job-{job.id}"
        )
        self.counters.jobs_started += 1
        self._tasks[job.id] = task
        task.add_done_callback(lambda done: self._finished(job, staged, done))
        return task

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until no job runs (jobs started meanwhile included); False if `timeout_s`
        passed first."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while self._tasks:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            await asyncio.wait(list(self._tasks.values()), timeout=remaining)
        return True

    async def cancel_all(self) -> None:
        """Cancel every running job and wait for them to settle (copies in flight finish
        first, so no slot is released under a write)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _run(self, job: TransferJob, staged: asyncio.Future[None] | None) -> None:
        self._started.add(job.id)
        try:
            await self.engine.run(job, staged)
        except Exception as error:  # any class: logged and counted, never the caller's
            self.count_error(error)
            log.error("transfer job %r failed: %r", job, error, exc_info=error)

    def _finished(
        self, job: TransferJob, staged: asyncio.Future[None] | None, task: asyncio.Task[None]
    ) -> None:
        self._tasks.pop(job.id, None)
        if job.id not in self._started:
            self.engine.never_ran(job)
        self._started.discard(job.id)
        manager = self.engine.manager
        try:
            if not manager.closed and manager.is_open(job):
                # Cancelled before it ran, or broken before it settled: nothing it did not
                # finish arrived. Its sources are given back and its pending blocks dropped.
                self.counters.jobs_abandoned += 1
                manager.complete_job(job, failed=job.pending_pairs())
        except Exception as error:
            self.count_error(error)
            log.error("settling abandoned job %r failed: %r", job, error, exc_info=error)
        finally:
            if staged is not None and not staged.done():
                staged.set_result(None)
            if not task.cancelled() and task.exception() is not None:
                self.count_error(task.exception())  # a BaseException that _run let through
            self._on_done()

    def count_error(self, error: BaseException | None) -> None:
        """Count `error` (None: nothing) as a job's: `job_errors` and its type's count."""
        if error is None:
            return
        self.counters.job_errors += 1
        name = type(error).__name__
        self.counters.error_types[name] = self.counters.error_types.get(name, 0) + 1
