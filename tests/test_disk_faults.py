"""DiskStore under faults: injected ENOSPC / EIO on writes, fsyncs and reads, rotten and cut
slab files, undecodable frames, a corrupted index, and a process killed with SIGKILL in the
middle of a write burst. Failures must be per block values, never exceptions and never data."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from disk_helpers import BLOCK, assert_intact, k, open_small, read, write

from kvtier.errors import DirectIOError
from kvtier.testing.storage import empty_buffers
from kvtier.tiers.disk import Codec, DiskStore, FaultyIO, IndexRecord
from kvtier.tiers.disk.log_store import LogStore
from kvtier.tiers.disk.testing import (
    deterministic_block,
    flip_byte,
    index_behind,
    stored_bytes,
)
from kvtier.tiers.storage import ReadFailure


def open_store(directory: Path, **kwargs: Any) -> DiskStore:
    return open_small(DiskStore, directory, **kwargs)


# --------------------------------------------------------------------------------------------
# Injected write, fsync and read errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
async def test_a_failed_write_run_fails_exactly_its_blocks(tmp_path: Path, code: int) -> None:
    io = FaultyIO()
    disk = open_store(tmp_path, io=io)
    try:
        fault = io.inject("pwritev", code, offset=disk.slot_location(5)[1])
        ids, slots = [10, 11, 12, 15, 16, 19], [0, 1, 2, 5, 6, 9]  # runs 0-2, 5-6, 9
        results = await write(disk, ids, slots)
        assert [result is None for result in results] == [True, True, True, False, False, True]
        for result in results[3:5]:
            assert isinstance(result, OSError) and result.errno == code
        assert fault.fired == 1
        failed, _ = await read(disk, [15, 16], [5, 6])
        assert failed == [ReadFailure.NOT_INDEXED] * 2  # no record for a failed block
        await assert_intact(disk, [10, 11, 12, 19], [0, 1, 2, 9])
        assert disk.stats.write_failures == 2 and len(disk) == 4
        # The store keeps working: once the disk has room again, the same slots take blocks.
        io.clear()
        assert await write(disk, [15, 16], [5, 6]) == [None, None]
        await assert_intact(disk, ids, slots)
        assert disk.check().ok
    finally:
        await disk.aclose()


async def test_a_failed_overwrite_leaves_no_stale_record(tmp_path: Path) -> None:
    io = FaultyIO()
    disk = open_store(tmp_path, io=io)
    assert await write(disk, [1], [5]) == [None]
    io.inject("pwritev", errno.EIO, offset=disk.slot_location(5)[1])
    (result,) = await write(disk, [2], [5])
    assert isinstance(result, OSError)
    # Block 1's record was dropped (durably) before slot 5 was touched; the slot's bytes may
    # be anything now, and neither block is served from it.
    results, _ = await read(disk, [1, 2], [5, 6])
    assert results[0] == ReadFailure.NOT_INDEXED
    await disk.aclose()
    disk = open_store(tmp_path)
    try:
        assert disk.restore() == []
    finally:
        await disk.aclose()


async def test_a_failed_fsync_fails_the_blocks_of_that_file_only(tmp_path: Path) -> None:
    io = FaultyIO()
    disk = open_store(tmp_path, io=io, num_blocks=8, slab_file_bytes=4 * BLOCK)
    try:
        io.inject("fsync", errno.EIO, path_suffix="slab-00001.bin", times=1)
        results = await write(disk, [1, 2, 5, 6], [1, 2, 5, 6])
        assert [result is None for result in results] == [True, True, False, False]
        assert all(isinstance(r, OSError) and r.errno == errno.EIO for r in results[2:])
        assert io.calls["fsync"] == 2  # once per touched file, not once per run or block
        assert len(disk) == 2
        assert await write(disk, [5, 6], [5, 6]) == [None, None]
        await assert_intact(disk, [1, 2, 5, 6], [1, 2, 5, 6])
    finally:
        await disk.aclose()


async def test_without_fsync_no_fsync_is_made(tmp_path: Path) -> None:
    io = FaultyIO()
    disk = open_store(tmp_path, io=io, fsync=False)
    try:
        assert await write(disk, [1, 2], [0, 4]) == [None, None]
        assert io.calls["fsync"] == 0
        await assert_intact(disk, [1, 2], [0, 4])
    finally:
        await disk.aclose()


async def test_a_read_error_fails_only_the_block_it_hits(tmp_path: Path) -> None:
    io = FaultyIO()
    disk = open_store(tmp_path, io=io)
    try:
        ids, slots = [1, 2, 3, 4], [1, 2, 3, 4]
        assert await write(disk, ids, slots) == [None] * 4
        io.inject("preadv", errno.EIO, offset=disk.slot_location(3)[1])
        results, buffers = await read(disk, ids, slots)
        assert results == [None, None, ReadFailure.IO_ERROR, None]
        for i in (0, 1, 3):
            assert np.array_equal(buffers[i], deterministic_block(ids[i], BLOCK))
        assert disk.stats.read_failures == {ReadFailure.IO_ERROR: 1}
        io.clear()
        await assert_intact(disk, ids, slots)
    finally:
        await disk.aclose()


async def test_a_transient_read_error_is_retried_block_by_block(tmp_path: Path) -> None:
    io = FaultyIO()
    disk = open_store(tmp_path, io=io)
    try:
        assert await write(disk, [1, 2, 3], [1, 2, 3]) == [None] * 3
        fault = io.inject("preadv", errno.EIO, offset=disk.slot_location(2)[1], times=1)
        await assert_intact(disk, [1, 2, 3], [1, 2, 3])
        assert fault.fired == 1
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# Damaged files
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "zstd"])
async def test_flipped_bytes_are_a_checksum_failure_that_check_finds_and_repairs(
    tmp_path: Path, compression: str
) -> None:
    disk = open_store(tmp_path, compression=compression)
    ids, slots = [2, 3, 4, 5], [0, 1, 2, 3]  # even ids compress
    assert await write(disk, ids, slots) == [None] * 4
    record = disk.record(k(4))
    assert record is not None
    path, offset = disk.slot_location(2)
    flip_byte(path, offset + record.length // 2)
    results, _ = await read(disk, ids, slots)
    assert results == [None, None, ReadFailure.CHECKSUM, None]

    report = disk.check()
    assert not report.ok and report.records == 4
    assert [(p.key, p.slot) for p in report.problems] == [(k(4), 2)]
    assert "checksum" in report.problems[0].what
    assert len(disk) == 4  # check without repair changes nothing

    repaired = disk.check(repair=True)
    assert repaired.repaired == 1 and len(disk) == 3
    assert disk.check().ok
    results, _ = await read(disk, [4], [2])
    assert results == [ReadFailure.NOT_INDEXED]
    await assert_intact(disk, [2, 3, 5], [0, 1, 3])
    await disk.aclose()
    disk = open_store(tmp_path)
    try:
        assert [block.slot for block in disk.restore()] == [0, 1, 3]
    finally:
        await disk.aclose()


async def test_bytes_beyond_a_compressed_frame_do_not_matter(tmp_path: Path) -> None:
    disk = open_store(tmp_path, compression="zstd")
    try:
        assert await write(disk, [2], [4]) == [None]
        record = disk.record(k(2))
        assert record is not None and record.codec == Codec.ZSTD and record.length < BLOCK - 1
        path, offset = disk.slot_location(4)
        flip_byte(path, offset + BLOCK - 1)
        await assert_intact(disk, [2], [4])
        assert (await disk.acheck()).ok
    finally:
        await disk.aclose()


async def test_a_truncated_slab_is_a_short_read_and_reopening_drops_what_was_cut(
    tmp_path: Path,
) -> None:
    disk = open_store(tmp_path, num_blocks=8)
    ids = list(range(8))
    assert await write(disk, ids, ids) == [None] * 8
    path, _ = disk.slot_location(0)
    os.truncate(path, 5 * BLOCK + BLOCK // 2)
    results, buffers = await read(disk, ids, ids)
    assert results == [None] * 5 + [ReadFailure.SHORT_READ] * 3
    for i in range(5):
        assert np.array_equal(buffers[i], deterministic_block(i, BLOCK))
    report = disk.check()
    assert [p.slot for p in report.problems] == [5, 6, 7]
    assert all("slab file ends" in p.what for p in report.problems)
    await disk.aclose()

    disk = open_store(tmp_path, num_blocks=8)
    try:
        assert disk.stats.dropped_at_open == 3
        assert [block.slot for block in disk.restore()] == [0, 1, 2, 3, 4]
        assert path.stat().st_size == 8 * BLOCK  # preallocated again
        assert await write(disk, [15, 16, 17], [5, 6, 7]) == [None] * 3
        await assert_intact(disk, [0, 4, 15, 16, 17], [0, 4, 5, 6, 7])
        assert disk.check().ok
    finally:
        await disk.aclose()


async def test_an_undecodable_frame_is_a_codec_failure(tmp_path: Path) -> None:
    disk = open_store(tmp_path)
    try:
        garbage = b"not a zstd frame" * 8
        path, offset = disk.slot_location(3)
        with path.open("r+b") as file:
            file.seek(offset)
            file.write(garbage)
        index_behind(disk, [(k(1), 3, int(Codec.ZSTD), garbage)])
        results, _ = await read(disk, [1], [3])
        assert results == [ReadFailure.CODEC]
        (problem,) = disk.check().problems
        assert problem.slot == 3 and "decode" in problem.what
    finally:
        await disk.aclose()


async def test_check_finds_a_slot_claimed_twice_and_keeps_the_newest(tmp_path: Path) -> None:
    disk = open_store(tmp_path)
    try:
        assert await write(disk, [1, 2], [3, 4]) == [None, None]
        record = disk.record(k(1))
        assert record is not None
        stale = IndexRecord(3, record.length, record.codec, record.checksum, seq=0)
        disk._catalog.index.put([(k(9), stale)])  # behind the store's back
        report = disk.check()
        assert [(p.key, p.slot) for p in report.problems] == [(k(9), 3)]
        assert "claimed" in report.problems[0].what
        assert disk.check(repair=True).repaired == 1
        assert disk.check().ok
        await assert_intact(disk, [1, 2], [3, 4])
    finally:
        await disk.aclose()


async def test_reopen_drops_the_older_of_two_records_for_one_slot(tmp_path: Path) -> None:
    disk = open_store(tmp_path)
    assert await write(disk, [1], [3]) == [None]
    record = disk.record(k(1))
    assert record is not None
    disk._catalog.index.put([(k(9), IndexRecord(3, BLOCK, 0, 0, seq=0))])
    await disk.aclose()
    disk = open_store(tmp_path)
    try:
        assert [block.key for block in disk.restore()] == [k(1)]
        assert disk.stats.dropped_at_open == 1
        assert disk.check().ok
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# SIGKILL in the middle of a write burst
# --------------------------------------------------------------------------------------------

_NUM_SLOTS = 48
_WRITER = f"""
import asyncio, os, signal, sys
from kvtier.keys import key_from_int
from kvtier.tiers.disk import DiskStore, FileIO
from kvtier.tiers.disk.log_store import LogStore
from kvtier.tiers.disk.testing import deterministic_block

