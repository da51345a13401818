"""The disk store's read path (kvtier/tiers/disk/reader.py) on its own: every block read is
verified against the record of the key it was asked for, and anything else is a named miss."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from disk_parts import BLOCK, blocks, k, open_parts

from kvtier.tiers.disk.io import FileIO, IOBuffer
from kvtier.tiers.disk.layout import IndexRecord, slab_file_name
from kvtier.tiers.disk.reader import BlockVerifier
from kvtier.tiers.disk.testing import flip_byte
from kvtier.tiers.storage import ReadFailure


class OneByteIO(FileIO):
    """Reads one byte per call: every read of a block is a long chain of partial reads."""

    def preadv(self, fd: int, buffers: Any, offset: int) -> int:
        first = memoryview(buffers[0]).cast("B")
        return super().preadv(fd, [first[:1]], offset)


def test_blocks_read_back_intact_and_are_counted(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        ids = [1, 2, 3, 4]
        assert parts.lane.write_now([k(i) for i in ids], [6, 7, 8, 20], blocks(ids)) == [None] * 4
        results, buffers = parts.read(ids, [6, 7, 8, 20])
        assert results == [None] * 4
        assert all(np.array_equal(a, b) for a, b in zip(buffers, blocks(ids), strict=True))
        stats = parts.counters.snapshot()
        assert stats.blocks_read == 4 and stats.bytes_read == 4 * BLOCK
    finally:
        parts.close()


def test_a_key_not_indexed_in_that_slot_is_a_miss(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1), k(2)], [0, 1], blocks([1, 2])) == [None, None]
        results, buffers = parts.read([1, 2, 9], [1, 1, 2])
        assert results == [ReadFailure.NOT_INDEXED, None, ReadFailure.NOT_INDEXED]
        assert not buffers[0].any()  # another key's slot: its bytes were never read
        assert parts.counters.snapshot().read_failures == {ReadFailure.NOT_INDEXED: 2}
    finally:
        parts.close()


def test_a_damaged_block_is_a_checksum_miss_and_its_neighbours_are_served(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        ids = [1, 2, 3]
        assert parts.lane.write_now([k(i) for i in ids], [0, 1, 2], blocks(ids)) == [None] * 3
        flip_byte(parts.files.root / slab_file_name(0), BLOCK + 10)
        results, buffers = parts.read(ids, [0, 1, 2])
        assert results == [None, ReadFailure.CHECKSUM, None]
        assert np.array_equal(buffers[2], blocks([3])[0])
    finally:
        parts.close()


def test_a_block_cut_off_by_a_truncated_file_is_a_short_read(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1), k(2)], [0, 1], blocks([1, 2])) == [None, None]
        os.truncate(parts.files.root / slab_file_name(0), BLOCK + 100)
        results, buffers = parts.read([1, 2], [0, 1])
        assert results == [None, ReadFailure.SHORT_READ]
        assert np.array_equal(buffers[0], blocks([1])[0])
    finally:
        parts.close()


def test_partial_reads_are_resumed(tmp_path: Path) -> None:
    parts = open_parts(tmp_path, io=OneByteIO(), compression="zstd")
    try:
        ids = [2, 3]  # one compressible, one not
        assert parts.lane.write_now([k(i) for i in ids], [4, 5], blocks(ids)) == [None, None]
        results, buffers = parts.read(ids, [4, 5])
        assert results == [None, None]
        assert all(np.array_equal(a, b) for a, b in zip(buffers, blocks(ids), strict=True))
    finally:
        parts.close()


def test_a_record_rewritten_during_the_read_is_not_served(tmp_path: Path) -> None:
    class RewritingIO(FileIO):
        armed = False

        def preadv(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
            if self.armed:
                self.armed = False
                parts.lane.write_now([k(5)], [3], blocks([5]))  # overwrites slot 3
            return super().preadv(fd, buffers, offset)

    io = RewritingIO()
    parts = open_parts(tmp_path, io=io)
    try:
        assert parts.lane.write_now([k(1)], [3], blocks([1])) == [None]
        io.armed = True
        results, _ = parts.read([1], [3])
        assert results == [ReadFailure.NOT_INDEXED]
        results, buffers = parts.read([5], [3])
        assert results == [None] and np.array_equal(buffers[0], blocks([5])[0])
    finally:
        parts.close()


def test_a_disabled_store_reads_nothing(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1)], [0], blocks([1])) == [None]
        assert parts.guard.disable("a test")
        results, buffers = parts.read([1], [0])
        assert results == [ReadFailure.IO_ERROR] and not buffers[0].any()
        assert parts.counters.snapshot().read_failures == {ReadFailure.IO_ERROR: 1}
    finally:
        parts.close()


def test_the_verifier_names_what_is_wrong_with_a_record(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1), k(2)], [0, 9], blocks([1, 2])) == [None, None]
        verifier = BlockVerifier(parts.layout, parts.files, parts.codec)
        scratch = verifier.scratch()
        record = parts.catalog.get(k(1))
        assert record is not None
        assert verifier.problem(k(1), record, scratch) is None
        assert "checksum mismatch" in (verifier.problem(k(2), record, scratch) or "")
        stale = IndexRecord(record.slot, record.length, record.codec, record.checksum, 99)
        assert "checksum mismatch" in (verifier.problem(k(1), stale, scratch) or "")
        beyond = IndexRecord(40, BLOCK, 0, 0, 1)
        assert "out of range" in (verifier.problem(k(1), beyond, scratch) or "")
        os.truncate(parts.files.root / slab_file_name(1), 100)
        far = parts.catalog.get(k(2))
        assert far is not None
        assert "slab file ends at byte 100" in (verifier.problem(k(2), far, scratch) or "")
    finally:
        parts.close()
