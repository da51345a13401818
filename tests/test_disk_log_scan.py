"""The log layout's open after a crash, below the store: `scan_records` (one loop with
`parse_header`'s checks inline) takes exactly the records a walk with `parse_header` takes,
whatever byte is damaged, and `LogIndex.replay` keeps the newest record per slot and each
key in its newest slot."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.log_format import (
    PAGE,
    REGION_HEADER_BYTES,
    Record,
    pack_header,
    pad8,
    parse_header,
    scan_records,
)
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex

pytestmark = pytest.mark.timeout(60)

NAMESPACE = b"0123456789abcdef0123"
EPOCH = 3


def _region(records: int, group: int) -> bytearray:
    """A region's bytes: a zero first page, then `records` records (keys and lengths of
    several sizes) in groups of `group`, each group starting on a page boundary."""
    data = bytearray(REGION_HEADER_BYTES)
    for i in range(records):
        if i % group == 0:
            data += bytes(-len(data) % PAGE)
        key = bytes([i % 251]) * (8 + i % 13)
        payload = bytes([i % 7]) * (100 + 37 * i)
        data += pack_header(NAMESPACE, key, i, len(payload), 0, EPOCH, 100 + i, 99)
        data += payload + bytes(pad8(len(payload)) - len(payload))
    return data + bytes(-len(data) % PAGE + PAGE)


def _walk(data: memoryview, limit: int) -> tuple[list[Record], int]:
    """The scan as a loop of `parse_header` calls (what `scan_records` must equal)."""
    records: list[Record] = []
    pos = REGION_HEADER_BYTES
    while pos < limit:
        record = parse_header(data, pos, NAMESPACE, EPOCH, limit)
        if record is None:
            if pos % PAGE == 0:
                break
            pos = -(-pos // PAGE) * PAGE
            continue
        records.append(record)
        pos += record.size
    return records, min(-(-pos // PAGE) * PAGE, limit)


def test_the_scan_takes_exactly_what_parse_header_takes_whatever_byte_is_damaged() -> None:
    clean = _region(40, 6)
    whole, end = scan_records(memoryview(clean), NAMESPACE, EPOCH, 0, len(clean))
    assert [record.slot for record in whole] == list(range(40))
    assert (whole, end) == _walk(memoryview(clean), len(clean))
    rng = random.Random(7)
    for _ in range(300):
        data = bytearray(clean)
        at = rng.randrange(REGION_HEADER_BYTES, len(clean))
        data[at] ^= 1 << rng.randrange(8)
        limit = rng.choice([len(data), rng.randrange(REGION_HEADER_BYTES, len(data))])
        got = scan_records(memoryview(data), NAMESPACE, EPOCH, 0, limit)
        assert got == _walk(memoryview(data), limit), (at, limit)
        assert len(got[0]) <= 40
    other = scan_records(memoryview(clean), NAMESPACE, EPOCH + 1, 0, len(clean))
    assert other == ([], REGION_HEADER_BYTES)


def _record(slot: int, seq: int, key: bytes, offset: int = 0) -> Record:
    return Record(OffloadKey(key), slot, 64, 0, 1, seq, 5, offset)


def test_replay_keeps_the_newest_per_slot_and_each_key_in_its_newest_slot() -> None:
    index = LogIndex(8, 2)
    index.seq[1] = 10  # a floor the checkpoint left: an older record is not taken
    index.replay(
        [
            (0, _record(0, 5, b"a" * 16)),
            (0, _record(0, 7, b"b" * 16, offset=4096)),
            (1, _record(0, 7, b"b" * 16, offset=8192)),  # the same record, moved: kept
            (0, _record(1, 9, b"c" * 16)),
            (0, _record(2, 3, b"k" * 16)),
            (0, _record(3, 4, b"k" * 16)),  # the same key, newer: slot 2 loses it
            (1, _record(4, 2, b"d" * 16)),
            (9 % 2, _record(9, 11, b"e" * 16)),  # beyond the store: ignored
        ]
    )
    assert (int(index.region[0]), int(index.offset[0]), int(index.seq[0])) == (1, 8192, 7)
    assert index.keys[0, :16].tobytes() == b"b" * 16
    assert int(index.region[1]) == NO_REGION and int(index.seq[1]) == 10
    assert int(index.region[2]) == NO_REGION
    assert (int(index.region[3]), int(index.seq[3])) == (0, 4)
    assert (int(index.region[4]), int(index.seq[4])) == (1, 2)
    assert index.written == {b"b" * 16: 0, b"k" * 16: 3, b"d" * 16: 4}
    assert np.count_nonzero(index.region != NO_REGION) == 3
