"""The chain's change signal (kvtier/chain/runtime.py): a waiter cancelled in the same moment
a change arrives is cancelled, not woken (Python 3.11's `asyncio.wait_for` swallowed such a
cancellation, and a Ctrl-C during `kvtier replay` then let the replay run to its end)."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvtier.chain.runtime import ChangeSignal


@pytest.mark.parametrize("deadline_s", [None, 60.0])
async def test_a_wait_cancelled_as_the_change_comes_is_cancelled(deadline_s: float | None) -> None:
    signal = ChangeSignal()
    deadline = None if deadline_s is None else time.perf_counter() + deadline_s
    waiter = asyncio.create_task(signal.wait(deadline))
    await asyncio.sleep(0)  # the waiter is parked on the change
    signal.poke()  # the change wakes it ...
    waiter.cancel()  # ... in the same turn of the loop as its cancellation
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_a_change_wakes_a_waiter() -> None:
    signal = ChangeSignal()
    waiter = asyncio.create_task(signal.wait(None))
    await asyncio.sleep(0)
    signal.poke()
    assert await waiter is True
