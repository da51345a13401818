"""What the disk kind's opener (`open_disk_tier`) checks before it opens a layout's store:
a store of the other layout in the tier's directory (refused, in one line), and for the log
layout the trust rules of the tier's directories (the per-block store's recovery checks
them itself).

**The other layout.**

The disk tier has two layouts (`layout` in its `[[tiers]]` table): "log" (format 4,
`LogStore`, the default) in `<path>/kvtier-log-<fingerprint>/` and "slots" (format 2, the
per-block `DiskStore`) in `<path>/kvtier-<fingerprint>/`. Neither reads the other's files.
A tier whose layout changed (a config written before "log" became the default, or an edit)
would otherwise open an empty store beside the old one: every lookup a miss, the old store's
space still taken, nothing said. So the disk kind's opener (`open_disk_tier`) refuses to
open while a store of the same model and block size in the other layout is there, with one
line saying what it is, how much it holds, and the three ways on: set `layout` back to keep
using it, `kvtier migrate` it (its verified blocks copied into the new layout), or remove
it to start empty (it is a cache: its blocks are lost, nothing else).

Counting what the old store holds only reads it: the per-block store's LMDB index opened
read-only, the log store opened to inspect (`LogStore(inspect=True)`, nothing written). A
store that cannot be read so (in use, damaged) is described by its bytes on disk alone.

**An older log format.** A log store's directory is named by its format too
(`log_fingerprint`), so a kvtier whose log format changed would open an empty store beside
the old one. This opener is the one place that refuses it (`older_log_store_line`): a log
store of this model and block size in another format, found by its directory's name (an
earlier format's fingerprint, `OLD_FORMAT_VERSIONS`: format 3 recorded no `layout.json`) or by
the format its `layout.json` records (any later change of format). This kvtier cannot read
it, so neither count nor migrate its blocks: the line says so, its bytes on disk, and the
ways on: remove it to start empty (a cache: its blocks are lost, so recomputed when next
needed, nothing else), or keep running the kvtier that wrote it. `LogStore` itself opens its
own directory only and never looks for other formats (tools and tests open it directly).

**Trusted directories.** As for the per-block store (safety.py): the tier's directory is
created 0700 only where it is the default one (a configured path's parent must exist), must
be owned by this user or root and writable by nobody else (or sticky), and an existing store
directory must be a real directory (no symlink) owned by this user and writable by nobody
else; else one DiskTierError saying so, before anything is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvtier.config_fields import readable_size
from kvtier.errors import DiskLayoutError
from kvtier.tiers.disk.layout import INDEX_DIR, layout_fingerprint
from kvtier.tiers.disk.log_format import LOG_FORMAT_VERSION
from kvtier.tiers.disk.neighbours import bytes_on_disk
from kvtier.tiers.disk.safety import check_parent_dir, check_store_dir
from kvtier.tiers.trusted import make_dirs

if TYPE_CHECKING:
    from kvtier.tiers.disk.log_store import LogStore

__all__ = [
    "LAYOUT_NAMES",
    "older_log_store_line",
    "other_layout_line",
    "refuse_older_log_store",
    "refuse_other_layout",
    "store_dir_of",
    "trust_log_dirs",
]

Layout = Literal["slots", "log"]

LAYOUT_NAMES: dict[str, str] = {
    "slots": 'a per-block disk store (layout = "slots", format 2)',
    "log": f'a log disk store (layout = "log", format {LOG_FORMAT_VERSION})',
}
"""What each layout's store is, in the words of the refusal."""


def store_dir_of(directory: Path, layout: Layout, block_size: int, model_id: str) -> Path:
    """The directory a store of `layout` for this block size and model has under the tier's
    `directory`."""
    if layout == "log":
        from kvtier.tiers.disk.log_format import log_fingerprint

        return directory / f"kvtier-log-{log_fingerprint(block_size, model_id)}"
    return directory / f"kvtier-{layout_fingerprint(block_size, model_id)}"


def _slots_blocks(store: Path) -> int | None:
    """The records of a per-block store's index, read-only; None when it cannot be read."""
    try:
        import lmdb

        env = lmdb.open(str(store / INDEX_DIR), readonly=True, lock=False, max_dbs=2, subdir=True)
    except Exception:
        return None
    try:
        blocks = env.open_db(b"blocks", create=False)
        with env.begin(db=blocks) as txn:
            return int(txn.stat(blocks)["entries"])
    except Exception:
        return None
    finally:
        env.close()


def open_recorded_log_store(store: Path, **options: Any) -> LogStore | None:
    """The log store in `store` opened by the geometry its `layout.json` records (block
    size, blocks, model, region size), plain I/O, its parents never created, with `options`
    (`inspect`, `max_workers`) on top; None when it has no readable
    `layout.json`. What `kvtier check`, `kvtier migrate` and this opener's counting share."""
    from kvtier.tiers.disk.log_store import LogStore, read_layout

    shape = read_layout(store)
    if shape is None:
        return None
    arguments: dict[str, Any] = {"direct_io": False, "create_parents": False}
    arguments.update(options)
    return LogStore(
        store.parent,
        block_size=int(shape["block_size"]),
        num_blocks=int(shape["num_blocks"]),
        model_id=str(shape["model_id"]),
        region_bytes=int(shape["region_bytes"]),
        **arguments,
    )