class TornIO(FileIO):
    \"\"\"Writes half of the bytes of its TEAR_AT-th pwritev, then kills the process.\"\"\"
    calls = 0

    def pwritev(self, fd, buffers, offset):
        TornIO.calls += 1
        if TornIO.calls == TEAR_AT:
            data = b"".join(bytes(buffer) for buffer in buffers)
            os.pwrite(fd, data[: len(data) // 2], offset)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().pwritev(fd, buffers, offset)

async def main():
    kind = LogStore if sys.argv[4] == "log" else DiskStore
    store = kind(sys.argv[1], block_size={BLOCK}, num_blocks={_NUM_SLOTS},
                      compression=sys.argv[2], direct_io="auto" if not TEAR_AT else False,
                      fsync=True, io=TornIO())
    first = 0
    while True:
        groups = [list(range(first + g * 5, first + (g + 1) * 5)) for g in range(2)]
        print("begin", groups[-1][-1], flush=True)
        writes = [
            store.write([key_from_int(i) for i in group], [i % {_NUM_SLOTS} for i in group],
                        [deterministic_block(i, {BLOCK}) for i in group])
            for group in groups
        ]
        results = await asyncio.gather(*writes)
        done = [i for g, r in zip(groups, results) for i, e in zip(g, r) if e is None]
        print("stored", *done, flush=True)
        first += 10

TEAR_AT = int(sys.argv[3])
asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("layout", "compression", "tear_at"),
    [
        ("slots", "none", 0),
        ("slots", "zstd", 0),
        ("slots", "none", 40),
        ("slots", "zstd", 40),
        ("log", "none", 0),
        ("log", "zstd", 0),
    ],
    ids=[
        "killed-raw",
        "killed-zstd",
        "torn-write-raw",
        "torn-write-zstd",
        "log-killed-raw",
        "log-killed-zstd",
    ],
)
async def test_sigkill_mid_burst_loses_no_stored_block_and_serves_no_corrupt_one(
    tmp_path: Path, layout: str, compression: str, tear_at: int
) -> None:
    """The writer is SIGKILLed by this process after 20 bursts (wherever it is then), or kills
    itself in the middle of its 40th pwritev, with half of that run's bytes written (a torn
    overwrite of slots that hold indexed blocks). The log layout is killed the same way (48
    slots overwritten 4 times: its regions are reclaimed meanwhile); its torn writes are
    test_disk_log.py's kill loop."""
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path), compression, str(tear_at), layout],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stored: set[int] = set()
    attempted = -1
    bursts = 0

    def take(line: str) -> None:
        nonlocal attempted, bursts
        word, *numbers = line.split()
        if word == "begin":
            attempted = int(numbers[0])
        elif word == "stored":
            stored.update(int(number) for number in numbers)
            bursts += 1

    fired = threading.Event()

    def hung() -> None:  # a hung writer fails the test, not the run
        fired.set()
        child.kill()

    watchdog = threading.Timer(120, hung)
    watchdog.start()
    try:
        assert child.stdout is not None and child.stderr is not None
        while tear_at or bursts < 20:  # ~200 blocks over 48 slots: all overwritten 4 times
            line = child.stdout.readline()
            if not line:
                break
            take(line)
        if not tear_at:
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
        for line in child.stdout:  # reported before the kill, read after it
            take(line)
        errors = child.stderr.read()
    finally:
        watchdog.cancel()
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
        if child.stderr is not None:
            child.stderr.close()
    seen = f"bursts {bursts}, last begun {attempted}, watchdog fired {fired.is_set()}"
    assert child.returncode == -signal.SIGKILL, f"{seen}; {errors}"
    assert attempted >= _NUM_SLOTS, (
        f"the writer died before overwriting any slot ({seen}): {errors}"
    )

    kind = LogStore if layout == "log" else DiskStore
    disk = kind(tmp_path, block_size=BLOCK, num_blocks=_NUM_SLOTS, compression=compression)
    try:
        restored = disk.restore()
        restored_ids = [int.from_bytes(block.key[:8], "big") for block in restored]
        assert all(0 <= i <= attempted for i in restored_ids)
        assert [block.slot for block in restored] == [i % _NUM_SLOTS for i in restored_ids]
        # Every block reported stored is there, unless a later block was (maybe) written over it.
        survivors = {i for i in stored if i + _NUM_SLOTS > attempted}
        assert survivors <= set(restored_ids), (seen, sorted(survivors - set(restored_ids)))
        # Every restored block reads back intact, its checksum verified.
        await assert_intact(disk, restored_ids, [block.slot for block in restored])
        # No block ever attempted reads as anything but itself or a miss.
        for first in range(0, attempted + 1, _NUM_SLOTS):
            ids = list(range(first, min(first + _NUM_SLOTS, attempted + 1)))
            results, buffers = await read(disk, ids, [i % _NUM_SLOTS for i in ids])
            for i, result, buffer in zip(ids, results, buffers, strict=True):
                assert result in (None, ReadFailure.NOT_INDEXED), (i, result)
                if result is None:
                    assert np.array_equal(buffer, deterministic_block(i, BLOCK))
        report = disk.check()
        assert report.ok, str(report)
        assert report.records == len(restored)
    finally:
        await disk.aclose()


