"""`TransferEngine`: runs the chained manager's transfer jobs through the tiers' storages.

- Bounded concurrency per tier pair (a semaphore per (source, destination)), with priority:
  a waiting promotion or load is served before a waiting demotion, and both before a
  write-through cascade.
- A job's steps run in order (demotions before the writes that reuse their slots); a copy
  whose source failed is skipped. Whatever happens, the job's bookkeeping is settled exactly
  once (`complete_job`), so no pin or pending slot ever leaks.
- A copy in flight is never abandoned: if the task running a job is cancelled, the copy is
  allowed to finish before its slots are released, so a slot is never reused under a write.
- Backpressure: when too many cascades are queued, new ones are dropped (counted), so a slow
  lower tier cannot stall loads.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from kvtier.engine.moves import Endpoint, MoveResult, move
from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.manager.jobs import JobKind, TransferJob
from kvtier.manager.tiered import TieredManager
from kvtier.tiers.storage import BlockStorage
from kvtier.tiers.tensor_copy import TensorCopier

T = TypeVar("T")

CALLER = -1
"""Tier index standing for the caller's tensor (the source of a put, the target of a get)."""


class Priority(enum.IntEnum):
    """Lower runs first."""

    LOAD = 0
    DEMOTE = 1
    CASCADE = 2


PRIORITY_OF = {
    JobKind.PROMOTE: Priority.LOAD,
    JobKind.DEMOTE: Priority.DEMOTE,
    JobKind.CASCADE: Priority.CASCADE,
}


class PrioritySemaphore:
    """An asyncio semaphore whose waiters are served by priority, then first come first."""

    def __init__(self, value: int) -> None:
        if value < 1:
            raise InvalidValueError(f"a semaphore needs a value >= 1, got {value}")
        self._free = value
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @asynccontextmanager
    async def hold(self, priority: int) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        # A free slot means no live waiter (release hands slots to waiters first); entries
        # left in the heap by cancelled waiters must not make a newcomer queue behind them.
        if self._free > 0:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # granted just as we were cancelled: pass it on
            raise

    def _release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)
                return
        self._free += 1

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f in self._waiters if not f.done())


async def finish_even_if_cancelled(awaitable: Awaitable[T]) -> T:
    """Await `awaitable`; if the caller is cancelled meanwhile, let it finish first, then
    re-raise the cancellation. For copies whose slots must not be released mid-write."""
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


@dataclass(slots=True)
class PairCounters:
    """Traffic between two endpoints."""

    blocks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    copies: int = 0

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(slots=True)
class EngineCounters:
    """What the engine did since it started."""

    jobs: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in JobKind})
    failed_blocks: int = 0
    corrupt_blocks: int = 0
    cascades_dropped: int = 0
    errors: int = 0
    pairs: dict[tuple[str, str], PairCounters] = field(default_factory=dict)


