"""Copy every verified block of one disk store into another (`kvtier migrate`).

The disk tier's two layouts (`layout = "slots"`, `DiskStore`; `layout = "log"`, `LogStore`)
read none of each other's files. Migrating a store reads each block it holds through the
source's own `read` (which verifies it: checksum bound to the key and namespace, length,
codec) and writes it into the target through the target's own `write`, in the slot it had,
oldest first (so the target's restore order, and with it the restored blocks' eviction
order, is the source's). Only the stores' public calls are used: either layout's format can
change without this module knowing.

A block that fails verification is counted as damaged and never written: the target holds
only blocks that were sound in the source. A block the target fails to store is counted as
failed (it is a miss later, as any block a tier failed to store).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvtier.tiers.storage import BlockStorage, RestoredBlock

__all__ = ["DEFAULT_BATCH", "MigrateReport", "copy_blocks"]

DEFAULT_BATCH = 64
"""Blocks read and written per call (a write group of the target)."""


@dataclass
class MigrateReport:
    """What a migration did, in blocks (and the bytes of those copied)."""

    found: int = 0
    """Blocks the source held when it was opened."""
    copied: int = 0
    """Verified in the source and stored in the target."""
    damaged: int = 0
    """Failed verification in the source (never written)."""
    failed: int = 0
    """Verified, but the target failed to store them."""
    copied_bytes: int = 0


async def copy_blocks(
    source: BlockStorage,
    target: BlockStorage,
    *,
    batch: int = DEFAULT_BATCH,
    step: Callable[[int], None] | None = None,
) -> MigrateReport:
    """Copy every block `source` restored at open into `target`, in the same slot, oldest
    first; `step(n)` after each batch of `n` blocks. The stores must have the same block size
    and `target` at least the slots `source` uses."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    if source.block_size != target.block_size:
        raise ValueError(
            f"block sizes differ: source {source.block_size}, target {target.block_size}"
        )
    blocks = source.restore()
    report = MigrateReport(found=len(blocks))
    buffers = [np.empty(source.block_size, np.uint8) for _ in range(min(batch, len(blocks)))]
    for start in range(0, len(blocks), batch):
        part: list[RestoredBlock] = blocks[start : start + batch]
        held = buffers[: len(part)]
        keys = [block.key for block in part]
        slots = [block.slot for block in part]
        outcomes = await source.read(keys, slots, held)
        sound = [i for i, outcome in enumerate(outcomes) if outcome is None]
        report.damaged += len(part) - len(sound)
        if sound:
            results = await target.write(
                [keys[i] for i in sound], [slots[i] for i in sound], [held[i] for i in sound]
            )
            stored = sum(1 for error in results if error is None)
            report.copied += stored
            report.failed += len(sound) - stored
            report.copied_bytes += stored * source.block_size
        if step is not None:
            step(len(part))
    return report
