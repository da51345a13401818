"""Nothing that goes wrong in the background reaches the caller of a `Hierarchy`.

A tier that raises (any exception class, in the loop or a worker thread), hangs, or a call
cancelled at any of its await points: the calling task is never cancelled and never sees
the exception (puts return counts, gets shorter prefixes), errors are counted, every pin,
pending block and draining slot is released once the background work is drained, and the
hierarchy keeps serving the right bytes afterwards. Faults are injected with
`kvtier.testing.faults.FlakyStorage`."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import lmdb
import pytest
import torch
from hierarchy_helpers import blocks_of, chain_config, content, key

from kvtier import Hierarchy
from kvtier.engine import TransferEngine
from kvtier.engine.moves import MoveResult
from kvtier.engine.supervisor import JobSupervisor
from kvtier.errors import InvalidValueError, ManagerClosedError
from kvtier.keys import OffloadKey
from kvtier.manager import TieredManager, TransferJob, make_tier_manager
from kvtier.manager.jobs import JobKind, slot_ids
from kvtier.testing.faults import CallKind, ErrorSpec, FlakyStorage, install, uninstall
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.pool.storage import TorchPool
from kvtier.tiers.storage import BlockStorage


class Boom(Exception):
    """A bug in a tier, of a class nobody catches on purpose."""


def keys_(*ids: int) -> list[OffloadKey]:
    return [key(i) for i in ids]


def settled(h: Hierarchy) -> None:
    """No pin, pending block or draining slot anywhere; the bookkeeping checks out."""
    for tier in h.stats().tiers:
        assert (tier.pending, tier.pinned, tier.draining) == (0, 0, 0), tier
    h.check()
    assert h.manager.open_jobs() == []


def assert_prefix(out: torch.Tensor, keys: list[OffloadKey]) -> None:
    """`out` is a prefix of `keys`' blocks, each row exactly its block's bytes."""
    assert out.shape[0] <= len(keys)
    for row, k in zip(out, keys, strict=False):
        assert torch.equal(row.cpu(), content(k)), k


HEALED_TIMEOUT_S = 60.0
"""The get deadline once the faults are gone: a loaded machine's promotion may take longer
than a test's short `load_timeout_s`, which is for the gets that meet the faults."""


async def assert_serves_everything_it_holds(h: Hierarchy, keys: list[OffloadKey]) -> int:
    """Every key some tier holds reads back whole and bit-exact; how many did."""
    served = 0
    for k in keys:
        if h.where(k) is None:
            continue
        out = await h.get([k], timeout_s=HEALED_TIMEOUT_S)
        assert out.shape[0] == 1, (k, h.where(k))
        assert torch.equal(out[0].cpu(), content(k)), k
        served += 1
    return served


async def assert_works_again(h: Hierarchy, first: int) -> None:
    """New blocks are stored and read back whole and bit-exact (spilling down the chain)."""
    fresh = keys_(*range(first, first + 6))
    for k in fresh:
        assert await h.put([k], blocks_of([k])) == 1
    out = await h.get(fresh, timeout_s=HEALED_TIMEOUT_S)
    assert out.shape[0] == len(fresh)
    assert_prefix(out, fresh)


CHAINS: dict[str, dict[str, Any]] = {
    "cpu-disk": {"gpu": None, "cpu": 4, "disk": 16},
    "gpu-cpu-disk": {"gpu": 2, "cpu": 4, "disk": 16},
}

ERRORS: list[tuple[ErrorSpec, bool]] = [
    (Boom, False),
    (KeyError, True),
    (lmdb.Error, False),
    (RuntimeError, True),
    (AttributeError, False),
    (ZeroDivisionError, True),
]


