"""A log store's write group (kvtier/tiers/disk/log_group.py): a run of records placed at
once (`fit_run`, `add_run`) lands exactly where `Part.fits` and `add` put them one by one,
and the compiled `page_aligned` answers as the Python one does."""

from __future__ import annotations

import mmap
import random
from typing import Any

import numpy as np
import pytest

from kvtier.keys import OffloadKey
from kvtier.tiers.disk import log_group
from kvtier.tiers.disk.jobs import WriteJob
from kvtier.tiers.disk.log_calls import call_columns_arrays
from kvtier.tiers.disk.log_format import PAGE, REGION_HEADER_BYTES, record_bytes
from kvtier.tiers.disk.log_group import Flight, Part, Pending, add, add_run, fit_run
from kvtier.tiers.disk.log_index import NO_REGION

pytestmark = pytest.mark.timeout(60)


def _one_by_one(part: Part, records: list[tuple[OffloadKey, int]], region: int) -> int:
    """Place `records` (key, length) with `Part.fits` and `add` until one does not fit."""
    for number, (key, length) in enumerate(records):
        at = part.fits(len(key), length, region)
        if at is None:
            return number
        add(part, key, number, 7 + number, None, at, length, 0, b"", NO_REGION, True)
    return len(records)


def _lengths(rng: random.Random, kind: str, count: int) -> list[int]:
    if kind == "pages":
        return [PAGE * rng.randint(1, 5) for _ in range(count)]
    if kind == "bytes":
        return [rng.choice([0, 1, 100, 4095, 4097, 9000]) for _ in range(count)]
    return [rng.choice([PAGE, 3 * PAGE, 100, 5000]) for _ in range(count)]


@pytest.mark.parametrize("kind", ["pages", "bytes", "mixed"])
def test_a_run_is_placed_as_records_one_by_one(kind: str) -> None:
    rng = random.Random(kind)
    for trial in range(200):
        region = PAGE * rng.randint(4, 40)
        start = rng.choice([REGION_HEADER_BYTES, PAGE * 2])
        before = [
            (OffloadKey(bytes(rng.randint(1, 40))), n)
            for n in _lengths(rng, kind, rng.randint(0, 3))
        ]
        run = [
            (OffloadKey(bytes(rng.randint(1, 40))), n)
            for n in _lengths(rng, kind, rng.randint(1, 60))
        ]
        expected = Part(0, start, 1, opens=False)
        if _one_by_one(expected, before, region) < len(before):
            continue
        fitted = _one_by_one(expected, run, region)
        part = Part(0, start, 1, opens=False)
        _one_by_one(part, before, region)
        key_lens = np.array([len(key) for key, _ in run], np.int64)
        lengths = np.array([length for _, length in run], np.int64)
        fit = fit_run(part, key_lens, lengths, region)
        whole = {length > 0 and length % PAGE == 0 for _, length in run}
        if len(whole) > 1:
            assert fit is None, trial  # mixed runs are placed one by one by the lane
            continue
        assert fit is not None
        taken, at = fit
        assert taken == fitted, trial
        assert at.tolist() == expected.offset[len(before) :], trial
        if taken:
            add_run(
                part,
                [key for key, _ in run[:taken]],
                list(range(taken)),
                7,
                at,
                lengths[:taken],
                [0] * taken,
                [b""] * taken,
                True,
            )
            assert (part.end, part.key_bytes, part.offset) == (
                expected.end,
                expected.key_bytes,
                expected.offset,
            )
            assert part.moved_from == [NO_REGION] * len(part.keys)
            payloads = [np.zeros(length, np.uint8) for _, length in run[:taken]]
            columns = call_columns_arrays([key for key, _ in run[:taken]], payloads)
            assert columns.run_bytes(0, taken) == sum(
                record_bytes(len(key), length) for key, length in run[:taken]
            )


def test_a_long_run_placed_in_turns_lands_as_one_by_one() -> None:
    """`fit_run` looks at a bounded number of records (a large first record, then small
    ones: fewer than fit); called again while a whole turn fits, it places them exactly as
    `Part.fits` and `add` would, up to the same record."""
    region = PAGE * 40
    run = [(OffloadKey(bytes(12)), 9000)] + [(OffloadKey(bytes(12)), 1)] * 3000
    expected = Part(0, REGION_HEADER_BYTES, 1, opens=False)
    fitted = _one_by_one(expected, run, region)
    key_lens = np.array([len(key) for key, _ in run], np.int64)
    lengths = np.array([length for _, length in run], np.int64)
    part = Part(0, REGION_HEADER_BYTES, 1, opens=False)
    done, turns = 0, 0
    while done < len(run):
        fit = fit_run(part, key_lens[done:], lengths[done:], region)
        assert fit is not None
        taken, at = fit
        if not taken:
            break
        keys = [key for key, _ in run[done : done + taken]]
        add_run(
            part,
            keys,
            list(range(taken)),
            7,
            at,
            lengths[done : done + taken],
            [0] * taken,
            [b""] * taken,
            True,
        )
        done, turns = done + taken, turns + 1
    assert turns > 1  # (the bound was reached: the run went in turns)
    assert done == fitted < len(run)
    assert (part.end, part.key_bytes, part.offset) == (
        expected.end,
        expected.key_bytes,
        expected.offset,
    )


