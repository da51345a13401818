"""The `[[tiers]]` table of a disk tier, its opener and its kind (`medium = "disk"`): a
persistent tier of slots in files on a local disk, reached by host buffers (`DiskStore`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from kvtier.config_fields import config_error, default_cache_dir, expand_path, true_false_or_auto
from kvtier.namespaces import combined_model_id
from kvtier.specs.base import Medium
from kvtier.tiers.disk.store import DiskStore
from kvtier.tiers.registry import BaseTierConfig, TierAccess, TierContext, TierKind


class DiskTierConfig(BaseTierConfig):
    """A tier of files on a local disk."""

    medium: Literal[Medium.DISK]
    path: Path = Field(default_factory=default_cache_dir)
    """Directory of the tier's files; "~" and $VARS are expanded at load."""
    compression: Literal["none", "zstd"] = "none"
    zstd_level: int = Field(default=3, ge=1, le=22)
    direct_io: bool | Literal["auto"] = "auto"
    """O_DIRECT: true, false, or "auto" (used where the filesystem supports it)."""
    fsync: bool = True
    """fsync files before a stored block counts as ready (survives a crash)."""

    @field_validator("path", mode="before")
    @classmethod
    def _expand(cls, value: object) -> Path:
        if not isinstance(value, str | Path):
            raise config_error("path", "expected a directory path string")
        if str(value) == "":
            raise config_error("path", "must not be empty")
        if "\0" in str(value):
            raise config_error("path", "must not contain a NUL character")
        try:
            return expand_path(value)
        except ValueError as error:
            raise config_error("path", str(error)) from None

    @field_validator("direct_io", mode="before")
    @classmethod
    def _check_direct_io(cls, value: object) -> bool | Literal["auto"]:
        return true_false_or_auto(value)


async def open_disk_tier(config: DiskTierConfig, context: TierContext) -> DiskStore:
    """A disk store, opened off the event loop (it may scan its index and preallocate files);
    `context.options` are `DiskStore`'s own (`max_workers`, `io`, ...)."""
    # A tenant narrows the namespace of the store's blocks (and so its directory), as it does
    # for the shared tiers; without one the store is the model's, as before.
    model_id = (
        combined_model_id(context.model_id, context.tenant) if context.tenant else context.model_id
    )
    return await asyncio.to_thread(
        DiskStore.from_config, config, context.block_size, model_id, **context.options
    )


KIND = TierKind(
    Medium.DISK,
    DiskTierConfig,
    volatile=False,
    access=TierAccess.HOST_BUFFERS,
    opener="kvtier.tiers.disk.kind:open_disk_tier",
)
"""A local disk: persistent, slots read and written through host buffers, kvtier's
bookkeeping deciding what it holds."""
