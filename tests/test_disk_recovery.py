"""Opening a disk store (kvtier/tiers/disk/recovery.py) on its own: the recorded layout wins,
a lost index is rebuilt from the slot headers, an interrupted group's records are dropped, a
failed open leaves nothing behind, and an open to inspect changes nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from disk_parts import BLOCK, blocks, k, open_parts, recovery

from kvtier.errors import DiskLayoutError, DiskTierError
from kvtier.tiers.disk.inflight import InflightLog
from kvtier.tiers.disk.layout import StoreLayout, pack_file_header, slab_file_name
from kvtier.tiers.disk.recovery import REBUILDING
from kvtier.tiers.disk.testing import flip_byte


def fill(directory: Path, count: int, **kwargs: object) -> Path:
    """A closed store holding blocks 0 .. count - 1 in slots 0 .. count - 1; its directory."""
    parts = open_parts(directory, **kwargs)  # type: ignore[arg-type]
    ids = list(range(count))
    assert parts.lane.write_now([k(i) for i in ids], ids, blocks(ids)) == [None] * count
    parts.close()
    return parts.files.root


def test_a_new_store_records_its_layout_and_sizes_its_files(tmp_path: Path) -> None:
    opening = recovery(tmp_path, num_blocks=20, slots_per_file=8)
    catalog = opening.open(direct_io=False)
    try:
        assert len(catalog) == 0 and opening.rebuilt_index is None and opening.problems == []
        assert catalog.index.read_layout() == opening.layout.meta()
        sizes = [os.path.getsize(opening.root / slab_file_name(i)) for i in range(3)]
        assert sizes == [8 * BLOCK, 8 * BLOCK, 4 * BLOCK]
    finally:
        opening.files.close(clean=True, catalog=catalog)


def test_a_reopened_store_keeps_the_slots_per_file_it_recorded(tmp_path: Path) -> None:
    fill(tmp_path, 3, slots_per_file=8)
    opening = recovery(tmp_path, slots_per_file=16)
    catalog = opening.open(direct_io=False)
    try:
        assert opening.layout.slots_per_file == 8
        assert sorted(catalog.keys()) == sorted(k(i) for i in range(3))
        assert [block.key for block in catalog.restored()] == [k(0), k(1), k(2)]
        assert catalog.next_seq == 4
    finally:
        opening.files.close(clean=True, catalog=catalog)


def test_another_stores_header_file_is_refused(tmp_path: Path) -> None:
    root = fill(tmp_path, 1)
    other = StoreLayout(32, BLOCK * 2, 8, "m")
    with (root / "headers.bin").open("r+b") as file:
        file.write(pack_file_header(other.meta()))
    opening = recovery(tmp_path)
    with pytest.raises(DiskLayoutError, match="header file records layout"):
        opening.open(direct_io=False)
    assert opening.files.lock_fd is None  # the failed open let go of everything
    opening = recovery(tmp_path)  # and the lock is free for the next try
    with pytest.raises(DiskLayoutError):
        opening.open(direct_io=False)


def test_a_missing_index_is_rebuilt_from_the_slot_headers(tmp_path: Path) -> None:
    root = fill(tmp_path, 5)
    shutil.rmtree(root / "index")
    parts = open_parts(tmp_path)
    try:
        assert parts.recovery.rebuilt_index == "the index is missing"
        assert sorted(parts.catalog.keys()) == sorted(k(i) for i in range(5))
        assert not (root / "index" / REBUILDING).exists()
        results, _ = parts.read(list(range(5)), list(range(5)))
        assert results == [None] * 5
    finally:
        parts.close()


def test_a_rebuild_skips_a_damaged_block_and_keeps_the_rest(tmp_path: Path) -> None:
    root = fill(tmp_path, 4)
    shutil.rmtree(root / "index")
    flip_byte(root / slab_file_name(0), 2 * BLOCK + 1)  # block 2
    parts = open_parts(tmp_path)
    try:
        assert sorted(parts.catalog.keys()) == sorted([k(0), k(1), k(3)])
    finally:
        parts.close()


def test_an_interrupted_groups_rewritten_slots_are_dropped_at_open(tmp_path: Path) -> None:
    root = fill(tmp_path, 4)
    flip_byte(root / slab_file_name(0), BLOCK + 7)  # slot 1: as a torn rewrite leaves it
    log = InflightLog(root / "inflight", 0o600)
    log.record([1, 3])  # the group in flight rewrote slots 1 and 3 (3 is still intact)
    log.close()
    opening = recovery(tmp_path)
    catalog = opening.open(direct_io=False)
    try:
        assert sorted(catalog.keys()) == sorted([k(0), k(2), k(3)])
        assert [(p.key, p.slot) for p in opening.problems] == [(k(1), 1)]
        assert "did not finish" in opening.problems[0].what
        assert opening.counters.snapshot().dropped_at_open == 1
        assert opening.files.inflight is not None and opening.files.inflight.read() == []
        assert k(1) not in dict(catalog.index.items())
    finally:
        opening.files.close(clean=True, catalog=catalog)


def test_an_interrupted_groups_unacknowledged_headers_are_cleared_at_open(tmp_path: Path) -> None:
    """A kill after a group wrote its bytes and slot headers but before its index commit
    leaves sound blocks nobody was told were stored: the open clears their headers, so the
    check finds no lost record and a rebuild does not bring them back."""
    root = fill(tmp_path, 4)
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(9)], [5], blocks([9])) == [None]
        parts.catalog.index.delete([k(9)])  # as if the commit never happened
    finally:
        parts.close()
    log = InflightLog(root / "inflight", 0o600)
    log.record([5])
    log.close()
    parts = open_parts(tmp_path)
    try:
        assert sorted(parts.catalog.keys()) == sorted(k(i) for i in range(4))
        report = parts.checker.check()
        assert report.ok, str(report)
    finally:
        parts.close()
    shutil.rmtree(root / "index")
    parts = open_parts(tmp_path)
    try:
        assert sorted(parts.catalog.keys()) == sorted(k(i) for i in range(4))
    finally:
        parts.close()


def test_records_of_slots_that_are_gone_are_dropped_when_the_store_shrinks(tmp_path: Path) -> None:
    root = fill(tmp_path, 20, num_blocks=32)
    opening = recovery(tmp_path, num_blocks=12)
    catalog = opening.open(direct_io=False)
    try:
        assert sorted(catalog.keys()) == sorted(k(i) for i in range(12))
        assert len(opening.problems) == 8 and opening.counters.snapshot().dropped_at_open == 8
        assert not (root / slab_file_name(2)).exists()  # beyond the last file: removed
        assert os.path.getsize(root / slab_file_name(1)) == 4 * BLOCK
    finally:
        opening.files.close(clean=True, catalog=catalog)


def test_opening_to_inspect_reports_what_an_open_would_drop_and_changes_nothing(
    tmp_path: Path,
) -> None:
    root = fill(tmp_path, 20, num_blocks=32)
    before = {path.name: path.stat().st_size for path in root.iterdir() if path.is_file()}
    opening = recovery(tmp_path, num_blocks=12, inspect=True)
    catalog = opening.open(direct_io=False)
    try:
        assert len(catalog) == 12 and len(opening.problems) == 8
        assert catalog.restored() == []
        assert opening.counters.snapshot().dropped_at_open == 0
    finally:
        opening.files.close(clean=False, catalog=catalog)
    after = {path.name: path.stat().st_size for path in root.iterdir() if path.is_file()}
    assert after == before
    opening = recovery(tmp_path)  # the index was not touched: opened as it was
    catalog = opening.open(direct_io=False)
    try:
        assert opening.rebuilt_index is None and len(catalog) == 20  # none was dropped
    finally:
        opening.files.close(clean=True, catalog=catalog)


def test_inspecting_a_store_without_an_index_is_an_error_not_a_rebuild(tmp_path: Path) -> None:
    root = fill(tmp_path, 2)
    shutil.rmtree(root / "index")
    with pytest.raises(DiskTierError, match="the index is missing"):
        recovery(tmp_path, inspect=True).open(direct_io=False)
    assert not (root / "index").exists()


def test_a_failed_open_removes_what_it_created(tmp_path: Path) -> None:
    store_parent = tmp_path / "new"
    opening = recovery(store_parent)
    (store_parent / f"kvtier-{opening.layout.fingerprint}").mkdir(parents=True, mode=0o700)
    (store_parent / f"kvtier-{opening.layout.fingerprint}" / slab_file_name(1)).mkdir()
    with pytest.raises(DiskTierError, match="cannot open the disk tier"):
        opening.open(direct_io=False)
    assert sorted(path.name for path in opening.root.iterdir()) == [slab_file_name(1)]
    assert opening.files.lock_fd is None and opening.files.slab_fds == []