def _log_blocks(store: Path) -> int | None:
    """The blocks a log store holds, opened to inspect; None when it cannot be opened."""
    try:
        opened = open_recorded_log_store(store, inspect=True, max_workers=1)
    except Exception:
        return None
    if opened is None:
        return None
    try:
        return len(opened)
    finally:
        opened.close()


def other_layout_line(store: Path, found: Layout, wanted: Layout) -> str:
    """The one line that refuses a tier of layout `wanted` over `store`, of layout `found`."""
    blocks = _log_blocks(store) if found == "log" else _slots_blocks(store)
    size = readable_size(bytes_on_disk(store))
    held = f"{blocks:,} blocks, {size} on disk" if blocks is not None else f"{size} on disk"
    lost = f"its {blocks:,} blocks" if blocks is not None else "its blocks"
    return (
        f'{store} is {LAYOUT_NAMES[found]} holding {held}, which layout = "{wanted}" does not '
        f'read: set layout = "{found}" in this disk tier to keep using it, run `kvtier migrate '
        f'{store}` to copy its verified blocks into a "{wanted}" store, or remove that '
        f"directory to start empty (a cache: {lost} are lost, nothing else)"
    )


def refuse_other_layout(directory: Path, wanted: Layout, block_size: int, model_id: str) -> None:
    """Raise DiskLayoutError (one line, `other_layout_line`) when the tier's `directory`
    holds a store of this block size and model in the layout other than `wanted`."""
    found: Layout = "slots" if wanted == "log" else "log"
    store = store_dir_of(directory, found, block_size, model_id)
    try:
        there = store.is_dir()
    except OSError:
        return  # the store's own open says what is wrong with the directory
    if there:
        raise DiskLayoutError(other_layout_line(store, found, wanted))


def _other_log_format(store: Path, block_size: int, model_id: str) -> object | None:
    """The log format of `store` (a `kvtier-log-*` directory) when it is a store of this
    block size and model in a format other than this kvtier's, else None: by the format its
    `layout.json` records, else by its name (an earlier format's fingerprint)."""
    import json

    from kvtier.tiers.disk.log_format import OLD_FORMAT_VERSIONS, log_fingerprint
    from kvtier.tiers.disk.log_store import LAYOUT_FILE

    try:
        recorded = json.loads((store / LAYOUT_FILE).read_text())
    except (OSError, ValueError):
        recorded = None
    if isinstance(recorded, dict):
        if recorded.get("block_size") != block_size or recorded.get("model_id") != model_id:
            return None  # another model's or block size's: said by nobody, read by nobody
        found = recorded.get("format")
        return None if found == LOG_FORMAT_VERSION else found
    for version in OLD_FORMAT_VERSIONS:
        if store.name == f"kvtier-log-{log_fingerprint(block_size, model_id, version)}":
            return version
    return None


def older_log_store_line(directory: Path, block_size: int, model_id: str) -> str | None:
    """The one line that refuses a log tier over a log store of this block size and model in
    an older (or newer) format than this kvtier's, or None when there is none (module
    docstring: how it is found). Such a store cannot be opened, so it is described by its
    bytes on disk."""
    own = store_dir_of(directory, "log", block_size, model_id).name
    try:
        children = sorted(directory.glob("kvtier-log-*"))
    except OSError:
        return None
    for store in children:
        try:
            if store.name == own or store.is_symlink() or not store.is_dir():
                continue
        except OSError:
            continue
        found = _other_log_format(store, block_size, model_id)
        if found is None:
            continue
        size = readable_size(bytes_on_disk(store))
        return (
            f"{store} is a log disk store of format {found} holding {size} on disk, which this "
            f"kvtier (format {LOG_FORMAT_VERSION}) can neither read nor migrate: remove that "
            f"directory to start empty (it is a cache: its blocks are lost and recomputed when "
            f"next needed, nothing else), or keep running the kvtier that wrote it"
        )
    return None


def refuse_older_log_store(directory: Path, block_size: int, model_id: str) -> None:
    """Raise DiskLayoutError (`older_log_store_line`) when the tier's `directory` holds a
    log store of this block size and model in another log format."""
    line = older_log_store_line(directory, block_size, model_id)
    if line is not None:
        raise DiskLayoutError(line)


def trust_log_dirs(directory: Path, store: Path, create_parents: bool) -> None:
    """The tier's `directory` created (with its missing parents only when `create_parents`)
    and trusted, and the log `store` in it trusted when it exists (module docstring)."""
    make_dirs(directory, create_parents=create_parents)
    check_parent_dir(directory)
    if store.exists() or store.is_symlink():
        check_store_dir(store)