def cases() -> list[Any]:
    params: list[Any] = []
    for chain, sizes in CHAINS.items():
        names = [name for name in ("gpu", "cpu", "disk") if sizes[name]]
        for tier, name in enumerate(names):
            for kind in ("read", "write"):
                error, in_thread = ERRORS[len(params) % len(ERRORS)]
                assert isinstance(error, type)
                where = "thread" if in_thread else "loop"
                params.append(
                    pytest.param(
                        chain,
                        tier,
                        kind,
                        error,
                        in_thread,
                        id=f"{chain}-{name}-{kind}-{error.__name__}-in-{where}",
                    )
                )
    return params


@pytest.mark.parametrize(("chain", "tier", "kind", "error", "in_thread"), cases())
async def test_a_tier_raising_any_exception_is_only_ever_a_miss(
    tmp_path: Path, chain: str, tier: int, kind: CallKind, error: type[Exception], in_thread: bool
) -> None:
    config = chain_config(tmp_path, **CHAINS[chain])
    # A short get deadline: a get whose promotion keeps failing waits at most this long.
    async with Hierarchy.from_config(config, load_timeout_s=0.3) as h:
        flaky = install(h, tier)
        every = keys_(*range(16))
        for k in every[:6]:
            assert await h.put([k], blocks_of([k])) == 1
        await h.drain()
        caller = asyncio.current_task()
        assert caller is not None
        rule = flaky.fail(kind, error, in_thread=in_thread)
        # Puts that evict (and demote) at every tier, then gets of blocks at every tier
        # (promotions), oldest first.
        for i in range(6, 16, 2):
            stored = await h.put(every[i : i + 2], blocks_of(every[i : i + 2]))
            assert 0 <= stored <= 2
        for start in (0, 3, 6, 10, 14):
            batch = every[start : start + 3]
            assert_prefix(await h.get(batch), batch)
        assert caller.cancelling() == 0 and not caller.cancelled()
        await h.drain()
        assert rule.fired >= 1
        stats = h.stats()
        assert stats.errors == {error.__name__: rule.fired}
        assert stats.failed_blocks >= 1
        # The engine contained every exception: no job broke, none was abandoned.
        assert stats.supervisor.job_errors == 0 and stats.supervisor.jobs_abandoned == 0
        assert stats.supervisor.jobs_started >= 1
        settled(h)
        flaky.clear()
        await assert_serves_everything_it_holds(h, every)
        await assert_works_again(h, 100)
        await h.drain()
        settled(h)


# -- hung tiers ------------------------------------------------------------------------------


async def test_a_get_from_a_hung_lower_tier_returns_at_its_deadline(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16)
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(8))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()
        assert h.where(ks[0]) == "disk"
        on_top = [k for k in ks if h.where(k) == "cpu"]
        assert on_top
        flaky = install(h, 1)
        hang = flaky.block("read")
        started = time.monotonic()
        out = await h.get(ks[:2], timeout_s=0.3)
        elapsed = time.monotonic() - started
        assert out.shape[0] == 0
        assert elapsed >= 0.25  # it waited for the promotion, until its deadline (never early)
        # ... and not for the read, which is still held (it is only released below).
        assert hang.waiting == 1 and h.stats().calls.get_timeouts == 1
        # The rest of the hierarchy does not wait for the hung tier (hung until released).
        out = await asyncio.wait_for(h.get(on_top[-1:]), 60)
        assert out.shape[0] == 1
        assert_prefix(out, on_top[-1:])
        hang.release()
        await asyncio.wait_for(h.drain(), 5)
        settled(h)
        out = await h.get(ks[:2])
        assert out.shape[0] == 2
        assert_prefix(out, ks[:2])
        await h.drain()
        settled(h)


