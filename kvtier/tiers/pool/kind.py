"""The `[[tiers]]` tables of the memory tiers and their kinds: `medium = "gpu"` (GPU memory,
`enabled = "auto"` allowed: built when CUDA is present) and `medium = "cpu"` (host memory,
bounded by this machine's). Imported when a config is validated, so it imports no torch; the
pool and its openers are in `kvtier.tiers.pool.storage`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import field_validator

from kvtier.config_fields import config_error, physical_memory, readable_size
from kvtier.specs.base import Medium
from kvtier.tiers.registry import BaseTierConfig, TierAccess, TierKind

_DEVICE_PATTERN = re.compile(r"cuda(:\d+)?|cpu")


class GPUTierConfig(BaseTierConfig):
    """A tier in GPU memory."""

    medium: Literal[Medium.GPU]
    device: str = "cuda"
    """A torch device: "cuda", "cuda:N", or "cpu" (for testing without a GPU)."""

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if _DEVICE_PATTERN.fullmatch(value) is None:
            raise config_error("device", 'expected "cuda", "cuda:N" or "cpu"')
        return value


class CPUTierConfig(BaseTierConfig):
    """A tier in host memory."""

    medium: Literal[Medium.CPU]
    pin_memory: bool = True
    """Page-lock the pool (only done when CUDA is present) for fast asynchronous copies."""

    @classmethod
    def check_capacity_bytes(cls, size: int) -> None:
        """Also within this machine's memory: a pool larger than the memory would fail, or
        swap, when it is allocated."""
        super().check_capacity_bytes(size)
        memory = physical_memory()
        if memory is not None and size > memory:
            raise config_error(
                "capacity",
                f"{readable_size(size)} of host memory, but this machine has "
                f"{readable_size(memory)}",
            )


GPU_KIND = TierKind(
    Medium.GPU,
    GPUTierConfig,
    volatile=True,
    access=TierAccess.TENSOR,
    auto_enable=True,
    opener="kvtier.tiers.pool.storage:open_gpu_tier",
)
"""GPU memory: volatile, a tensor pool, enabled = "auto" allowed."""

CPU_KIND = TierKind(
    Medium.CPU,
    CPUTierConfig,
    volatile=True,
    access=TierAccess.TENSOR,
    opener="kvtier.tiers.pool.storage:open_cpu_tier",
)
"""Host memory: volatile, a tensor pool."""
