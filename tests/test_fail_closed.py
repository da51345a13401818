"""A disk tier fails closed when the ground moves under it (issue 19, item 5).

Measured before: after `rm -rf` of an open disk tier's directory, 485 puts of 4 blocks all
said stored, and none was there after a restart (writes went on into unlinked files, and
the lock went with the directory). Now the group that finds its files removed or replaced
(directory, slab, header or index file, lock file removed or replaced) reports none of its
blocks stored, and the store disables itself: writes fail, reads are misses, it claims no
block and gives its files back; the hierarchy lists it in `stats().disabled_tiers` with the
reason and drops its blocks from the bookkeeping; reopening the path starts from what is
really there. Real directories, real unlinks: no fault injection."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hierarchy_helpers import BLOCK, LAYOUTS, blocks_of, chain_config, key, store_class

import kvtier.hierarchy
from kvtier import Hierarchy
from kvtier.errors import DiskTierError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.testing.storage import empty_buffers
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk.facade import StoreFacade
from kvtier.tiers.disk.testing import deterministic_block
from kvtier.tiers.storage import ReadFailure


def k(i: int) -> OffloadKey:
    return key_from_int(i)


def open_store(directory: Path, layout: str = "slots", **kwargs: Any) -> StoreFacade:
    options: dict[str, Any] = {"block_size": BLOCK, "num_blocks": 16, "direct_io": False}
    options.update(kwargs)
    return store_class(layout)(directory, **options)


async def write(disk: StoreFacade, ids: list[int], slots: list[int]) -> list[OSError | None]:
    buffers = [deterministic_block(i, BLOCK) for i in ids]
    return await disk.write([k(i) for i in ids], slots, buffers)


async def read(disk: StoreFacade, ids: list[int], slots: list[int]) -> list[ReadFailure | None]:
    buffers = empty_buffers(len(ids), BLOCK)
    results = await disk.read([k(i) for i in ids], slots, buffers)
    for i, buffer, result in zip(ids, buffers, results, strict=True):
        if result is None:
            assert np.array_equal(buffer, deterministic_block(i, BLOCK)), f"block {i} differs"
    return results


def open_descriptors_under(path: Path) -> list[str]:
    """The files under `path` this process holds open (Linux: /proc/self/fd; elsewhere
    nothing is known, and [] is returned)."""
    found: list[str] = []
    if not os.path.isdir("/proc/self/fd"):
        return found
    for name in os.listdir("/proc/self/fd"):
        with_target = os.path.join("/proc/self/fd", name)
        try:
            target = os.readlink(with_target)
        except OSError:
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found


# -- the store ----------------------------------------------------------------------------------


def remove_directory(disk: StoreFacade) -> None:
    shutil.rmtree(disk.path)


def remove_lock(disk: StoreFacade) -> None:
    (disk.path / "lock").unlink()


def replace_lock(disk: StoreFacade) -> None:
    (disk.path / "lock").unlink()
    (disk.path / "lock").write_bytes(b"")  # what a second store's open would create


def remove_index(disk: DiskStore) -> None:
    shutil.rmtree(disk.path / "index")


def remove_slab(disk: DiskStore) -> None:
    (disk.path / "slab-00000.bin").unlink()


def remove_headers(disk: DiskStore) -> None:
    (disk.path / "headers.bin").unlink()


def remove_regions(disk: StoreFacade) -> None:
    (disk.path / "regions.bin").unlink()


GROUND = {
    "directory": (remove_directory, "lock file"),
    "lock removed": (remove_lock, "lock file"),
    "lock replaced": (replace_lock, "replaced by another file"),
    "index": (remove_index, "index file"),
    "slab file": (remove_slab, "slab file"),
    "header file": (remove_headers, "header file"),
}
"""What is taken from a per-block store, and the words its reason names it by."""

LOG_GROUND = {
    "directory": (remove_directory, "regions.bin was removed"),
    "regions file": (remove_regions, "regions.bin was removed"),
    "lock removed": (remove_lock, "lock file"),
    "lock replaced": (replace_lock, "replaced by another file"),
}
"""The same for a log store (its files: the lock and the regions file)."""

CASES = [pytest.param("slots", what, id=f"slots-{what}") for what in GROUND] + [
    pytest.param("log", what, id=f"log-{what}") for what in LOG_GROUND
]


@pytest.mark.parametrize(("layout", "what"), CASES)
async def test_a_store_whose_files_are_taken_reports_no_block_stored(
    tmp_path: Path, layout: str, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    take, named = (LOG_GROUND if layout == "log" else GROUND)[what]
    disk = open_store(tmp_path, layout)
    try:
        assert await write(disk, [0, 1, 2, 3], [0, 1, 2, 3]) == [None] * 4
        assert disk.disabled_reason is None
        take(disk)
        with caplog.at_level(logging.ERROR, logger="kvtier.disk"):
            results = await write(disk, [4, 5], [4, 5])
        assert all(isinstance(r, OSError) and r.errno == errno.ESTALE for r in results), results
        reason = disk.disabled_reason
        assert reason is not None and named in reason, reason
        lines = [r.getMessage() for r in caplog.records if "disabled" in r.getMessage()]
        assert len(lines) == 1 and named in lines[0], lines
        # Disabled for good: writes fail, reads are misses, it claims nothing.
        assert all(isinstance(r, OSError) for r in await write(disk, [6], [6]))
        assert await read(disk, [0, 1, 4], [0, 1, 4]) == [ReadFailure.IO_ERROR] * 3
        assert len(disk) == 0 and disk.restore() == []
        await disk.forget([k(0)])  # nothing to forget, no error
        with pytest.raises(DiskTierError, match="disabled"):
            disk.check()
        assert "disabled" in repr(disk)
        assert disk.stats.write_failures == 3
        # Its files are given back at once (so is the space of removed ones).
        assert open_descriptors_under(disk.path) == []
        assert disk.keys() == []
    finally:
        await disk.aclose()
    assert disk.closed
    # The path opens again, and every block it claims then reads back as its own bytes.
    again = open_store(tmp_path, layout)
    try:
        held = {block.key: block.slot for block in again.restore()}
        ids = [i for i in range(7) if k(i) in held]
        assert await read(again, ids, [held[k(i)] for i in ids]) == [None] * len(ids)
        assert await write(again, [9], [9]) == [None]
        assert again.disabled_reason is None
    finally:
        again.close()


@pytest.mark.timeout(60)
async def test_a_second_log_store_opened_after_the_lock_was_removed_disables_the_first(
    tmp_path: Path,
) -> None:
    """The lock file removed under an open store lets a second one open the same files: the
    first one's next group fails and disables it (it writes nothing more there), the second
    serves, and every block claimed afterwards reads back as its own bytes. (Log layout
    only: the per-block store's LMDB index cannot be opened twice in one process; its lock
    file cases are above.)"""
    layout = "log"
    first = open_store(tmp_path, layout)
    try:
        assert await write(first, [0, 1], [0, 1]) == [None, None]
        remove_lock(first)
        second = open_store(tmp_path, layout)  # the lock is free: nothing refuses it
        try:
            assert await write(second, [2, 3], [2, 3]) == [None, None]
            results = await write(first, [4, 5], [4, 5])
            assert all(isinstance(r, OSError) and r.errno == errno.ESTALE for r in results)
            reason = first.disabled_reason
            assert reason is not None and "lock file" in reason, reason
            assert second.disabled_reason is None
            assert await read(second, [2, 3], [2, 3]) == [None, None]
        finally:
            second.close()
    finally:
        await first.aclose()
    again = open_store(tmp_path, layout)
    try:
        held = {block.key: block.slot for block in again.restore()}
        assert k(2) in held and k(3) in held
        ids = [i for i in range(6) if k(i) in held]
        assert await read(again, ids, [held[k(i)] for i in ids]) == [None] * len(ids)
    finally:
        again.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", LAYOUTS)
async def test_reads_in_flight_when_the_files_are_taken_are_blocks_or_misses(
    tmp_path: Path, layout: str
) -> None:
    """Reads keep running while the directory is removed and a write group finds it: each
    read is its block's own bytes or a miss, none raises, and the files are closed once the
    store disabled itself (no descriptor closed under a read: a reused one would be read)."""
    disk = open_store(tmp_path, layout, num_blocks=64)
    try:
        ids = list(range(64))
        assert await write(disk, ids, ids) == [None] * 64
        stop = asyncio.Event()
        outcomes: list[ReadFailure | None] = []

        async def reader(first: int) -> None:
            while not stop.is_set():
                part = [(first + i) % 64 for i in range(8)]
                outcomes.extend(await read(disk, part, part))  # (verifies the bytes served)
                await asyncio.sleep(0)  # (a disabled store answers without waiting)

        readers = [asyncio.create_task(reader(first)) for first in range(0, 64, 8)]
        await asyncio.sleep(0)
        remove_directory(disk)
        results = await write(disk, [0], [0])
        assert isinstance(results[0], OSError) and disk.disabled_reason is not None
        stop.set()
        await asyncio.gather(*readers)
        assert all(r is None or isinstance(r, ReadFailure) for r in outcomes)
        assert await read(disk, [1, 2], [1, 2]) == [ReadFailure.IO_ERROR] * 2
        assert open_descriptors_under(disk.path) == []
    finally:
        await disk.aclose()


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_after_rm_rf_the_reopened_path_starts_empty(tmp_path: Path, layout: str) -> None:
    disk = open_store(tmp_path, layout)
    assert await write(disk, [0, 1], [0, 1]) == [None, None]
    shutil.rmtree(disk.path)
    assert all(r is not None for r in await write(disk, [2, 3], [2, 3]))
    await disk.aclose()
    again = open_store(tmp_path, layout)
    try:
        assert again.restore() == [] and len(again) == 0
    finally:
        again.close()


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_a_moved_directory_disables_the_store(tmp_path: Path, layout: str) -> None:
    disk = open_store(tmp_path / "a", layout, create_parents=True)
    try:
        assert await write(disk, [0], [0]) == [None]
        (tmp_path / "a").rename(tmp_path / "b")  # the files live on, not at the store's path
        assert all(r is not None for r in await write(disk, [1], [1]))
        assert disk.disabled_reason is not None and "was removed" in disk.disabled_reason
    finally:
        await disk.aclose()


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_writes_queued_before_the_loss_fail_too(tmp_path: Path, layout: str) -> None:
    """Calls that join the write lane's queue before the group that finds the loss fail
    with it or after it, never stored."""
    disk = open_store(tmp_path, layout)
    try:
        assert await write(disk, [0], [0]) == [None]
        shutil.rmtree(disk.path)
        results = await asyncio.gather(*(write(disk, [i], [i]) for i in range(1, 9)))
        assert all(r[0] is not None for r in results), results
    finally:
        await disk.aclose()


async def test_a_store_that_keeps_its_files_is_not_disabled(tmp_path: Path) -> None:
    """The checks never fire on an untouched store: a stray file beside it, a forget, many
    groups across several slab files."""
    disk = open_store(tmp_path, num_blocks=64, slab_file_bytes=8 * BLOCK)
    try:
        (disk.path / "notes.txt").write_text("an unrelated file")
        for first in range(0, 64, 8):
            ids = list(range(first, first + 8))
            assert await write(disk, ids, ids) == [None] * 8
        await disk.forget([k(0), k(1)])
        assert disk.disabled_reason is None and len(disk) == 62
    finally:
        disk.close()


# -- the hierarchy ------------------------------------------------------------------------------


def disk_only(tmp_path: Path, layout: str, **options: Any) -> dict[str, Any]:
    """One disk tier of `layout`, as kvtier's chain below vLLM's CPU tier is."""
    config = chain_config(tmp_path, gpu=None, cpu=None, disk=64, layout=layout)
    config["tiers"][0].update(options)
    return config


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_rm_rf_under_an_open_hierarchy_fails_the_puts_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, layout: str
) -> None:
    config = disk_only(tmp_path, layout)
    before = [key(i) for i in range(8)]
    after = [key(100 + i) for i in range(40)]
    async with Hierarchy.from_config(config) as h:
        assert await h.put(before, blocks_of(before)) == 8
        assert h.lookup(before) == 8
        (store_dir,) = (tmp_path / "disk").glob("kvtier-*")
        shutil.rmtree(store_dir)
        with caplog.at_level(logging.WARNING, logger="kvtier"):
            stored = 0
            for first in range(0, len(after), 4):
                part = after[first : first + 4]
                stored += await h.put(part, blocks_of(part))
            stats = h.stats()
        assert stored == 0
        assert stats.calls.put_failed == len(after) and stats.calls.put_stored == 8
        reason = stats.disabled_tiers["disk"]
        assert reason.startswith("disabled while open:") and str(store_dir) in reason
        assert h.disabled_tiers == stats.disabled_tiers
        assert "disabled: disk" in repr(h)
        # Nothing claims a block the tier no longer has: lookups and gets are misses.
        assert h.lookup(before) == 0 and h.lookup(after) == 0
        assert (await h.get(before)).shape[0] == 0
        assert all(h.where(k) is None for k in before + after)
        detected = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(detected) == 1
        assert all("disabled while open" in r.getMessage() for r in detected)
        logged = [r for r in caplog.records if "serving without" in r.getMessage()]
        assert len(logged) == 1 and "'disk'" in logged[0].getMessage()
    # Reopening the path starts empty: nothing is claimed that is not there.
    async with Hierarchy.from_config(config) as h:
        assert h.disabled_tiers == {}
        assert h.lookup(before) == 0 and h.lookup(after) == 0
        assert await h.put(after[:4], blocks_of(after[:4])) == 4


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_a_deleted_lock_file_disables_the_tier_and_reopening_serves_only_real_blocks(
    tmp_path: Path, layout: str
) -> None:
    config = disk_only(tmp_path, layout)
    first = [key(i) for i in range(8)]
    later = [key(50 + i) for i in range(8)]
    async with Hierarchy.from_config(config) as h:
        assert await h.put(first, blocks_of(first)) == 8
        (store_dir,) = (tmp_path / "disk").glob("kvtier-*")
        (store_dir / "lock").unlink()
        assert await h.put(later, blocks_of(later)) == 0
        assert "lock file" in h.stats().disabled_tiers["disk"]
        assert h.lookup(first) == 0
    async with Hierarchy.from_config(config) as h:
        # The directory was intact: what the index holds is there, and reads back as itself.
        # The group that found the lock gone committed nothing: per block, `later` was never
        # indexed; in a log its records are in the regions file, durable before the check
        # (self-describing, verified), so the restart's scan finds them: reported failed,
        # found later, never a wrong byte.
        assert h.lookup(first) == 8
        assert h.lookup(later) == (8 if layout == "log" else 0)
        held = first + (later if layout == "log" else [])
        assert torch.equal(await h.get(held), blocks_of(held))


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_a_lost_bottom_tier_leaves_the_memory_tier_serving(
    tmp_path: Path, layout: str
) -> None:
    """cpu -> disk: after rm -rf, demotions into the disk fail (counted), the cpu tier goes
    on serving, and no block is ever found in the disk tier again."""
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=32, layout=layout)
    async with Hierarchy.from_config(config) as h:
        early = [key(i) for i in range(16)]  # more than cpu holds: half demoted to disk
        assert await h.put(early, blocks_of(early)) == 16
        await h.drain()
        assert h.where(early[0]) == "disk"
        (store_dir,) = (tmp_path / "disk").glob("kvtier-*")
        shutil.rmtree(store_dir)
        late = [key(100 + i) for i in range(16)]
        for first in range(0, 16, 4):
            part = late[first : first + 4]
            assert await h.put(part, blocks_of(part)) == 4  # the cpu tier takes them
            await h.drain()
        stats = h.stats()
        assert "disk" in stats.disabled_tiers
        assert stats.failed_blocks > 0  # the demotions into the lost tier
        everything = early + late
        assert all(h.where(k) != "disk" for k in everything)
        assert stats.tiers[1].used == 0  # the disk tier's bookkeeping holds nothing
        held = [k for k in everything if h.where(k) == "cpu"]
        assert held and torch.equal(await h.get(held), blocks_of(held))


async def test_the_disabled_tiers_are_logged_by_stats_at_most_once_per_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = disk_only(tmp_path, "log")
    async with Hierarchy.from_config(config) as h:
        (store_dir,) = (tmp_path / "disk").glob("kvtier-*")
        shutil.rmtree(store_dir)
        assert await h.put([key(1)], blocks_of([key(1)])) == 0
        with caplog.at_level(logging.WARNING, logger="kvtier.hierarchy"):
            for _ in range(5):
                h.stats()
        assert sum("serving without" in r.getMessage() for r in caplog.records) == 1
        monkeypatch.setattr(kvtier.hierarchy, "DISABLED_LOG_INTERVAL_S", 0.0)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kvtier.hierarchy"):
            for _ in range(3):
                h.stats()
        assert sum("serving without" in r.getMessage() for r in caplog.records) == 3
