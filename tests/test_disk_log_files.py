"""A log store's files (kvtier/tiers/disk/log_files.py): a reclaim reads only the spans
holding a region's live records (`record_spans`, `read_records`), each record's bytes as the
file holds them, and says which records a truncated file cuts off; a head thread's header
write (`write_here`) lands where `write_parts` would put it; `write_parts` cuts a write in
pieces of about equal bytes (`pieces`: whole pages, at least WRITE_PIECE_BYTES each when
there is that much, one `pwritev` each) and the pieces in one batch per write thread
(`spread`), and a piece that fails fails its batch's future while every other piece still
lands."""

from __future__ import annotations

import errno
import itertools
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.tiers.disk.io import IOV_MAX, FaultyIO, FileIO
from kvtier.tiers.disk.log_files import (
    SPAN_BYTES,
    SPAN_GAP,
    WRITE_PIECE_BYTES,
    WRITE_THREADS,
    Geometry,
    LogFiles,
    pieces,
    pieces_sized,
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


def test_pieces_hold_every_byte_once_in_order_in_whole_pages() -> None:
    rng = random.Random(21)
    for _ in range(60):
        sizes = [PAGE * rng.choice([1, 4, 16, 64, 300, 2048]) for _ in range(rng.randint(0, 40))]
        if rng.random() < 0.2:
            sizes = [PAGE] * rng.randint(IOV_MAX, IOV_MAX + 600)  # many small buffers
        data = np.frombuffer(rng.randbytes(sum(sizes)), dtype=np.uint8)
        offsets = np.cumsum([0, *sizes])
        views = [data[a:b].data for a, b in itertools.pairwise(offsets)]
        for threads in (1, 2, WRITE_THREADS):
            cut = pieces(views, threads)
            joined = b"".join(bytes(view) for piece in cut for view in piece)
            assert joined == data.tobytes()
            got = [sum(view.nbytes for view in piece) for piece in cut]
            assert all(nbytes % PAGE == 0 and nbytes > 0 for nbytes in got)
            assert all(0 < len(piece) <= IOV_MAX for piece in cut)
            if data.nbytes and all(len(piece) < IOV_MAX for piece in cut):
                assert len(cut) == max(1, min(threads, data.nbytes // WRITE_PIECE_BYTES))
                assert max(got) - min(got) <= len(cut) * PAGE


def test_pieces_of_a_smaller_least_size_start_more_threads() -> None:
    """`piece_bytes` (a group's first part): pieces of at least that much, up to `threads`;
    every byte once, in order."""
    data = aligned_buffer(7 * (1 << 20))
    data[:] = np.frombuffer(random.Random(5).randbytes(data.nbytes), dtype=np.uint8)
    rows = [data[at : at + 16 * PAGE].data for at in range(0, data.nbytes, 16 * PAGE)]
    assert len(pieces_sized(rows, WRITE_THREADS)) == 1  # 7 MiB: one WRITE_PIECE_BYTES piece
    for least, count in ((1 << 20, min(WRITE_THREADS, 7)), (2 << 20, 3), (8 << 20, 1)):
        cut = pieces_sized(rows, WRITE_THREADS, None, least)
        assert len(cut) == count
        assert b"".join(bytes(v) for piece, _ in cut for v in piece) == data.tobytes()
        assert sum(nbytes for _, nbytes in cut) == data.nbytes


def test_write_parts_makes_one_pwritev_a_piece(tmp_path: Path) -> None:
    """A part of two pieces' bytes in rows of 16 pages is two system calls, whatever its
    rows (1 MiB writes made one a MiB: 9 here, each a GIL hand-off and more CPU)."""
    io = FaultyIO()
    files = _files(tmp_path, 8, io)
    try:
        data = aligned_buffer(2 * WRITE_PIECE_BYTES + 5 * PAGE)
        rows = [data[at : at + 16 * PAGE].data for at in range(0, data.nbytes, 16 * PAGE)]
        before = io.calls["pwritev"]
        writes = files.write_parts(1, PAGE, rows, True)
        assert sorted(write.result() for write in writes) == [1, 2]  # numbered as returned
        assert files.writes_done == 2 and files.synced_through == 0
        files.sync()
        assert files.synced_through == 2
        assert len(writes) == 2
        assert io.calls["pwritev"] - before == 2
    finally:
        files.close()


@pytest.mark.parametrize("faulty", [False, True], ids=["plain", "faulty-io"])
def test_write_parts_lands_every_part_and_a_failed_part_fails_its_batch(
    tmp_path: Path, faulty: bool
) -> None:
    """With the real system calls (the compiled batch, where built) and through a `FileIO`
    that sees every call (Python): every byte lands; with one piece's write failing, one
    future raises that OSError and the other pieces still land."""
    io = FaultyIO() if faulty else FileIO()
    files = _files(tmp_path, 12, io)
    rng = random.Random(13)
    try:
        data = aligned_buffer(3 * WRITE_PIECE_BYTES + 5 * PAGE)
        data[:] = np.frombuffer(rng.randbytes(data.nbytes), dtype=np.uint8)
        rows = [data[at : at + 16 * PAGE].data for at in range(0, data.nbytes, 16 * PAGE)]
        writes = files.write_parts(1, PAGE, rows, True)
        assert len(writes) == min(WRITE_THREADS, 3)
        assert len({write.result() for write in writes}) == len(writes)  # each its number
        back = aligned_buffer(data.nbytes)
        assert files.read_run(1, PAGE, [back.data], True) == data.nbytes
        assert np.array_equal(back, data)
        if not isinstance(io, FaultyIO):
            return
        first = sum(view.nbytes for view in pieces(rows)[0])
        bad = 2 * REGION + PAGE + first + 1  # inside the second piece
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
        second = slice(first, first + sum(view.nbytes for view in pieces(rows)[1]))
        keep = np.ones(data.nbytes, bool)
        keep[second] = False
        assert np.array_equal(back[keep], data[keep])
    finally:
        files.close()


def test_pieces_of_arrays_cut_them_by_bytes() -> None:
    """Buffers of any contiguous kind (a part's payloads are the caller's arrays), their
    sizes given or not: every byte once, in order, a cut one cut by bytes (uint16 and 2-D
    arrays: slicing the array itself would cut elements or rows); the pieces' byte counts
    are their buffers'."""
    rng = random.Random(5)
    for _ in range(40):
        arrays: list[Any] = []
        for _ in range(rng.randint(1, 30)):
            pages = rng.choice([1, 4, 16, 300])
            raw = np.frombuffer(rng.randbytes(pages * PAGE), dtype=np.uint8)
            arrays.append(rng.choice([raw, raw.view(np.uint16), raw.reshape(pages, PAGE)]))
        data = b"".join(array.tobytes() for array in arrays)
        sizes = [array.nbytes for array in arrays]
        for threads in (1, 2, WRITE_THREADS):
            for given in (sizes, None):
                cut = pieces_sized(list(arrays), threads, given)
                joined = b"".join(memoryview(b).cast("B") for piece, _ in cut for b in piece)
                assert joined == data
                assert [n for _, n in cut] == [
                    sum(memoryview(b).nbytes for b in piece) for piece, _ in cut
                ]
