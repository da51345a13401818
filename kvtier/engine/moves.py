"""Moving blocks between endpoints: a tier's storage, or a caller's tensor of blocks.

One function, `move`, covers every pair: pool to pool is a tensor copy (GPU<->CPU on a CUDA
stream); pool to disk and disk to pool hand the host pool's rows straight to the disk tier's
`pwrite`/`pread` (no staging copy); anything else (a GPU pool and a disk tier, two disk
tiers, a caller's GPU tensor and a disk tier) goes through a host staging tensor, pinned when
CUDA is present.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from kvtier.keys import OffloadKey
from kvtier.tiers.storage import BlockStorage, HostBuffer, ReadFailure, TensorStorage, TierAccess
from kvtier.tiers.tensor_copy import TensorCopier, cuda_available

Endpoint = BlockStorage | torch.Tensor
"""Where blocks are: a tier's storage, or a `[n, block_size]` uint8 tensor of the caller."""


_NOT_DAMAGE = (ReadFailure.NOT_INDEXED, ReadFailure.IO_ERROR)
"""Read failures of a shared store that mean "not there now" (evicted by the store, or the
store unreachable), not "bad bytes"."""


@dataclass(frozen=True, slots=True)
class MoveResult:
    """Per-block outcome of a move: keys that did not arrive, and keys whose source could not
    be read (the source block must be dropped from the bookkeeping). `gone` are those of
    `corrupt` that a client tier (`TierAccess.CLIENT`: a shared store) no longer holds or
    could not be asked for: not damage (nothing to delete, nothing counted as corrupt), only
    a miss."""

    failed: frozenset[OffloadKey] = frozenset()
    corrupt: frozenset[OffloadKey] = frozenset()
    gone: frozenset[OffloadKey] = frozenset()


def _tensor_of(endpoint: Endpoint) -> torch.Tensor | None:
    if isinstance(endpoint, torch.Tensor):
        return endpoint
    if isinstance(endpoint, TensorStorage):
        return endpoint.tensor
    return None


def _host_rows(tensor: torch.Tensor, ids: npt.NDArray[np.int64]) -> list[HostBuffer] | None:
    """Zero-copy row views of a contiguous host tensor, or None if it has none."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return None
    array = tensor.numpy()
    return [array[int(i)] for i in ids]


def _staging(n: int, block_size: int) -> torch.Tensor:
    return torch.empty((n, block_size), dtype=torch.uint8, pin_memory=cuda_available())


async def move(
    copier: TensorCopier,
    keys: Sequence[OffloadKey],
    src: Endpoint,
    src_ids: npt.NDArray[np.int64],
    dst: Endpoint,
    dst_ids: npt.NDArray[np.int64],
    block_size: int,
) -> MoveResult:
    """Copy block `keys[i]` from row/slot `src_ids[i]` of `src` to `dst_ids[i]` of `dst`."""
    if not keys:
        return MoveResult()
    src_tensor, dst_tensor = _tensor_of(src), _tensor_of(dst)
    if src_tensor is not None and dst_tensor is not None:
        await copier.copy(src_tensor, src_ids, dst_tensor, dst_ids)
        return MoveResult()
    if src_tensor is not None:  # tensor -> storage
        assert isinstance(dst, BlockStorage)  # narrowing: only storages have no tensor
        rows = _host_rows(src_tensor, src_ids)
        if rows is None:
            staged = _staging(len(keys), block_size)
            await copier.copy(src_tensor, src_ids, staged, np.arange(len(keys)))
            rows = _host_rows(staged, np.arange(len(keys)))
            assert rows is not None
        errors = await dst.write(keys, [int(i) for i in dst_ids], rows)
        return MoveResult(failed=frozenset(k for k, e in zip(keys, errors, strict=True) if e))
    assert isinstance(src, BlockStorage)
    staged_out: torch.Tensor | None = None
    rows = _host_rows(dst_tensor, dst_ids) if dst_tensor is not None else None
    if rows is None:
        staged_out = _staging(len(keys), block_size)
        rows = _host_rows(staged_out, np.arange(len(keys)))
        assert rows is not None
    failures = await src.read(keys, [int(i) for i in src_ids], rows)
    bad = frozenset(k for k, f in zip(keys, failures, strict=True) if f is not None)
    gone = (
        frozenset(k for k, f in zip(keys, failures, strict=True) if f in _NOT_DAMAGE)
        if src.access is TierAccess.CLIENT
        else frozenset()
    )
    if staged_out is not None:
        good = np.asarray([f is None for f in failures])
        if good.any():
            indices = np.flatnonzero(good)
            if dst_tensor is not None:
                await copier.copy(staged_out, indices, dst_tensor, dst_ids[indices])
            else:
                assert isinstance(dst, BlockStorage)
                good_keys = [keys[int(i)] for i in indices]
                errors = await dst.write(
                    good_keys,
                    [int(dst_ids[int(i)]) for i in indices],
                    [rows[int(i)] for i in indices],
                )
                lost = frozenset(k for k, e in zip(good_keys, errors, strict=True) if e)
                return MoveResult(failed=bad | lost, corrupt=bad, gone=gone)
    return MoveResult(failed=bad, corrupt=bad, gone=gone)