async def test_stored_bytes_helper_reads_the_slab(tmp_path: Path) -> None:
    disk = open_store(tmp_path)
    try:
        assert await write(disk, [3], [2]) == [None]
        assert stored_bytes(disk, 2, BLOCK) == deterministic_block(3, BLOCK).tobytes()
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# Coalescing and races, observed through the I/O layer
# --------------------------------------------------------------------------------------------


class _RecordingIO(FaultyIO):
    """Logs (operation, offset, bytes) of every pwritev / preadv, and runs `before_read` (once)
    just before the next preadv: a stand-in for a write that races the read."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int, int]] = []
        self.before_read: Any = None

    def pwritev(self, fd: int, buffers: Any, offset: int) -> int:
        self.log.append(("pwritev", offset, sum(memoryview(b).nbytes for b in buffers)))
        return super().pwritev(fd, buffers, offset)

    def preadv(self, fd: int, buffers: Any, offset: int) -> int:
        hook, self.before_read = self.before_read, None
        if hook is not None:
            hook()
        self.log.append(("preadv", offset, sum(memoryview(b).nbytes for b in buffers)))
        return super().preadv(fd, buffers, offset)


async def test_contiguous_slots_move_in_one_system_call_per_run(tmp_path: Path) -> None:
    io = _RecordingIO()
    disk = open_store(tmp_path, io=io)
    try:
        io.log.clear()
        ids, slots = [1, 2, 3, 4, 5, 6], [9, 2, 3, 4, 10, 12]  # runs 2-4, 9-10, 12
        assert await write(disk, ids, slots) == [None] * 6
        assert io.log == [
            ("pwritev", 2 * BLOCK, 3 * BLOCK),
            ("pwritev", 9 * BLOCK, 2 * BLOCK),
            ("pwritev", 12 * BLOCK, BLOCK),
        ]
        assert io.calls["fsync"] == 1  # once per batch
        io.log.clear()
        await assert_intact(disk, ids[::-1], slots[::-1])
        assert [entry[0] for entry in io.log] == ["preadv"] * 3
        assert sorted(entry[1:] for entry in io.log) == [
            (2 * BLOCK, 3 * BLOCK),
            (9 * BLOCK, 2 * BLOCK),
            (12 * BLOCK, BLOCK),
        ]
    finally:
        await disk.aclose()


async def test_a_write_racing_a_read_makes_the_read_a_miss_not_a_corruption(
    tmp_path: Path,
) -> None:
    io = _RecordingIO()
    disk = open_store(tmp_path, io=io)
    try:
        assert await write(disk, [1], [3]) == [None]
        # Between the read's index lookup and its preadv, block 2 is written over slot 3.
        io.before_read = lambda: disk._lane.write_now([k(2)], [3], [deterministic_block(2, BLOCK)])
        results, _ = await read(disk, [1], [3])
        assert results == [ReadFailure.NOT_INDEXED]
        assert disk.stats.read_failures == {ReadFailure.NOT_INDEXED: 1}
        await assert_intact(disk, [2], [3])
    finally:
        await disk.aclose()


@pytest.mark.parametrize("direct_io", [False, True])
async def test_a_compressed_block_is_read_only_as_far_as_its_frame(
    tmp_path: Path, direct_io: bool
) -> None:
    size = 4 * BLOCK  # so that even a frame rounded up to 4 KiB is shorter than a slot
    io = _RecordingIO()
    try:
        disk = open_store(tmp_path, io=io, compression="zstd", direct_io=direct_io, block_size=size)
    except DirectIOError:
        pytest.skip("no O_DIRECT on the filesystem of tmp_path")
    try:
        ids, slots = [1, 2, 3], [4, 5, 6]  # block 2 compresses; 1 and 3 are random bytes
        data = [deterministic_block(i, size) for i in ids]
        assert await disk.write([k(i) for i in ids], slots, data) == [None] * 3
        frame = disk.record(k(2))
        assert frame is not None and frame.codec == Codec.ZSTD
        expected = -(-frame.length // 4096) * 4096 if direct_io else frame.length
        assert expected < size
        io.log.clear()
        buffers = empty_buffers(3, size)
        assert await disk.read([k(i) for i in ids], slots, buffers) == [None] * 3
        for buffer, block in zip(buffers, data, strict=True):
            assert np.array_equal(buffer, block)
        # Slots 4-5 are one run that stops at the end of block 2's frame; slot 6 is another.
        assert sorted(io.log) == [
            ("preadv", 4 * size, size + expected),
            ("preadv", 6 * size, size),
        ]
    finally:
        await disk.aclose()