def _buffers() -> list[Any]:
    pool = np.frombuffer(mmap.mmap(-1, 8 * PAGE), dtype=np.uint8)
    return [
        pool[:PAGE],
        pool[PAGE : 3 * PAGE],
        pool[1 : PAGE + 1],  # not aligned
        pool[: PAGE - 8],  # not whole pages
        pool[:0],  # empty
        pool[PAGE : 2 * PAGE].data,
        bytes(PAGE),  # (whatever its address: as the Python check says)
        pool.reshape(8, PAGE)[:, :8],  # not contiguous
    ]


def test_page_aligned_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_group, "_compiled_page_aligned", None)
    answers = log_group.page_aligned(_buffers())
    assert answers[:6] == [True, True, False, False, True, True]
    assert answers[7] is False


def test_the_compiled_page_check_agrees_with_the_python_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled = log_group._compiled_page_aligned
    if compiled is None:
        pytest.skip("the compiled core is not built (scripts/build-core)")
    buffers = _buffers()
    got = compiled(buffers, PAGE)
    monkeypatch.setattr(log_group, "_compiled_page_aligned", None)
    assert got == log_group.page_aligned(buffers)


def test_a_failed_group_fails_exactly_the_blocks_not_yet_durable() -> None:
    """`Flight.fail` after a mid-group flush: the records placed first (`flushed` of them,
    in the order `where` spans them, a forget's record counted) stay stored; every other
    block of every call fails, and a block that already failed keeps its error."""
    keys = [OffloadKey(bytes([n])) for n in range(6)]
    first = WriteJob(keys[:3], [0, 1, 2], [], None)
    second = WriteJob(keys[3:], [3, 4, 5], [], None)
    earlier = OSError(5, "earlier")
    results: list[list[OSError | None]] = [[None, None, None], [None, earlier, None]]
    flight = Flight([first, second], results, Pending())
    flight.where = [(0, 3), (-1, 1), (1, 3)]
    flight.pending.flushed = 5  # the first call, the forget and the second call's first block
    error = OSError(28, "full")
    flight.fail(error)
    assert results == [[None, None, None], [None, earlier, error]]
    flight.pending.flushed = 0
    flight.fail(error)
    assert results == [[error, error, error], [error, earlier, error]]


def test_the_lane_lets_go_of_the_gil_after_a_groups_first_parts_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`let_writers_in` yields after the hand-off of a group's first YIELD_PARTS parts (so
    their writes start while the lane places the next), and not after later ones (each
    yield is a switch of threads)."""
    yields: list[int] = []
    monkeypatch.setattr(log_group, "_yield", lambda: yields.append(1))
    for closed in range(1, 8):
        log_group.let_writers_in(closed)
    assert len(yields) == log_group.YIELD_PARTS == 2


async def test_a_large_call_yields_after_its_first_parts(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call of many regions' worth yields a few times (its first parts, and the first
    after a mid-group flush), not once per part, and stores every block."""
    from disk_helpers import assert_intact, open_small, write_ok

    from kvtier.tiers.disk.log_store import LogStore

    yields: list[int] = []
    monkeypatch.setattr(log_group, "_yield", lambda: yields.append(1))
    store = open_small(LogStore, tmp_path, num_blocks=64, block_size=16 << 10)
    try:
        await write_ok(store, list(range(64)), list(range(64)))
        parts = store._lane.opened
        await assert_intact(store, list(range(64)), list(range(64)))
    finally:
        await store.aclose()
    assert parts > 2 * log_group.YIELD_PARTS
    assert 0 < len(yields) < parts


def _image(part: Part, span: int) -> bytes:
    """What a part's payload write must put on disk: each payload at its offset, zeros
    elsewhere up to `span`."""
    out = bytearray(span)
    for payload, at, length in zip(part.payloads, part.offset, part.length, strict=True):
        out[at : at + length] = memoryview(payload).cast("B")
    return bytes(out)


@pytest.mark.parametrize("kind", ["pages", "bytes", "mixed", "tombstone"])
def test_payload_views_write_every_payload_at_its_offset(kind: str) -> None:
    """The buffers of a part's payload write, back to back, are its image (each payload at
    its offset, zeros in the gaps and to the span), whichever payloads it holds; and a part
    of whole-page payloads back to back hands the caller's arrays on as they are (no view a
    block: docs/BENCHMARKS.md, "The write row's CPU per block")."""
    rng = random.Random(kind)
    for _ in range(100):
        part = Part(0, REGION_HEADER_BYTES, 1, opens=False)
        count = rng.randint(1, 12)
        lengths = _lengths(rng, "pages" if kind == "tombstone" else kind, count)
        if kind == "tombstone":
            lengths[rng.randrange(count)] = 0
        for number, length in enumerate(lengths):
            payload = np.frombuffer(rng.randbytes(length), dtype=np.uint8)
            at = part.fits(4, length, 1 << 30)
            assert at is not None
            add(part, OffloadKey(b"key%d" % number), number, number, None, at, length, 0,
                payload, NO_REGION, True)  # fmt: skip
        span = -(-part.end // PAGE) * PAGE + rng.choice([0, PAGE])
        buffers, sizes = log_group.payload_views(part, span)
        assert sizes == [memoryview(buffer).nbytes for buffer in buffers]
        assert b"".join(memoryview(buffer).cast("B") for buffer in buffers) == _image(part, span)
        assert 0 not in sizes
        if kind == "pages":
            assert all(a is b for a, b in zip(buffers, part.payloads, strict=False))
