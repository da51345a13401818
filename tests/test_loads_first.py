"""Loads first, end to end (issue 23, item 3): a get is never queued behind puts.

- A block on its way to a slow tier (demoted, its write queued behind every other write
  there) is served from its staging snapshot, before that write lands: ordering observed
  through a disk tier whose slab writes are held, never through clocks.
- `PutGate` bounds the puts inside a chain, lets none in while a get waits for room, never
  refuses one, and leaks no place when a waiter is cancelled or its deadline passes.
- Nothing is lost: every block of many concurrent puts is stored, present or counted as
  refused, and every stored one reads back bit-exact.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from hierarchy_helpers import HeldWrites, blocks_of, chain_config, demoting_chain, key

from kvtier import Hierarchy
from kvtier.chain.gate import PutGate
from kvtier.engine.staging import StagingArena
from kvtier.errors import InvalidValueError


async def spin(n: int = 10) -> None:
    """Let every ready task run."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_get_is_served_before_the_queued_writes_of_puts_land(tmp_path: Path) -> None:
    io = HeldWrites()
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=64, reserve=False)
    async with Hierarchy.from_config(config, disk_options={"io": io}) as h:
        # Each put of 4 evicts the 4 before it: their disk writes queue up, held.
        victims = await demoting_chain(h, io)  # on their way, not readable there
        for first in range(0, 20, 4):
            part = victims[first : first + 4]
            out = await asyncio.wait_for(h.get(part, timeout_s=None), 10)
            assert torch.equal(out, blocks_of(part))
        # Every get was served while none of those writes had landed.
        assert io.completed == 0
        assert h.chain.engine.counters.staged_reads == 20
        io.release.set()
        await h.drain()
        assert io.completed >= 1
        assert h.stats().calls.get_timeouts == 0


async def test_a_read_of_a_snapshot_keeps_its_rows_until_it_is_done() -> None:
    arena = StagingArena(4, 64)
    rows = await arena.acquire(2)
    arena.hold(rows)
    arena.release(rows)  # the write below finished while a get copies out of them
    assert arena.free == 2  # not handed out again under the copy
    arena.hold(rows[:1])
    arena.unhold(rows)
    assert arena.free == 3
    arena.unhold(rows[:1])
    assert arena.free == 4
    again = await arena.acquire(4)
    assert sorted(again.tolist()) == [0, 1, 2, 3]


async def test_the_gate_bounds_the_puts_inside_and_serves_them_in_order() -> None:
    gate = PutGate(2)
    order: list[int] = []
    release = asyncio.Event()

    async def put(index: int) -> None:
        await gate.enter(None)
        order.append(index)
        try:
            await release.wait()
        finally:
            gate.leave()

    tasks = [asyncio.ensure_future(put(i)) for i in range(6)]
    await spin()
    assert gate.in_flight == 2 and order == [0, 1] and gate.waits == 4
    release.set()
    await asyncio.gather(*tasks)
    assert order == list(range(6)) and gate.peak_in_flight == 2 and gate.in_flight == 0


async def test_no_put_enters_while_a_get_waits_for_room() -> None:
    gate = PutGate(4)
    entered = asyncio.Event()

    async def put() -> None:
        await gate.enter(None)
        entered.set()

    with gate.load_waiting():
        task = asyncio.ensure_future(put())
        await spin()
        assert not entered.is_set() and not gate.open_now()
    await asyncio.wait_for(task, 5)
    assert entered.is_set() and gate.in_flight == 1


async def test_a_put_past_its_deadline_goes_in_and_a_cancelled_one_takes_no_place() -> None:
    gate = PutGate(1)
    await gate.enter(None)
    cancelled = asyncio.ensure_future(gate.enter(None))
    await spin()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert gate.in_flight == 1
    # A deadline already passed: let in anyway (never refused), counted by the caller.
    assert await gate.enter(0.0) is False
    assert gate.in_flight == 2
    gate.leave()
    gate.leave()
    assert gate.in_flight == 0 and gate.open_now()
    with pytest.raises(InvalidValueError):
        PutGate(0)


@pytest.mark.slow
async def test_concurrent_puts_lose_nothing_and_stay_within_the_gate(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=256)
    async with Hierarchy.from_config(config) as h:
        ks = [key(i) for i in range(128)]
        groups = [ks[i : i + 2] for i in range(0, 128, 2)]
        stored = await asyncio.gather(*(h.put(g, blocks_of(g)) for g in groups))
        await h.drain()
        calls = h.stats().calls
        assert calls.put_blocks == 128
        assert sum(stored) == calls.put_stored
        assert calls.put_stored + calls.put_present + calls.put_refused + calls.put_failed == 128
        assert calls.put_admission_waits >= 1  # 64 puts at once: most of them queued
        gate = h.chain.gate
        assert gate.peak_in_flight <= gate.limit and gate.in_flight == 0
        held = [k for k in ks if h.where(k) is not None]
        assert len(held) == calls.put_stored
        for first in range(0, len(held), 4):
            part = held[first : first + 4]
            assert torch.equal(await h.get(part, timeout_s=None), blocks_of(part))
