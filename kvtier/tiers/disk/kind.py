"""The `[[tiers]]` table of a disk tier and its kind (`medium = "disk"`): a persistent tier
of slots in files on a local disk, reached by host buffers (`LogStore` or `DiskStore` by its
`layout`; store.py holds the opener: validating a config imports no storage library).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from kvtier.config_fields import config_error, default_cache_dir, expand_path, true_false_or_auto
from kvtier.specs.base import Medium
from kvtier.tiers.registry import BaseTierConfig, TierAccess, TierKind


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
    layout: Literal["slots", "log"] = "log"
    """How blocks are laid out: "log" (format 4, the default: blocks appended to a log of
    regions, `LogStore`) or "slots" (format 2, one fixed slot per block in slab files,
    `DiskStore`). A store of the other layout in `path` is refused at open (one line)."""
    region_bytes: int = Field(default=16 << 20, ge=64 << 10, le=1 << 30, multiple_of=4096)
    """Size of one region of a new `layout = "log"` store (ignored by "slots"); an existing
    store keeps the regions it was written with (log_layout.py)."""

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


KIND = TierKind(
    Medium.DISK,
    DiskTierConfig,
    volatile=False,
    access=TierAccess.HOST_BUFFERS,
    opener="kvtier.tiers.disk.store:open_disk_tier",
    options_keyword="disk_options",
)
"""A local disk: persistent, slots read and written through host buffers, kvtier's
bookkeeping deciding what it holds."""
