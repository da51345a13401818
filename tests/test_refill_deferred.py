"""A background refill planned off the put that makes it due (`defer_refills`,
`ChainPlanner.plan_refills`, `Chain.plan_refills`): the put returns before the refill's
victims are chosen; the chain plans it on the loop's next turn, or at once where something
must not go on without it (a store short of room, `drain`, `flush`, closing). Planned later,
it decides what the store would have decided, and never takes a slot a put still writes."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hierarchy_helpers import blocks_of, chain_config, key
from test_refill_floor import MARKS, background_copies, plans, random_puts
from test_refill_merge import Recorder
from test_tiered_manager import k

from kvtier import Hierarchy
from kvtier.keys import OffloadKey
from kvtier.manager import JobKind, TieredManager, make_tier_manager, slot_ids

# -- the bookkeeping ---------------------------------------------------------------------------


def cpu_over_disk(floor: int, *, defer: bool, cpu: int = 256) -> TieredManager:
    tiers = [
        make_tier_manager(cpu, 64, "cpu", "lru", name="cpu"),
        make_tier_manager(4096, 64, "disk", "lru", name="disk"),
    ]
    return TieredManager(
        tiers, watermarks=[MARKS, None], min_refills=[floor, 0], defer_refills=defer
    )


def run_puts(floor: int, *, defer: bool, puts: int = 300, seed: int = 3) -> Recorder:
    """`random_puts`, each put followed by the refill it made due (deferred: planned after
    the store settled, as the chain does)."""
    model = Recorder(cpu_over_disk(floor, defer=defer))
    manager = model.manager

    def plan_deferred() -> None:
        due = manager.refill_due
        jobs = manager.take_jobs()  # what the store planned: no refill, if one is due
        assert not (due and any(job.background for job in jobs))
        for job in jobs:
            model.run(job)
        assert manager.plan_refills() is due
        assert not manager.refill_due

    return random_puts(model, puts, seed, plan_deferred if defer else None)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("floor", [0, 20])
def test_a_deferred_refill_plans_what_the_store_would_have_planned(seed: int, floor: int) -> None:
    inline = run_puts(floor, defer=False, seed=seed)
    deferred = run_puts(floor, defer=True, seed=seed)
    assert plans(deferred) == plans(inline)  # the same jobs, blocks and slots, in order
    assert deferred.contents() == inline.contents()
    copies = background_copies(deferred)
    assert copies and max(copies) <= 256 // 8  # never more than the cap
    if floor:
        assert min(copies) >= floor  # each refill still copies at least the floor


def due(manager: TieredManager) -> bool:
    """`refill_due` read afresh (a call, so that a type checker does not narrow it)."""
    return manager.refill_due


def test_a_store_only_notes_a_refill_due() -> None:
    manager = cpu_over_disk(0, defer=True)
    model = Recorder(manager)
    for i in range(250):  # 256 slots, trigger 6 free: the 251st block makes a refill due
        model.put([k(i)])
    assert not due(manager) and manager.take_jobs() == []
    model.put([k(250)])
    assert due(manager)
    assert manager.take_jobs() == [] and manager.top.num_draining == 0
    assert manager.counters.reserve_evicted == 0
    assert manager.plan_refills() and not manager.refill_due
    (job,) = manager.take_jobs()
    assert job.kind is JobKind.DEMOTE and job.background
    assert manager.counters.reserve_evicted == 13 - 5  # from 5 free to the target, 13
    assert not manager.plan_refills()  # nothing due any more


class Window(Recorder):
    """The byte model with puts in flight: a store's slots are reserved (`begin`) and
    written and settled later (`finish`), while refills are planned and jobs run between."""

    def __init__(self, manager: TieredManager) -> None:
        super().__init__(manager)
        self.in_flight: list[tuple[list[OffloadKey], list[int]]] = []
        self.queued: list[Any] = []

    def begin(self, keys: list[OffloadKey]) -> None:
        out = self.manager.prepare_store(keys)
        if out is None:
            return
        if out.demotion is not None:
            self.run(out.demotion)  # the put waits for its victims' snapshot
        slots = [int(slot) for slot in slot_ids(out.store_spec)]
        self.in_flight.append((list(out.keys_to_store), slots))

    def finish(self, index: int) -> None:
        keys, slots = self.in_flight.pop(index)
        for key_, slot in zip(keys, slots, strict=True):
            self.slots[0][slot] = key_
        self.manager.complete_store(keys)

    def plan_refill(self) -> None:
        open_before = {job.id for job in self.manager.open_jobs()}
        self.manager.plan_refills()
        new = [job for job in self.manager.open_jobs() if job.id not in open_before]
        writing = {slot for _, slots in self.in_flight for slot in slots}
        for job in new:  # its victims' slots: never one a put in flight writes
            drained = {block.block_id for index, blocks in job.drain for block in blocks}
            read = {int(s) for step in job.steps if step.src == 0 for s in step.src_ids}
            assert not (drained | read) & writing

    def run_queued(self, rng: random.Random) -> None:
        self.queued.extend(self.manager.take_jobs())
        if self.queued:
            self.run(self.queued.pop(rng.randrange(len(self.queued))))


@pytest.mark.parametrize("seed", range(6))
def test_refills_planned_while_puts_are_in_flight_never_take_their_slots(seed: int) -> None:
    rng = random.Random(seed)
    manager = cpu_over_disk(8, defer=True, cpu=96)
    model = Window(manager)
    next_key = 0
    for _ in range(1500):
        op = rng.random()
        if op < 0.4 and len(model.in_flight) < 4:
            keys = [k(next_key + j) for j in range(rng.randint(1, 6))]
            next_key += len(keys)
            if next_key > 40 and rng.random() < 0.2:
                keys[0] = k(rng.randrange(next_key - 40))
            model.begin(keys)
        elif op < 0.65 and model.in_flight:
            model.finish(rng.randrange(len(model.in_flight)))
        elif op < 0.8:
            model.plan_refill()
        else:
            model.run_queued(rng)
        model.verify()  # every readable block holds its own bytes
    while model.in_flight:
        model.finish(0)
    model.plan_refill()
    model.queued.extend(manager.take_jobs())
    for job in model.queued:
        model.run(job)
    model.verify()
    assert manager.counters.reserve_evicted > 0


# -- the chain ---------------------------------------------------------------------------------


def memory_chain(tmp_path: Path) -> dict[str, Any]:
    """A top tier of 256 blocks (its reserve: 6 -> 13 free) over one of 4096, both memory."""
    return chain_config(tmp_path, gpu=256, cpu=4096, disk=None, device="cpu")


async def put_until_due(h: Hierarchy, first: int = 0) -> int:
    """Puts of 2 new blocks until one returns with a refill due; the next free key."""
    manager = h.chain.manager
    for _ in range(1000):
        ks = [key(first), key(first + 1)]
        first += 2
        assert await h.put(ks, blocks_of(ks)) == 2
        if manager.refill_due:
            return first
        await h.drain()
    raise AssertionError("no put returned with a refill due")


async def assert_reads_back(h: Hierarchy, keys: list[OffloadKey]) -> None:
    """Every block some tier holds reads back its own bytes."""
    held = [key_ for key_ in keys if h.where(key_) is not None]
    for start in range(0, len(held), 16):
        part = held[start : start + 16]
        got = await h.get(part)
        assert got.shape[0] == len(part)
        assert torch.equal(got.cpu(), blocks_of(part))


async def test_a_put_returns_before_the_refill_it_makes_due_is_planned(tmp_path: Path) -> None:
    async with Hierarchy.from_config(memory_chain(tmp_path), flush_on_close=False) as h:
        manager = h.chain.manager
        top = manager.top
        seen = 0
        for first in range(0, 1000, 2):
            ks = [key(first), key(first + 1)]
            evicted = manager.counters.reserve_evicted
            assert await h.put(ks, blocks_of(ks)) == 2
            if manager.refill_due:
                seen += 1
                # The put is over; its refill's victims are not chosen yet.
                assert manager.counters.reserve_evicted == evicted
                assert top.num_draining == 0
                assert not any(job.background for job in manager.open_jobs())
                await asyncio.sleep(0)  # the loop's next turn plans it
                assert not due(manager)
                assert manager.counters.reserve_evicted > evicted
                assert h.chain.busy
            await h.drain()
        assert seen >= 50  # every 4th put or so (13 free after a refill, trigger 6)
        assert h.stats().calls.put_demotion_waits == 0
        await assert_reads_back(h, [key(i) for i in range(1000)])
        h.check()


async def test_a_store_short_of_room_plans_the_due_refill_and_waits_for_it(
    tmp_path: Path,
) -> None:
    async with Hierarchy.from_config(memory_chain(tmp_path), flush_on_close=False) as h:
        first = await put_until_due(h)
        top = h.chain.manager.top
        assert top.num_free < 8 and top.num_draining == 0
        ks = [key(first + i) for i in range(8)]  # more than the free slots: it must wait
        assert await h.put(ks, blocks_of(ks)) == 8
        calls = h.stats().calls
        assert calls.put_backpressure_waits == 1  # it waited for the refill's slots
        assert calls.put_demotion_waits == 0  # rather than evicting on its own path
        await h.drain()
        await assert_reads_back(h, [key(i) for i in range(first + 8)])


async def test_drain_plans_a_due_refill_and_waits_for_it(tmp_path: Path) -> None:
    async with Hierarchy.from_config(memory_chain(tmp_path), flush_on_close=False) as h:
        await put_until_due(h)
        manager = h.chain.manager
        await h.drain()
        assert not manager.refill_due and not h.chain.busy
        assert manager.top.num_draining == 0
        assert manager.top.num_free == 13  # the reserve is back at its target


async def test_flush_plans_a_due_refill_first(tmp_path: Path) -> None:
    async with Hierarchy.from_config(memory_chain(tmp_path), flush_on_close=False) as h:
        first = await put_until_due(h)
        manager = h.chain.manager
        await h.flush()
        assert h.last_flush is not None and h.last_flush.left == 0
        assert not manager.refill_due
        assert manager.top.num_free + manager.top.num_draining >= 13  # the reserve refilled
        await h.drain()
        await assert_reads_back(h, [key(i) for i in range(first)])
        h.check()


@pytest.mark.parametrize("flush", [False, True])
async def test_closing_with_a_refill_due_plans_and_settles_it(
    tmp_path: Path, flush: bool, caplog: pytest.LogCaptureFixture
) -> None:
    h = Hierarchy.from_config(memory_chain(tmp_path), flush_on_close=flush)
    async with h:
        await put_until_due(h)
        chain = h.chain
        evicted = chain.manager.counters.reserve_evicted
    assert chain.manager.closed and chain.state == "closed"
    assert chain.manager.counters.reserve_evicted > evicted  # planned as the close began
    counters = chain.supervisor.counters
    assert counters.job_errors == 0 and counters.jobs_abandoned == 0
    await asyncio.sleep(0)  # a refill callback still scheduled would run (and fail) here
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_an_engine_store_returns_before_its_refill_is_planned(tmp_path: Path) -> None:
    async with Hierarchy.from_config(memory_chain(tmp_path), flush_on_close=False) as h:
        manager = h.chain.manager
        pool = h.storages[0].tensor  # type: ignore[attr-defined]
        seen = 0
        for first in range(0, 600, 3):
            ks = [key(first + i) for i in range(3)]
            out = await h.prepare_engine_store(ks)
            assert out is not None and out.keys_to_store == ks
            if manager.refill_due:
                seen += 1
                assert manager.top.num_draining == 0  # its victims are not chosen yet
            # The engine writes the slots it was given, then settles them.
            for row, slot in enumerate(slot_ids(out.store_spec).tolist()):
                pool[slot] = blocks_of(ks)[row]
            manager.complete_store(ks)
            h.start_planned_jobs()
            await h.drain()
        assert seen >= 20
        await assert_reads_back(h, [key(i) for i in range(600)])
        h.check()


async def test_concurrent_puts_and_gets_with_deferred_refills_read_back_right(
    tmp_path: Path,
) -> None:
    rng = random.Random(7)
    async with Hierarchy.from_config(memory_chain(tmp_path), flush_on_close=False) as h:
        manager = h.chain.manager

        async def putter(base: int) -> None:
            for i in range(60):
                ks = [key(base + 4 * i + j) for j in range(rng.randint(1, 4))]
                assert await h.put(ks, blocks_of(ks)) == len(ks)

        async def getter() -> None:
            for _ in range(60):
                base = 10_000 * rng.randrange(6)
                ks = [key(base + i) for i in sorted(rng.sample(range(240), 3))]
                got = await h.get(ks)
                if got.shape[0]:
                    assert torch.equal(got.cpu(), blocks_of(ks[: got.shape[0]]))
                await asyncio.sleep(0)

        await asyncio.gather(*(putter(10_000 * n) for n in range(6)), getter(), getter())
        await h.drain()
        assert manager.counters.reserve_evicted > 0
        await assert_reads_back(h, [key(10_000 * n + i) for n in range(6) for i in range(240)])
        h.check()


async def test_a_deferred_refill_that_fails_to_plan_is_a_counted_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning on the loop's next turn has no caller: what it raises is counted as a job's
    error and logged, the put that made it due stays stored, and the chain goes on."""
    async with Hierarchy.from_config(memory_chain(tmp_path), flush_on_close=False) as h:
        manager = h.chain.manager
        counters = h.chain.supervisor.counters
        first = await put_until_due(h)

        def broken() -> bool:
            manager.planner.refill_due = False
            raise RuntimeError("planning failed")

        monkeypatch.setattr(manager, "plan_refills", broken)
        await asyncio.sleep(0)  # the loop's next turn runs the planning, which raises
        assert counters.job_errors == 1
        assert counters.error_types == {"RuntimeError": 1}
        monkeypatch.undo()
        ks = [key(first), key(first + 1)]
        assert await h.put(ks, blocks_of(ks)) == 2
        await h.drain()
        await assert_reads_back(h, [key(i) for i in range(first + 2)])
