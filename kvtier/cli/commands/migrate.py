"""`kvtier migrate`: copy a disk store's verified blocks into a store of the other layout.

The disk tier's layouts (`layout = "log"`, the default, and `layout = "slots"`) read none of
each other's files, and a tier whose directory holds a store of the other layout is refused
at open (`kvtier.tiers.disk.open_checks`). This command is the way on that keeps the
blocks: it opens the store named (`kvtier-<fp>`: per-block; `kvtier-log-<fp>`: log), reads
every block it holds through the store's own verifying read, and writes the sound ones into
a new store of the other layout (`kvtier.tiers.disk.migrate`). A block that fails
verification is counted and never copied.

Without DEST the store is migrated in place: the new store is built in a staging directory
beside it, and only once every block was copied and the new store closed cleanly is the old
one removed and the new one moved into the tier's directory (a failure leaves the old store
as it was, and removes the staging directory). With DEST the new store is created in DEST
(the `path` of the tier that will open it) and the old one is left alone.

Exit status: 0 every block copied; 1 copied, but some blocks were damaged (skipped) or
could not be stored; 2 bad options (one line); 4 the store could not be read (in use by a
running kvtier, not a kvtier store).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from kvtier.cli.console import out, progress
from kvtier.errors import InvalidValueError

if TYPE_CHECKING:
    from kvtier.tiers.disk.facade import StoreFacade
    from kvtier.tiers.disk.migrate import MigrateReport

EXIT_OK = 0
EXIT_SKIPPED = 1
EXIT_UNREAD = 4

Layout = Literal["slots", "log"]


def layout_of(store_dir: Path) -> Layout | None:
    """The layout of the store in `store_dir`, by its name; None when it is not a store's."""
    from kvtier.cli.commands.check import _STORE_NAME

    if not _STORE_NAME.fullmatch(store_dir.name):
        return None
    return "log" if store_dir.name.startswith("kvtier-log-") else "slots"


def open_source(store_dir: Path, layout: Layout) -> StoreFacade:
    """The store in `store_dir`, opened as it was built (its own records say how) and as a
    tier opens it (what its open drops, an interrupted write group's blocks or a record
    that cannot be served, is dropped here too: never copied)."""
    from kvtier.cli.commands.check import store_shape
    from kvtier.errors import DiskTierError
    from kvtier.tiers.disk import DiskStore
    from kvtier.tiers.disk.log_store import LAYOUT_FILE
    from kvtier.tiers.disk.open_checks import open_recorded_log_store

    if layout == "log":
        store = open_recorded_log_store(store_dir)
        if store is None:
            raise DiskTierError(f"{store_dir} has no readable {LAYOUT_FILE}: not a log store")
        return store
    slots = store_shape(store_dir)
    if slots is None:
        raise DiskTierError(f"{store_dir} has no readable headers.bin: not a per-block store")
    return DiskStore(
        store_dir.parent,
        block_size=slots.block_size,
        num_blocks=slots.num_blocks,
        model_id=slots.model_id,
        direct_io=False,
        create_parents=False,
    )


def open_target(
    directory: Path, layout: Layout, source: StoreFacade, region_bytes: int
) -> StoreFacade:
    """A new store of `layout` in `directory`, of the source's block size, model and
    capacity; written with fsync (the copy is durable once this command says so)."""
    from kvtier.tiers.disk import DiskStore
    from kvtier.tiers.disk.log_store import LogStore

    model_id = source.model_id
    if layout == "log":
        return LogStore(
            directory,
            block_size=source.block_size,
            num_blocks=source.num_blocks,
            model_id=model_id,
            region_bytes=region_bytes,
            create_parents=False,
        )
    return DiskStore(
        directory,
        block_size=source.block_size,
        num_blocks=source.num_blocks,
        model_id=model_id,
        create_parents=False,
    )


def _copy(source: StoreFacade, target: StoreFacade, batch: int) -> MigrateReport:
    from kvtier.tiers.disk.migrate import copy_blocks

    found = len(source)
    with progress(f"migrating {found:,} blocks", max(1, found)) as step:
        return asyncio.run(copy_blocks(source, target, batch=batch, step=step))


