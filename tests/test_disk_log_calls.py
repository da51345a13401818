"""A write call's columns as the log lane places them (kvtier/tiers/disk/log_calls.py): the
compiled pass (`_plan_core.call_columns`) and its array path are their definition (each
buffer's bytes, each key's, `record_bytes` and `page_aligned` summed), and a store placing
its calls with either ends in the same index, counters and blocks, before and after a
restart, with O_DIRECT payloads, copied ones and zstd's encoded ones mixed in calls."""

from __future__ import annotations

import mmap
import random
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
from disk_helpers import k

from kvtier.tiers.disk import log_calls
from kvtier.tiers.disk.log_calls import call_columns, call_columns_arrays
from kvtier.tiers.disk.log_format import PAGE, record_bytes
from kvtier.tiers.disk.log_group import page_aligned
from kvtier.tiers.disk.log_index import LogIndex
from kvtier.tiers.disk.log_store import LogStore

pytestmark = pytest.mark.timeout(120)

BLOCK = 2 * PAGE


def _buffers(pool: np.ndarray[Any, Any]) -> list[Any]:
    """Buffers of every kind a call's payloads come in (and one that is not contiguous)."""
    return [
        pool[: 2 * PAGE],  # aligned whole pages
        pool[1 : PAGE + 1],  # not aligned
        pool[: PAGE - 8],  # not whole pages
        pool[:0],  # empty
        pool[PAGE : 3 * PAGE].data,
        memoryview(bytes(300)),
        memoryview(bytearray(5000)),
        pool.reshape(8, PAGE)[:, :8],  # not contiguous
        pool[2 * PAGE : 4 * PAGE],
    ]


def _paths() -> list[Any]:
    paths: list[Any] = [call_columns_arrays]
    if log_calls._compiled_columns is not None:
        paths.append(call_columns)
    return paths


@pytest.mark.parametrize("columns_of", _paths(), ids=lambda path: path.__name__)
def test_call_columns_are_their_definition(columns_of: Any) -> None:
    pool = np.frombuffer(mmap.mmap(-1, 8 * PAGE), np.uint8)
    rng = random.Random(3)
    buffers = _buffers(pool) * 3
    rng.shuffle(buffers)
    keys = [rng.randbytes(rng.randint(1, 90)) for _ in buffers]
    got = columns_of(keys, buffers)
    sizes = [memoryview(buffer).nbytes for buffer in buffers]
    aligned = page_aligned(buffers)
    assert got.lengths.tolist() == sizes
    assert got.key_lens.tolist() == [len(key) for key in keys]
    assert all(a.dtype == np.int64 for a in got)
    for first in range(len(buffers) + 1):
        for stop in range(first, len(buffers) + 1):
            want = sum(record_bytes(len(keys[i]), sizes[i]) for i in range(first, stop))
            assert got.run_bytes(first, stop) == want
            assert got.direct(first, stop) == all(aligned[first:stop])
    with pytest.raises(ValueError, match="differ in length"):
        columns_of(keys[:-1], buffers)


def _state(store: LogStore) -> tuple[object, ...]:
    index = store._index
    arrays = tuple(getattr(index, name).tobytes() for name in (*LogIndex.ARRAYS, "keys", "live"))
    lane = store._lane
    return (*arrays, dict(index.written), lane.appended_bytes, lane.next_seq, lane.moved_bytes)


async def _run(path: Path, compression: Literal["none", "zstd"]) -> list[tuple[object, ...]]:
    """Calls of aligned, unaligned and mixed rows, overwrites and a forget, into a small
    store that reclaims; the store's state after each call (its bytes appended those of the
    records written, uncompressed), then after a reopen, and every block read back."""
    rng = np.random.default_rng(5)
    pool = np.frombuffer(mmap.mmap(-1, 64 * BLOCK + PAGE), np.uint8)
    pool[:] = rng.integers(0, 256, pool.size, dtype=np.uint8)
    if compression == "zstd":
        pool[: 32 * BLOCK] = 7  # (compressible: encoded payloads shorter than a page)
    aligned = [pool[i * BLOCK : (i + 1) * BLOCK] for i in range(64)]
    unaligned = [pool[i * BLOCK + 8 : (i + 1) * BLOCK + 8] for i in range(64)]
    states: list[tuple[object, ...]] = []
    store = LogStore(path, block_size=BLOCK, num_blocks=24, direct_io=True, compression=compression)
    held: dict[int, tuple[int, Any]] = {}
    appended = 0
    try:
        for call in range(12):
            slots = [int(s) for s in rng.choice(24, size=int(rng.integers(1, 12)), replace=False)]
            ids = [call * 100 + s for s in slots]
            rows = [
                (aligned if rng.random() < 0.7 else unaligned)[int(rng.integers(0, 64))]
                for _ in slots
            ]
            assert await store.write([k(i) for i in ids], slots, rows) == [None] * len(slots)
            held.update({s: (i, row) for s, i, row in zip(slots, ids, rows, strict=True)})
            appended += sum(record_bytes(len(k(i)), BLOCK) for i in ids)
            if call == 6:
                gone = held.pop(next(iter(held)))[0]
                await store.forget([k(gone)])
                appended += record_bytes(len(k(gone)), 0)
            states.append(_state(store))
            if compression == "none":  # (each record's bytes as stored: the block's)
                assert store._lane.appended_bytes == appended
    finally:
        await store.aclose()
    store = LogStore(path, block_size=BLOCK, num_blocks=24, direct_io=True, compression=compression)
    try:
        states.append(_state(store)[:-3])  # (a reopened lane counts from its open)
        slots = sorted(held)
        out = [np.empty(BLOCK, np.uint8) for _ in slots]
        assert await store.read([k(held[s][0]) for s in slots], slots, out) == [None] * len(slots)
        for slot, got in zip(slots, out, strict=True):
            assert np.array_equal(got, held[slot][1]), f"slot {slot} differs"
    finally:
        await store.aclose()
    return states


@pytest.mark.parametrize("compression", ["none", "zstd"])
async def test_a_store_places_the_same_with_either_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compression: Literal["none", "zstd"]
) -> None:
    if log_calls._compiled_columns is None:
        pytest.skip("the compiled core is not built (scripts/build-core)")
    compiled = await _run(tmp_path / "compiled", compression)
    monkeypatch.setattr(log_calls, "_compiled_columns", None)
    arrays = await _run(tmp_path / "arrays", compression)
    assert len(compiled) == len(arrays)
    for step, (got, want) in enumerate(zip(compiled, arrays, strict=True)):
        assert got == want, f"the stores differ after step {step}"
