"""The transfer engine's parts: the priority semaphore and job execution over fake storages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from hierarchy_helpers import key

from kvtier.engine import Priority, PrioritySemaphore, TransferEngine
from kvtier.errors import InvalidValueError
from kvtier.manager import TieredManager, make_tier_manager
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.pool.storage import TorchPool
from kvtier.tiers.storage import BlockStorage


async def test_waiters_are_served_by_priority_then_arrival() -> None:
    semaphore = PrioritySemaphore(1)
    order: list[str] = []

    async def take(priority: int, name: str) -> None:
        async with semaphore.hold(priority):
            order.append(name)

    async with semaphore.hold(0):
        tasks = [
            asyncio.ensure_future(take(2, "cascade")),
            asyncio.ensure_future(take(1, "demote-1")),
            asyncio.ensure_future(take(0, "load")),
            asyncio.ensure_future(take(1, "demote-2")),
        ]
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == ["load", "demote-1", "demote-2", "cascade"]


async def test_a_cancelled_waiter_never_blocks_later_ones() -> None:
    semaphore = PrioritySemaphore(1)
    async with semaphore.hold(0):
        waiter = asyncio.ensure_future(semaphore.hold(1).__aenter__())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    # The slot is free again; a newcomer must get it at once, not queue behind the corpse.
    async with asyncio.timeout(1):
        async with semaphore.hold(5):
            pass
    assert semaphore.waiting == 0
    with pytest.raises(InvalidValueError):
        PrioritySemaphore(0)


async def test_a_failed_step_fails_the_copies_that_depend_on_it(tmp_path: Path) -> None:
    tiers = [make_tier_manager(n, 64, m, name=m) for n, m in ((1, "gpu"), (2, "cpu"), (4, "disk"))]
    manager = TieredManager(tiers)
    pools: list[BlockStorage] = [TorchPool(1, 64, "cpu"), TorchPool(2, 64, "cpu")]
    pools.append(DiskStore(tmp_path, block_size=64, num_blocks=4, direct_io=False))
    engine = TransferEngine(manager, pools)
    # Four blocks in a chain of 1 + 2 + 4: block 0 ends up in the bottom tier.
    for i in range(4):
        out = manager.prepare_store([key(i)])
        assert out is not None
        if out.demotion is not None:
            await engine.run(out.demotion)
        manager.complete_store([key(i)])
    assert manager.locate(key(0)) == (2, True)
    assert manager.lookup(key(0)) is None
    (job,) = manager.take_jobs()
    assert [(s.src, s.dst) for s in job.steps if key(0) in s.keys] == [(2, 1), (1, 0)]

    async def broken_read(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("EIO")

    pools[2].read = broken_read  # type: ignore[method-assign]
    result = await engine.run(job)
    assert key(0) in result.failed
    assert manager.locate(key(0)) == (2, True)  # still where it was, unpinned
    for tier in manager.tiers:
        assert tier.stats().pinned == 0 and tier.stats().pending == 0
    assert engine.counters.errors == 1
    assert manager.open_jobs() == []
    await pools[2].aclose()


@pytest.mark.timeout(30)
async def test_a_pair_counts_its_most_copies_in_flight_at_once(tmp_path: Path) -> None:
    """`peak_in_flight`: two copies held in the disk write at once count 2; a third, alone
    after them, leaves it at 2 (what `kvtier replay` reports, to tell whether a tier was
    ever handed more than one call at a time)."""
    tiers = [make_tier_manager(n, 64, m, name=m) for n, m in ((4, "cpu"), (8, "disk"))]
    manager = TieredManager(tiers)
    pool = TorchPool(4, 64, "cpu")
    disk = DiskStore(tmp_path, block_size=64, num_blocks=8, direct_io=False)
    engine = TransferEngine(manager, [pool, disk])
    entered = 0
    both_in = asyncio.Event()
    write = disk.write

    async def held_write(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal entered
        entered += 1
        if entered == 2:
            both_in.set()
        await both_in.wait()  # the first waits until the second is in flight too
        return await write(*args, **kwargs)

    disk.write = held_write  # type: ignore[method-assign]

    def copy(i: int):  # type: ignore[no-untyped-def]
        ids = np.asarray([i], dtype=np.int64)
        return engine.transfer([key(i)], 0, pool, ids, 1, disk, ids, Priority.DEMOTE)

    assert engine.counters.pairs == {}
    results = await asyncio.gather(copy(0), copy(1))
    assert all(not result.failed for result in results)
    await copy(2)
    pair = engine.counters.pairs["cpu", "disk"]
    assert (pair.copies, pair.peak_in_flight, pair.in_flight) == (3, 2, 0)
    assert disk.stats.blocks_written == 3
    await disk.aclose()
