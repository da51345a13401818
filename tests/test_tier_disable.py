"""A tier that cannot be opened (issue 9, item 3): the cases tests/test_hierarchy_disable.py
does not cover. A tier dropped from the middle of a chain leaves a working chain; a tier whose
bookkeeping (its restore) fails after its store opened is disabled like one whose store did
not open; and every way an open can fail after a disk store opened (strict, a failing
restore, the staging arena, bad options, a cancellation, a close that raises) gives the
store's lock back, so the same directory opens again at once."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from hierarchy_helpers import LAYOUTS, blocks_of, chain_config, key, store_class, tier_store

from kvtier import Hierarchy
from kvtier.engine.staging import StagingArena
from kvtier.errors import DiskLockedError, DiskTierError, InvalidValueError, KvtierError
from kvtier.tiers.disk.facade import StoreFacade

pytestmark = pytest.mark.parametrize("layout", LAYOUTS)


def cpu_disk_cold(tmp_path: Path, layout: str, *, strict: bool = False) -> dict[str, Any]:
    """cpu (8) -> disk (16) -> cold (disk, 64), both disk tiers of `layout` under
    `tmp_path`."""
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=16, layout=layout)
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


def reopen(path: Path, num_blocks: int, layout: str) -> None:
    """Open and close a store of `layout` at `path`: raises DiskLockedError while another
    holds it."""
    tier_store(layout, path, num_blocks).close()


async def test_a_tier_dropped_from_the_middle_leaves_a_working_chain(
    tmp_path: Path, layout: str, caplog: pytest.LogCaptureFixture
) -> None:
    holder = tier_store(layout, tmp_path / "disk", 16)
    ks = [key(i) for i in range(40)]  # more than cpu holds: demotions go to 'cold'
    try:
        with caplog.at_level(logging.ERROR, logger="kvtier"):
            async with Hierarchy.from_config(cpu_disk_cold(tmp_path, layout)) as h:
                assert [tier.name for tier in h.tiers] == ["cpu", "cold"]
                assert list(h.disabled_tiers) == ["disk"]
                assert "disabled: disk" in repr(h)
                assert await h.put(ks, blocks_of(ks)) == 40
                await h.drain()
                assert h.where(ks[0]) == "cold"
                assert torch.equal(await h.get(ks), blocks_of(ks))
        lines = [r.getMessage() for r in caplog.records if "disabled" in r.getMessage()]
        assert len(lines) == 1 and "'disk'" in lines[0] and "DiskLockedError" in lines[0]
    finally:
        holder.close()
    # The chain without 'disk' was a valid chain: what it flushed to 'cold' is there, and
    # with 'disk' back the full chain serves it.
    async with Hierarchy.from_config(cpu_disk_cold(tmp_path, layout)) as h:
        assert h.disabled_tiers == {}
        assert torch.equal(await h.get(ks), blocks_of(ks))


def fail_restore(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    def restore(self: StoreFacade) -> Any:
        raise DiskTierError(f"{self.path}: index unreadable (test)")

    cls = store_class(layout)
    monkeypatch.setattr(cls, "restore", restore)
    monkeypatch.setattr(cls, "restore_cold", restore)  # what a chain calls


async def test_a_tier_whose_restore_fails_is_disabled_and_its_lock_given_back(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_restore(monkeypatch, layout)
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=16, layout=layout)
    config["strict"] = False
    async with Hierarchy.from_config(config) as h:
        assert [tier.name for tier in h.tiers] == ["cpu"]
        assert "index unreadable (test)" in h.disabled_tiers["disk"]
        reopen(tmp_path / "disk", 16, layout)  # the store opened, then was closed again
        assert await h.put([key(1)], blocks_of([key(1)])) == 1


async def test_strict_a_failing_restore_fails_the_open_and_frees_the_lock(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_restore(monkeypatch, layout)
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=16, layout=layout)
    config["strict"] = True
    h = Hierarchy.from_config(config)
    with pytest.raises(DiskTierError, match="index unreadable"):
        await h.open()
    assert h.closed
    reopen(tmp_path / "disk", 16, layout)


async def test_strict_a_locked_bottom_tier_frees_the_tier_opened_before_it(
    tmp_path: Path,
    layout: str,
) -> None:
    holder = tier_store(layout, tmp_path / "cold", 64)
    try:
        with pytest.raises(DiskLockedError):
            await Hierarchy.from_config(cpu_disk_cold(tmp_path, layout, strict=True)).open()
    finally:
        holder.close()
    reopen(tmp_path / "disk", 16, layout)
    async with Hierarchy.from_config(cpu_disk_cold(tmp_path, layout, strict=True)) as h:
        assert [tier.name for tier in h.tiers] == ["cpu", "disk", "cold"]


async def test_no_staging_memory_is_a_clear_error_and_frees_the_disk_tier(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_memory(cls: type[StagingArena], staging_bytes: int, block_size: int) -> Any:
        raise MemoryError("no memory (test)")

    monkeypatch.setattr(StagingArena, "sized", classmethod(no_memory))
    h = Hierarchy.from_config(chain_config(tmp_path, gpu=None, cpu=8, disk=16, layout=layout))
    with pytest.raises(KvtierError, match=r"cannot allocate the staging arena .*staging_bytes"):
        await h.open()
    assert h.closed
    reopen(tmp_path / "disk", 16, layout)


async def test_options_a_tier_does_not_take_fail_the_open_even_when_not_strict(
    tmp_path: Path,
    layout: str,
) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=16, layout=layout)
    h = Hierarchy.from_config(config, tier_options={"disk": {"max_workerz": 2}})
    with pytest.raises(
        InvalidValueError, match=r"tier 'disk'.*tier_options\['disk'\].*max_workerz"
    ):
        await h.open()
    assert h.disabled_tiers == {}  # a caller's mistake, not a tier to leave out
    # An option the config already sets (direct_io) is refused the same way.
    h = Hierarchy.from_config(config, disk_options={"direct_io": False})
    with pytest.raises(InvalidValueError, match="direct_io"):
        await h.open()
    reopen(tmp_path / "disk", 16, layout)


async def test_a_cancelled_open_gives_the_disk_lock_back(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = threading.Event()
    go_on = threading.Event()
    kind = store_class(layout)
    real = kind.from_config.__func__  # type: ignore[attr-defined]

    def slow_open(cls: type[StoreFacade], *args: Any, **kwargs: Any) -> StoreFacade:
        store: StoreFacade = real(cls, *args, **kwargs)
        opened.set()
        go_on.wait(10)  # the open is cancelled while its thread still runs
        return store

    monkeypatch.setattr(kind, "from_config", classmethod(slow_open))
    h = Hierarchy.from_config(chain_config(tmp_path, gpu=None, cpu=8, disk=16, layout=layout))
    opening = asyncio.create_task(h.open())
    assert await asyncio.to_thread(opened.wait, 10)
    opening.cancel()
    await asyncio.sleep(0.05)
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await opening
    assert h.closed
    reopen(tmp_path / "disk", 16, layout)


async def test_a_tier_that_fails_to_close_does_not_keep_the_next_one_open(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Hierarchy.from_config(cpu_disk_cold(tmp_path, layout), flush_on_close=False)
    await h.open()
    first = h.storages[1]

    async def broken_close() -> None:
        raise OSError("close failed (test)")

    monkeypatch.setattr(first, "aclose", broken_close)
    with pytest.raises(OSError, match="close failed"):
        await h.close()
    assert h.closed
    reopen(tmp_path / "cold", 64, layout)  # closed although the tier above it failed to close
    monkeypatch.undo()
    await first.aclose()
