"""A log store's group makes no fdatasync of its own when every write of it returned before
an earlier fdatasync began (an early flush's, log_lane.py `_unsynced`): that sync made them
durable. Checked by the order of the events (each write's return, each sync's start), never
by how long anything takes."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from disk_helpers import assert_intact, write_ok

from kvtier.tiers.disk.io import FaultyIO
from kvtier.tiers.disk.log_files import LogFiles
from kvtier.tiers.disk.log_group import Flight
from kvtier.tiers.disk.log_lane import LogLane
from kvtier.tiers.disk.log_store import LogStore

pytestmark = pytest.mark.timeout(120)

BLOCK = 64 << 10
SLOTS = 64
CALLS = 6


class Watch:
    """When each write returned (by its number) and when each fdatasync began; per group
    finished, whether it synced itself and, if not, whether a sync began after its writes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.returned: dict[int, float] = {}
        self.syncs: list[float] = []
        self.finished: list[tuple[bool, bool]] = []  # (synced itself, covered by a sync)
        self.gate = threading.Event()
        watch = self

        def timed(original: Any) -> Any:
            def wrapped(*args: Any, **kwargs: Any) -> int:
                number: int = original(*args, **kwargs)
                watch.returned[number] = time.perf_counter()
                return number

            return wrapped

        monkeypatch.setattr(LogFiles, "_write_batch", timed(LogFiles._write_batch))
        monkeypatch.setattr(LogFiles, "write_here", timed(LogFiles.write_here))
        original_sync = LogFiles.sync

        def sync(files: LogFiles) -> None:
            watch.syncs.append(time.perf_counter())
            original_sync(files)

        monkeypatch.setattr(LogFiles, "sync", sync)
        original_finish = LogLane._finish

        def finish(lane: LogLane, flights: list[Flight]) -> None:
            before = len(watch.syncs)
            original_finish(lane, flights)
            synced = len(watch.syncs) > before
            last = max(
                (watch.returned[f.pending.written] for f in flights if f.pending.written),
                default=0.0,
            )
            covered = bool(watch.syncs) and last < watch.syncs[-1]
            watch.finished.append((synced, covered))

        monkeypatch.setattr(LogLane, "_finish", finish)

    def gate_early_flushes(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """An early flush begins only once the lane joins it, after every write the lane
        has started returned: a flush joined at a group's end then covers the whole group."""
        original_flushed, original_join = LogLane._flushed, LogLane._join
        watch = self

        def flushed(lane: LogLane, pending: Any) -> None:
            watch.gate.wait(30)
            watch.gate.clear()
            original_flushed(lane, pending)

        def join(lane: LogLane, pending: Any) -> Any:
            if lane._early is not None:
                pending.wait()  # (the writes placed since the split)
                watch.gate.set()
            return original_join(lane, pending)

        monkeypatch.setattr(LogLane, "_flushed", flushed)
        monkeypatch.setattr(LogLane, "_join", join)


async def _calls(path: Path) -> tuple[LogStore, FaultyIO]:
    """A store one call large (the bench's shape: 13 regions, a call fills 9, so calls make
    early flushes), written
    CALLS times with fresh keys into every slot; the last call's blocks checked."""
    io = FaultyIO()
    store = await LogStore.open_async(path, block_size=BLOCK, num_blocks=SLOTS, fsync=True, io=io)
    slots = list(range(SLOTS))
    for call in range(CALLS):
        await write_ok(store, [call * SLOTS + slot for slot in slots], slots)
    await assert_intact(store, [(CALLS - 1) * SLOTS + slot for slot in slots], slots)
    return store, io


def test_a_group_covered_by_an_earlier_sync_does_not_sync_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = Watch(monkeypatch)
    watch.gate_early_flushes(monkeypatch)

    async def run() -> None:
        store, io = await _calls(tmp_path / "store")
        await store.aclose()
        assert io.calls["fsync"] >= len(watch.syncs)
        reopened = await LogStore.open_async(
            tmp_path / "store", block_size=BLOCK, num_blocks=SLOTS, fsync=True
        )
        slots = list(range(SLOTS))
        await assert_intact(reopened, [(CALLS - 1) * SLOTS + slot for slot in slots], slots)
        await reopened.aclose()

    asyncio.run(run())
    skipped = [covered for synced, covered in watch.finished if not synced]
    assert skipped, watch.finished  # some group's writes all came before an early flush's sync
    assert all(skipped)  # a group that did not sync was covered by a sync begun after it


def test_every_group_syncs_or_was_covered_without_gating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = Watch(monkeypatch)

    async def run() -> None:
        store, _ = await _calls(tmp_path / "store")
        await store.aclose()

    asyncio.run(run())
    assert len(watch.finished) >= CALLS
    assert all(synced or covered for synced, covered in watch.finished)
