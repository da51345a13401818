"""The log layout's on-disk groups and its open after a crash, below the store: `scan_groups`
takes every record of every sound group and stops at the first header page that is not sound
(torn, of another epoch, cut off), a payload torn under a sound header fails its bound
checksum (a miss, never wrong bytes), and `LogIndex.replay` keeps the newest record per slot
and each key in its newest slot."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.log_format import (
    PAGE,
    REGION_HEADER_BYTES,
    Record,
    bound_checksum,
    head_bytes,
    pack_group,
    payload_at,
    round_page,
    scan_groups,
)
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex

pytestmark = pytest.mark.timeout(60)

NAMESPACE = b"0123456789abcdef0123"
EPOCH = 3


def _region(records: int, group: int) -> tuple[bytearray, list[tuple[int, int]]]:
    """A region's bytes: a zero first page, then `records` records (keys of several sizes,
    payloads of whole pages and of odd lengths) in groups of `group`; and per group where it
    starts and the bytes of its header pages in use."""
    data = bytearray(REGION_HEADER_BYTES)
    starts: list[tuple[int, int]] = []
    for first in range(0, records, group):
        ids = range(first, min(first + group, records))
        keys = [bytes([i % 251]) * (8 + i % 13) for i in ids]
        payloads = [
            bytes([i % 7 + 1]) * (PAGE * (1 + i % 2) if i % 3 else 100 + 37 * i) for i in ids
        ]
        offsets, end = [], 0
        for payload in payloads:
            offsets.append(payload_at(end, len(payload)))
            end = offsets[-1] + len(payload)
        span = round_page(end)
        fields = {
            "slot": list(ids),
            "seq": [100 + i for i in ids],
            "checksum": [
                bound_checksum(NAMESPACE, key, i, len(p), 0, 100 + i, p)
                for key, i, p in zip(keys, ids, payloads, strict=True)
            ],
            "offset": offsets,
            "length": [len(payload) for payload in payloads],
            "codec": [0] * len(keys),
        }
        starts.append((len(data), head_bytes(len(keys), sum(map(len, keys)))))
        head = pack_group(NAMESPACE, EPOCH, keys, fields, span)
        body = bytearray(span)
        for at, payload in zip(offsets, payloads, strict=True):
            body[at : at + len(payload)] = payload
        data += head + body
    return data + bytes(PAGE), starts


def _verified(data: bytearray, records: list[Record]) -> list[int]:
    """The slots of `records` whose payload in `data` matches its bound checksum."""
    return [
        r.slot
        for r in records
        if r.checksum
        == bound_checksum(
            NAMESPACE,
            r.key,
            r.slot,
            r.length,
            r.codec,
            r.seq,
            bytes(data[r.offset : r.offset + r.length]),
        )
    ]


def test_the_scan_takes_every_record_of_sound_groups_with_its_payload() -> None:
    data, starts = _region(40, 6)
    records, end = scan_groups(memoryview(data), NAMESPACE, EPOCH, 0, len(data))
    assert [record.slot for record in records] == list(range(40))
    assert _verified(data, records) == list(range(40))
    assert end == len(data) - PAGE  # the page after the last group
    assert all(r.offset % PAGE == 0 for r in records if r.length % PAGE == 0)
    assert scan_groups(memoryview(data), NAMESPACE, EPOCH + 1, 0, len(data)) == (
        [],
        REGION_HEADER_BYTES,
    )
    cut, _ = scan_groups(memoryview(data), NAMESPACE, EPOCH, 0, starts[3][0] + PAGE)
    assert [record.slot for record in cut] == list(range(18))  # a group cut off: not taken


def test_a_torn_header_page_ends_the_scan_at_its_group() -> None:
    clean, starts = _region(40, 6)
    rng = random.Random(7)
    for _ in range(200):
        data = bytearray(clean)
        group = rng.randrange(len(starts))
        start, used = starts[group]
        at = start + rng.randrange(used)
        data[at] ^= 1 << rng.randrange(8)
        records, end = scan_groups(memoryview(data), NAMESPACE, EPOCH, 0, len(data))
        assert [record.slot for record in records] == list(range(6 * group)), at
        assert end == start


def test_a_torn_payload_fails_its_checksum_and_nothing_else() -> None:
    clean, _ = _region(40, 6)
    records, _ = scan_groups(memoryview(clean), NAMESPACE, EPOCH, 0, len(clean))
    rng = random.Random(9)
    for _ in range(100):
        victim = rng.choice(records)
        data = bytearray(clean)
        data[victim.offset + rng.randrange(victim.length)] ^= 1 << rng.randrange(8)
        again, _ = scan_groups(memoryview(data), NAMESPACE, EPOCH, 0, len(data))
        assert again == records  # the header pages hold: every record is found
        assert _verified(data, again) == [r.slot for r in records if r.slot != victim.slot]


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
