"""The other stores in a disk store's directory, said at open.

A store lives in `<directory>/kvtier-<fingerprint>/`, the fingerprint naming its block size
and model id (layout.py). A tier whose `block_size` (or model id) changed therefore opens a
second, empty store beside the first: nothing is found (every lookup misses) and the old
store keeps its disk space. That is by design (blocks of another layout must never be read)
but silent; `other_stores` lists the stores beside this one from their own layout records
(`headers.bin`, read only), and `say_other_stores` tells the operator in one log line per
store: what it is, what it holds on disk and how to get the space back.

A store of the same block size but another model id may be in use by another model sharing
the directory, so it is said at INFO; one of this model (another block size or layout
version) or of unknown layout is what a changed config leaves behind, said as a WARNING.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from kvtier.config_fields import readable_size
from kvtier.tiers.disk.layout import (
    FILE_HEADER_BYTES,
    HEADERS_FILE,
    StoreLayout,
    unpack_file_header,
)

_log = logging.getLogger(__name__)

STORE_PREFIX = "kvtier-"
"""The name of every store's own directory starts with this (then its fingerprint)."""


@dataclass(frozen=True, slots=True)
class OtherStore:
    """A store beside this one: its directory, its layout as recorded (None where its
    `headers.bin` is missing or unreadable) and the bytes its files take on disk."""

    path: Path
    block_size: int | None
    model_id: str | None
    bytes_on_disk: int

    def same_model(self, layout: StoreLayout) -> bool:
        """Whether it is this model's store (another block size or layout version)."""
        return self.model_id == layout.model_id

    def line(self, layout: StoreLayout) -> str:
        """The one line that says this store is there, why it is not read, and the fix."""
        where = f"disk tier in {self.path.parent}"
        held = f"keeping {readable_size(self.bytes_on_disk)} on disk"
        if self.block_size is None:
            return (
                f"{where}: another store is there, {self.path}, of unknown layout (no "
                f"readable {HEADERS_FILE}), {held}: remove the old store directory "
                f"{self.path} if no kvtier uses it"
            )
        mine = f"block_size {layout.block_size}, model_id {layout.model_id!r}"
        theirs = f"block_size {self.block_size}, model_id {self.model_id!r}"
        if self.block_size != layout.block_size and self.same_model(layout):
            back = f"or set block_size back to {self.block_size}"
        elif self.same_model(layout):
            back = "(it was written by another layout version of kvtier)"
        else:
            back = f"if model_id {self.model_id!r} is no longer served"
        return (
            f"{where}: another store is there, {self.path} ({theirs}), which this tier "
            f"({mine}) does not read (its lookups there miss), {held}: remove the old store "
            f"directory {self.path} {back}"
        )


def other_stores(directory: Path, layout: StoreLayout) -> list[OtherStore]:
    """The stores in `directory` other than `layout`'s, by name; none when the directory
    does not exist or cannot be listed. Reads only each store's layout page and the sizes
    of its files; never opens, locks or changes a store."""
    own = layout.store_dir(directory).name
    try:
        children = sorted(directory.iterdir())
    except OSError:
        return []
    found = []
    for child in children:
        if child.name == own or not child.name.startswith(STORE_PREFIX):
            continue
        try:
            if not child.is_dir() or child.is_symlink():
                continue
        except OSError:
            continue
        recorded = _layout_record(child)
        block_size = recorded.get("block_size") if recorded else None
        model_id = recorded.get("model_id") if recorded else None
        found.append(
            OtherStore(
                child,
                block_size if isinstance(block_size, int) else None,
                model_id if isinstance(model_id, str) else None,
                bytes_on_disk(child),
            )
        )
    return found


def say_other_stores(directory: Path, layout: StoreLayout) -> list[OtherStore]:
    """`other_stores`, each logged in one line (module docstring: WARNING for a store a
    changed config left behind, INFO for another model's)."""
    stores = other_stores(directory, layout)
    for store in stores:
        level = (
            logging.INFO
            if store.block_size is not None and not store.same_model(layout)
            else logging.WARNING
        )
        _log.log(level, "%s", store.line(layout))
    return stores


def _layout_record(store: Path) -> dict[str, object] | None:
    try:
        with open(store / HEADERS_FILE, "rb") as file:
            data = file.read(FILE_HEADER_BYTES)
    except OSError:
        return None
    return unpack_file_header(data)


def bytes_on_disk(store: Path) -> int:
    """Bytes the files under `store` take on disk (allocated blocks, so sparse slabs count
    what they hold), 0 for what cannot be read."""
    total = 0
    for folder, _, files in os.walk(store):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total
