"""TorchPool runs the BlockStorage conformance suite, on the CPU and (when present) CUDA."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.testing.storage import StorageTests
from kvtier.tiers.pool.storage import TorchPool, resolve_device
from kvtier.tiers.storage import BlockStorage
from kvtier.tiers.tensor_copy import TensorCopier, coalesce


class TestTorchPoolCPU(StorageTests):
    device = "cpu"

    def make_storage(self, num_blocks: int, block_size: int, tmp_path: Path) -> BlockStorage:
        return TorchPool(num_blocks, block_size, self.device)

    def backdoor_read(self, storage: BlockStorage, slot: int) -> bytes:
        assert isinstance(storage, TorchPool)
        return bytes(storage.tensor[slot].cpu().numpy())

    def backdoor_write(
        self, storage: BlockStorage, key: OffloadKey, slot: int, data: bytes
    ) -> None:
        assert isinstance(storage, TorchPool)
        row = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        storage.tensor[slot].copy_(row)


class TestGPUTierAsConfigured(TestTorchPoolCPU):
    """A GPU tier as a config gives it (`device = "cuda"`): on CUDA where there is one, on its
    CPU fallback elsewhere, so CI runs the GPU tier's code path too."""

    device = "cuda"


@pytest.mark.gpu
class TestTorchPoolCUDA(TestTorchPoolCPU):
    device = "cuda"

    def make_storage(self, num_blocks: int, block_size: int, tmp_path: Path) -> BlockStorage:
        pool = TorchPool(num_blocks, block_size, self.device)
        assert pool.device.type == "cuda" and pool.fallback is None
        return pool


def test_host_pool_is_page_aligned_for_direct_io() -> None:
    pool = TorchPool(8, 4096, "cpu")
    assert pool.tensor.data_ptr() % 4096 == 0
    assert all(row.ctypes.data % 4096 == 0 for row in pool.rows(range(8)))


def test_cuda_without_cuda_falls_back_and_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    device, reason = resolve_device("cuda:0")
    assert device.type == "cpu" and reason is not None and "cuda:0" in reason
    pool = TorchPool(2, 64, "cuda")
    assert "fallback" in repr(pool) and pool.on_host


def test_rows_are_views_and_an_empty_pool_is_refused() -> None:
    pool = TorchPool(2, 64, "cpu")
    assert len(pool.rows([0, 1])) == 2
    with pytest.raises(InvalidValueError, match="num_blocks >= 1"):
        TorchPool(0, 64, "cpu")


def test_coalesce_finds_runs_moving_together() -> None:
    src = np.array([3, 4, 5, 9, 10, 2], dtype=np.int64)
    dst = np.array([0, 1, 2, 3, 7, 8], dtype=np.int64)
    assert coalesce(src, dst) == [(3, 0, 3), (9, 3, 1), (10, 7, 1), (2, 8, 1)]
    assert coalesce(np.empty(0, np.int64), np.empty(0, np.int64)) == []


@pytest.mark.parametrize("count", [1, 3, 40, 300])
async def test_copier_scatters_and_gathers_rows_exactly(count: int) -> None:
    rng = np.random.default_rng(count)
    src = torch.from_numpy(rng.integers(0, 256, (400, 4096), dtype=np.uint8))
    dst = torch.zeros((400, 4096), dtype=torch.uint8)
    s = rng.choice(400, count, replace=False)
    d = rng.choice(400, count, replace=False)
    await TensorCopier().copy(src, s, dst, d)
    assert torch.equal(dst[torch.from_numpy(d)], src[torch.from_numpy(s)])
    untouched = np.setdiff1d(np.arange(400), d)
    assert int(dst[torch.from_numpy(untouched)].sum()) == 0
