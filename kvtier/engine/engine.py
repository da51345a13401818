"""`TransferEngine`: runs the chained manager's transfer jobs through the tiers' storages.

- **Priority at every queue.** One priority semaphore per tier (a copy between two tiers
  queues at the slower, lower one; a caller's copy at the tier it reads or writes), so a
  promotion out of the disk tier and a demotion into it compete for the same slots: loads
  first, then demotions, then write-through cascades, and one slot is kept for loads.
- **Slow tiers off the critical path.** A demotion or cascade from a memory tier to a slow
  tier (disk, remote) first snapshots the blocks into a `StagingArena` (a memory copy), gives
  the source slots back (`TieredManager.release_sources`, and the job's `staged` future), and
  writes the snapshot in the background. Only a full arena makes a job wait (counted).
- A job's steps run in order (demotions before the writes that reuse their slots); a copy
  whose source failed is skipped. Whatever happens, the job's bookkeeping is settled exactly
  once (`complete_job`), so no pin or pending slot ever leaks.
- **Failure is a miss.** Any exception a storage raises (any class, in any thread) fails the
  blocks of that copy, is counted and logged, and never escapes `run` or `transfer`.
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
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import torch

from kvtier.engine.moves import Endpoint, MoveResult, move
from kvtier.engine.staging import StagingArena
from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.manager.jobs import CopyStep, JobKind, TransferJob
from kvtier.manager.tiered import TieredManager
from kvtier.tiers.storage import BlockStorage, TensorStorage, TierAccess
from kvtier.tiers.tensor_copy import TensorCopier

log = logging.getLogger("kvtier.engine")

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
    """An asyncio semaphore whose waiters are served by priority, then first come first.

    `reserved` of its `value` slots are kept for the first priority (loads): other holders
    never take the last `reserved` free slots, so a load finds one even while background
    writes keep the rest busy.
    """

    def __init__(self, value: int, *, reserved: int = 0) -> None:
        if value < 1:
            raise InvalidValueError(f"a semaphore needs a value >= 1, got {value}")
        if not 0 <= reserved < value:
            raise InvalidValueError(f"reserved must be in [0, {value}), got {reserved}")
        self._free = value
        self._reserved = reserved
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @asynccontextmanager
    async def hold(self, priority: int) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    def _floor(self, priority: int) -> int:
        """Free slots that must remain after a holder of `priority` takes one."""
        return 0 if priority <= Priority.LOAD else self._reserved

    async def _acquire(self, priority: int) -> None:
        # Release hands slots to live waiters first, so a slot free to this priority means
        # no live waiter that could have taken it; entries left in the heap by cancelled
        # waiters must not make a newcomer queue behind them.
        if self._free > self._floor(priority) and not self._better_waiter(priority):
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

    def _better_waiter(self, priority: int) -> bool:
        """Whether a live waiter of this or a higher priority is queued."""
        while self._waiters and self._waiters[0][2].done():
            heapq.heappop(self._waiters)
        return bool(self._waiters) and self._waiters[0][0] <= priority

    def _release(self) -> None:
        self._free += 1
        while self._waiters:
            priority, _, future = self._waiters[0]
            if future.done():
                heapq.heappop(self._waiters)
                continue
            if self._free <= self._floor(priority):
                return  # the best waiter may not take the slots kept for loads
            heapq.heappop(self._waiters)
            self._free -= 1
            future.set_result(None)
            return

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
    """Traffic between two endpoints. `seconds` is the wall time during which at least one
    copy of the pair was in flight (concurrent copies are not counted twice), so
    `gb_per_s` is the pair's throughput, not a per-copy speed."""

    blocks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    copies: int = 0
    failed: int = 0
    """Blocks whose copy failed."""
    corrupt: int = 0
    """Blocks found corrupt at the source."""
    gone: int = 0
    """Blocks a shared store at the source no longer held (evicted by the store itself) or
    could not be asked for: misses, counted in `failed` too, never in `corrupt`."""
    in_flight: int = 0
    peak_in_flight: int = 0
    """The most copies of the pair in flight at once (1: each ran alone)."""
    busy_since: float = 0.0

    def start(self, now: float) -> None:
        if self.in_flight == 0:
            self.busy_since = now
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def stop(self, now: float) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.seconds += now - self.busy_since

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(slots=True)
class EngineCounters:
    """What the engine did since it started."""

    jobs: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in JobKind})
    failed_blocks: int = 0
    corrupt_blocks: int = 0
    gone_blocks: int = 0
    """Reads of blocks a shared store no longer held (or could not be asked for): misses."""
    cascades_dropped: int = 0
    errors: int = 0
    """Copies that raised (any exception class): their blocks failed."""
    error_types: dict[str, int] = field(default_factory=dict)
    """Copies that raised, by exception class name."""
    staged_blocks: int = 0
    """Blocks snapshotted into the staging arena on their way to a slow tier."""
    staged_reads: int = 0
    """Blocks a get copied out of the staging arena (being written to a slow tier, so
    readable in neither tier): served at once instead of after that write."""
    pairs: dict[tuple[str, str], PairCounters] = field(default_factory=dict)

    def count_error(self, error: BaseException) -> None:
        self.errors += 1
        name = type(error).__name__
        self.error_types[name] = self.error_types.get(name, 0) + 1