async def test_a_get_from_a_hung_top_tier_returns_at_its_deadline(tmp_path: Path) -> None:
    """A read of blocks already at the top (a disk-only chain's disk) that hangs: the get
    returns at its deadline; the late read keeps its pins until it ends (drain waits)."""
    config = chain_config(tmp_path, gpu=None, cpu=None, disk=8)
    async with Hierarchy.from_config(config) as h:
        ks = keys_(1, 2)
        assert await h.put(ks, blocks_of(ks)) == 2
        flaky = install(h, 0)
        hang = flaky.block("read")
        out = await h.get(ks, timeout_s=0.3)  # the read is held until released below
        assert out.shape[0] == 0 and h.stats().calls.get_timeouts == 1
        assert hang.waiting == 1  # the get returned at its deadline, not after the read
        assert h.stats().tiers[0].pinned == 2  # the late read still reads those slots
        hang.release()
        await asyncio.wait_for(h.drain(), 2)
        settled(h)
        out = await h.get(ks)
        assert out.shape[0] == 2
        assert_prefix(out, ks)


async def test_a_get_whose_promotion_fails_returns_the_miss_without_retrying(
    tmp_path: Path,
) -> None:
    """A promotion whose copy raised brought nothing: that is a miss at once, not a new
    promotion at every wake-up until the deadline."""
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16)
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(8))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()
        assert h.where(ks[0]) == "disk"
        flaky = install(h, 1)
        rule = flaky.fail("read", Boom)
        started_jobs = h.stats().supervisor.jobs_started
        out = await h.get(ks[:1], timeout_s=2.0)
        await h.drain()
        promotions = h.stats().supervisor.jobs_started - started_jobs
        settled(h)
        assert out.shape[0] == 0 and rule.fired >= 1
        # A miss at once: the get did not wait out its deadline, nor promote again and again.
        assert h.stats().calls.get_timeouts == 0 and promotions < 4, promotions


# -- cancellation ----------------------------------------------------------------------------


def request(h: Hierarchy, op: str, round_: int, ks: list[OffloadKey]) -> asyncio.Task[Any]:
    """A put of two new blocks (the top tier is full: it demotes), or a get of a block of
    the top tier or of the bottom one, then of one of the bottom (promotions)."""
    if op == "put":
        new = keys_(1000 + 2 * round_, 1001 + 2 * round_)
        return asyncio.ensure_future(h.put(new, blocks_of(new)))
    below = [k for k in ks if h.where(k) == "disk"]
    top = [k for k in ks if h.where(k) == h.tiers[0].name]
    assert below and top
    first = top[round_ % len(top)] if round_ % 2 else below[round_ % len(below)]
    batch = list(dict.fromkeys([first, below[-1]]))
    return asyncio.ensure_future(h.get(batch))


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("op", ["put", "get"])
async def test_a_call_cancelled_at_any_await_leaks_nothing(
    tmp_path: Path, op: str, chain: str
) -> None:
    """Cancel the call after n event-loop turns for n = 0, 1, ... (and after growing short
    times): whatever it was waiting for, after a drain nothing is pinned, pending or
    draining, and every block the chain holds reads back bit-exact."""
    config = chain_config(tmp_path, **CHAINS[chain])
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(14))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()
        caller = asyncio.current_task()
        assert caller is not None
        outcomes = {"cancelled": 0, "finished": 0}
        delays = [("turns", n) for n in range(40)] + [("seconds", 1e-4 * 2**i) for i in range(8)]
        for round_, (unit, amount) in enumerate(delays):
            task = request(h, op, round_, ks)
            if unit == "turns":
                for _ in range(int(amount)):
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(amount)
            if task.done():
                outcomes["finished"] += 1
            else:
                task.cancel()
            await asyncio.wait([task])
            if task.cancelled():
                outcomes["cancelled"] += 1
            else:
                result = task.result()  # never an exception
                assert isinstance(result, int | torch.Tensor)
            assert caller.cancelling() == 0
            await h.drain()
            settled(h)
        assert outcomes["cancelled"] >= 5, outcomes
        every = ks + keys_(*range(1000, 1000 + 2 * len(delays)))
        assert await assert_serves_everything_it_holds(h, every) >= 4
        await assert_works_again(h, 2000)
        await h.drain()
        settled(h)


