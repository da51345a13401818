"""The disk store's check (kvtier/tiers/disk/fsck.py) on its own: records against their slot
headers and bytes, lost records found from the headers, and a repair that fixes both."""

from __future__ import annotations

import os
from pathlib import Path

from disk_parts import blocks, k, open_parts

from kvtier.tiers.disk.fsck import header_problem
from kvtier.tiers.disk.layout import BlockHeader, IndexRecord, slab_file_name


def test_a_slots_header_names_a_swapped_stale_or_disagreeing_record() -> None:
    record = IndexRecord(slot=3, length=100, codec=1, checksum=7, seq=5)
    assert header_problem(k(1), record, None) is None  # unreadable: the checksum decides
    assert header_problem(k(1), record, BlockHeader(k(1), 5, 100, 1, 7)) is None
    assert "another key" in (header_problem(k(1), record, BlockHeader(k(2), 5, 100, 1, 7)) or "")
    assert "stale record" in (header_problem(k(1), record, BlockHeader(k(1), 6, 100, 1, 7)) or "")
    assert "disagree" in (header_problem(k(1), record, BlockHeader(k(1), 5, 100, 1, 8)) or "")


def test_a_sound_store_checks_clean(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1), k(2)], [0, 9], blocks([1, 2])) == [None, None]
        report = parts.checker.check()
        assert report.ok and report.records == 2 and report.notes == ()
    finally:
        parts.close()


def test_swapped_records_are_found_and_a_repair_puts_them_right(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1), k(2), k(3)], [0, 1, 2], blocks([1, 2, 3])) == [None] * 3
        one, two = parts.catalog.get(k(1)), parts.catalog.get(k(2))
        assert one is not None and two is not None
        parts.catalog.index.put([(k(1), two), (k(2), one)])  # behind the catalog's back
        report = parts.checker.check()
        swapped = [p.key for p in report.problems if "another key" in p.what]
        lost = [(p.key, p.slot) for p in report.problems if "lost record" in p.what]
        assert sorted(swapped) == sorted([k(1), k(2)])
        assert sorted(lost) == [(k(1), 0), (k(2), 1)]  # their blocks are intact in place
        repaired = parts.checker.check(repair=True)
        assert (repaired.repaired, repaired.reindexed) == (2, 2)
        assert parts.catalog.get(k(1)) == one and parts.catalog.get(k(2)) == two
        assert IndexRecord.unpack(dict(parts.catalog.index.items())[k(1)]) == one
        assert parts.checker.check().ok
    finally:
        parts.close()


def test_a_lost_record_is_found_from_its_header_and_restored_by_a_repair(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        assert parts.lane.write_now([k(1), k(2)], [4, 5], blocks([1, 2])) == [None, None]
        parts.catalog.index.delete([k(2)])  # the index lost it; the header still has it
        parts.catalog.drop([k(2)])
        report = parts.checker.check()
        assert [(problem.key, problem.slot) for problem in report.problems] == [(k(2), 5)]
        assert "lost record" in report.problems[0].what
        repaired = parts.checker.check(repair=True)
        assert repaired.reindexed == 1 and k(2) in parts.catalog
        results, _ = parts.read([2], [5])
        assert results == [None]
    finally:
        parts.close()


def test_stray_files_are_noted_and_stray_slabs_removed_by_a_repair(tmp_path: Path) -> None:
    parts = open_parts(tmp_path)
    try:
        root = parts.files.root
        (root / "notes.txt").write_text("mine")
        (root / slab_file_name(40)).write_bytes(b"old")
        report = parts.checker.check()
        assert report.ok and len(report.notes) == 2
        repaired = parts.checker.check(repair=True)
        assert any("removed the stray slab file" in note for note in repaired.notes)
        assert os.path.exists(root / "notes.txt") and not (root / slab_file_name(40)).exists()
    finally:
        parts.close()
