"""A disk tier whose block_size changed opens a second store beside the first: it says so
at open, in one line naming both block sizes, the directory and the fix, and its tier's
description counts the store it does not read."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvtier import Hierarchy
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk.layout import StoreLayout
from kvtier.tiers.disk.neighbours import other_stores

LOGGER = "kvtier.tiers.disk.neighbours"


def make_store(directory: Path, block_size: int, model_id: str = "") -> Path:
    """A store of `block_size` in `directory`, created and closed; its own directory."""
    store = DiskStore(
        directory, block_size=block_size, num_blocks=8, model_id=model_id, direct_io=False
    )
    store.close()
    return store.path


def test_a_changed_block_size_is_said_with_both_sizes_and_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = make_store(tmp_path, 8192)
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = DiskStore(tmp_path, block_size=4096, num_blocks=8, direct_io=False)
    try:
        assert store.path != old and old.is_dir()  # the old store is left as it is
        assert [other.path for other in store.other_stores] == [old]
        assert store.other_stores[0].block_size == 8192
        assert store.other_stores[0].bytes_on_disk >= 8 * 8192  # its slots still take space
    finally:
        store.close()
    said = [record for record in caplog.records if record.name == LOGGER]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    line = said[0].getMessage()
    assert "\n" not in line
    assert f"disk tier in {tmp_path}:" in line
    assert "block_size 8192" in line and "block_size 4096" in line
    assert f"remove the old store directory {old} or set block_size back to 8192" in line


def test_the_same_store_reopened_has_no_neighbour(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_store(tmp_path, 4096)
    (tmp_path / "notes.txt").write_text("not a store")
    (tmp_path / "kvtier-stray-file").write_text("a file, not a store directory")
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = DiskStore(tmp_path, block_size=4096, num_blocks=8, direct_io=False)
    store.close()
    assert store.other_stores == []
    assert not [record for record in caplog.records if record.name == LOGGER]


def test_another_models_store_is_said_at_info_and_one_without_layout_as_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    theirs = make_store(tmp_path, 4096, model_id="other-model")
    broken = tmp_path / "kvtier-0123456789abcdef0123"
    broken.mkdir()
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = DiskStore(tmp_path, block_size=4096, num_blocks=8, direct_io=False)
    store.close()
    said = {record.getMessage(): record.levelno for record in caplog.records}
    assert len(said) == 2
    (other_line,) = [line for line in said if str(theirs) in line]
    assert said[other_line] == logging.INFO  # possibly served by another model: no warning
    assert "model_id 'other-model'" in other_line
    (broken_line,) = [line for line in said if str(broken) in line]
    assert said[broken_line] == logging.WARNING and "unknown layout" in broken_line


def test_a_missing_directory_has_no_other_store(tmp_path: Path) -> None:
    assert other_stores(tmp_path / "absent", StoreLayout(8, 4096)) == []


async def test_the_tiers_description_counts_the_store_it_does_not_read(tmp_path: Path) -> None:
    make_store(tmp_path, 8192)
    config = {
        "block_size": 4096,
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": 4},
            {
                "name": "disk",
                "medium": "disk",
                "capacity": 8,
                "path": str(tmp_path),
                "layout": "slots",  # the per-block store says the stores beside it
            },
        ],
    }
    async with Hierarchy.from_config(config) as h:
        disk = next(tier for tier in h.tiers if tier.name == "disk")
        assert disk.where.endswith(", 1 other store beside it)"), disk.where
