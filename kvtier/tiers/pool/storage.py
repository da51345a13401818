"""`TorchPool`: a tier's blocks in one preallocated torch tensor (GPU memory or host memory).

The pool is `[num_blocks, block_size]` uint8, allocated once: slots never move, so a slot id
from the bookkeeping is a row index. A host pool is page-aligned (and page-locked when CUDA is
present and asked for), so the disk tier can read and write its rows directly, with O_DIRECT,
and CUDA copies from it are truly asynchronous.

A GPU tier whose device is `cuda` on a machine without CUDA runs on the CPU instead, and says
so (`fallback`, its repr and its stats), so tests and CI exercise the same code.

`open_gpu_tier` and `open_cpu_tier` are the openers the kinds of `kvtier.tiers.pool.kind`
name.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np
import torch

from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.tiers.pool.kind import CPUTierConfig, GPUTierConfig
from kvtier.tiers.registry import TierContext
from kvtier.tiers.storage import HostBuffer, ReadFailure, TensorStorage
from kvtier.tiers.tensor_copy import TensorCopier, cuda_available


def resolve_device(requested: str) -> tuple[torch.device, str | None]:
    """The device a tier asked for, or the CPU with the reason when CUDA is missing."""
    device = torch.device(requested)
    if device.type == "cuda":
        if not cuda_available():
            return torch.device("cpu"), f"{requested} requested, CUDA not available: using cpu"
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise InvalidValueError(
                f"device {requested!r}: only {torch.cuda.device_count()} CUDA devices"
            )
        return torch.device("cuda", index), None
    return device, None


def _page_aligned_host(num_bytes: int) -> tuple[torch.Tensor, mmap.mmap]:
    """A zeroed host tensor backed by anonymous, page-aligned memory (and the mapping)."""
    mapping = mmap.mmap(-1, num_bytes)
    return torch.frombuffer(mapping, dtype=torch.uint8), mapping


class TorchPool(TensorStorage):
    """`num_blocks` blocks of `block_size` bytes in one tensor on `device`."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        device: str = "cpu",
        *,
        pin_memory: bool = False,
        copier: TensorCopier | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise InvalidValueError(
                f"a pool needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.requested_device = device
        self.device, self.fallback = resolve_device(device)
        self.copier = copier if copier is not None else TensorCopier()
        self._mapping: mmap.mmap | None = None
        nbytes = num_blocks * block_size
        self.pinned = False
        if self.device.type == "cuda":
            self.tensor = torch.empty(
                (num_blocks, block_size), dtype=torch.uint8, device=self.device
            )
        elif pin_memory and cuda_available():
            self.tensor = torch.empty((num_blocks, block_size), dtype=torch.uint8, pin_memory=True)
            self.pinned = True
        else:
            flat, self._mapping = _page_aligned_host(nbytes)
            self.tensor = flat.view(num_blocks, block_size)
        self._host_rows = self.tensor.numpy() if self.device.type == "cpu" else None

    @property
    def persistent(self) -> bool:
        return False

    @property
    def on_host(self) -> bool:
        """Whether the pool is in host memory (its rows can be handed to file I/O)."""
        return self._host_rows is not None

    def rows(self, slots: Sequence[int] | np.ndarray) -> list[HostBuffer]:
        """Views of the given rows of a host pool (no copy)."""
        if self._host_rows is None:
            raise InvalidValueError(f"a {self.device} pool has no host rows")
        rows = self._host_rows
        return [rows[int(slot)] for slot in slots]

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        self._check(keys, slots, buffers)
        if buffers:
            staged = torch.from_numpy(np.stack([np.asarray(b) for b in buffers]))
            await self.copier.copy(staged, np.arange(len(buffers)), self.tensor, slots)
        return [None] * len(keys)

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        self._check(keys, slots, buffers)
        for i, buffer in enumerate(buffers):
            if not buffer.flags.writeable:
                raise InvalidValueError(f"buffers[{i}] is read-only; a read needs to fill it")
        if buffers:
            staged = torch.empty((len(buffers), self.block_size), dtype=torch.uint8)
            await self.copier.copy(self.tensor, slots, staged, np.arange(len(buffers)))
            host = staged.numpy()
            for i, buffer in enumerate(buffers):
                buffer[:] = host[i]
        return [None] * len(keys)

    def _check(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> None:
        if not len(keys) == len(slots) == len(buffers):
            raise InvalidValueError(
                f"{len(keys)} keys, {len(slots)} slots and {len(buffers)} buffers must agree"
            )
        for slot in slots:
            if not 0 <= int(slot) < self.num_blocks:
                raise InvalidValueError(f"slot {slot} is not in 0..{self.num_blocks - 1}")
        for i, buffer in enumerate(buffers):
            if (
                not isinstance(buffer, np.ndarray)
                or buffer.dtype != np.uint8
                or buffer.ndim != 1
                or buffer.size != self.block_size
                or not buffer.flags.c_contiguous
            ):
                shown = (
                    f"{buffer.dtype} array of shape {buffer.shape}"
                    if isinstance(buffer, np.ndarray)
                    else type(buffer).__name__
                )
                raise InvalidValueError(
                    f"buffers[{i}] must be a contiguous 1-D uint8 array of {self.block_size} "
                    f"bytes, got a {shown}"
                )

    def describe(self) -> str:
        """Where the pool lives, for reprs and stats."""
        where = str(self.device)
        if self.pinned:
            where += ", pinned"
        if self.fallback:
            where += f" (fallback: {self.fallback})"
        return where

    def __repr__(self) -> str:
        return f"TorchPool({self.num_blocks} x {self.block_size} B on {self.describe()})"


async def open_gpu_tier(config: GPUTierConfig, context: TierContext) -> TorchPool:
    """The opener of a gpu tier: a pool on the tier's device (falling back as `TorchPool`
    does)."""
    return TorchPool(config.num_blocks, context.block_size, config.device, copier=context.copier)


async def open_cpu_tier(config: CPUTierConfig, context: TierContext) -> TorchPool:
    """The opener of a cpu tier: a host-memory pool, page-locked when asked for and CUDA is
    present."""
    return TorchPool(
        config.num_blocks,
        context.block_size,
        "cpu",
        pin_memory=config.pin_memory and cuda_available(),
        copier=context.copier,
    )