class TransferEngine:
    """Executes transfer jobs for one `TieredManager` over its tiers' storages."""

    def __init__(
        self,
        manager: TieredManager,
        storages: Sequence[BlockStorage],
        *,
        copier: TensorCopier | None = None,
        max_concurrency: int = 4,
        max_pending_cascades: int = 64,
    ) -> None:
        if len(storages) != len(manager.tiers):
            raise InvalidValueError(f"{len(storages)} storages for {len(manager.tiers)} tiers")
        if max_pending_cascades < 0:
            raise InvalidValueError(
                f"max_pending_cascades must be >= 0, got {max_pending_cascades}"
            )
        self.manager = manager
        self.storages = list(storages)
        self.names = [tier.name for tier in manager.tiers]
        self.block_size = manager.block_size
        self.copier = copier if copier is not None else TensorCopier()
        self.max_concurrency = max_concurrency
        self.max_pending_cascades = max_pending_cascades
        self.counters = EngineCounters()
        self._pairs: dict[tuple[int, int], PrioritySemaphore] = {}
        self._cascades_in_flight = 0

    def _semaphore(self, src: int, dst: int) -> PrioritySemaphore:
        key = (src, dst)
        semaphore = self._pairs.get(key)
        if semaphore is None:
            semaphore = self._pairs[key] = PrioritySemaphore(self.max_concurrency)
        return semaphore

    def name_of(self, index: int) -> str:
        return "caller" if index == CALLER else self.names[index]

    def endpoint(self, index: int) -> BlockStorage:
        return self.storages[index]

    # -- moves -----------------------------------------------------------------------------

    async def transfer(
        self,
        keys: Sequence[OffloadKey],
        src: int,
        src_end: Endpoint,
        src_ids: np.ndarray,
        dst: int,
        dst_end: Endpoint,
        dst_ids: np.ndarray,
        priority: Priority,
    ) -> MoveResult:
        """One move under the pair's semaphore, counted; a failure of the whole move (an
        exception from a device or file) is reported as every block failing."""
        async with self._semaphore(src, dst).hold(priority):
            started = time.perf_counter()
            try:
                result = await finish_even_if_cancelled(
                    move(self.copier, keys, src_end, src_ids, dst_end, dst_ids, self.block_size)
                )
            except (OSError, RuntimeError, ValueError):
                self.counters.errors += 1
                result = MoveResult(failed=frozenset(keys))
            elapsed = time.perf_counter() - started
        pair = self.counters.pairs.setdefault(
            (self.name_of(src), self.name_of(dst)), PairCounters()
        )
        moved = len(keys) - len(result.failed)
        pair.blocks += moved
        pair.bytes += moved * self.block_size
        pair.seconds += elapsed
        pair.copies += 1
        self.counters.failed_blocks += len(result.failed)
        self.counters.corrupt_blocks += len(result.corrupt)
        return result

    # -- jobs ------------------------------------------------------------------------------

    def admit(self, job: TransferJob) -> bool:
        """Whether to run a job now; a cascade over the backlog limit is dropped here (its
        bookkeeping settled as failed) and False returned."""
        if job.kind is JobKind.CASCADE:
            if self._cascades_in_flight >= self.max_pending_cascades:
                pending = {(tier, key) for tier, keys in job.pending for key in keys}
                self.counters.cascades_dropped += len(pending)
                self.manager.complete_job(job, failed=pending)
                return False
            self._cascades_in_flight += 1
        return True

    async def run(self, job: TransferJob) -> MoveResult:
        """Run a job's steps in order and settle its bookkeeping, whatever happens. Call
        `admit` first for jobs that may be dropped (cascades)."""
        priority = PRIORITY_OF[job.kind]
        failed: set[tuple[int, OffloadKey]] = set()
        corrupt: set[tuple[int, OffloadKey]] = set()
        steps_done = 0
        try:
            for step in job.steps:
                alive = [i for i, key in enumerate(step.keys) if (step.src, key) not in failed]
                for key in step.keys:
                    if (step.src, key) in failed:
                        failed.add((step.dst, key))
                if not alive:
                    continue
                keys = [step.keys[i] for i in alive]
                result = await self.transfer(
                    keys,
                    step.src,
                    self.storages[step.src],
                    step.src_ids[alive],
                    step.dst,
                    self.storages[step.dst],
                    step.dst_ids[alive],
                    priority,
                )
                failed.update((step.dst, key) for key in result.failed)
                corrupt.update((step.src, key) for key in result.corrupt)
                steps_done += 1
        except BaseException:
            # Cancelled (or broken) mid-job: what was not copied did not arrive.
            for step in job.steps[steps_done:]:
                failed.update((step.dst, key) for key in step.keys)
            raise
        finally:
            if job.kind is JobKind.CASCADE:
                self._cascades_in_flight -= 1
            self.counters.jobs[job.kind.value] += 1
            self.manager.complete_job(job, failed, corrupt)
            bad_by_tier: dict[int, list[OffloadKey]] = {}
            for tier, key in corrupt:
                bad_by_tier.setdefault(tier, []).append(key)
            for tier, bad in bad_by_tier.items():
                try:
                    await asyncio.shield(self.storages[tier].forget(bad))
                except (OSError, asyncio.CancelledError):
                    self.counters.errors += 1  # the record is re-checked on every read
        return MoveResult(
            failed=frozenset(key for _, key in failed),
            corrupt=frozenset(key for _, key in corrupt),
        )
