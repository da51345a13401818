"""A log store's `layout.json`: what it was written with, so that an open under other
settings keeps the store's own regions and a checkpoint that is not its own is ignored.

It records the block size, the model, the capacity and `region_bytes` of the last open (what
`kvtier check` and `kvtier migrate` open a store by), the size of the regions the regions
file is cut into (`region_size`: a small store's are smaller than `region_bytes`), and the
store's identity: a random `store_id` made for one regions file (`regions_file`: its inode
number and generation, `file_identity`), which every checkpoint carries. A new or emptied
regions file, or another file at its path (a copy, a replacement), gets a new identity, so
no checkpoint written for other regions is loaded over these (the open scans them)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from kvtier.tiers.disk.log_files import region_size, smallest_region
from kvtier.tiers.disk.log_format import LOG_FORMAT_VERSION, PAGE

LAYOUT_FILE = "layout.json"
"""The file in a log store's directory that holds its layout."""

MAX_REGION_BYTES = 1 << 30
"""The largest region a recorded layout is believed to have (the config's bound)."""


@dataclass(frozen=True, slots=True)
class Written:
    """What a store's existing files were written with: its regions' size (None: not known,
    the open's own applies) and its identity (None: a new one is made)."""

    region_size: int | None
    store_id: str | None


def read_layout(path: Path) -> dict[str, Any] | None:
    """The layout a log store in `path` recorded, or None (absent, unreadable, another
    format)."""
    try:
        data = json.loads((path / LAYOUT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != LOG_FORMAT_VERSION:
        return None
    return data


def written_with(
    recorded: dict[str, Any] | None,
    *,
    block_size: int,
    model_id: str,
    record_max: int,
    regions_file: str,
    fresh: bool,
) -> Written:
    """What the regions file (whose identity is `regions_file`; `fresh`: new or empty) was written
    with, by the `recorded` layout: nothing known for a fresh file, another store's layout
    (block size, model) or a damaged one; the identity only for the file it was made for.
    A layout written before `region_size` was recorded gives the size its capacity and
    `region_bytes` gave then."""
    if fresh or recorded is None:
        return Written(None, None)
    if recorded.get("block_size") != block_size or recorded.get("model_id") != model_id:
        return Written(None, None)
    size = recorded.get("region_size")
    if size is None:
        blocks, wanted = recorded.get("num_blocks"), recorded.get("region_bytes")
        if _is_int(blocks) and _is_int(wanted) and blocks > 0 and wanted > 0:
            size = region_size(blocks, record_max, wanted)
    if not (
        _is_int(size)
        and size % PAGE == 0
        and smallest_region(record_max) <= size <= MAX_REGION_BYTES
    ):
        size = None
    store_id = recorded.get("store_id")
    if not isinstance(store_id, str) or recorded.get("regions_file") != regions_file:
        store_id = None
    return Written(size, store_id)


def new_store_id() -> str:
    """A new random identity for a regions file."""
    return secrets.token_hex(8)


def write_layout(path: Path, layout: dict[str, Any]) -> None:
    """Record `layout` (block_size, num_blocks, model_id, region_bytes, region_size,
    store_id, regions_file) in `path/layout.json`, atomically and durably, unless it
    already says that (a checkpoint carrying the identity must never outlive it)."""
    layout = {"format": LOG_FORMAT_VERSION, **layout}
    if read_layout(path) == layout:
        return
    temporary = path / f".{LAYOUT_FILE}.tmp"
    with open(temporary, "w") as file:
        file.write(json.dumps(layout, sort_keys=True))
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path / LAYOUT_FILE)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some filesystems sync no directory
            os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
