"""The `[[tiers]]` table of a shared-directory tier and its kind (`medium = "shared-fs"`):
imported when a config is validated; the storage and its opener are in
`kvtier.tiers.sharedfs.storage`.

    [[tiers]]
    name = "nfs"
    medium = "shared-fs"
    capacity = 65536              # keys kvtier remembers; max_size bounds the files
    path = "/mnt/kvtier"
    max_size = "500GiB"
    auth_key_file = "/etc/kvtier/fleet.key"
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from kvtier.config_fields import config_error, expand_path, parse_size
from kvtier.tiers.registry import TierAccess, TierKind
from kvtier.tiers.shared.config import SharedTierConfig


class SharedFSTierConfig(SharedTierConfig):
    """A tier of one file per block under a directory many hosts mount."""

    medium: Literal["shared-fs"]
    path: Path
    """The shared directory ("~" and $VARS expanded); the tier uses a subdirectory per
    namespace (model, block size)."""
    max_size: int | str | None = None
    """Bytes the namespace's files may take (an int or "500GiB"); the sweeper removes the
    least recently used past it. Default: `capacity` blocks."""
    sweep_interval_s: float | None = Field(default=10.0, gt=0)
    """Seconds between sweeps (None: this node never sweeps, neither periodically nor on its
    own writes; another node must)."""
    sweep_low_watermark: float = Field(default=0.9, gt=0, le=1)
    """A sweep brings the files down to this fraction of `max_size`."""
    group: str | int | None = None
    """A group (name or gid) whose members share the tree: its directories are created 2770
    and its files 0640 with that group, and directories of that group are trusted. Default:
    only this user (0700 directories, 0600 files); see `kvtier.tiers.sharedfs.storage`."""
    fsync: bool = False
    """fsync each file (and its directory) before a store counts as done."""
    compression: Literal["none", "zstd"] = "none"
    zstd_level: int = Field(default=3, ge=1, le=22)
    max_workers: int = Field(default=8, ge=1, le=256)
    """Threads doing this tier's file I/O."""
    negative_ttl_ms: int = Field(default=200, ge=0, le=3_600_000)

    @field_validator("path", mode="before")
    @classmethod
    def _expand(cls, value: object) -> Path:
        if not isinstance(value, str | Path) or str(value) == "" or "\0" in str(value):
            raise config_error("path", "expected a directory path")
        try:
            return expand_path(value)
        except ValueError as error:
            raise config_error("path", str(error)) from None

    @field_validator("max_size")
    @classmethod
    def _check_size(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            try:
                parse_size(value)
            except (ValueError, TypeError) as error:
                raise config_error("max_size", str(error)) from None
        return value

    @field_validator("group")
    @classmethod
    def _check_group(cls, value: str | int | None) -> str | int | None:
        if isinstance(value, int) and value < 0:
            raise config_error("group", "expected a group name or a gid >= 0")
        if isinstance(value, str) and (value == "" or "\0" in value):
            raise config_error("group", "expected a group name or a gid >= 0")
        return value


KIND = TierKind(
    "shared-fs",
    SharedFSTierConfig,
    volatile=False,
    owns_index=True,
    shared=True,
    access=TierAccess.CLIENT,
    opener="kvtier.tiers.sharedfs.storage:open_sharedfs_tier",
)
"""A shared directory's declarations: persistent, written by many nodes, reached by key
(one file per block), answering lookups and evicting (its sweeper) by itself."""
