"""The transfer engine alone, over small pools and a `FlakyStorage`: every job is settled
exactly once whatever happens (success, an exception of any class, cancellation at each of
its await points), the bytes every tier says it holds are the right ones, the priority
semaphore serves loads first and keeps their slot, and a demotion to a hung slow tier lets
its store go on as soon as the snapshot is taken."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from hierarchy_helpers import content, key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.engine import Priority, PrioritySemaphore, TransferEngine
from kvtier.engine.moves import MoveResult
from kvtier.engine.staging import StagingArena
from kvtier.engine.supervisor import JobSupervisor
from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.manager import TieredManager, TransferJob, make_tier_manager
from kvtier.manager.jobs import JobKind, slot_ids
from kvtier.manager.planner import Watermarks, WritePolicy
from kvtier.manager.tier import TierManager
from kvtier.testing.faults import CallKind, ErrorSpec, FlakyCounters, FlakyStorage
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.pool.storage import TorchPool
from kvtier.tiers.storage import BlockStorage

B = 64
SIZES = (2, 4, 8)  # gpu, cpu, slow: 14 blocks fill the chain


class Boom(Exception):
    """A storage bug of a class nobody catches on purpose."""


class CountingManager(TieredManager):
    """A TieredManager that counts `complete_job` calls per job."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.completions: Counter[int] = Counter()

    def complete_job(
        self,
        job: TransferJob,
        failed: Iterable[tuple[int, OffloadKey]] = (),
        corrupt: Iterable[tuple[int, OffloadKey]] = (),
    ) -> None:
        self.completions[job.id] += 1
        super().complete_job(job, failed, corrupt)


@dataclass
class Rig:
    """A gpu(2) -> cpu(4) -> slow(8) chain of host pools; the tiers in `wrapped` are
    FlakyStorages (not TorchPools, so the engine drives them through read/write)."""

    manager: CountingManager
    tiers: list[TierManager]
    storages: list[BlockStorage]
    engine: TransferEngine
    staging: StagingArena
    jobs: list[TransferJob] = field(default_factory=list)
    """Every job the rig ran or handed out."""

    def flaky(self, tier: int) -> FlakyStorage:
        storage = self.storages[tier]
        assert isinstance(storage, FlakyStorage)
        return storage

    def inner(self, tier: int) -> BlockStorage:
        storage = self.storages[tier]
        return storage.inner if isinstance(storage, FlakyStorage) else storage


def make_rig(
    wrapped: tuple[int, ...] = (2,),
    *,
    write_policy: WritePolicy = "write-back",
    watermarks: list[Watermarks | None] | None = None,
    disk: Path | None = None,
) -> Rig:
    names = ("gpu", "cpu", "slow")
    media = ("gpu", "cpu", "disk")
    tiers = [
        make_tier_manager(n, B, m, name=name)
        for n, m, name in zip(SIZES, media, names, strict=True)
    ]
    manager = CountingManager(tiers, write_policy=write_policy, watermarks=watermarks)
    storages: list[BlockStorage] = [TorchPool(n, B) for n in SIZES[:2]]
    bottom: BlockStorage
    if disk is not None:
        bottom = DiskStore(disk, block_size=B, num_blocks=SIZES[2], direct_io=False, fsync=False)
    else:
        bottom = TorchPool(SIZES[2], B)
    storages.append(bottom)
    storages = [FlakyStorage(s) if i in wrapped else s for i, s in enumerate(storages)]
    staging = StagingArena(4, B)
    engine = TransferEngine(manager, storages, staging=staging, max_concurrency=2)
    return Rig(manager, tiers, storages, engine, staging)


async def put(rig: Rig, k: OffloadKey) -> None:
    """Store one block the way Hierarchy.put does, healthy path: demote its victims, write
    its bytes at the top, complete, run what the store planned (cascades, reserves)."""
    out = rig.manager.prepare_store([k])
    assert out is not None
    if out.demotion is not None:
        rig.jobs.append(out.demotion)
        await rig.engine.run(out.demotion)
    write_top(rig, k, int(slot_ids(out.store_spec)[0]))
    rig.manager.complete_store([k])
    for job in rig.manager.take_jobs():
        rig.jobs.append(job)
        if rig.engine.admit(job):
            await rig.engine.run(job)