@dataclass(slots=True)
class _JobRun:
    """The running outcome of one job: (tier, key) copies that failed, sources found
    corrupt, steps whose outcome is known, and steps still writing in the background."""

    job: TransferJob
    failed: set[tuple[int, OffloadKey]] = field(default_factory=set)
    corrupt: set[tuple[int, OffloadKey]] = field(default_factory=set)
    gone: set[tuple[int, OffloadKey]] = field(default_factory=set)
    settled: set[int] = field(default_factory=set)
    writes: dict[int, asyncio.Task[MoveResult]] = field(default_factory=dict)

    def collect(self, index: int, result: MoveResult) -> None:
        step = self.job.steps[index]
        self.failed.update((step.dst, key) for key in result.failed)
        self.corrupt.update((step.src, key) for key in result.corrupt)
        self.gone.update((step.src, key) for key in result.gone)
        self.settled.add(index)

    def fail_unsettled(self) -> None:
        """Cancelled (or broken) mid-job: a step not run, or whose write did not finish,
        did not arrive."""
        for index, step in enumerate(self.job.steps):
            if index in self.settled:
                continue
            task = self.writes.get(index)
            if task is not None and task.done() and not task.cancelled():
                self.collect(index, task.result())
            else:
                self.failed.update((step.dst, key) for key in step.keys)


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
        staging: StagingArena | None = None,
        tensor_tiers: Sequence[bool] | None = None,
    ) -> None:
        """`staging`: the arena that lets demotions and cascades to slow tiers give their
        sources back after a memory copy; None: they hold them until written.
        `tensor_tiers`: per tier, whether its bytes are a torch tensor pool (its kind's
        declared access; default: each storage's own `access`)."""
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
        self.staging = staging
        self.tensor_tiers = (
            list(tensor_tiers)
            if tensor_tiers is not None
            else [storage.access is TierAccess.TENSOR for storage in storages]
        )
        if len(self.tensor_tiers) != len(self.storages):
            raise InvalidValueError(f"{len(self.tensor_tiers)} access flags for {len(storages)}")
        for index, (tensor, storage) in enumerate(zip(self.tensor_tiers, storages, strict=True)):
            if tensor and not isinstance(storage, TensorStorage):
                raise InvalidValueError(
                    f"tier {self.names[index]!r} is declared a tensor pool, but its storage is "
                    f"a {type(storage).__name__}: declare its access as host buffers or client"
                )
        self.counters = EngineCounters()
        self._lanes: dict[int, PrioritySemaphore] = {}
        self._cascades_in_flight = 0
        self._admitted: set[int] = set()  # cascades counted in the backlog
        self._staged_rows: dict[OffloadKey, int] = {}  # key -> arena row, while written below

    def _semaphore(self, src: int, dst: int) -> PrioritySemaphore:
        """The queue of a copy: that of the lower (slower) of its two tiers."""
        lane = max(src, dst)
        semaphore = self._lanes.get(lane)
        if semaphore is None:
            reserved = 1 if self.max_concurrency > 1 else 0
            semaphore = PrioritySemaphore(self.max_concurrency, reserved=reserved)
            self._lanes[lane] = semaphore
        return semaphore

    def queue_depths(self) -> dict[str, int]:
        """Copies waiting at each tier's queue now (the lanes are copied in one step, so a
        scrape may call it from another thread)."""
        return {self.name_of(lane): sem.waiting for lane, sem in list(self._lanes.items())}

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
        pair = self.counters.pairs.setdefault(
            (self.name_of(src), self.name_of(dst)), PairCounters()
        )
        async with self._semaphore(src, dst).hold(priority):
            pair.start(time.perf_counter())
            try:
                result = await finish_even_if_cancelled(
                    move(self.copier, keys, src_end, src_ids, dst_end, dst_ids, self.block_size)
                )
            except Exception as error:  # any class: a failed copy is a miss, never a crash
                self.counters.count_error(error)
                log.warning(
                    "copy of %d blocks %s -> %s failed: %r",
                    len(keys),
                    self.name_of(src),
                    self.name_of(dst),
                    error,
                )
                result = MoveResult(failed=frozenset(keys))
            finally:
                pair.stop(time.perf_counter())
        moved = len(keys) - len(result.failed)
        pair.blocks += moved
        pair.bytes += moved * self.block_size
        pair.copies += 1
        corrupt = len(result.corrupt - result.gone)
        pair.failed += len(result.failed)
        pair.corrupt += corrupt
        pair.gone += len(result.gone)
        self.counters.failed_blocks += len(result.failed)
        self.counters.corrupt_blocks += corrupt
        self.counters.gone_blocks += len(result.gone)
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
            self._admitted.add(job.id)
        return True

    def never_ran(self, job: TransferJob) -> None:
        """An admitted job's task ended before `run` started (cancelled): give back its
        place in the cascade backlog."""
        self._leave_backlog(job)

    def _leave_backlog(self, job: TransferJob) -> None:
        if job.id in self._admitted:
            self._admitted.discard(job.id)
            self._cascades_in_flight -= 1

    async def run(self, job: TransferJob, staged: asyncio.Future[None] | None = None) -> MoveResult:
        """Run a job's steps in order and settle its bookkeeping, whatever happens (success,
        any exception, cancellation). Call `admit` first for jobs that may be dropped
        (cascades). `staged` (if given) is resolved as soon as the job no longer reads its
        sources, which may be long before the job ends: a store that waits for the demotion
        of its victims waits only for that."""
        state = _JobRun(job)
        try:
            async with asyncio.TaskGroup() as group:
                try:
                    for index in range(len(job.steps)):
                        await self._run_step(state, index, group)
                finally:
                    self._release_sources(state, staged)
            for index, task in state.writes.items():
                state.collect(index, task.result())
        finally:
            state.fail_unsettled()
            self._leave_backlog(job)
            self.counters.jobs[job.kind.value] += 1
            if self.manager.is_open(job):
                self.manager.complete_job(job, state.failed, state.corrupt)
            await self._forget_corrupt(state.corrupt - state.gone)
        return MoveResult(
            failed=frozenset(key for _, key in state.failed),
            corrupt=frozenset(key for _, key in state.corrupt),
            gone=frozenset(key for _, key in state.gone),
        )

    async def _run_step(self, state: _JobRun, index: int, group: asyncio.TaskGroup) -> None:
        """Copy one step's blocks whose sources are intact: inline, or snapshot them and
        write in the background (a task of `group`)."""
        step = state.job.steps[index]
        await self._await_sources(state, step)
        alive = [i for i, key in enumerate(step.keys) if (step.src, key) not in state.failed]
        state.failed.update((step.dst, key) for key in step.keys if (step.src, key) in state.failed)
        if not alive:
            state.settled.add(index)
            return
        keys = [step.keys[i] for i in alive]
        src_ids, dst_ids = step.src_ids[alive], step.dst_ids[alive]
        priority = PRIORITY_OF[state.job.kind]
        if self._stageable(step, len(keys)):
            rows = await self._stage(step, src_ids)
            if rows is None:
                state.collect(index, MoveResult(failed=frozenset(keys)))
            else:
                self._staged_rows.update(zip(keys, (int(row) for row in rows), strict=True))
                state.writes[index] = group.create_task(
                    self._write_staged(keys, step, rows, dst_ids, priority)
                )
            return
        result = await self.transfer(
            keys,
            step.src,
            self.storages[step.src],
            src_ids,
            step.dst,
            self.storages[step.dst],
            dst_ids,
            priority,
        )
        state.collect(index, result)

    async def _await_sources(self, state: _JobRun, step: CopyStep) -> None:
        """Wait for the background writes of earlier steps that this step reads from."""
        wanted = set(step.keys)
        for index, task in list(state.writes.items()):
            earlier = state.job.steps[index]
            if earlier.dst == step.src and not wanted.isdisjoint(earlier.keys):
                await asyncio.wait([task])
                state.collect(index, task.result())
                del state.writes[index]

    def _stageable(self, step: CopyStep, count: int) -> bool:
        """Whether a step may snapshot its sources and write in the background: a copy down
        the chain (a demotion or cascade, also one a promotion makes room with) from a memory
        tier to a tier that is not a tensor pool."""
        return (
            self.staging is not None
            and step.dst > step.src
            and self.tensor_tiers[step.src]
            and not self.tensor_tiers[step.dst]
            and self.staging.fits(count)
        )

    async def _stage(
        self, step: CopyStep, src_ids: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64] | None:
        """Copy a step's source blocks into arena rows; None if the copy failed."""
        staging = self.staging
        source = self.storages[step.src]
        if staging is None or not isinstance(source, TensorStorage):
            return None
        rows = await staging.acquire(len(src_ids))
        try:
            await finish_even_if_cancelled(
                self.copier.copy(source.tensor, src_ids, staging.tensor, rows)
            )
        except Exception as error:
            staging.release(rows)
            self.counters.count_error(error)
            log.warning("staging %d blocks of %s failed: %r", len(rows), step.src, error)
            return None
        except BaseException:
            staging.release(rows)
            raise
        self.counters.staged_blocks += len(rows)
        return rows

    async def _write_staged(
        self,
        keys: list[OffloadKey],
        step: CopyStep,
        rows: npt.NDArray[np.int64],
        dst_ids: npt.NDArray[np.int64],
        priority: Priority,
    ) -> MoveResult:
        """Write snapshotted blocks from the arena to their destination, then free the rows."""
        staging = self.staging
        if staging is None:
            return MoveResult(failed=frozenset(keys))
        try:
            return await self.transfer(
                keys,
                step.src,
                staging.tensor,
                rows,
                step.dst,
                self.storages[step.dst],
                dst_ids,
                priority,
            )
        finally:
            for key, row in zip(keys, rows, strict=True):
                if self._staged_rows.get(key) == row:
                    del self._staged_rows[key]
            staging.release(rows)

    def staged_prefix(self, keys: Sequence[OffloadKey]) -> int:
        """How many leading `keys` have a snapshot in the staging arena (on their way to a
        slow tier)."""
        count = 0
        while count < len(keys) and keys[count] in self._staged_rows:
            count += 1
        return count

    async def read_staged(
        self, keys: Sequence[OffloadKey], out: torch.Tensor, rows: npt.NDArray[np.int64]
    ) -> int:
        """Copy the leading `keys` that have a snapshot in the staging arena into
        `out[rows[i]]`; how many. A block being demoted to a slow tier is readable in
        neither tier until that write lands (behind every other write queued there); its
        snapshot is the block's bytes, so a get is served from it at once (loads first).
        The rows are held while copied, so they are not reused under the copy."""
        staging = self.staging
        count = self.staged_prefix(keys)
        if staging is None or count == 0:
            return 0
        arena_rows = np.asarray([self._staged_rows[key] for key in keys[:count]], np.int64)
        staging.hold(arena_rows)
        try:
            await finish_even_if_cancelled(
                self.copier.copy(staging.tensor, arena_rows, out, rows[:count])
            )
        finally:
            staging.unhold(arena_rows)
        self.counters.staged_reads += count
        return count

    def _release_sources(self, state: _JobRun, staged: asyncio.Future[None] | None) -> None:
        """Every step is issued: give the sources back, and settle the tiers no background
        write is still filling (e.g. the CPU tier of a GPU -> CPU -> disk demotion)."""
        job = state.job
        try:
            if self.manager.is_open(job):
                self.manager.release_sources(job)
                writing = {job.steps[index].dst for index in state.writes}
                done = {step.dst for step in job.steps} - writing
                issued = all(i in state.settled or i in state.writes for i in range(len(job.steps)))
                if done and issued:
                    self.manager.settle_tiers(job, done, state.failed, state.corrupt)
        finally:
            if staged is not None and not staged.done():
                staged.set_result(None)

    async def _forget_corrupt(self, corrupt: set[tuple[int, OffloadKey]]) -> None:
        """Tell persistent tiers to drop the records of blocks found bad (best effort: a
        record is re-checked on every read anyway). An error of a forget, a cancellation
        of the forget itself included, is counted and the next tier is told. A cancellation
        of the job's task while it waits here is re-raised (the shielded forget goes on):
        swallowed, `run` would return as if its caller had not cancelled it."""
        bad_by_tier: dict[int, list[OffloadKey]] = {}
        for tier, key in corrupt:
            bad_by_tier.setdefault(tier, []).append(key)
        for tier, bad in bad_by_tier.items():
            try:
                await asyncio.shield(self.storages[tier].forget(bad))
            except asyncio.CancelledError as error:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                self.counters.count_error(error)
            except Exception as error:
                self.counters.count_error(error)
