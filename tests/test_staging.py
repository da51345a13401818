"""`StagingArena`: row accounting, first-come-first-served grants, cancellation that leaks no
row (before and just after a grant), and `fits`."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.engine.staging import StagingArena
from kvtier.errors import InvalidValueError

Rows = npt.NDArray[np.int64]


async def spin(n: int = 5) -> None:
    """Let every ready task run (a few event-loop iterations)."""
    for _ in range(n):
        await asyncio.sleep(0)


def assert_all_free(arena: StagingArena) -> None:
    assert arena.free == arena.num_blocks


async def assert_takes_at_once(arena: StagingArena, count: int) -> None:
    """A request of `count` rows is served without queueing (no hidden waiter or
    reservation left behind), and its rows go back."""
    waits = arena.waits
    rows = await asyncio.wait_for(arena.acquire(count), 1)
    assert arena.waits == waits
    assert len(set(rows.tolist())) == count
    arena.release(rows)


async def test_acquire_and_release_account_for_every_row() -> None:
    arena = StagingArena(8, 64)
    assert arena.free == 8 and arena.tensor.shape == (8, 64)
    first = await arena.acquire(3)
    second = await arena.acquire(5)
    assert arena.free == 0 and arena.waits == 0 and arena.peak_used == 8
    together = first.tolist() + second.tolist()
    assert sorted(together) == list(range(8))  # disjoint, every one a real row
    # Each holder's rows are its own memory.
    arena.tensor[first] = 1
    arena.tensor[second] = 2
    assert int(arena.tensor[first].sum()) == 3 * 64
    arena.release(first)
    assert arena.free == 3
    arena.release(second)
    assert_all_free(arena)
    assert await arena.acquire(0) is not None and arena.free == 8


async def test_a_request_waits_for_enough_rows_and_is_counted() -> None:
    arena = StagingArena(4, 16)
    held = await arena.acquire(3)
    waiter = asyncio.ensure_future(arena.acquire(2))
    await spin()
    assert not waiter.done() and arena.waits == 1
    part = held[:1]
    arena.release(part)  # 2 free now: the waiter is served
    rows = await asyncio.wait_for(waiter, 1)
    assert len(rows) == 2 and not set(rows.tolist()) & set(held[1:].tolist())
    assert arena.free == 0
    arena.release(rows)
    arena.release(held[1:])
    assert_all_free(arena)


async def test_a_large_request_is_not_overtaken_by_later_small_ones() -> None:
    arena = StagingArena(4, 16)
    held = await arena.acquire(3)  # 1 row free
    order: list[str] = []

    async def take(name: str, count: int) -> Rows:
        rows = await arena.acquire(count)
        order.append(name)
        return rows

    big = asyncio.ensure_future(take("big", 4))
    await spin()
    smalls = [asyncio.ensure_future(take(f"small-{i}", 1)) for i in range(3)]
    await spin()
    # A row is free, but the big request came first: the small ones queue behind it.
    assert order == [] and arena.free == 1
    arena.release(held)
    rows = await asyncio.wait_for(big, 1)
    await spin()
    assert order == ["big"]  # the small ones still wait for the big one's rows
    arena.release(rows)
    for task in smalls:
        arena.release(await asyncio.wait_for(task, 1))
    assert order == ["big", "small-0", "small-1", "small-2"]
    assert_all_free(arena)


async def test_a_waiter_cancelled_before_its_grant_leaks_nothing() -> None:
    arena = StagingArena(4, 16)
    held = await arena.acquire(3)
    big = asyncio.ensure_future(arena.acquire(2))
    await spin()
    small = asyncio.ensure_future(arena.acquire(1))
    await spin()
    assert not big.done() and not small.done()
    big.cancel()
    with pytest.raises(asyncio.CancelledError):
        await big
    # The request that blocked it is gone: the small one is served from the free row at once.
    rows = await asyncio.wait_for(small, 1)
    assert len(rows) == 1 and arena.free == 0
    arena.release(rows)
    arena.release(held)
    assert_all_free(arena)
    await assert_takes_at_once(arena, 4)


async def test_a_waiter_cancelled_just_after_its_grant_passes_the_rows_on() -> None:
    arena = StagingArena(4, 16)
    held = await arena.acquire(4)
    granted = asyncio.ensure_future(arena.acquire(3))
    await spin()
    behind = asyncio.ensure_future(arena.acquire(4))
    await spin()
    arena.release(held)  # promises 3 rows to `granted`, which has not run yet
    assert arena.free == 1
    granted.cancel()  # cancelled before it could take them
    with pytest.raises(asyncio.CancelledError):
        await granted
    # Its rows were passed on to the next waiter, not lost.
    rows = await asyncio.wait_for(behind, 1)
    assert len(rows) == 4
    arena.release(rows)
    assert_all_free(arena)
    await assert_takes_at_once(arena, 4)


def test_fits_and_bad_sizes() -> None:
    arena = StagingArena(4, 16)
    assert arena.fits(0) and arena.fits(4) and not arena.fits(5)
    with pytest.raises(InvalidValueError, match="4-row arena"):
        asyncio.run(arena.acquire(5))
    for blocks, size in ((0, 16), (4, 0)):
        with pytest.raises(InvalidValueError):
            StagingArena(blocks, size)
    assert StagingArena.sized(16 * 1000, 16).num_blocks == 1000
    assert StagingArena.sized(1, 16).num_blocks == 64  # never fewer than 64 rows


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_interleavings_never_double_book_or_leak_a_row(sizes: list[int], seed: int) -> None:
    """Requests of random sizes hold their rows for random event-loop turns, some are cancelled
    at random turns (waiting, just granted, or holding): no row is ever held twice at once,
    every request not cancelled is served (no deadlock), and every row comes back."""

    async def scenario() -> None:
        rng = random.Random(seed)
        arena = StagingArena(6, 8)
        in_use: set[int] = set()
        served = 0

        async def request(count: int) -> None:
            nonlocal served
            rows = await arena.acquire(count)
            try:
                taken = set(rows.tolist())
                assert not taken & in_use, "a row handed out twice"
                in_use.update(taken)
                served += 1
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)
            finally:
                in_use.difference_update(rows.tolist())
                arena.release(rows)

        tasks = [asyncio.ensure_future(request(size)) for size in sizes]
        cancelled = set()
        for index, task in enumerate(tasks):
            if rng.random() < 0.3:
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)
                task.cancel()
                cancelled.add(index)
        async with asyncio.timeout(5):
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for index, result in enumerate(results):
            if index not in cancelled:
                assert result is None, result
        assert served >= len(sizes) - len(cancelled)
        assert not in_use
        assert_all_free(arena)
        await assert_takes_at_once(arena, 6)

    asyncio.run(scenario())
