"""A tier that cannot be opened (issue 9, item 3 and the hierarchy's side of item 2): with
`strict = false` it is left out, logged and listed, and the hierarchy serves with the rest;
with `strict = true` (the default since issue 19, item 6) the open fails; either way a
failed open releases all it opened, the disk lock included."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from hierarchy_helpers import BLOCK, LAYOUTS, blocks_of, chain_config, key, tier_store

from kvtier import Hierarchy
from kvtier.errors import DiskLockedError, DiskTierError, KvtierError
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk.facade import StoreFacade

by_layout = pytest.mark.parametrize("layout", LAYOUTS)


def two_disks(tmp_path: Path, strict: bool, layout: str) -> dict[str, Any]:
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=32, layout=layout)
    config["strict"] = strict
    config["tiers"].append(
        {
            "name": "cold",
            "medium": "disk",
            "capacity": 64,
            "path": str(tmp_path / "cold"),
            "layout": layout,
        }
    )
    return config


def hold_lock(path: Path, num_blocks: int, layout: str) -> StoreFacade:
    """A store holding the lock of the disk tier at `path`, as another running kvtier would."""
    return tier_store(layout, path, num_blocks)


@by_layout
async def test_a_locked_disk_tier_is_disabled_and_the_rest_serve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, layout: str
) -> None:
    holder = hold_lock(tmp_path / "cold", 64, layout)
    try:
        with caplog.at_level(logging.ERROR, logger="kvtier"):
            async with Hierarchy.from_config(two_disks(tmp_path, False, layout)) as h:
                assert [tier.name for tier in h.tiers] == ["cpu", "disk"]
                reason = h.stats().disabled_tiers["cold"]
                assert "DiskLockedError" in reason and str(holder.path) in reason
                assert h.disabled_tiers == h.stats().disabled_tiers
                ks = [key(i) for i in range(20)]
                assert await h.put(ks, blocks_of(ks)) == 20
                assert torch.equal(await h.get(ks), blocks_of(ks))
        assert any("tier 'cold' disabled" in record.message for record in caplog.records)
    finally:
        holder.close()


@by_layout
async def test_strict_fails_the_open_and_releases_what_it_opened(
    tmp_path: Path, layout: str
) -> None:
    holder = hold_lock(tmp_path / "cold", 64, layout)
    try:
        with pytest.raises(DiskLockedError):
            await Hierarchy.from_config(two_disks(tmp_path, True, layout)).open()
    finally:
        holder.close()
    # The first disk tier opened before the second failed: its lock was given back.
    tier_store(layout, tmp_path / "disk", 32).close()


@by_layout
async def test_a_disk_path_that_is_a_file_disables_only_that_tier(
    tmp_path: Path, layout: str
) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=32, layout=layout)
    config["strict"] = False
    (tmp_path / "disk").write_text("not a directory")
    async with Hierarchy.from_config(config) as h:
        assert [tier.name for tier in h.tiers] == ["cpu"]
        assert "not a directory" in h.disabled_tiers["disk"]
        assert await h.put([key(1)], blocks_of([key(1)])) == 1


@by_layout
async def test_when_no_tier_opens_the_open_fails_and_says_why(tmp_path: Path, layout: str) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=None, disk=32, layout=layout)
    config["strict"] = False
    (tmp_path / "disk").write_text("not a directory")
    with pytest.raises(KvtierError, match=r"no tier of the chain could be opened: disk: "):
        await Hierarchy.from_config(config).open()


async def test_a_damaged_store_is_a_disabled_tier_not_a_crash(tmp_path: Path) -> None:
    # The per-block store's header file (the log layout's damaged files: test_disk_log.py).
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=32, layout="slots")
    async with Hierarchy.from_config(config) as h:
        assert await h.put([key(1)], blocks_of([key(1)])) == 1
    store_dir = next((tmp_path / "disk").glob("kvtier-*"))
    # The header file of another model's store: the layout it records is not this one's.
    other = DiskStore(tmp_path / "x", block_size=BLOCK, num_blocks=32, model_id="other")
    (store_dir / "headers.bin").write_bytes((other.path / "headers.bin").read_bytes())
    other.close()
    config["strict"] = False
    async with Hierarchy.from_config(config) as h:
        assert [tier.name for tier in h.tiers] == ["cpu"]
        assert "DiskLayoutError" in h.disabled_tiers["disk"]
    config["strict"] = True
    with pytest.raises(DiskTierError, match=r"tier 'disk'.*refusing to serve its blocks"):
        await Hierarchy.from_config(config).open()


async def test_a_chain_with_no_tier_active_here_says_so(tmp_path: Path) -> None:
    config = {
        "block_size": BLOCK,
        "tiers": [{"name": "g", "medium": "gpu", "capacity": 4, "enabled": "auto"}],
    }
    if torch.cuda.is_available():
        pytest.skip("an auto GPU tier is active where CUDA is")
    with pytest.raises(KvtierError, match="no active tier here"):
        await Hierarchy.from_config(config).open()
