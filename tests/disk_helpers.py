"""What the disk tier's tests of both layouts (test_disk_log.py for `LogStore`,
test_disk_faults.py and test_disk_store.py for `DiskStore`) do alike: a small store opened
(or one for the `StorageTests` suite), blocks `deterministic_block(i)` written under key
`k(i)`, read back, and checked intact."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from kvtier.errors import DirectIOError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.testing.storage import empty_buffers
from kvtier.tiers.disk.testing import deterministic_block
from kvtier.tiers.storage import BlockStorage, HostBuffer, ReadFailure

BLOCK = 4096
"""The block size of the small stores."""

_S = TypeVar("_S", bound=BlockStorage)


def k(i: int) -> OffloadKey:
    """The key block `i` is stored under."""
    return key_from_int(i)


def open_small(kind: Callable[..., _S], directory: Path, **kwargs: Any) -> _S:
    """A store of `kind` in `directory`: 16 blocks of BLOCK bytes, buffered; `kwargs` add to
    or override those."""
    options: dict[str, Any] = {"block_size": BLOCK, "num_blocks": 16, "direct_io": False}
    options.update(kwargs)
    return kind(directory, **options)


async def write(store: BlockStorage, ids: list[int], slots: list[int]) -> list[OSError | None]:
    """Write blocks `ids` into `slots`; the per-block results."""
    data = [deterministic_block(i, store.block_size) for i in ids]
    return await store.write([k(i) for i in ids], slots, data)


async def write_ok(store: BlockStorage, ids: list[int], slots: list[int]) -> None:
    """Write blocks `ids` into `slots`, every one stored."""
    assert await write(store, ids, slots) == [None] * len(ids)


async def read(
    store: BlockStorage, ids: list[int], slots: list[int]
) -> tuple[list[ReadFailure | None], list[HostBuffer]]:
    """Read blocks `ids` from `slots`: the per-block results and the buffers read into."""
    buffers = empty_buffers(len(ids), store.block_size)
    return await store.read([k(i) for i in ids], slots, buffers), buffers


async def assert_intact(store: BlockStorage, ids: list[int], slots: list[int]) -> None:
    """Blocks `ids` read back from `slots`, every one intact."""
    results, buffers = await read(store, ids, slots)
    assert results == [None] * len(ids)
    for i, buffer in zip(ids, buffers, strict=True):
        assert np.array_equal(buffer, deterministic_block(i, store.block_size)), (
            f"block {i} differs"
        )


def open_or_skip(
    kind: Callable[..., _S],
    directory: Path,
    num_blocks: int,
    block_size: int,
    compression: str,
    direct_io: bool,
) -> _S:
    """A store of `kind` for the `StorageTests` suite; the test is skipped where the
    filesystem of `directory` has no O_DIRECT and `direct_io` asks for it."""
    try:
        return kind(
            directory,
            block_size=block_size,
            num_blocks=num_blocks,
            compression=compression,
            direct_io=direct_io,
        )
    except DirectIOError as error:
        pytest.skip(f"no O_DIRECT here: {error}")