def write_top(rig: Rig, k: OffloadKey, slot: int) -> None:
    top = rig.inner(0)
    assert isinstance(top, TorchPool)
    top.tensor[slot] = content(k, B)


async def fill(rig: Rig, count: int = sum(SIZES)) -> None:
    for i in range(count):
        await put(rig, key(i))


async def read_slot(storage: BlockStorage, k: OffloadKey, slot: int) -> np.ndarray | None:
    buffer = np.zeros(B, dtype=np.uint8)
    (failure,) = await storage.read([k], [slot], [buffer])
    return None if failure is not None else buffer


async def verify(rig: Rig) -> None:
    """Every job settled exactly once; nothing pinned, pending or draining; every staging
    row back; and each block a tier holds as ready has exactly its bytes there."""
    assert rig.manager.open_jobs() == []
    for job in rig.jobs:
        assert rig.manager.completions[job.id] == 1, job
    assert all(count == 1 for count in rig.manager.completions.values())
    for tier in rig.manager.tiers:
        stats = tier.stats()
        assert (stats.pending, stats.pinned, stats.draining) == (0, 0, 0), stats
    rig.manager.check()
    assert rig.staging.free == rig.staging.num_blocks
    for index, tier in enumerate(rig.tiers):
        for k, block in list(tier.policy.items()):
            assert block.ref_cnt >= 0
            got = await read_slot(rig.inner(index), k, block.block_id)
            assert got is not None, (tier.name, k)
            assert np.array_equal(got, content(k, B).numpy()), (tier.name, k)


# -- scenarios: a rig in some state and one job to run on it -------------------------------

Prepared = tuple[Rig, TransferJob, Callable[[], None]]
"""A rig, the job under test, and what the job's caller does once it is done."""
Scenario = Callable[[tuple[int, ...], Path], Awaitable[Prepared]]
"""(wrapped tiers, tmp dir) -> Prepared."""


async def demote(wrapped: tuple[int, ...], tmp: Path) -> Prepared:
    """A full chain: a store evicts at every tier (gpu -> cpu and cpu -> slow)."""
    rig = make_rig(wrapped)
    await fill(rig)
    new = key(100)
    out = rig.manager.prepare_store([new])
    assert out is not None and out.demotion is not None
    assert {(s.src, s.dst) for s in out.demotion.steps} == {(0, 1), (1, 2)}

    def after() -> None:  # the store goes on once the victims are out
        write_top(rig, new, int(slot_ids(out.store_spec)[0]))
        rig.manager.complete_store([new])

    return rig, out.demotion, after


async def promote(wrapped: tuple[int, ...], tmp: Path) -> Prepared:
    """Two blocks of the bottom tier climb to the top, demoting victims on the way."""
    rig = make_rig(wrapped)
    await fill(rig)
    assert rig.manager.lookup_many([key(0), key(1)]) == [None, None]
    (job,) = rig.manager.take_jobs()
    assert job.kind is JobKind.PROMOTE and job.steps[-1].dst == 0
    return rig, job, lambda: None


async def store_one(rig: Rig, new: OffloadKey) -> list[TransferJob]:
    """Store one block at the top as a caller would (its demotion first, if any); the jobs
    the store left queued."""
    out = rig.manager.prepare_store([new])
    assert out is not None
    if out.demotion is not None:
        rig.jobs.append(out.demotion)
        await rig.engine.run(out.demotion)
    write_top(rig, new, int(slot_ids(out.store_spec)[0]))
    rig.manager.complete_store([new])
    return rig.manager.take_jobs()


async def cascade(wrapped: tuple[int, ...], tmp: Path) -> Prepared:
    """Write-through: a new block is copied down the whole chain."""
    rig = make_rig(wrapped, write_policy="write-through")
    await fill(rig, 12)
    (job,) = await store_one(rig, key(100))
    assert job.kind is JobKind.CASCADE and [s.dst for s in job.steps] == [1, 2]
    assert rig.engine.admit(job)
    return rig, job, lambda: None


