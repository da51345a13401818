"""DiskStore's write lane: concurrent write and forget calls merged into groups (one fdatasync
per slab file and one index commit per group), reads that never queue behind writes, a failed
group commit, cancellation, closing with calls queued, and the in-flight log that lets a store
reopened after a crash drop the records a group left pointing at rewritten bytes.

The queueing is forced, not timed: `GateIO` holds the lane inside its first pwritev while the
test queues more calls, and the test checks the queue before opening the gate."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

import kvtier.tiers.disk.lane as disk_lane
from kvtier.errors import DiskTierError, StorageClosedError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.testing.storage import empty_buffers
from kvtier.tiers.disk import DiskStore, FaultyIO
from kvtier.tiers.disk.testing import deterministic_block
from kvtier.tiers.storage import ReadFailure

BLOCK = 4096
GATE_TIMEOUT = 60  # seconds; only a hang waits this long (never a timing assertion)


def k(i: int) -> OffloadKey:
    return key_from_int(i)


class GateIO(FaultyIO):
    """A FaultyIO whose pwritev waits at a gate while the gate is shut, after saying that it
    got there; with `tear`, it first writes half of the call's bytes (what a process killed
    in the middle of the call leaves). Logs (offset, bytes) of every pwritev."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[int, int]] = []
        self.arrived = threading.Event()
        self._open = threading.Event()
        self._open.set()
        self.tear = False

    def shut(self, *, tear: bool = False) -> None:
        self.tear = tear
        self.arrived.clear()
        self._open.clear()

    def open_gate(self) -> None:
        self._open.set()

    def pwritev(self, fd: int, buffers: Any, offset: int) -> int:
        if not self._open.is_set():
            if self.tear:
                data = b"".join(bytes(buffer) for buffer in buffers)
                os.pwrite(fd, data[: len(data) // 2], offset)
            self.arrived.set()
            if not self._open.wait(GATE_TIMEOUT):
                raise OSError(errno.ETIMEDOUT, "the test never opened the gate")
        self.log.append((offset, sum(memoryview(buffer).nbytes for buffer in buffers)))
        return super().pwritev(fd, buffers, offset)


@pytest.fixture
def io() -> Iterator[GateIO]:
    gate = GateIO()
    try:
        yield gate
    finally:
        gate.open_gate()  # a failed test must not leave a lane thread waiting


def open_store(directory: Path, **kwargs: Any) -> DiskStore:
    options: dict[str, Any] = {"block_size": BLOCK, "num_blocks": 400, "direct_io": False}
    options.update(kwargs)
    return DiskStore(directory, **options)


async def write(disk: DiskStore, ids: list[int], slots: list[int]) -> list[OSError | None]:
    return await disk.write(
        [k(i) for i in ids], slots, [deterministic_block(i, BLOCK) for i in ids]
    )


async def read(disk: DiskStore, ids: list[int], slots: list[int]) -> list[ReadFailure | None]:
    buffers = empty_buffers(len(ids), BLOCK)
    results = await disk.read([k(i) for i in ids], slots, buffers)
    for i, result, buffer in zip(ids, results, buffers, strict=True):
        if result is None:
            assert np.array_equal(buffer, deterministic_block(i, BLOCK)), f"block {i} differs"
    return results


async def assert_intact(disk: DiskStore, ids: list[int], slots: list[int]) -> None:
    assert await read(disk, ids, slots) == [None] * len(ids)


async def hold_the_lane(disk: DiskStore, io: GateIO, *, tear: bool = False) -> asyncio.Task[Any]:
    """Start a write of block 1000 into slot 399 and return once its group is inside pwritev
    (held at the gate): calls made from now on queue up behind it."""
    io.shut(tear=tear)
    task = asyncio.create_task(write(disk, [1000], [399]))
    assert await asyncio.to_thread(io.arrived.wait, GATE_TIMEOUT), "the lane never wrote"
    return task


async def queued(disk: DiskStore, count: int) -> None:
    """Let the tasks just created run up to their first await (each queues its call there),
    and check that `count` calls wait in the lane's queue."""
    await asyncio.sleep(0)
    assert disk._lane.queued == count


# --------------------------------------------------------------------------------------------
# Merging
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fsync", [True, False])
async def test_concurrent_writes_merge_into_one_group_with_one_sync_and_commit(
    tmp_path: Path, io: GateIO, fsync: bool
) -> None:
    disk = open_store(tmp_path, io=io, fsync=fsync)
    try:
        first = await hold_the_lane(disk, io)
        batches = [list(range(20 * b, 20 * b + 20)) for b in range(15)]  # slots 0-299 in all
        tasks = [asyncio.create_task(write(disk, batch, batch)) for batch in batches]
        await queued(disk, 15)
        io.open_gate()
        assert await first == [None]
        for results in await asyncio.gather(*tasks):
            assert results == [None] * 20
        stats = disk.stats
        assert (stats.write_batches, stats.write_groups) == (16, 2)
        assert stats.index_commits == 2
        assert stats.fsyncs == io.calls["fsync"] == (2 if fsync else 0)
        # The held group's one block, then the 15 batches' consecutive slots in one call.
        assert io.log == [(399 * BLOCK, BLOCK), (0, 300 * BLOCK)]
        ids = [i for batch in batches for i in batch]
        await assert_intact(disk, [*ids, 1000], [*ids, 399])
        assert stats.blocks_written == 301 and stats.write_failures == 0
    finally:
        await disk.aclose()
    disk = open_store(tmp_path)
    try:
        assert len(disk.restore()) == 301
        assert disk.check().ok
    finally:
        await disk.aclose()


async def test_a_group_is_bounded(
    tmp_path: Path, io: GateIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_lane, "WRITE_GROUP_BYTES", 5 * 20 * BLOCK)  # five batches
    disk = open_store(tmp_path, io=io)
    try:
        first = await hold_the_lane(disk, io)
        batches = [list(range(20 * b, 20 * b + 20)) for b in range(12)]
        tasks = [asyncio.create_task(write(disk, batch, batch)) for batch in batches]
        await queued(disk, 12)
        io.open_gate()
        await first
        for results in await asyncio.gather(*tasks):
            assert results == [None] * 20
        stats = disk.stats
        assert (stats.write_batches, stats.write_groups, stats.index_commits) == (13, 4, 4)
        ids = [i for batch in batches for i in batch]
        await assert_intact(disk, ids, ids)
    finally:
        await disk.aclose()


async def test_forgets_merge_into_the_group_of_the_writes_around_them(
    tmp_path: Path, io: GateIO
) -> None:
    disk = open_store(tmp_path, io=io)
    try:
        assert await write(disk, [1, 2, 3], [0, 1, 2]) == [None] * 3
        before = disk.stats
        first = await hold_the_lane(disk, io)
        tasks = [
            asyncio.create_task(disk.forget([k(1)])),
            asyncio.create_task(write(disk, [11], [6])),
            asyncio.create_task(disk.forget([k(2), k(99)])),
        ]
        await queued(disk, 3)
        io.open_gate()
        await first
        assert await asyncio.gather(*tasks) == [None, [None], None]
        stats = disk.stats
        assert stats.write_groups - before.write_groups == 2
        assert stats.index_commits - before.index_commits == 2
        assert (stats.forget_batches, stats.write_batches - before.write_batches) == (2, 2)
        assert await read(disk, [1, 2], [0, 1]) == [ReadFailure.NOT_INDEXED] * 2
        await assert_intact(disk, [3, 11, 1000], [2, 6, 399])
    finally:
        await disk.aclose()
    disk = open_store(tmp_path)
    try:
        assert sorted(block.slot for block in disk.restore()) == [2, 6, 399]
    finally:
        await disk.aclose()


async def test_queued_calls_on_one_slot_or_key_keep_their_order(tmp_path: Path, io: GateIO) -> None:
    disk = open_store(tmp_path, io=io)
    try:
        first = await hold_the_lane(disk, io)
        tasks = [
            asyncio.create_task(write(disk, [1], [0])),
            asyncio.create_task(write(disk, [2], [0])),  # same slot: waits for the next group
            asyncio.create_task(write(disk, [3], [1])),
            asyncio.create_task(disk.forget([k(3)])),  # same key: waits for the next group
        ]
        await queued(disk, 4)
        io.open_gate()
        await first
        assert await asyncio.gather(*tasks) == [[None], [None], [None], None]
        assert disk.stats.write_groups == 4  # [1000], [1], [2, 3], [forget 3]
        assert await read(disk, [1, 3], [0, 1]) == [ReadFailure.NOT_INDEXED] * 2
        await assert_intact(disk, [2], [0])
        assert disk.check().ok and len(disk) == 2
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# Reads beside the write lane
# --------------------------------------------------------------------------------------------


async def test_a_read_completes_while_write_groups_are_held_in_pwritev(
    tmp_path: Path, io: GateIO
) -> None:
    """With a shared pool of two threads, two held writes would keep this read waiting."""
    disk = open_store(tmp_path, io=io, max_workers=2)
    try:
        assert await write(disk, [1, 2], [0, 1]) == [None, None]
        first = await hold_the_lane(disk, io)
        writes = [asyncio.create_task(write(disk, [10 + i], [10 + i])) for i in range(4)]
        await queued(disk, 4)
        results = await asyncio.wait_for(read(disk, [1, 2], [0, 1]), GATE_TIMEOUT)
        assert results == [None, None]
        assert not first.done() and not any(task.done() for task in writes)
        io.open_gate()
        await first
        for result in await asyncio.gather(*writes):
            assert result == [None]
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# Failures, cancellation, closing
# --------------------------------------------------------------------------------------------


async def test_a_failed_group_commit_fails_every_block_of_the_group(
    tmp_path: Path, io: GateIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = open_store(tmp_path, io=io)
    try:
        assert await write(disk, [1, 2, 3], [0, 1, 2]) == [None] * 3
        index = disk._catalog.index
        update = index.update
        calls: list[int] = []

        def second_commit_fails(deleted: Any, records: Any) -> None:
            calls.append(len(calls))
            if len(calls) == 2:  # the merged group's commit (the held group's is the first)
                raise lmdb.Error("injected commit failure")
            update(deleted, records)

        monkeypatch.setattr(index, "update", second_commit_fails)
        first = await hold_the_lane(disk, io)
        writes = [
            asyncio.create_task(write(disk, [11, 12], [0, 5])),  # overwrites block 1
            asyncio.create_task(write(disk, [13], [6])),
        ]
        forget = asyncio.create_task(disk.forget([k(2)]))
        await queued(disk, 3)
        io.open_gate()
        assert await first == [None]
        failed = [result for results in await asyncio.gather(*writes) for result in results]
        assert len(failed) == 3
        for result in failed:
            assert isinstance(result, OSError) and result.errno == errno.EIO
            assert "injected commit failure" in str(result)
        with pytest.raises(DiskTierError, match="injected commit failure"):
            await forget
        # Nothing of the group is served, nor block 1 (its slot was rewritten) or block 2
        # (forgotten); block 3 was never touched.
        missing = ReadFailure.NOT_INDEXED
        assert await read(disk, [11, 12, 13], [0, 5, 6]) == [missing] * 3
        assert await read(disk, [1, 2], [0, 1]) == [missing] * 2
        await assert_intact(disk, [3, 1000], [2, 399])
        stats = disk.stats
        assert stats.write_failures == 3 and len(disk) == 2
        assert len(calls) == 3  # the failed commit was followed by one that dropped 1 and 2
        # The store keeps working, and memory and index agree.
        assert await write(disk, [14, 15], [0, 5]) == [None, None]
        await assert_intact(disk, [14, 15, 3], [0, 5, 2])
        assert disk.check().ok
    finally:
        await disk.aclose()
    disk = open_store(tmp_path)
    try:
        assert sorted(int.from_bytes(b.key[:8], "big") for b in disk.restore()) == [
            3,
            14,
            15,
            1000,
        ]
        assert disk.check().ok
    finally:
        await disk.aclose()


async def test_a_failed_run_and_a_failed_fsync_fail_only_their_blocks_of_a_group(
    tmp_path: Path, io: GateIO
) -> None:
    disk = open_store(tmp_path, io=io, num_blocks=400, slab_file_bytes=200 * BLOCK)
    try:
        first = await hold_the_lane(disk, io)
        io.inject("pwritev", errno.ENOSPC, offset=disk.slot_location(10)[1], times=1)
        io.inject("fsync", errno.EIO, path_suffix="slab-00001.bin", times=1)
        writes = [
            asyncio.create_task(write(disk, [1, 2], [10, 11])),  # the failing run
            asyncio.create_task(write(disk, [3], [20])),
            asyncio.create_task(write(disk, [4], [210])),  # the file whose fsync fails
        ]
        await queued(disk, 3)
        io.open_gate()
        # The held group wrote slot 399 of slab-00001.bin, and its fsync failed.
        (held,) = await first
        assert isinstance(held, OSError) and held.errno == errno.EIO
        one, two, three = await asyncio.gather(*writes)
        assert all(isinstance(r, OSError) and r.errno == errno.ENOSPC for r in one)
        assert two == [None] and three == [None]
        assert disk.stats.index_commits == 1  # the held group had nothing to commit
        await assert_intact(disk, [3, 4], [20, 210])
        assert await read(disk, [1, 2, 1000], [10, 11, 399]) == [ReadFailure.NOT_INDEXED] * 3
    finally:
        await disk.aclose()


async def test_cancelling_writes_corrupts_nothing(tmp_path: Path, io: GateIO) -> None:
    disk = open_store(tmp_path, io=io)
    try:
        running = await hold_the_lane(disk, io)
        waiting = asyncio.create_task(write(disk, [11], [6]))
        await queued(disk, 1)
        running.cancel()
        waiting.cancel()
        io.open_gate()
        for task in (running, waiting):
            with pytest.raises(asyncio.CancelledError):
                await task
        # A later call runs after the cancelled ones were dealt with.
        assert await write(disk, [12], [7]) == [None]
        # The running group completed; the waiting call was withdrawn, its slot never written.
        await assert_intact(disk, [1000, 12], [399, 7])
        assert await read(disk, [11], [6]) == [ReadFailure.NOT_INDEXED]
        assert disk.slot_location(6)[1] not in [offset for offset, _ in io.log]
        assert disk.stats.write_batches == 2
        assert disk.check().ok
    finally:
        await disk.aclose()


async def test_aclose_finishes_the_queued_calls_and_refuses_new_ones(
    tmp_path: Path, io: GateIO
) -> None:
    disk = open_store(tmp_path, io=io)
    first = await hold_the_lane(disk, io)
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(write(disk, [i], [i])) for i in range(5)]
    tasks.append(asyncio.create_task(disk.forget([k(4)])))
    await queued(disk, 6)
    closing = asyncio.create_task(disk.aclose())
    while not disk.closed:  # close() has begun in its thread
        await asyncio.sleep(0.001)
    with pytest.raises(StorageClosedError):
        await write(disk, [9], [9])
    with pytest.raises(StorageClosedError):
        await disk.forget([k(0)])
    assert not closing.done()
    io.open_gate()
    await closing
    assert await first == [None]
    assert await asyncio.gather(*tasks) == [[None]] * 5 + [None]
    with pytest.raises(StorageClosedError):
        await read(disk, [0], [0])
    disk = open_store(tmp_path)
    try:
        assert sorted(block.slot for block in disk.restore()) == [0, 1, 2, 3, 399]
    finally:
        await disk.aclose()


async def test_a_write_from_another_event_loop_thread_is_settled_on_its_own_loop(
    tmp_path: Path,
) -> None:
    disk = open_store(tmp_path)
    try:
        results = await asyncio.to_thread(asyncio.run, write(disk, [1], [0]))
        assert results == [None]
        assert await write(disk, [2], [1]) == [None]
        await assert_intact(disk, [1, 2], [0, 1])
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# The in-flight log
# --------------------------------------------------------------------------------------------


def crash_copy(live: Path, to: Path) -> Path:
    """A copy of the store directory as a process killed now would leave it (the page
    cache survives a killed process; LMDB's lock file is rebuilt on open)."""
    shutil.copytree(live, to, ignore=shutil.ignore_patterns("lock.mdb"))
    return to


async def test_reopening_after_a_killed_group_drops_the_records_of_torn_slots(
    tmp_path: Path, io: GateIO
) -> None:
    disk = open_store(tmp_path / "live", io=io)
    try:
        assert await write(disk, [1, 2, 3], [3, 4, 8]) == [None] * 3
        io.shut(tear=True)
        # Slots 3-4 are one run: the held pwritev has torn slot 3 (block 1's), not slot 4.
        task = asyncio.create_task(write(disk, [5, 6], [3, 4]))
        assert await asyncio.to_thread(io.arrived.wait, GATE_TIMEOUT)
        killed = crash_copy(tmp_path / "live", tmp_path / "killed")
        no_log = crash_copy(tmp_path / "live", tmp_path / "no-log")
        io.open_gate()
        assert await task == [None, None]
    finally:
        await disk.aclose()
    (disk_dir,) = no_log.iterdir()
    (disk_dir / "inflight").unlink()

    disk = open_store(killed)
    try:
        assert disk.stats.dropped_at_open == 1
        assert [block.key for block in disk.restore()] == [k(2), k(3)]
        await assert_intact(disk, [2, 3], [4, 8])
        assert disk.check().ok
        # The log was checked and emptied: the next open drops nothing more.
    finally:
        await disk.aclose()
    disk = open_store(killed)
    try:
        assert disk.stats.dropped_at_open == 0 and len(disk) == 2
    finally:
        await disk.aclose()

    # Without the log (a power cut can lose it), the stale record survives the open, and the
    # checksum keeps its torn bytes from being served.
    disk = open_store(no_log)
    try:
        assert [block.key for block in disk.restore()] == [k(1), k(2), k(3)]
        assert await read(disk, [1], [3]) == [ReadFailure.CHECKSUM]
        assert [problem.key for problem in disk.check().problems] == [k(1)]
    finally:
        await disk.aclose()


async def test_a_group_records_its_slots_in_the_in_flight_log(tmp_path: Path) -> None:
    disk = open_store(tmp_path)
    try:
        assert disk._files.inflight is not None and disk._files.inflight.read() == []
        assert await write(disk, [1, 2, 3], [7, 2, 300]) == [None] * 3
        assert disk._files.inflight.read() == [7, 2, 300]
        await disk.forget([k(1)])  # a group that writes nothing leaves the log alone
        assert disk._files.inflight.read() == [7, 2, 300]
    finally:
        await disk.aclose()


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
async def test_a_torn_or_foreign_in_flight_log_reads_as_empty(tmp_path: Path, damage: str) -> None:
    disk = open_store(tmp_path)
    assert await write(disk, [1], [5]) == [None]
    path = disk.path / "inflight"
    data = path.read_bytes()  # as a killed process leaves it (a clean close empties it)
    await disk.aclose()
    if damage == "truncate":
        path.write_bytes(data[:-3])
    elif damage == "flip":
        path.write_bytes(data[:10] + bytes([data[10] ^ 1]) + data[11:])
    else:
        path.write_bytes(b"not a log at all" * 3)
    disk = open_store(tmp_path)
    try:
        assert disk._files.inflight is not None and disk._files.inflight.read() == []
        assert disk.stats.dropped_at_open == 0
        await assert_intact(disk, [1], [5])
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# Reads first
# --------------------------------------------------------------------------------------------


class ReadGateIO(GateIO):
    """A GateIO whose preadv also waits at a gate of its own while that one is shut."""

    def __init__(self) -> None:
        super().__init__()
        self.read_arrived = threading.Event()
        self._read_open = threading.Event()
        self._read_open.set()

    def shut_reads(self) -> None:
        self.read_arrived.clear()
        self._read_open.clear()

    def open_reads(self) -> None:
        self._read_open.set()

    def preadv(self, fd: int, buffers: Any, offset: int) -> int:
        if not self._read_open.is_set():
            self.read_arrived.set()
            if not self._read_open.wait(GATE_TIMEOUT):
                raise OSError(errno.ETIMEDOUT, "the test never opened the read gate")
        return super().preadv(fd, buffers, offset)


async def test_a_write_group_waits_for_the_reads_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group does not start while a read is on the device (here: held in preadv), so the
    read is not slowed down by it; it starts as soon as the read is done."""
    monkeypatch.setattr(disk_lane, "READS_FIRST_WAIT_S", GATE_TIMEOUT)
    io = ReadGateIO()
    disk = open_store(tmp_path, io=io)
    try:
        await write(disk, [1], [1])
        io.shut_reads()
        reading = asyncio.create_task(read(disk, [1], [1]))
        assert await asyncio.to_thread(io.read_arrived.wait, GATE_TIMEOUT)
        writes_before = len(io.log)
        writing = asyncio.create_task(write(disk, [2], [2]))
        await asyncio.sleep(0.2)
        assert not writing.done() and len(io.log) == writes_before  # held back
        io.open_reads()
        assert await reading == [None]
        assert await asyncio.wait_for(writing, GATE_TIMEOUT) == [None]
        await assert_intact(disk, [1, 2], [1, 2])
    finally:
        io.open_reads()
        await disk.aclose()


async def test_reads_never_starve_the_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a read stuck on the device, a write still goes through after the bounded wait."""
    monkeypatch.setattr(disk_lane, "READS_FIRST_WAIT_S", 0.05)
    io = ReadGateIO()
    disk = open_store(tmp_path, io=io)
    try:
        await write(disk, [1], [1])
        io.shut_reads()
        reading = asyncio.create_task(read(disk, [1], [1]))
        assert await asyncio.to_thread(io.read_arrived.wait, GATE_TIMEOUT)
        assert await asyncio.wait_for(write(disk, [2], [2]), GATE_TIMEOUT) == [None]
        assert not reading.done()
        io.open_reads()
        assert await reading == [None]
    finally:
        io.open_reads()
        await disk.aclose()
