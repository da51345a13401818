"""The disk store's write lane (kvtier/tiers/disk/lane.py) on its own: a group writes bytes,
slot headers and one index commit; a failed run, commit or lost file fails exactly the blocks
it should, and nothing half-written is ever indexed."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import lmdb
import pytest
from disk_parts import BLOCK, blocks, k, open_parts

from kvtier.errors import DiskTierError, StorageClosedError
from kvtier.tiers.disk.io import FaultyIO
from kvtier.tiers.disk.jobs import ForgetJob, WriteJob
from kvtier.tiers.disk.lane import split_runs
from kvtier.tiers.disk.layout import IndexRecord, Run, entry_offset, slab_file_name, unpack_entry
from kvtier.tiers.storage import ReadFailure


def header_of(parts: Any, slot: int) -> Any:
    data = os.pread(parts.files.headers_fd, 320, entry_offset(slot))
    return unpack_entry(data, parts.layout.namespace, slot)


def test_runs_are_split_into_parts_of_about_equal_bytes() -> None:
    runs = [Run(0, 0, (0, 1)), Run(0, 100, (2,)), Run(1, 0, (3,)), Run(1, 50, (4, 5))]
    lengths = [10, 10, 20, 20, 10, 10]
    assert split_runs(runs, lengths, 1) == [runs]
    assert split_runs(runs, lengths, 2) == [runs[:2], runs[2:]]
    parts = split_runs(runs, lengths, 8)  # never more parts than runs
    assert [run for part in parts for run in part] == runs and len(parts) <= len(runs)


def test_a_group_writes_bytes_headers_and_records(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1), k(2), k(3)], [0, 1, 9], blocks([1, 2, 3])) == [None] * 3
        assert sorted(parts.catalog.keys()) == sorted([k(1), k(2), k(3)])
        indexed = dict(parts.catalog.index.items())
        for key, slot in ((k(1), 0), (k(2), 1), (k(3), 9)):
            record = parts.catalog.get(key)
            assert record is not None and record.slot == slot
            assert IndexRecord.unpack(indexed[key]) == record
            header = header_of(parts, slot)
            assert header is not None and header.key == key and header.record(slot) == record
        results, buffers = parts.read([1, 2, 3], [0, 1, 9])
        assert results == [None] * 3
        assert all((a == b).all() for a, b in zip(buffers, blocks([1, 2, 3]), strict=True))
        stats = parts.counters.snapshot()
        assert (stats.write_groups, stats.blocks_written, stats.index_commits) == (1, 3, 1)
        assert stats.fsyncs == 2  # slots 0, 1 in file 0 and slot 9 in file 1
    finally:
        parts.close()


def test_rewriting_a_slot_drops_its_old_record_and_forgetting_clears_its_header(
    tmp_path: Path,
) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1), k(2)], [4, 5], blocks([1, 2])) == [None, None]
        assert parts.lane.write_now([k(3)], [4], blocks([3])) == [None]
        assert k(1) not in parts.catalog and k(1) not in dict(parts.catalog.index.items())
        assert header_of(parts, 4).key == k(3)
        results, _ = parts.read([1, 3], [4, 4])
        assert results[0] is not None and results[1] is None
    finally:
        parts.close()


def test_a_failed_run_fails_only_its_blocks(tmp_path: Path) -> None:
    io = FaultyIO()
    parts = open_parts(tmp_path, io=io)
    try:
        io.inject("pwritev", errno.ENOSPC, path_suffix=slab_file_name(1), times=1)
        results = parts.lane.write_now([k(1), k(2), k(3)], [0, 8, 9], blocks([1, 2, 3]))
        assert results[0] is None
        assert all(isinstance(r, OSError) and r.errno == errno.ENOSPC for r in results[1:])
        assert parts.catalog.keys() == [k(1)]
        assert header_of(parts, 8) is None and header_of(parts, 9) is None
        assert parts.counters.snapshot().write_failures == 2
    finally:
        parts.close()


def test_a_failed_commit_fails_the_group_and_indexes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1)], [3], blocks([1])) == [None]
        index = parts.catalog.index
        real_update = index.update
        calls: list[int] = []

        def first_commit_fails(deleted: Any, records: Any) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise lmdb.Error("injected commit failure")
            real_update(deleted, records)

        monkeypatch.setattr(index, "update", first_commit_fails)
        results = parts.lane.write_now([k(2), k(3)], [3, 4], blocks([2, 3]))
        assert all(isinstance(r, OSError) and r.errno == errno.EIO for r in results)
        # Neither new block is indexed; the overwritten block's record is gone from memory
        # and, by the second transaction, from the index too.
        assert parts.catalog.keys() == []
        assert dict(parts.catalog.index.items()) == {}
        assert header_of(parts, 4) is None  # a failed block's header is cleared
        assert parts.counters.snapshot().index_commits == 2  # the first group, the retry
    finally:
        parts.close()


def test_a_group_whose_files_were_removed_disables_the_store(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1)], [0], blocks([1])) == [None]
        os.unlink(parts.files.root / slab_file_name(0))
        results = parts.lane.write_now([k(2)], [1], blocks([2]))
        assert isinstance(results[0], OSError) and results[0].errno == errno.ESTALE
        assert parts.guard.reason is not None and "was removed" in parts.guard.reason
        assert len(parts.catalog) == 0 and parts.files.slab_fds == []  # nothing held
        refused = parts.lane.write_now([k(3)], [2], blocks([3]))
        assert isinstance(refused[0], OSError) and refused[0].errno == errno.ESTALE
        read, _ = parts.read([1], [0])
        assert read == [ReadFailure.IO_ERROR]  # a disabled store serves nothing
    finally:
        parts.close()


async def test_queued_calls_are_settled_with_their_own_results(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        loop = asyncio.get_running_loop()
        written: asyncio.Future[list[OSError | None]] = loop.create_future()
        forgotten: asyncio.Future[None] = loop.create_future()
        parts.lane.submit(WriteJob([k(1), k(2)], [0, 1], blocks([1, 2]), written))
        parts.lane.submit(ForgetJob([k(1)], forgotten))
        assert await written == [None, None]
        await forgotten
        assert parts.catalog.keys() == [k(2)]
        assert parts.lane.queued == 0
    finally:
        await asyncio.to_thread(parts.close)
    with pytest.raises(StorageClosedError):
        parts.lane.submit(ForgetJob([k(2)], asyncio.get_running_loop().create_future()))


async def test_a_forget_whose_commit_fails_raises_a_disk_tier_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1)], [0], blocks([1])) == [None]

        def failing(deleted: Any, records: Any) -> None:
            raise lmdb.Error("injected")

        monkeypatch.setattr(parts.catalog.index, "update", failing)
        forgotten: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        parts.lane.submit(ForgetJob([k(1)], forgotten))
        with pytest.raises(DiskTierError, match="could not commit its index"):
            await forgotten
        assert k(1) not in parts.catalog  # not served either way
    finally:
        await asyncio.to_thread(parts.close)


def test_a_compressed_group_stores_frames_shorter_than_a_block(tmp_path: Path) -> None:
    parts = open_parts(tmp_path, compression="zstd")
    try:
        ids = [0, 2, 4]  # even ids are compressible
        assert parts.lane.write_now([k(i) for i in ids], [0, 1, 2], blocks(ids)) == [None] * 3
        records = [parts.catalog.get(k(i)) for i in ids]
        assert all(record is not None and record.length < BLOCK for record in records)
        results, buffers = parts.read(ids, [0, 1, 2])
        assert results == [None] * 3
        assert all((a == b).all() for a, b in zip(buffers, blocks(ids), strict=True))
    finally:
        parts.close()
