"""The disk store's format in one object (kvtier/tiers/disk/layout.py): slot addressing, runs,
slot headers, index records, the bound checksum and the layout record."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.errors import DiskLayoutError, InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.tiers.codec import Codec
from kvtier.tiers.disk.layout import (
    ENTRY_BYTES,
    FILE_HEADER_BYTES,
    LAYOUT_VERSION,
    IndexRecord,
    StoreLayout,
    entry_offset,
    headers_file_bytes,
    layout_fingerprint,
    pack_file_header,
    slots_in_headers_file,
    unpack_entry,
    unpack_file_header,
)


def test_slots_are_addressed_by_file_and_offset() -> None:
    layout = StoreLayout(num_blocks=10, block_size=100, slots_per_file=4, model_id="m")
    assert layout.num_files == 3
    assert [layout.locate(slot) for slot in (0, 3, 4, 9)] == [(0, 0), (0, 300), (1, 0), (2, 100)]
    assert [layout.file_bytes(file) for file in range(3)] == [400, 400, 200]
    assert layout.store_dir(Path("/x")) == Path(f"/x/kvtier-{layout.fingerprint}")


def test_the_block_size_and_model_name_the_namespace() -> None:
    layout = StoreLayout(8, 4096, 2, "llama")
    assert layout.fingerprint == layout_fingerprint(4096, "llama")
    assert layout.namespace == layout.fingerprint.encode()
    wider = layout.with_slots_per_file(8)
    assert (wider.slots_per_file, wider.num_files) == (8, 1)
    assert (wider.fingerprint, wider.block_size, wider.num_blocks) == (
        layout.fingerprint,
        4096,
        8,
    )
    assert StoreLayout(8, 8192, 2, "llama").fingerprint != layout.fingerprint
    assert StoreLayout(8, 4096, 2, "other").fingerprint != layout.fingerprint


@pytest.mark.parametrize(
    "arguments",
    [(0, 10, 1, ""), (10, 0, 1, ""), (10, 10, 0, ""), (True, 10, 1, ""), (10, 10, 1, 3)],
)
def test_an_impossible_layout_is_refused(arguments: tuple[object, ...]) -> None:
    with pytest.raises(InvalidValueError):
        StoreLayout(*arguments)  # type: ignore[arg-type]


def test_runs_are_consecutive_slots_of_one_file_and_end_at_a_short_block() -> None:
    layout = StoreLayout(num_blocks=20, block_size=10, slots_per_file=8)
    slots = [9, 3, 4, 5, 7, 8, 10]
    runs = layout.runs(range(len(slots)), slots)
    assert [(run.file, run.offset, run.members) for run in runs] == [
        (0, 30, (1, 2, 3)),
        (0, 70, (4,)),  # slot 8 starts file 1
        (1, 0, (5, 0, 6)),
    ]
    short = layout.runs(range(3), [3, 4, 5], ends_run=lambda member: member == 1)
    assert [run.members for run in short] == [(0, 1), (2,)]


def test_a_groups_entries_are_what_each_record_packs_and_unpacks_to() -> None:
    layout = StoreLayout(16, 4096, 16, "m")
    keys = [OffloadKey(b"\x01"), OffloadKey(bytes(range(200)))]
    slots, lengths, codecs, seqs = [5, 2], [4096, 17], [0, 1], [7, 9]
    blocks = [bytes(4096), b"z" * 17]
    entries = layout.entries(keys, slots, lengths, codecs, seqs, blocks)
    raw = entries.tobytes()
    for i, key in enumerate(keys):
        record = IndexRecord(slots[i], lengths[i], codecs[i], int(entries["checksum"][i]), seqs[i])
        assert layout.checksum(key, record, blocks[i]) == record.checksum
        entry = layout.pack_entry(key, record)
        assert entry == raw[i * ENTRY_BYTES : (i + 1) * ENTRY_BYTES]
        header = unpack_entry(entry, layout.namespace, slots[i])
        assert header is not None and header.key == key and header.record(slots[i]) == record
    headers = layout.unpack_entries(raw + bytes(ENTRY_BYTES), 5)
    assert headers[0] is not None and headers[0].key == keys[0]
    assert headers[1] is None  # slot 6's entry was written for slot 2: not this slot's
    assert headers[2] is None  # an empty entry


def test_a_record_bound_to_another_key_slot_or_sequence_has_another_checksum() -> None:
    layout = StoreLayout(16, 4096, 16, "m")
    record = IndexRecord(3, 4096, 0, 0, 1)
    checksum = layout.checksum(OffloadKey(b"a"), record, bytes(4096))
    assert layout.checksum(OffloadKey(b"b"), record, bytes(4096)) != checksum
    assert layout.checksum(OffloadKey(b"a"), IndexRecord(4, 4096, 0, 0, 1), bytes(4096)) != checksum
    assert layout.checksum(OffloadKey(b"a"), IndexRecord(3, 4096, 0, 0, 2), bytes(4096)) != checksum
    other = StoreLayout(16, 4096, 16, "n")
    assert other.checksum(OffloadKey(b"a"), record, bytes(4096)) != checksum


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (IndexRecord(16, 4096, 0, 0, 1), "slot out of range"),
        (IndexRecord(1, 4096, 7, 0, 1), "unknown codec"),
        (IndexRecord(1, 100, int(Codec.NONE), 0, 1), "impossible"),
        (IndexRecord(1, 4097, int(Codec.ZSTD), 0, 1), "impossible"),
        (IndexRecord(1, 0, int(Codec.ZSTD), 0, 1), "impossible"),
        (IndexRecord(1, 4096, int(Codec.NONE), 0, 1), None),
        (IndexRecord(1, 12, int(Codec.ZSTD), 0, 1), None),
    ],
)
def test_records_the_layout_cannot_hold_are_named(record: IndexRecord, problem: str | None) -> None:
    found = StoreLayout(16, 4096, 4).record_problem(record)
    assert found is None if problem is None else problem in (found or "")


def test_the_layout_record_is_checked_against_the_store() -> None:
    layout = StoreLayout(16, 4096, 4, "m")
    meta = layout.meta()
    assert meta == {
        "fingerprint": layout.fingerprint,
        "layout_version": LAYOUT_VERSION,
        "block_size": 4096,
        "model_id": "m",
        "slots_per_file": 4,
    }
    assert layout.matches(layout.meta(99))
    assert layout.recorded_slots_per_file(layout.meta(99), "here") == 99
    other = StoreLayout(16, 8192, 4, "m").meta()
    assert not layout.matches(other)
    with pytest.raises(DiskLayoutError, match="fingerprint"):
        layout.recorded_slots_per_file(other, "here")
    with pytest.raises(DiskLayoutError, match="bad slots_per_file"):
        layout.recorded_slots_per_file(layout.meta(0), "here")


def test_the_header_files_layout_page_round_trips_and_damage_reads_as_none() -> None:
    meta = StoreLayout(16, 4096, 4, "m").meta()
    page = pack_file_header(meta)
    assert len(page) == FILE_HEADER_BYTES and unpack_file_header(page) == meta
    damaged = page[:20] + bytes([page[20] ^ 1]) + page[21:]
    assert unpack_file_header(damaged) is None
    assert unpack_file_header(b"short") is None
    assert entry_offset(0) == FILE_HEADER_BYTES and entry_offset(2) == FILE_HEADER_BYTES + 640
    assert slots_in_headers_file(headers_file_bytes(16)) == 16
    assert slots_in_headers_file(10) == 0