# -- the supervisor on its own ---------------------------------------------------------------


async def chain_with_a_promotion(
    tmp_path: Path,
) -> tuple[TieredManager, list[BlockStorage], TransferJob]:
    """A cpu(2) -> disk(8) chain with blocks 0..5 (0..3 on disk) and the PROMOTE job of a
    lookup of block 0, not yet run."""
    tiers = [make_tier_manager(2, 64, "cpu", name="cpu"), make_tier_manager(8, 64, "disk")]
    manager = TieredManager(tiers)
    storages: list[BlockStorage] = [
        TorchPool(2, 64),
        DiskStore(tmp_path, block_size=64, num_blocks=8, direct_io=False, fsync=False),
    ]
    engine = TransferEngine(manager, storages)
    top = storages[0]
    assert isinstance(top, TorchPool)
    for i in range(6):
        out = manager.prepare_store([key(i)])
        assert out is not None
        if out.demotion is not None:
            await engine.run(out.demotion)
        top.tensor[int(slot_ids(out.store_spec)[0])] = content(key(i), 64)
        manager.complete_store([key(i)])
    assert manager.locate(key(0)) == (1, True)
    assert manager.lookup(key(0)) is None
    (job,) = manager.take_jobs()
    assert job.kind is JobKind.PROMOTE
    assert manager.tiers[1].stats().pinned == 1  # the job pins its source
    return manager, storages, job


@pytest.mark.parametrize("staged", [False, True])
async def test_a_job_cancelled_before_it_ever_ran_is_settled(tmp_path: Path, staged: bool) -> None:
    manager, storages, job = await chain_with_a_promotion(tmp_path)
    engine = TransferEngine(manager, storages)
    woken = []
    supervisor = JobSupervisor(engine, lambda: woken.append(True))
    future: asyncio.Future[None] | None = (
        asyncio.get_running_loop().create_future() if staged else None
    )
    task = supervisor.spawn(job, future)
    task.cancel()  # before its first step
    await asyncio.wait_for(supervisor.drain(), 5)
    assert task.cancelled()
    assert manager.open_jobs() == []
    for tier in manager.tiers:
        stats = tier.stats()
        assert (stats.pending, stats.pinned, stats.draining) == (0, 0, 0), stats
    manager.check()
    assert manager.promotion_of(key(0)) is None
    assert manager.locate(key(0)) == (1, True)  # where it was, unpinned, not at the top
    assert supervisor.counters.jobs_abandoned == 1 and supervisor.counters.job_errors == 0
    assert engine.counters.jobs["promote"] == 0  # it never ran
    assert woken == [True] and not supervisor.busy
    assert future is None or future.done()
    # A new lookup promotes it as usual.
    assert manager.lookup(key(0)) is None
    (again,) = manager.take_jobs()
    assert await engine.run(again) == MoveResult()
    assert manager.lookup(key(0)) is True
    for storage in storages:
        await storage.aclose()


async def test_a_job_that_breaks_outside_any_copy_is_counted_and_settled(tmp_path: Path) -> None:
    """A bug in the engine itself (not a tier's copy): the supervisor catches it, counts it
    in `stats().supervisor`, settles the job, and the caller's get is a miss."""
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16)
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(8))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()
        assert h.where(ks[0]) == "disk"
        engine = h._engine
        assert engine is not None
        healthy = engine.run

        async def broken(job: TransferJob, staged: asyncio.Future[None] | None = None) -> Any:
            if job.kind is JobKind.PROMOTE:
                raise Boom("a bug in the engine")
            return await healthy(job, staged)

        engine.run = broken  # type: ignore[method-assign]
        out = await h.get(ks[:2], timeout_s=0.3)
        assert out.shape[0] == 0
        await h.drain()
        supervisor = h.stats().supervisor
        assert supervisor.job_errors >= 1 and supervisor.error_types == {
            "Boom": supervisor.job_errors
        }
        assert supervisor.jobs_abandoned == supervisor.job_errors
        settled(h)
        engine.run = healthy  # type: ignore[method-assign]
        out = await h.get(ks[:2])
        assert out.shape[0] == 2
        assert_prefix(out, ks[:2])
        await h.drain()
        settled(h)


