"""A job whose corrupt read makes the engine tell a persistent tier to forget the block:
cancelling the job's task while that (shielded) forget is under way cancels the job, the
forget goes on, and the job is still settled exactly once; an error of the forget itself,
a cancellation of the forget included, is counted and swallowed (best effort)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from hierarchy_helpers import key
from test_engine_faults import SCENARIOS, Rig, verify

from kvtier.keys import OffloadKey
from kvtier.manager import TransferJob


class HangingForget:
    """A forget that waits for `release` (what the tier's index update would take)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.done: list[Sequence[OffloadKey]] = []
        self.cancel_itself = False

    async def __call__(self, keys: Sequence[OffloadKey]) -> None:
        self.entered.set()
        await self.release.wait()
        if self.cancel_itself:
            raise asyncio.CancelledError
        self.done.append(keys)


async def corrupt_promotion(tmp_path: Path) -> tuple[Rig, TransferJob, HangingForget]:
    """A promotion whose read of key 0 from the slow tier fails its checksum, that tier's
    forget hanging."""
    rig, job, _ = await SCENARIOS["promote"]((2,), tmp_path)
    slow = rig.flaky(2)
    slow.fail_blocks("read", [key(0)])
    forget = HangingForget()
    slow.forget = forget  # type: ignore[method-assign]
    return rig, job, forget


async def test_a_job_cancelled_while_its_forget_runs_is_cancelled(tmp_path: Path) -> None:
    rig, job, forget = await corrupt_promotion(tmp_path)
    task = asyncio.ensure_future(rig.engine.run(job))
    await forget.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    rig.jobs.append(job)
    assert rig.engine.counters.errors == 0  # the caller's cancellation is no forget error
    assert rig.manager.completions[job.id] == 1  # settled before the forget, once
    assert rig.manager.locate(key(0)) is None  # dropped everywhere all the same
    forget.release.set()
    while not forget.done:  # the shielded forget goes on to its end
        await asyncio.sleep(0)
    assert forget.done == [[key(0)]]
    rig.flaky(2).clear()
    await verify(rig)


async def test_a_forget_cancelled_by_itself_is_counted_not_raised(tmp_path: Path) -> None:
    rig, job, forget = await corrupt_promotion(tmp_path)
    forget.cancel_itself = True
    forget.release.set()
    result = await rig.engine.run(job)  # returns: the job's task was not cancelled
    rig.jobs.append(job)
    assert key(0) in result.corrupt
    assert rig.engine.counters.error_types == {"CancelledError": 1}
    assert rig.manager.completions[job.id] == 1
    rig.flaky(2).clear()
    await verify(rig)
