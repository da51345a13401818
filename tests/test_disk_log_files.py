"""A log store's files (kvtier/tiers/disk/log_files.py): a reclaim reads only the spans
holding a region's live records (`record_spans`, `read_records`), each record's bytes as the
file holds them, and says which records a truncated file cuts off; a head thread's header
write (`write_here`) lands where `write_parts` would put it; `write_parts` cuts a write in
parts and the parts in one batch per write thread (`spread`), and a part that fails fails
its batch's future while every other part still lands."""

from __future__ import annotations

import errno
import itertools
import os
import random
from pathlib import Path

import numpy as np
import pytest

from kvtier.tiers.disk.io import FaultyIO, FileIO
from kvtier.tiers.disk.log_files import (
    SPAN_BYTES,
    SPAN_GAP,
    WRITE_PART_BYTES,
    WRITE_THREADS,
    Geometry,
    LogFiles,
    record_spans,
    spread,
)
from kvtier.tiers.disk.log_format import PAGE, REGIONS_FILE
from kvtier.tiers.disk.log_group import aligned_buffer
from kvtier.tiers.disk.ops import WriteOp

pytestmark = pytest.mark.timeout(60)

REGION = 4 << 20


def _records(rng: random.Random, count: int, whole_pages: bool) -> list[tuple[int, int]]:
    """`count` records (offset, length) in order, apart by random gaps, within a region."""
    records: list[tuple[int, int]] = []
    at = PAGE
    for _ in range(count):
        length = PAGE * rng.randint(1, 8) if whole_pages else rng.randint(1, 3 * PAGE)
        gap = rng.choice([0, 8, PAGE, 5 * PAGE, SPAN_GAP - PAGE, SPAN_GAP, 3 * SPAN_GAP])
        offset = at + gap if whole_pages else (at + gap + 7) // 8 * 8
        if whole_pages:
            offset = -(-offset // PAGE) * PAGE
        if offset + length > REGION:
            break
        records.append((offset, length))
        at = offset + length
    return records


@pytest.mark.parametrize("whole_pages", [True, False])
def test_record_spans_hold_every_record_once_and_skip_wide_gaps(whole_pages: bool) -> None:
    rng = random.Random(7)
    for _ in range(200):
        records = _records(rng, rng.randint(1, 60), whole_pages)
        spans = record_spans(records)
        for start, stop in spans:
            assert start % PAGE == 0 and stop % PAGE == 0 and start < stop
        for (_, stop), (start, _) in itertools.pairwise(spans):
            assert stop <= start  # in order, apart
        for offset, length in records:
            holding = [s for s in spans if s[0] <= offset and offset + length <= s[1]]
            assert len(holding) == 1, (offset, length, spans)
        for (begun, stop), (start, _) in itertools.pairwise(spans):
            assert start - stop >= SPAN_GAP or start - begun >= SPAN_BYTES


def _files(root: Path, regions: int, io: FileIO | None = None) -> LogFiles:
    files = LogFiles(root, Geometry(REGION, regions), io or FileIO(), "auto")
    files.allocate()
    return files


def test_read_records_reads_each_record_as_the_file_holds_it(tmp_path: Path) -> None:
    rng = random.Random(3)
    files = _files(tmp_path, 2)
    try:
        content = np.frombuffer(rng.randbytes(REGION), dtype=np.uint8)
        files.write_here(1, 0, [content.data], False)
        for whole_pages in (True, False, True):
            records = _records(rng, 40, whole_pages)
            first = records[0][0] // PAGE * PAGE
            view = aligned_buffer(REGION)
            reached = files.read_records(1, first, view.data, records)
            for (offset, length), end in zip(records, reached, strict=True):
                assert end >= offset + length
                got = view[offset - first : offset - first + length]
                assert np.array_equal(got, content[offset : offset + length])
    finally:
        files.close()


def test_read_records_says_which_records_a_truncated_file_cuts_off(tmp_path: Path) -> None:
    rng = random.Random(5)
    files = _files(tmp_path, 2)
    try:
        content = np.frombuffer(rng.randbytes(REGION), dtype=np.uint8)
        files.write_here(1, 0, [content.data], False)
        cut = REGION + REGION // 2 + 100  # the file ends inside region 1
        os.truncate(tmp_path / REGIONS_FILE, cut)
        records = _records(rng, 80, True)
        assert records[-1][0] + records[-1][1] > cut - REGION, "no record past the cut"
        first = records[0][0] // PAGE * PAGE
        view = aligned_buffer(REGION)
        reached = files.read_records(1, first, view.data, records)
        for (offset, length), end in zip(records, reached, strict=True):
            whole = offset + length <= end
            assert whole == (REGION + offset + length <= cut)
            if whole:
                got = view[offset - first : offset - first + length]
                assert np.array_equal(got, content[offset : offset + length])
    finally:
        files.close()


def test_write_here_lands_where_write_parts_puts_the_same_bytes(tmp_path: Path) -> None:
    rng = random.Random(9)
    files = _files(tmp_path, 3)
    try:
        data = aligned_buffer(3 * (1 << 20) + 2 * PAGE)
        data[:] = np.frombuffer(rng.randbytes(data.nbytes), dtype=np.uint8)
        files.write_here(1, 2 * PAGE, [data.data], True)
        for write in files.write_parts(2, 2 * PAGE, [data.data], True):
            write.result()
        back = [aligned_buffer(data.nbytes), aligned_buffer(data.nbytes)]
        for region, out in zip((1, 2), back, strict=True):
            assert files.read_run(region, 2 * PAGE, [out.data], True) == data.nbytes
        assert np.array_equal(back[0], data) and np.array_equal(back[1], data)
    finally:
        files.close()


def test_spread_keeps_every_part_once_in_order_in_even_batches() -> None:
    for count in range(0, 23):
        parts = [WriteOp(3, [b"x"], at, 1) for at in range(count)]
        for threads in (1, 2, WRITE_THREADS):
            batches = spread(parts, threads)
            assert [op for batch in batches for op in batch] == parts
            assert len(batches) == min(threads, count)
            sizes = [len(batch) for batch in batches]
            assert all(sizes) and (not sizes or max(sizes) - min(sizes) <= 1)


@pytest.mark.parametrize("faulty", [False, True], ids=["plain", "faulty-io"])
def test_write_parts_lands_every_part_and_a_failed_part_fails_its_batch(
    tmp_path: Path, faulty: bool
) -> None:
    """With the real system calls (the compiled batch, where built) and through a `FileIO`
    that sees every call (Python): every byte lands; with one part's write failing, one
    future raises that OSError and the other parts still land."""
    io = FaultyIO() if faulty else FileIO()
    files = _files(tmp_path, 3, io)
    rng = random.Random(13)
    try:
        data = aligned_buffer(3 * WRITE_PART_BYTES + 5 * PAGE)
        data[:] = np.frombuffer(rng.randbytes(data.nbytes), dtype=np.uint8)
        rows = [data[at : at + 16 * PAGE].data for at in range(0, data.nbytes, 16 * PAGE)]
        writes = files.write_parts(1, PAGE, rows, True)
        assert len(writes) == min(WRITE_THREADS, 4)
        assert sum(write.result() for write in writes) == data.nbytes
        back = aligned_buffer(data.nbytes)
        assert files.read_run(1, PAGE, [back.data], True) == data.nbytes
        assert np.array_equal(back, data)
        if not isinstance(io, FaultyIO):
            return
        bad = 2 * REGION + PAGE + WRITE_PART_BYTES + 1  # inside the second part
        io.inject("pwritev", errno.EIO, path_suffix=REGIONS_FILE, offset=bad, times=1)
        data[:] = np.frombuffer(rng.randbytes(data.nbytes), dtype=np.uint8)
        errors = []
        for write in files.write_parts(2, PAGE, rows, True):
            try:
                write.result()
            except OSError as error:
                errors.append(error.errno)
        assert errors == [errno.EIO]
        assert files.read_run(2, PAGE, [back.data], True) == data.nbytes
        second = slice(WRITE_PART_BYTES, 2 * WRITE_PART_BYTES)
        keep = np.ones(data.nbytes, bool)
        keep[second] = False
        assert np.array_equal(back[keep], data[keep])
    finally:
        files.close()