def _say(report: MigrateReport, source: Path, target: Path) -> None:
    out.print(
        f"{source} -> {target}: {report.found:,} blocks found, {report.copied:,} copied "
        f"({report.copied_bytes:,} bytes), {report.damaged:,} skipped as damaged, "
        f"{report.failed:,} failed to store",
        markup=False,
    )


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("dest", required=False, type=click.Path(path_type=Path))
@click.option(
    "--to",
    "to_layout",
    type=click.Choice(["log", "slots"]),
    default=None,
    help="The layout of the new store (default: the other one).",
)
@click.option(
    "--region-bytes",
    type=int,
    default=16 << 20,
    show_default=True,
    help='Region size of a new "log" store: the region_bytes of the tier that will open it '
    "(a log store keeps the regions it was written with whatever an open asks).",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 4096),
    default=64,
    show_default=True,
    help="Blocks read and written per call (one write group of the new store).",
)
def migrate(
    store: Path, dest: Path | None, to_layout: str | None, region_bytes: int, batch: int
) -> None:
    """Copy every verified block of a disk store into a new store of the other layout.

    STORE is a store directory: kvtier-<fingerprint> (layout "slots") or
    kvtier-log-<fingerprint> (layout "log"), as the refusal at open names it. Each block is
    read and verified through the store's own read; a damaged one is counted and never
    copied. The new store has the old one's block size, model and capacity.

    Without DEST the store is migrated in place: the new store is built beside it and, once
    every block is copied, replaces it (the old store is removed). With DEST the new store
    is created in DEST (the `path` of the tier that will open it) and the old one is kept.
    A store opened by a running kvtier is locked: stop it first.

    \b
    Exit status:
      0  every block copied
      1  done, but some blocks were damaged (skipped) or failed to store
      2  bad options (one line on stderr)
      4  the store could not be read (in use, or not a kvtier store)

    \b
    Examples:
      kvtier migrate ~/.cache/kvtier/kvtier-0123456789abcdef0123
      kvtier migrate old/kvtier-0123456789abcdef0123 new-tier-dir --to log
    """
    from kvtier.errors import DiskLockedError, DiskTierError
    from kvtier.tiers.disk.open_checks import store_dir_of

    if not store.is_dir() or store.is_symlink():
        raise InvalidValueError(f"{store} is not a store directory")
    found = layout_of(store)
    if found is None:
        raise InvalidValueError(
            f"{store} is not a store directory (kvtier-<fingerprint> or kvtier-log-<fingerprint>)"
        )
    wanted: Layout = "slots" if found == "log" else "log"
    if to_layout is not None and to_layout == found:
        raise InvalidValueError(f'{store} is already a "{found}" store: --to {to_layout}')
    in_place = dest is None
    if dest is not None and not dest.is_dir():
        raise InvalidValueError(f"{dest} is not a directory (create it first)")
    target_dir = store.parent / f".kvtier-migrate-{store.name}" if dest is None else dest
    if in_place:
        shutil.rmtree(target_dir, ignore_errors=True)  # a staging directory a crash left
        target_dir.mkdir(mode=0o700)
    try:
        source = open_source(store, found)
    except DiskLockedError:
        out.print(f"cannot migrate: {store} is in use (a running kvtier holds it)", markup=False)
        _cleanup(target_dir, in_place)
        sys.exit(EXIT_UNREAD)
    except DiskTierError as error:
        out.print(f"cannot migrate: {error}", markup=False)
        _cleanup(target_dir, in_place)
        sys.exit(EXIT_UNREAD)
    # Never into (nor, in place, over) a store that is already there: its blocks would mix.
    there = store_dir_of(
        store.parent if dest is None else dest, wanted, source.block_size, source.model_id
    )
    if there.exists() or there.is_symlink():
        source.close()
        _cleanup(target_dir, in_place)
        raise InvalidValueError(
            f'{there} already exists (a "{wanted}" store of this model and block size): '
            "remove it first, or migrate into another directory"
        )
    try:
        try:
            target = open_target(target_dir, wanted, source, region_bytes)
        except BaseException:
            _cleanup(target_dir, in_place)
            raise
        try:
            held = len(source)
            report = _copy(source, target, batch)
        finally:
            target.close()
    except BaseException:
        _cleanup(target_dir, in_place)
        raise
    finally:
        source.close()
    new_store = target.path
    if in_place and report.found != held:  # never remove blocks that were not offered
        _say(report, store, new_store)
        out.print(
            f"{store} held {held:,} blocks but listed {report.found:,}: kept as it was; the "
            f"copy is in {new_store}",
            markup=False,
        )
        sys.exit(EXIT_SKIPPED)
    if in_place:
        shutil.rmtree(store)
        final = store.parent / new_store.name
        os.replace(new_store, final)
        _cleanup(target_dir, in_place)
        new_store = final
    _say(report, store, new_store)
    if in_place:
        where = store.parent
        out.print(f'set layout = "{wanted}" in the disk tier that uses {where}', markup=False)
    sys.exit(EXIT_SKIPPED if report.damaged or report.failed else EXIT_OK)


def _cleanup(staging: Path, in_place: bool) -> None:
    """Remove the staging directory of an in-place migration (never a DEST)."""
    if in_place:
        shutil.rmtree(staging, ignore_errors=True)