async def reserve(wrapped: tuple[int, ...], tmp: Path) -> Prepared:
    """A background demotion keeping the cpu tier's reserve of free slots (its victims'
    slots drain until the job has read them)."""
    rig = make_rig(wrapped, watermarks=[None, (0.5, 0.75), None])
    await fill(rig, 5)
    (job,) = await store_one(rig, key(100))
    assert job.background and job.drain and rig.manager.tiers[1].num_draining > 0
    return rig, job, lambda: None


def counted_from_here(scenario: Scenario) -> Scenario:
    """The scenario, with the wrappers' call counters zeroed once its set-up is done."""

    async def prepared(wrapped: tuple[int, ...], tmp: Path) -> Prepared:
        rig, job, after = await scenario(wrapped, tmp)
        for storage in rig.storages:
            if isinstance(storage, FlakyStorage):
                storage.counters = FlakyCounters()
        return rig, job, after

    return prepared


SCENARIOS: dict[str, Scenario] = {
    name: counted_from_here(scenario)
    for name, scenario in (
        ("demote", demote),
        ("promote", promote),
        ("cascade", cascade),
        ("reserve", reserve),
    )
}
LAYOUTS = {"slow-wrapped": (2,), "cpu-and-slow-wrapped": (1, 2)}


@dataclass(frozen=True)
class FaultMode:
    tier: int
    kind: CallKind
    error: ErrorSpec
    in_thread: bool = False
    delay_s: float = 0.0


FAULTS = {
    "slow-read-Boom": FaultMode(2, "read", Boom),
    "slow-write-KeyError": FaultMode(2, "write", KeyError),
    "slow-write-lmdb.Error-in-thread": FaultMode(2, "write", lmdb.Error, in_thread=True),
    "slow-read-RuntimeError-in-thread-late": FaultMode(
        2, "read", RuntimeError, in_thread=True, delay_s=0.01
    ),
    "cpu-read-AttributeError": FaultMode(1, "read", AttributeError),
    "cpu-write-Boom-in-thread": FaultMode(1, "write", Boom("always the same"), in_thread=True),
}

