"""Reopening a log store under other settings or another store's files (issue 33): a store
opened with another `region_bytes` than it was written with keeps the regions it has (and
says so in one line), and a checkpoint that is not the store's own (copied from another
store, or left from an earlier regions file) is ignored: the regions are scanned, so the
store's own blocks are found and nothing is claimed that is not there. A background checkpoint
is due once enough regions were opened and enough bytes appended (`checkpoint_min_bytes`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from disk_helpers import assert_intact, k, open_small, read, write_ok

from kvtier.tiers.disk.log_files import file_identity
from kvtier.tiers.disk.log_format import CHECKPOINT_DIR, PAGE
from kvtier.tiers.disk.log_store import LogStore
from kvtier.tiers.storage import ReadFailure

pytestmark = pytest.mark.timeout(120)

BLOCKS = 1024
"""Enough blocks that the regions are of `region_bytes` (a small store's are shrunk)."""


def open_log(directory: Path, **kwargs: Any) -> LogStore:
    options: dict[str, Any] = {"num_blocks": BLOCKS, "region_bytes": 64 * PAGE}
    options.update(kwargs)
    return open_small(LogStore, directory, **options)


async def fill(store: LogStore, ids: list[int]) -> None:
    for first in range(0, len(ids), 4):
        part = ids[first : first + 4]
        await write_ok(store, part, [i % store.num_blocks for i in part])


# -- another region_bytes ----------------------------------------------------------------------


@pytest.mark.parametrize("other", [32 * PAGE, 256 * PAGE])
async def test_another_region_bytes_keeps_the_regions_it_was_written_with(
    tmp_path: Path, other: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Measured before: 8 blocks written with one region_bytes, 0 found with another."""
    store = open_log(tmp_path)
    written = store.region_bytes
    await fill(store, list(range(8)))
    await store.aclose()
    with caplog.at_level(logging.WARNING):
        again = open_log(tmp_path, region_bytes=other)
    try:
        assert again.region_bytes == written
        assert len(again) == 8
        await assert_intact(again, list(range(8)), list(range(8)))
        lines = [r.getMessage() for r in caplog.records if "region_bytes" in r.getMessage()]
        assert len(lines) == 1 and str(written) in lines[0] and str(other) in lines[0], lines
        await fill(again, list(range(8, 16)))
    finally:
        await again.aclose()
    # Without a checkpoint too (as after kill -9): the regions scanned at their own size.
    (again.path / CHECKPOINT_DIR / "data.mdb").unlink()
    third = open_log(tmp_path, region_bytes=other)
    try:
        assert not third.opened.from_checkpoint
        await assert_intact(third, list(range(16)), list(range(16)))
    finally:
        await third.aclose()


async def test_a_new_regions_file_takes_the_new_region_bytes(tmp_path: Path) -> None:
    """With no block to keep (the regions file removed) the new setting applies, and
    nothing of the old regions is claimed."""
    store = open_log(tmp_path)
    await fill(store, [1, 2])
    await store.aclose()
    (store.path / "regions.bin").unlink()
    again = open_log(tmp_path, region_bytes=32 * PAGE)
    try:
        assert again.region_bytes == 32 * PAGE and len(again) == 0
        await fill(again, [3, 4])
    finally:
        await again.aclose()
    third = open_log(tmp_path, region_bytes=32 * PAGE)
    try:
        assert third.opened.from_checkpoint
        assert sorted(b.key for b in third.restore()) == [k(3), k(4)]
        await assert_intact(third, [3, 4], [3, 4])
    finally:
        third.close()


async def test_a_capacity_change_of_a_small_store_keeps_its_blocks(tmp_path: Path) -> None:
    """A small store's regions are shrunk to its size; grown, it keeps the regions it has."""
    store = open_small(LogStore, tmp_path, num_blocks=16)
    small = store.region_bytes
    await fill(store, list(range(8)))
    await store.aclose()
    again = open_small(LogStore, tmp_path, num_blocks=BLOCKS)
    try:
        assert again.region_bytes == small
        await assert_intact(again, list(range(8)), list(range(8)))
    finally:
        await again.aclose()


# -- a checkpoint that is not the store's own -------------------------------------------------


async def two_stores(tmp_path: Path) -> tuple[Path, Path]:
    """Two stores of one model and block size written alike (same slots, same regions, same
    epochs), blocks 0-7 in "a" and 100-107 in "b"; their directories."""
    paths = []
    for name, first in (("a", 0), ("b", 100)):
        store = open_log(tmp_path / name)
        await fill(store, [first + i for i in range(8)])
        await store.aclose()
        paths.append(store.path)
    return paths[0], paths[1]


async def test_a_checkpoint_copied_from_another_store_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Measured before: b restored a's 8 blocks (every read a miss) and lost its own 8."""
    a, b = await two_stores(tmp_path)
    shutil.rmtree(b / CHECKPOINT_DIR)
    shutil.copytree(a / CHECKPOINT_DIR, b / CHECKPOINT_DIR)
    with caplog.at_level(logging.WARNING):
        again = open_log(tmp_path / "b")
    try:
        assert not again.opened.from_checkpoint
        assert sorted(block.key for block in again.restore()) == [k(100 + i) for i in range(8)]
        await assert_intact(again, [100 + i for i in range(8)], list(range(100, 108)))
        results, _ = await read(again, list(range(8)), list(range(8)))
        assert results == [ReadFailure.NOT_INDEXED] * 8
        assert any("not this store's" in r.getMessage() for r in caplog.records)
        await fill(again, [200, 201])
    finally:
        await again.aclose()
    # The checkpoint written at that close is its own: the next open starts from it.
    third = open_log(tmp_path / "b")
    try:
        assert third.opened.from_checkpoint and third.opened.scanned_records == 0
        await assert_intact(third, [100, 200, 201], [100, 200 % BLOCKS, 201 % BLOCKS])
    finally:
        third.close()


def generations_known(directory: Path) -> bool:
    """Whether the filesystem of `directory` gives inode generation numbers."""
    path = directory / "probe"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    try:
        return not file_identity(fd).endswith(":0")
    finally:
        os.close(fd)
        path.unlink()


@pytest.mark.parametrize("how", ["renamed over", "removed, then copied"])
async def test_a_regions_file_copied_from_another_store_is_not_read_by_its_checkpoint(
    tmp_path: Path, how: str
) -> None:
    """The other way round: a's regions file put in place of b's (another file, though it
    may get the removed one's inode number): a's blocks are found by the scan, none of b's
    claimed."""
    a, b = await two_stores(tmp_path)
    if how == "renamed over":
        shutil.copy(a / "regions.bin", b / "regions.copy")
        os.replace(b / "regions.copy", b / "regions.bin")
    else:
        if not generations_known(tmp_path):
            pytest.skip("this filesystem gives no inode generation numbers")
        os.unlink(b / "regions.bin")
        shutil.copy(a / "regions.bin", b / "regions.bin")
    again = open_log(tmp_path / "b")
    try:
        assert not again.opened.from_checkpoint
        assert sorted(block.key for block in again.restore()) == [k(i) for i in range(8)]
        await assert_intact(again, list(range(8)), list(range(8)))
    finally:
        again.close()


async def test_a_store_written_before_its_identity_was_recorded_opens_by_a_scan_once(
    tmp_path: Path,
) -> None:
    """A layout.json without `store_id` (an older kvtier of this format): its checkpoint
    cannot be told from a copied one, so the first open scans; the next uses a checkpoint."""
    store = open_log(tmp_path)
    await fill(store, list(range(8)))
    await store.aclose()
    recorded = json.loads((store.path / "layout.json").read_text())
    for name in ("store_id", "regions_file", "region_size"):
        del recorded[name]
    (store.path / "layout.json").write_text(json.dumps(recorded))
    for from_checkpoint in (False, True):
        again = open_log(tmp_path)
        try:
            assert again.opened.from_checkpoint == from_checkpoint
            await assert_intact(again, list(range(8)), list(range(8)))
        finally:
            again.close()


# -- how often a checkpoint is written ---------------------------------------------------------


@pytest.mark.parametrize("min_bytes", [None, 0])
async def test_a_background_checkpoint_waits_for_its_bytes_as_well_as_its_regions(
    tmp_path: Path, min_bytes: int | None
) -> None:
    """A small store opens `checkpoint_every` regions within one call's bytes; a background
    checkpoint waits until `checkpoint_min_bytes` were appended too (measured before: one
    every two regions here, on every large call of a store one call large). The close
    writes one either way; a restart then finds every block."""
    store = open_log(tmp_path)
    if min_bytes is not None:
        store.checkpoint_min_bytes = min_bytes
    assert store.checkpoint_every < 8
    written = [0]
    checkpoint = store.checkpoint

    def counting() -> None:
        written[0] += 1
        checkpoint()

    store.checkpoint = counting  # type: ignore[method-assign]
    for first in range(0, 2 * BLOCKS, 64):
        ids = list(range(first, first + 64))
        await write_ok(store, ids, [i % BLOCKS for i in ids])
    assert store._lane.opened >= 3 * store.checkpoint_every
    await store.aclose()  # (runs the background checkpoints submitted, then its own)
    assert (written[0] == 1) == (min_bytes is None), written[0]
    again = open_log(tmp_path)
    try:
        assert again.opened.from_checkpoint
        assert len(again) == BLOCKS
    finally:
        again.close()
