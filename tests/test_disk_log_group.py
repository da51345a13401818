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
from kvtier.tiers.disk.log_format import PAGE, REGION_HEADER_BYTES, record_bytes
from kvtier.tiers.disk.log_group import Part, add, add_run, fit_run, run_bytes
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
            assert run_bytes(key_lens[:taken], lengths[:taken]) == sum(
                record_bytes(len(key), length) for key, length in run[:taken]
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