# (scenario, layout) -> the (tier, call kind) the job is sure to make through a wrapper.
CALLS = {
    ("demote", (2,)): {(2, "write")},
    ("demote", (1, 2)): {(1, "write"), (1, "read"), (2, "write")},
    ("promote", (2,)): {(2, "read"), (2, "write")},
    ("promote", (1, 2)): {(2, "read"), (2, "write"), (1, "read"), (1, "write")},
    ("cascade", (2,)): {(2, "write")},
    ("cascade", (1, 2)): {(1, "write"), (1, "read"), (2, "write")},
    ("reserve", (2,)): {(2, "write")},
    ("reserve", (1, 2)): {(1, "read"), (2, "write")},
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("name", SCENARIOS)
async def test_a_healthy_job_moves_every_block_and_settles_once(
    name: str, layout: tuple[int, ...], tmp_path: Path
) -> None:
    rig, job, after = await SCENARIOS[name](layout, tmp_path)
    staged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    result = await rig.engine.run(job, staged)
    rig.jobs.append(job)
    after()
    assert staged.done() and result == MoveResult()
    made = {
        (tier, kind)
        for tier in layout
        for kind in ("read", "write")
        if rig.flaky(tier).counters.calls[kind]
    }
    assert made == CALLS[(name, layout)]
    assert rig.engine.counters.errors == 0
    await verify(rig)


@pytest.mark.parametrize(
    ("layout", "fault"),
    [
        pytest.param(layout, fault, id=f"{layout_id}-{fault_id}")
        for layout_id, layout in LAYOUTS.items()
        for fault_id, fault in FAULTS.items()
        if fault.tier in layout
    ],
)
@pytest.mark.parametrize("name", SCENARIOS)
async def test_an_exception_of_any_class_fails_blocks_and_settles_once(
    name: str, layout: tuple[int, ...], fault: FaultMode, tmp_path: Path
) -> None:
    rig, job, after = await SCENARIOS[name](layout, tmp_path)
    flaky = rig.flaky(fault.tier)
    rule = flaky.fail(fault.kind, fault.error, in_thread=fault.in_thread, delay_s=fault.delay_s)
    staged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    result = await rig.engine.run(job, staged)  # never raises
    rig.jobs.append(job)
    after()
    assert staged.done()
    raised = sum(flaky.counters.raised.values())
    assert rig.engine.counters.errors == raised == rule.fired
    expected = type(fault.error) if isinstance(fault.error, BaseException) else fault.error
    assert isinstance(expected, type)
    if (fault.tier, fault.kind) in CALLS[(name, layout)]:
        assert raised >= 1
        assert result.failed
        assert rig.engine.counters.error_types == {expected.__name__: raised}
    else:
        assert raised == 0
    flaky.clear()
    await verify(rig)
    # The chain keeps working: the blocks that did not arrive are misses, nothing else.
    await put(rig, key(200))
    await verify(rig)


async def test_a_corrupt_read_whose_forget_raises_is_still_settled_once(tmp_path: Path) -> None:
    rig, job, _ = await SCENARIOS["promote"]((2,), tmp_path)
    slow = rig.flaky(2)
    slow.fail_blocks("read", [key(0)])
    slow.fail("forget", Boom)
    result = await rig.engine.run(job)
    rig.jobs.append(job)
    assert key(0) in result.corrupt and key(0) in result.failed and key(1) not in result.failed
    assert slow.counters.calls["forget"] == 1 and slow.counters.raised["forget"] == 1
    assert rig.engine.counters.error_types == {"Boom": 1}
    assert rig.manager.locate(key(0)) is None  # dropped everywhere, bytes never served
    assert rig.manager.locate(key(1)) == (0, True)
    slow.clear()
    await verify(rig)


# -- cancellation at every await point ------------------------------------------------------


async def turns_to_finish(rig: Rig, job: TransferJob) -> int:
    """Event-loop turns an uncancelled run of `job` takes (the copies are inline host
    copies, so the schedule is deterministic)."""
    task = asyncio.ensure_future(rig.engine.run(job))
    turns = 0
    while not task.done():
        await asyncio.sleep(0)
        turns += 1
    task.result()
    return turns


@pytest.mark.parametrize("via", ["engine", "supervisor"])
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("name", SCENARIOS)
async def test_cancelled_at_each_await_a_job_settles_once_and_keeps_bytes_right(
    name: str, layout: tuple[int, ...], via: str, tmp_path: Path
) -> None:
    """Cancel the job's task after n event-loop turns, for every n up to the turns a whole
    run takes (n = 0: before it ever ran, which only the supervisor can settle)."""
    rig, job, after = await SCENARIOS[name](layout, tmp_path)
    total = await turns_to_finish(rig, job)
    assert total >= 3
    cancelled_mid_run = 0
    for turns in range(0 if via == "supervisor" else 1, total + 1):
        rig, job, after = await SCENARIOS[name](layout, tmp_path)
        staged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task: asyncio.Future[Any]
        if via == "supervisor":
            supervisor = JobSupervisor(rig.engine, lambda: None)
            task = supervisor.spawn(job, staged)
        else:
            task = asyncio.ensure_future(rig.engine.run(job, staged))
        for _ in range(turns):
            await asyncio.sleep(0)
        if not task.done():
            task.cancel()
            cancelled_mid_run += 1
        await asyncio.wait([task])
        rig.jobs.append(job)
        assert staged.done()
        after()
        await verify(rig)
        if via == "supervisor":
            assert not supervisor.busy and supervisor.counters.job_errors == 0
            assert supervisor.counters.jobs_abandoned == (1 if turns == 0 else 0)
        # The chain still works after it: a store that evicts at every tier, then a read.
        await put(rig, key(300))
        await verify(rig)
    assert cancelled_mid_run >= total - 1


async def test_a_job_on_a_real_disk_cancelled_at_random_times_settles_once(
    tmp_path: Path,
) -> None:
    """The same with a DiskStore at the bottom (its I/O in worker threads): cancel after
    random short times."""
    rng = random.Random(1)
    outcomes: Counter[str] = Counter()
    for attempt in range(12):
        rig = make_rig((), disk=tmp_path / f"d{attempt}")
        await fill(rig)
        out = rig.manager.prepare_store([key(100)])
        assert out is not None and out.demotion is not None
        assert rig.manager.lookup_many([key(5)]) == [None]  # key(0) was evicted
        (promotion,) = rig.manager.take_jobs()
        jobs = [out.demotion, promotion]
        tasks = [asyncio.ensure_future(rig.engine.run(job)) for job in jobs]
        await asyncio.sleep(rng.uniform(0, 0.004))
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        outcomes.update("cancelled" if task.cancelled() else "finished" for task in tasks)
        rig.jobs.extend(jobs)
        write_top(rig, key(100), int(slot_ids(out.store_spec)[0]))
        rig.manager.complete_store([key(100)])
        await verify(rig)
        bottom = rig.storages[2]
        await bottom.aclose()
    assert outcomes["cancelled"] >= 6  # most cancels landed while the jobs ran


# -- the supervisor --------------------------------------------------------------------------


async def test_a_job_whose_run_breaks_before_settling_is_settled_by_the_supervisor(
    tmp_path: Path,
) -> None:
    rig, job, _ = await SCENARIOS["promote"]((2,), tmp_path)

    class BrokenEngine(TransferEngine):
        async def run(
            self, job: TransferJob, staged: asyncio.Future[None] | None = None
        ) -> MoveResult:
            await asyncio.sleep(0)
            raise Boom("a bug before any bookkeeping")

    broken = BrokenEngine(rig.manager, rig.storages, staging=rig.staging)
    supervisor = JobSupervisor(broken, lambda: None)
    staged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = supervisor.spawn(job, staged)
    await asyncio.wait_for(supervisor.drain(), 5)
    assert task.done() and not task.cancelled() and task.exception() is None
    counters = supervisor.counters
    assert (counters.job_errors, counters.jobs_abandoned) == (1, 1)
    assert counters.error_types == {"Boom": 1}
    assert staged.done()
    rig.jobs.append(job)
    await verify(rig)
    assert rig.manager.locate(key(0)) == (2, True)  # still where it was


async def test_a_cascade_cancelled_before_it_ran_gives_back_its_backlog_place(
    tmp_path: Path,
) -> None:
    rig, job, _ = await SCENARIOS["cascade"]((2,), tmp_path)
    rig.engine.max_pending_cascades = 1  # admitted already: the backlog is full
    ran = rig.engine.counters.jobs["cascade"]
    supervisor = JobSupervisor(rig.engine, lambda: None)
    supervisor.spawn(job).cancel()
    await supervisor.drain()
    rig.jobs.append(job)
    assert supervisor.counters.jobs_abandoned == 1
    assert rig.engine.counters.jobs["cascade"] == ran  # it never ran
    await verify(rig)
    # Its place was given back: the next cascade is admitted, not dropped.
    out = rig.manager.prepare_store([key(101)])
    assert out is not None and out.demotion is None
    write_top(rig, key(101), int(slot_ids(out.store_spec)[0]))
    rig.manager.complete_store([key(101)])
    (follow,) = rig.manager.take_jobs()
    assert rig.engine.admit(follow)
    await rig.engine.run(follow)
    rig.jobs.append(follow)
    assert rig.manager.locate(key(101)) == (0, True)
    assert rig.manager.tiers[2].lookup(key(101)) is True
    await verify(rig)


# -- a hung slow tier ------------------------------------------------------------------------


async def test_a_demotion_to_a_hung_tier_resolves_staged_before_its_write(tmp_path: Path) -> None:
    """The store waits only for the victims' snapshot: `staged` resolves, the top and middle
    tiers' slots are usable, while the write to the slow tier is still blocked."""
    rig, job, after = await SCENARIOS["demote"]((2,), tmp_path)
    slow = rig.flaky(2)
    gate = slow.block("write")
    staged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(rig.engine.run(job, staged))
    await asyncio.wait_for(staged, 2)
    assert not task.done()
    assert gate.waiting == 1 and slow.counters.returned["write"] == 0
    assert job.sources_released
    gpu, cpu, bottom = (tier.stats() for tier in rig.manager.tiers)
    assert (gpu.pinned, cpu.pending, cpu.pinned) == (0, 0, 0)  # cpu settled early
    assert bottom.pending == 1  # only the slow write is still open
    assert rig.staging.free == rig.staging.num_blocks - 1  # its snapshot
    after()  # the store completes while the slow write hangs
    assert rig.manager.locate(key(100)) == (0, True)
    gate.release()
    assert await asyncio.wait_for(task, 2) == MoveResult()
    rig.jobs.append(job)
    await verify(rig)


async def test_a_hung_slow_write_cancelled_lets_go_of_everything(tmp_path: Path) -> None:
    rig, job, after = await SCENARIOS["demote"]((2,), tmp_path)
    slow = rig.flaky(2)
    gate = slow.block("write")
    supervisor = JobSupervisor(rig.engine, lambda: None)
    staged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = supervisor.spawn(job, staged)
    await asyncio.wait_for(staged, 2)
    after()
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # a copy in flight is never abandoned mid-write
    gate.release()
    await asyncio.wait_for(supervisor.drain(), 2)
    rig.jobs.append(job)
    await verify(rig)


# -- the priority semaphore ------------------------------------------------------------------


async def spin(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_loads_go_first_and_non_loads_never_take_the_reserved_slot() -> None:
    semaphore = PrioritySemaphore(3, reserved=1)
    order: list[str] = []
    release = asyncio.Event()

    async def hold(priority: int, name: str) -> None:
        async with semaphore.hold(priority):
            order.append(name)
            await release.wait()

    tasks = [asyncio.ensure_future(hold(Priority.DEMOTE, f"demote-{i}")) for i in range(3)]
    await spin()
    # Two background copies took the two slots that are not kept for loads; the third
    # waits though a slot is free, and so does a cascade.
    assert order == ["demote-0", "demote-1"] and semaphore.waiting == 1
    tasks.append(asyncio.ensure_future(hold(Priority.CASCADE, "cascade")))
    await spin()
    assert len(order) == 2 and semaphore.waiting == 2
    tasks.append(asyncio.ensure_future(hold(Priority.LOAD, "load-0")))
    await spin()
    assert order[2:] == ["load-0"]  # the load found the slot kept for it
    # A second load queues ahead of every background waiter: it is served first.
    tasks.append(asyncio.ensure_future(hold(Priority.LOAD, "load-1")))
    await spin()
    assert len(order) == 3 and semaphore.waiting == 3
    release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order[3:] == ["load-1", "demote-2", "cascade"]


async def test_holders_never_exceed_the_value_nor_non_loads_the_unreserved_slots() -> None:
    semaphore = PrioritySemaphore(4, reserved=2)
    holding: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    gate = asyncio.Event()

    async def hold(priority: int) -> None:
        kind = "load" if priority == Priority.LOAD else "other"
        async with semaphore.hold(priority):
            holding[kind] += 1
            peak[kind] = max(peak[kind], holding[kind])
            peak["all"] = max(peak["all"], holding["load"] + holding["other"])
            await gate.wait()
            holding[kind] -= 1

    tasks = [asyncio.ensure_future(hold(p)) for p in [1, 2, 1, 2, 1] * 2]
    await spin()
    assert peak["other"] == 2
    tasks += [asyncio.ensure_future(hold(Priority.LOAD)) for _ in range(4)]
    await spin()
    assert peak["load"] == 2 and peak["all"] == 4
    gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert peak["other"] == 2 and peak["all"] == 4


@pytest.mark.parametrize("where", ["waiting", "granted"])
async def test_a_cancelled_waiter_does_not_block_the_others(where: str) -> None:
    semaphore = PrioritySemaphore(2, reserved=1)
    outer = semaphore.hold(Priority.LOAD)
    await outer.__aenter__()  # one slot held by a load, one left (kept for loads)
    background = asyncio.ensure_future(semaphore.hold(Priority.DEMOTE).__aenter__())
    await spin()
    assert not background.done()
    victim_cm = semaphore.hold(Priority.LOAD)
    victim = asyncio.ensure_future(victim_cm.__aenter__())
    await spin()
    assert victim.done()  # a load takes the reserved slot at once
    await victim_cm.__aexit__(None, None, None)
    # Both slots but one taken again; a load waits behind the held one.
    inner = semaphore.hold(Priority.LOAD)
    await inner.__aenter__()
    waiter = asyncio.ensure_future(semaphore.hold(Priority.LOAD).__aenter__())
    await spin()
    assert not waiter.done() and semaphore.waiting == 2
    if where == "granted":
        await inner.__aexit__(None, None, None)  # grants the waiting load, not yet run
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    if where == "waiting":
        await inner.__aexit__(None, None, None)
    # The free slot is the one kept for loads; the background copy still waits for the
    # other one, and gets it when the outer load leaves, whatever happened to the waiter.
    await spin()
    assert not background.done()
    await outer.__aexit__(None, None, None)
    await asyncio.wait_for(background, 1)
    assert semaphore.waiting == 0


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=st.integers(1, 4),
    reserved_share=st.integers(0, 3),
    holders=st.lists(
        st.tuples(
            st.sampled_from([int(p) for p in Priority]),  # priority
            st.integers(0, 3),  # turns it holds the slot
            st.one_of(st.none(), st.integers(0, 4)),  # cancelled after that many turns
            st.integers(0, 2),  # turns before it asks
        ),
        min_size=1,
        max_size=16,
    ),
)
def test_random_interleavings_never_deadlock_or_overbook(
    value: int, reserved_share: int, holders: list[tuple[int, int, int | None, int]]
) -> None:
    """Random holders of random priorities, some cancelled at random turns (queued, just
    granted or holding): never more holders than slots, never a non-load in a reserved slot,
    never a free slot left idle while a waiter could take it, and every holder not
    cancelled gets through (no deadlock); then every slot is free again."""
    reserved = min(reserved_share, value - 1)

    async def scenario() -> None:
        semaphore = PrioritySemaphore(value, reserved=reserved)
        holding = Counter[str]()
        violations: list[str] = []

        def check() -> None:
            if holding["all"] > value:
                violations.append(f"{holding['all']} holders of {value} slots")
            if holding["other"] > value - reserved:
                violations.append(f"{holding['other']} non-loads with {reserved} reserved")
            free = semaphore._free
            for priority, _, future in semaphore._waiters:
                floor = 0 if priority == Priority.LOAD else reserved
                if not future.done() and free > floor:
                    violations.append(f"a priority-{priority} waiter idles by {free} free")

        async def holder(priority: int, turns: int, delay: int) -> None:
            await spin(delay)
            async with semaphore.hold(priority):
                kind = "load" if priority == Priority.LOAD else "other"
                holding["all"] += 1
                holding[kind] += 1
                check()
                try:
                    await spin(turns)
                finally:
                    holding["all"] -= 1
                    holding[kind] -= 1

        tasks = [asyncio.ensure_future(holder(p, t, d)) for p, t, _, d in holders]

        async def canceller(task: asyncio.Task[None], after: int) -> None:
            await spin(after)
            task.cancel()

        cancels = [
            asyncio.ensure_future(canceller(task, after))
            for task, (_, _, after, _) in zip(tasks, holders, strict=True)
            if after is not None
        ]
        done = asyncio.ensure_future(asyncio.gather(*tasks, return_exceptions=True))
        while not done.done():
            check()
            await asyncio.sleep(0)
        async with asyncio.timeout(5):
            results = await done
            await asyncio.gather(*cancels)
        assert not violations, violations[:3]
        for task, result in zip(tasks, results, strict=True):
            assert result is None or (task.cancelled() and isinstance(result, BaseException))
        assert semaphore.waiting == 0
        async with asyncio.timeout(1), AsyncExitStack() as stack:
            for _ in range(value):  # every slot free again, taken at once
                await stack.enter_async_context(semaphore.hold(Priority.LOAD))

    asyncio.run(scenario())


async def test_a_tier_declared_tensor_that_is_not_a_pool_is_refused() -> None:
    """A storage declared a tensor pool but not one would have its demotions staged from a
    tensor it does not have (lost silently): the engine refuses it, naming the tier."""
    tiers = [make_tier_manager(n, B, m, name=m) for n, m in ((2, "cpu"), (4, "disk"))]
    manager = TieredManager(tiers)
    storages: list[BlockStorage] = [FlakyStorage(TorchPool(2, B)), FlakyStorage(TorchPool(4, B))]
    with pytest.raises(InvalidValueError, match="'cpu' is declared a tensor pool"):
        TransferEngine(manager, storages, staging=StagingArena(4, B), tensor_tiers=[True, False])
    engine = TransferEngine(manager, storages, staging=StagingArena(4, B))
    assert engine.tensor_tiers == [False, False]  # by default, what the storages are