async def test_flaky_storage_rules(tmp_path: Path) -> None:
    """The fault injector itself: next-N failures, delays, gates, block failures, clear."""
    pool = TorchPool(4, 64)
    flaky = FlakyStorage(pool)
    buffers = [content(key(i), 64).numpy().copy() for i in range(2)]
    assert await flaky.write(keys_(0, 1), [0, 1], buffers) == [None, None]
    once = flaky.fail("read", KeyError, times=1)
    with pytest.raises(KeyError, match="injected"):
        await flaky.read(keys_(0), [0], [buffers[0].copy()])
    assert once.fired == 1 and not once.active
    out = [buffers[0].copy() * 0]
    assert await flaky.read(keys_(0), [0], out) == [None]
    assert (out[0] == buffers[0]).all()
    flaky.fail("write", Boom, in_thread=True, times=1)
    with pytest.raises(Boom):
        await flaky.write(keys_(2), [2], buffers[:1])
    flaky.fail_blocks("read", keys_(1))
    results = await flaky.read(keys_(0, 1), [0, 1], [b.copy() for b in buffers])
    assert results[0] is None and results[1] is not None
    gate = flaky.block("forget", times=1)
    forget = asyncio.ensure_future(flaky.forget(keys_(0)))
    await asyncio.sleep(0.01)
    assert not forget.done() and flaky.waiting == 1
    gate.release()
    await asyncio.wait_for(forget, 1)
    slow = flaky.delay("write", 0.05, times=1)
    started = time.monotonic()
    await flaky.write(keys_(3), [3], buffers[:1])
    assert time.monotonic() - started >= 0.04 and slow.fired == 1
    assert flaky.counters.calls == {"read": 3, "write": 3, "forget": 1}
    assert flaky.counters.raised == {"read": 1, "write": 1}
    hung = flaky.block("read")
    pending = asyncio.ensure_future(flaky.read(keys_(0), [0], [buffers[0].copy()]))
    await asyncio.sleep(0.01)
    flaky.clear()  # opens the gate: nothing stays blocked
    assert await asyncio.wait_for(pending, 1) == [None]
    assert hung.gate is not None and hung.gate.is_set() and flaky.faults == []
    assert not flaky.persistent and flaky.num_blocks == 4


async def test_install_and_uninstall_swap_a_tier_and_its_access(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16)
    async with Hierarchy.from_config(config) as h:
        engine = h._engine
        assert engine is not None
        pool = h.storages[0]
        assert isinstance(pool, TorchPool) and engine.tensor_tiers == [True, False]
        flaky = install(h, 0)
        assert h.storages[0] is flaky and engine.storages[0] is flaky and flaky.inner is pool
        assert engine.tensor_tiers == [False, False]  # driven through read/write now
        ks = keys_(*range(8))
        for k in ks:
            assert await h.put([k], blocks_of([k])) == 1
        out = await h.get(ks)
        assert out.shape[0] == 8
        assert_prefix(out, ks)
        assert flaky.counters.calls["write"] >= 8 and flaky.counters.calls["read"] >= 1
        with pytest.raises(InvalidValueError):
            install(h, 1, flaky)  # it wraps another tier's storage
        await h.drain()
        assert uninstall(h, 0) is pool
        assert [s is pool for s in h.storages] == [True, False]
        assert [s is pool for s in engine.storages] == [True, False]
        assert engine.tensor_tiers == [True, False]
        with pytest.raises(InvalidValueError):
            uninstall(h, 0)
        assert_prefix(await h.get(ks), ks)
        await h.drain()
        settled(h)
    with pytest.raises(ManagerClosedError):
        install(h, 0)
