"""Helpers for the data-path tests: configs with tiny capacities and block contents that are a
deterministic function of the key, so any block read back can be verified."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvtier import Hierarchy
from kvtier.keys import OffloadKey, key_from_int
from kvtier.tiers.disk.facade import StoreFacade
from kvtier.tiers.disk.io import FileIO, IOBuffer

BLOCK = 4096


LAYOUTS = ("log", "slots")
"""The disk tier's layouts, for tests that hold for both."""


def store_class(layout: str) -> type[StoreFacade]:
    """The disk store class of `layout`."""
    from kvtier.tiers.disk import DiskStore
    from kvtier.tiers.disk.log_store import LogStore

    return LogStore if layout == "log" else DiskStore


def tier_store(layout: str, path: Path, num_blocks: int, **kwargs: Any) -> StoreFacade:
    """A store of `layout` in the tier directory `path` (as a disk tier of BLOCK-byte blocks
    and no model id opens it): one that holds its lock, as another running kvtier would."""
    return store_class(layout)(
        path, block_size=BLOCK, num_blocks=num_blocks, create_parents=True, **kwargs
    )


def key(i: int) -> OffloadKey:
    return key_from_int(i)


def content(k: OffloadKey, block_size: int = BLOCK) -> torch.Tensor:
    """The bytes of block `k`: random, seeded by the key."""
    seed = int.from_bytes(k[:8], "big")
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, block_size, dtype=np.uint8))


def blocks_of(keys: list[OffloadKey], block_size: int = BLOCK) -> torch.Tensor:
    return torch.stack([content(k, block_size) for k in keys])


def chain_config(
    tmp_path: Path,
    gpu: int | None = 4,
    cpu: int | None = 8,
    disk: int | None = 32,
    *,
    policy: str = "lru",
    write_policy: str = "write-back",
    block_size: int = BLOCK,
    model_id: str = "",
    device: str = "cuda",
    reserve: bool = True,
    layout: str | None = None,
) -> dict[str, Any]:
    """A gpu -> cpu -> disk chain (any tier None is left out). The gpu tier asks for cuda,
    which falls back to the CPU where there is none. `reserve=False` sets every tier's
    high_watermark to 1 (no reserve of free slots), for tests of exact placement. `layout`
    sets the disk tier's ("log" or "slots"; None: the default)."""
    tiers: list[dict[str, Any]] = []
    if gpu:
        tiers.append(
            {"name": "gpu", "medium": "gpu", "capacity": gpu, "policy": policy, "device": device}
        )
    if cpu:
        tiers.append({"name": "cpu", "medium": "cpu", "capacity": cpu, "policy": policy})
    if disk:
        tiers.append(
            {
                "name": "disk",
                "medium": "disk",
                "capacity": disk,
                "policy": policy,
                "path": str(tmp_path / "disk"),
            }
        )
        if layout is not None:
            tiers[-1]["layout"] = layout
    if not reserve:
        for tier in tiers:
            tier["high_watermark"] = 1.0
    return {
        "block_size": block_size,
        "model_id": model_id,
        "write_policy": write_policy,
        "tiers": tiers,
    }


class HeldWrites(FileIO):
    """Slab writes wait until `release` is set; counts the writes that completed."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.completed = 0

    def pwritev(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        self.release.wait(30)
        written = super().pwritev(fd, buffers, offset)
        self.completed += 1
        return written


async def demoting_chain(h: Hierarchy, io: HeldWrites) -> list[OffloadKey]:
    """Put 24 blocks into a cpu (4) -> disk chain whose disk writes are held: the first 20
    are on their way to the disk, readable in neither tier; returns their keys."""
    ks = [key(i) for i in range(24)]
    for first in range(0, 24, 4):
        part = ks[first : first + 4]
        assert await asyncio.wait_for(h.put(part, blocks_of(part)), 10) == 4
    assert io.completed == 0
    victims = ks[:20]
    assert all(h.where(k) == "disk" for k in victims)
    return victims
