"""`kvtier bench` and the data-path benchmark behind it: what it reports, never how fast.

Also the data-path changes the benchmark led to: the host copy paths of `TensorCopier`
(per-run numpy copies, split across threads when large; a numpy gather-scatter for small
rows) and `DiskStore.read` splitting a large batch over its worker threads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kvtier.keys import key_from_int
from kvtier.tiers import tensor_copy
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk import store as disk_store
from kvtier.tiers.storage import ReadFailure
from kvtier.tiers.tensor_copy import TensorCopier


@pytest.mark.parametrize(
    ("row_bytes", "count", "scattered"),
    [
        (16, 300, True),  # small rows, scattered: one numpy gather-scatter
        (512, 40, True),
        (4096, 300, True),  # rows worth a loop: one copy per run
        (4096, 300, False),  # one run
        (64 << 10, 64, True),  # 4 MiB: in a worker thread
        (64 << 10, 100, False),  # one 6.25 MiB run: torch's copy_
    ],
)
async def test_host_copies_put_every_row_in_its_place(
    row_bytes: int, count: int, scattered: bool
) -> None:
    rng = np.random.default_rng(row_bytes + count)
    rows = 400
    src = torch.from_numpy(rng.integers(0, 256, (rows, row_bytes), dtype=np.uint8))
    dst = torch.zeros((rows, row_bytes), dtype=torch.uint8)
    if scattered:
        s = rng.choice(rows, count, replace=False)
        d = rng.choice(rows, count, replace=False)
    else:
        s, d = np.arange(10, 10 + count), np.arange(50, 50 + count)
    await TensorCopier().copy(src, s, dst, d)
    assert torch.equal(dst[torch.from_numpy(d)], src[torch.from_numpy(s)])
    untouched = np.setdiff1d(np.arange(rows), d)
    assert int(dst[torch.from_numpy(untouched)].sum()) == 0


async def test_large_host_copies_are_split_across_threads_and_stay_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tensor_copy, "HOST_SPLIT_BYTES", 1 << 20)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    calls: list[int] = []
    real = tensor_copy._copy_host

    def counting(src: torch.Tensor, s: np.ndarray, dst: torch.Tensor, d: np.ndarray) -> None:
        calls.append(len(s))
        real(src, s, dst, d)

    monkeypatch.setattr(tensor_copy, "_copy_host", counting)
    rng = np.random.default_rng(7)
    src = torch.from_numpy(rng.integers(0, 256, (200, 64 << 10), dtype=np.uint8))
    dst = torch.zeros_like(src)
    s, d = rng.permutation(200)[:150], rng.permutation(200)[:150]
    await TensorCopier().copy(src, s, dst, d)
    assert sorted(calls) == [50, 50, 50]  # 9.4 MiB: three parts, one per "thread"
    assert torch.equal(dst[torch.from_numpy(d)], src[torch.from_numpy(s)])


async def test_a_long_host_run_is_one_part_copied_by_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = tensor_copy._copy_host

    def counting(src: torch.Tensor, s: np.ndarray, dst: torch.Tensor, d: np.ndarray) -> None:
        calls.append(len(s))
        real(src, s, dst, d)

    monkeypatch.setattr(tensor_copy, "_copy_host", counting)
    src = torch.arange(300, dtype=torch.int64).to(torch.uint8).repeat_interleave(64 << 10)
    src = src.reshape(300, 64 << 10)
    dst = torch.zeros_like(src)
    await TensorCopier().copy(src, np.arange(0, 290), dst, np.arange(5, 295))
    assert calls == [290]  # 18 MiB in one run: one thread, torch splits it itself
    assert torch.equal(dst[5:295], src[0:290])


async def test_a_host_copy_of_another_dtype_takes_torchs_path() -> None:
    src = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    dst = torch.zeros_like(src)
    await TensorCopier().copy(src, [3, 1, 7], dst, [0, 5, 9])
    assert torch.equal(dst[[0, 5, 9]], src[[3, 1, 7]])


async def test_a_large_disk_read_is_split_over_the_workers_and_stays_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_store, "READ_SPLIT_BYTES", 4 * 4096)
    store = await DiskStore.open_async(
        tmp_path, block_size=4096, num_blocks=100, max_workers=3, direct_io=False
    )
    try:
        rng = np.random.default_rng(3)
        slots = [int(s) for s in rng.choice(100, 40, replace=False)]
        keys = [key_from_int(i) for i in range(40)]
        blocks = rng.integers(0, 256, (40, 4096), dtype=np.uint8)
        assert not any(await store.write(keys, slots, list(blocks)))
        assert len(store._read_parts(slots)) == 3
        # Rot one stored block and ask for one key that was never stored.
        slab, offset = store.slot_location(slots[7])
        with open(slab, "r+b") as file:
            file.seek(offset + 100)
            file.write(bytes([blocks[7][100] ^ 0xFF]))
        asked = [*keys, key_from_int(999)]
        spare = next(s for s in range(100) if s not in slots)
        out = np.zeros((41, 4096), dtype=np.uint8)
        results = await store.read(asked, [*slots, spare], list(out))
    finally:
        await store.aclose()
    assert results[7] == ReadFailure.CHECKSUM
    assert results[40] == ReadFailure.NOT_INDEXED
    assert all(result is None for i, result in enumerate(results[:40]) if i != 7)
    good = [i for i in range(40) if i != 7]
    assert np.array_equal(out[good], blocks[good])
