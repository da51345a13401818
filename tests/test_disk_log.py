"""LogStore (`layout = "log"`): the BlockStorage suite, then what the log layout promises:
restart from the checkpoint and the regions written since, reclaiming by region with every
live block kept, forgets that survive a restart, the old format refused, faults as misses."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from disk_helpers import BLOCK, assert_intact, k, open_or_skip, open_small, read, write, write_ok

from kvtier.errors import DiskLayoutError, DiskTierError
from kvtier.keys import OffloadKey
from kvtier.testing.storage import StorageTests
from kvtier.tiers.disk.jobs import WriteJob
from kvtier.tiers.disk.log_format import PAGE
from kvtier.tiers.disk.log_store import LogStore
from kvtier.tiers.disk.testing import deterministic_block
from kvtier.tiers.storage import BlockStorage, ReadFailure

pytestmark = pytest.mark.timeout(120)


def open_log(directory: Path, **kwargs: Any) -> LogStore:
    return open_small(LogStore, directory, **kwargs)


class LogStorageTests(StorageTests):
    compression: ClassVar[str] = "none"
    direct_io: ClassVar[bool] = False

    def make_storage(self, num_blocks: int, block_size: int, tmp_path: Path) -> BlockStorage:
        return open_or_skip(
            LogStore, tmp_path / "disk", num_blocks, block_size, self.compression, self.direct_io
        )

    def backdoor_read(self, storage: BlockStorage, slot: int) -> bytes:
        assert isinstance(storage, LogStore)
        row = storage._index.row(slot)
        assert row is not None
        buffer = np.empty(storage.block_size, dtype=np.uint8)
        assert storage._reader.read([row.key], [slot], [buffer]) == [None]
        return buffer.tobytes()

    def backdoor_write(
        self, storage: BlockStorage, key: OffloadKey, slot: int, data: bytes
    ) -> None:
        assert isinstance(storage, LogStore)
        buffer = np.frombuffer(data, dtype=np.uint8).copy()
        assert storage._lane.commit([WriteJob([key], [slot], [buffer], None)]) == [[None]]


class TestLogStoreRaw(LogStorageTests):
    pass


class TestLogStoreZstd(LogStorageTests):
    compression = "zstd"


class TestLogStoreDirect(LogStorageTests):
    direct_io = True


# --------------------------------------------------------------------------------------------
# Restart, reclaiming, forgets
# --------------------------------------------------------------------------------------------


async def test_reopened_store_restores_every_block_oldest_first(tmp_path: Path) -> None:
    store = open_log(tmp_path)
    await write_ok(store, [10, 11, 12], [5, 0, 9])
    await write_ok(store, [13], [1])
    await store.aclose()
    again = open_log(tmp_path)
    try:
        assert [(b.key, b.slot) for b in again.restore()] == [
            (k(10), 5),
            (k(11), 0),
            (k(12), 9),
            (k(13), 1),
        ]
        assert again.opened.from_checkpoint and again.opened.scanned_records == 0
        await assert_intact(again, [10, 11, 12, 13], [5, 0, 9, 1])
    finally:
        await again.aclose()


async def test_restart_without_a_checkpoint_scans_the_regions(tmp_path: Path) -> None:
    store = open_log(tmp_path)
    await write_ok(store, [1, 2, 3], [0, 1, 2])
    await store.forget([k(2)])
    await write_ok(store, [4], [0])  # slot 0 written over
    store._lane.close()  # as a killed process: no last checkpoint
    store._files.close()
    again = open_log(tmp_path)
    try:
        assert not again.opened.from_checkpoint
        assert sorted((b.key, b.slot) for b in again.restore()) == [(k(3), 2), (k(4), 0)]
        await assert_intact(again, [3, 4], [2, 0])
        results, _ = await read(again, [1, 2], [0, 1])
        assert results == [ReadFailure.NOT_INDEXED] * 2
    finally:
        await again.aclose()


async def test_reclaiming_keeps_every_live_block_through_many_overwrites(tmp_path: Path) -> None:
    store = open_log(tmp_path, num_blocks=32)
    model: dict[int, int] = {}
    rng = random.Random(3)
    try:
        for step in range(120):
            slots = rng.sample(range(32), 4)
            ids = [step * 10 + i for i in range(4)]
            await write_ok(store, ids, slots)
            model.update(zip(slots, ids, strict=True))
        assert store.moved_bytes > 0, "no region was reclaimed"
        assert store._lane.opened > store.num_regions
        await assert_intact(store, list(model.values()), list(model))
        assert len(store) == len(model)
    finally:
        await store.aclose()
    again = open_log(tmp_path, num_blocks=32)
    try:
        assert sorted((b.slot, b.key) for b in again.restore()) == sorted(
            (slot, k(i)) for slot, i in model.items()
        )
        await assert_intact(again, list(model.values()), list(model))
    finally:
        await again.aclose()


async def test_an_lru_workload_moves_little(tmp_path: Path) -> None:
    """Slots written over oldest first (an LRU tier's evictions): regions empty as they age,
    so reclaiming moves almost nothing (write amplification near 1)."""
    store = open_log(tmp_path, num_blocks=64)
    try:
        for step in range(40):
            ids = list(range(step * 16, step * 16 + 16))
            await write_ok(store, ids, [i % 64 for i in ids])
        assert store.write_amplification < 1.2, store.write_amplification
    finally:
        await store.aclose()


async def test_a_log_store_of_the_old_format_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """A format-3 store (named by its fingerprint, no layout.json) is refused by the disk
    tier's opener, the one place that looks, in one line: what it is, its bytes, that it
    cannot be migrated, and what starting empty loses. Nothing is created beside it."""
    from hierarchy_helpers import chain_config

    from kvtier import Hierarchy
    from kvtier.config_fields import readable_size
    from kvtier.tiers.disk.log_format import log_fingerprint
    from kvtier.tiers.disk.neighbours import bytes_on_disk

    older = tmp_path / "disk" / f"kvtier-log-{log_fingerprint(BLOCK, '', 3)}"
    older.mkdir(parents=True)
    (older / "regions.bin").write_bytes(b"\1" * 8192)
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=32, layout="log")
    with pytest.raises(DiskLayoutError) as caught:
        await Hierarchy.from_config(config).open()
    message = str(caught.value)
    assert "\n" not in message and str(older) in message and "format 3" in message
    assert "neither read nor migrate" in message and "remove that directory" in message
    assert (
        "blocks are lost" in message
        and f"holding {readable_size(bytes_on_disk(older))} " in message
    )
    assert [p.name for p in (tmp_path / "disk").iterdir()] == [older.name]
    # `kvtier check` of that tier says the same instead of "nothing stored yet".
    from click.testing import CliRunner

    from kvtier.cli import main

    config_path = tmp_path / "chain.toml"
    config_path.write_text(
        f'block_size = {BLOCK}\n[[tiers]]\nname = "disk"\nmedium = "disk"\ncapacity = 32\n'
        f'path = "{tmp_path / "disk"}"\n'
    )
    checked = CliRunner().invoke(main, ["check", "--config", str(config_path)])
    assert checked.exit_code == 4, checked.output
    assert "cannot check" in checked.output and "format 3" in checked.output
    # The store itself does not look (tools and tests open it directly beside anything).
    open_log(tmp_path / "disk").close()


@pytest.mark.parametrize("torn", ["header", "payload"])
async def test_a_torn_group_after_a_crash_is_a_miss_never_wrong_bytes(
    tmp_path: Path, torn: str
) -> None:
    """A group written after the last checkpoint, then damaged as a crash mid-write would
    leave it: a torn header page loses the whole group (the scan stops there), a torn
    payload loses its block alone; every other block is intact."""
    store = open_log(tmp_path)
    await write_ok(store, [1, 2], [0, 1])
    await store.aclose()  # the checkpoint covers blocks 1 and 2
    store = open_log(tmp_path)
    await write_ok(store, [3, 4], [2, 3])  # one group, scanned at the next open
    first, second = store._index.row(2), store._index.row(3)
    assert first is not None and second is not None
    store._lane.close()  # as a killed process: no last checkpoint
    store._files.close()
    if torn == "header":  # an entry in the group's header page, just before its payloads
        at = store._files.base(first.region) + first.offset - PAGE + 100
    else:
        at = store._files.base(second.region) + second.offset + 100
    with open(store._files.root / "regions.bin", "r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 0x40]))
    again = open_log(tmp_path)
    try:
        await assert_intact(again, [1, 2], [0, 1])
        lost = [3, 4] if torn == "header" else [4]
        kept = [i for i in (3, 4) if i not in lost]
        await assert_intact(again, kept, [i - 1 for i in kept])
        results, _ = await read(again, lost, [i - 1 for i in lost])
        assert results == [ReadFailure.NOT_INDEXED] * len(lost)
        if torn == "payload":
            assert any("interrupted write" in problem for problem in again.opened.problems)
    finally:
        await again.aclose()


async def test_a_damaged_region_header_loses_its_blocks_never_serves_them(tmp_path: Path) -> None:
    store = open_log(tmp_path, num_blocks=8)
    await write_ok(store, [1, 2], [0, 1])
    region = int(store._index.region[0])
    path, base = store._files.root / "regions.bin", store._files.base(region)
    store._lane.close()
    store._files.close()
    with open(path, "r+b") as file:
        file.seek(base + 8)
        file.write(b"\xff\xff")
    again = open_log(tmp_path, num_blocks=8)
    try:
        assert any("damaged" in problem for problem in again.opened.problems)
        results, _ = await read(again, [1, 2], [0, 1])
        assert results == [ReadFailure.NOT_INDEXED] * 2
        await write_ok(again, [3], [0])
        await assert_intact(again, [3], [0])
    finally:
        await again.aclose()


async def test_a_truncated_regions_file_and_a_rotten_byte_are_misses(tmp_path: Path) -> None:
    store = open_log(tmp_path, num_blocks=64)
    ids = list(range(64))
    for first in range(0, 64, 8):
        await write_ok(store, ids[first : first + 8], ids[first : first + 8])
    await store.aclose()
    path = store._files.root / "regions.bin"
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(store.region_bytes * 2)  # the regions past the second are cut off
    again = open_log(tmp_path, num_blocks=64)
    try:
        restored = {b.slot for b in again.restore()}
        held = [i for i in ids if i in restored]
        gone = [i for i in ids if i not in restored]
        assert gone, "the truncation cut nothing"
        await assert_intact(again, held, held)
        results, _ = await read(again, gone, gone)
        assert results == [ReadFailure.NOT_INDEXED] * len(gone)
        assert path.stat().st_size == size  # grown back
        if held:
            row = again._index.row(held[0])
            assert row is not None
            with open(path, "r+b") as file:
                file.seek(again._files.base(row.region) + row.payload_offset + 100)
                file.write(b"\x00\x01\x02")
            results, _ = await read(again, held[:1], held[:1])
            assert results == [ReadFailure.CHECKSUM]
            report = again.check(repair=True)
            assert len(report.problems) == 1 and report.repaired == 1
    finally:
        await again.aclose()


async def test_write_failures_fail_their_blocks_and_nothing_else(tmp_path: Path) -> None:
    from kvtier.tiers.disk import FaultyIO

    io = FaultyIO()
    store = open_log(tmp_path, io=io)
    try:
        await write_ok(store, [1], [0])
        io.inject("pwritev", errno.ENOSPC)
        results = await store.write(
            [k(2), k(3)], [1, 2], [deterministic_block(i, BLOCK) for i in (2, 3)]
        )
        assert all(isinstance(result, OSError) for result in results)
        io.clear()
        await write_ok(store, [4], [3])
        await assert_intact(store, [1, 4], [0, 3])
        misses, _ = await read(store, [2, 3], [1, 2])
        assert misses == [ReadFailure.NOT_INDEXED] * 2
    finally:
        await store.aclose()


async def test_a_failed_fdatasync_leaves_the_index_as_before_the_group(tmp_path: Path) -> None:
    """The lane plans a group's index changes while its writes and fdatasync run: when the
    sync fails, none of them is made. A key the group moved to another slot is still found
    in its old one, a slot it wrote over still holds its old block, and its new slots are
    misses; the next group is indexed as usual."""
    from kvtier.tiers.disk import FaultyIO

    io = FaultyIO()
    store = open_log(tmp_path, io=io)
    try:
        await write_ok(store, [1, 2], [0, 1])
        io.inject("fsync", errno.EIO, times=1)
        results = await store.write(
            [k(1), k(7)], [3, 1], [deterministic_block(i, BLOCK) for i in (1, 7)]
        )
        assert all(isinstance(result, OSError) for result in results)
        assert store._index.find(k(1)) == 0 and len(store) == 2
        await assert_intact(store, [1, 2], [0, 1])
        misses, _ = await read(store, [1, 7], [3, 1])
        assert misses == [ReadFailure.NOT_INDEXED] * 2
        await write_ok(store, [1, 7], [3, 1])
        assert store._index.find(k(1)) == 3 and len(store) == 2
        await assert_intact(store, [1, 7], [3, 1])
    finally:
        await store.aclose()


# --------------------------------------------------------------------------------------------
# kill -9 in a loop while regions are reclaimed
# --------------------------------------------------------------------------------------------

_SLOTS = 48
_WRITER = f"""
import asyncio, os, random, signal, sys
from kvtier.keys import key_from_int
from kvtier.tiers.disk import FileIO
from kvtier.tiers.disk.log_store import LogStore
from kvtier.tiers.disk.testing import deterministic_block

class TornIO(FileIO):
    calls = 0
    def pwritev(self, fd, buffers, offset):
        TornIO.calls += 1
        if TornIO.calls == TEAR_AT:
            data = b"".join(bytes(buffer) for buffer in buffers)
            os.pwrite(fd, data[: len(data) // 2], offset)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().pwritev(fd, buffers, offset)

def slot(i):
    return random.Random(i // 4).sample(range({_SLOTS}), 4)[i % 4]

async def main():
    store = LogStore(sys.argv[1], block_size={BLOCK}, num_blocks={_SLOTS}, direct_io=False,
                     compression=sys.argv[2], io=TornIO(), fsync=sys.argv[5] == "1")
    store.checkpoint_every = 3
    store.checkpoint_min_bytes = 0
    first = int(sys.argv[4])
    while True:
        groups = [list(range(first + g * 4, first + (g + 1) * 4)) for g in range(3)]
        print("begin", groups[-1][-1], flush=True)
        writes = [
            store.write([key_from_int(i) for i in group], [slot(i) for i in group],
                        [deterministic_block(i, {BLOCK}) for i in group])
            for group in groups
        ]
        results = await asyncio.gather(*writes)
        done = [i for g, r in zip(groups, results) for i, e in zip(g, r) if e is None]
        print("stored", *done, "moved", store.moved_bytes, flush=True)
        first += 12

TEAR_AT = int(sys.argv[3])
asyncio.run(main())
"""


def _slot(i: int) -> int:
    """The slot of block `i`: random, distinct within each batch of four."""
    return random.Random(i // 4).sample(range(_SLOTS), 4)[i % 4]


def _run_writer(
    directory: Path, compression: str, tear_at: int, first: int, bursts: int, fsync: bool
) -> tuple[set[int], int, int]:
    """Run the writer until `bursts` bursts are reported (then SIGKILL it) or it tears a
    write and kills itself; (ids reported stored, last id attempted, bytes moved)."""
    import signal
    import subprocess
    import sys
    import threading

    child = subprocess.Popen(
        [
            *(sys.executable, "-c", _WRITER, str(directory), compression, str(tear_at)),
            *(str(first), "1" if fsync else "0"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stored: set[int] = set()
    attempted = first - 1
    moved = 0
    seen = 0

    def take(line: str) -> None:
        nonlocal attempted, moved, seen
        if not line.endswith("\n"):  # torn by the kill: not a report (its write not begun)
            return
        words = line.split()
        if words and words[0] == "begin":
            attempted = int(words[1])
        elif words and words[0] == "stored":
            stored.update(int(w) for w in words[1:-2])
            moved = int(words[-1])
            seen += 1

    watchdog = threading.Timer(60, child.kill)
    watchdog.start()
    try:
        assert child.stdout is not None and child.stderr is not None
        while tear_at or seen < bursts:
            line = child.stdout.readline()
            if not line:
                break
            take(line)
        if not tear_at:
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
        for line in child.stdout:
            take(line)
        errors = child.stderr.read()
    finally:
        watchdog.cancel()
        child.kill()
        child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert child.returncode == -signal.SIGKILL, errors
    return stored, attempted, moved


@pytest.mark.parametrize(
    ("compression", "tear_at", "fsync"),
    [("none", 0, True), ("zstd", 0, True), ("none", 23, True), ("none", 0, False)],
    ids=["killed-raw", "killed-zstd", "torn-write-raw", "killed-raw-no-fsync"],
)
async def test_kill_loop_during_reclaim_loses_no_stored_block_and_serves_no_wrong_one(
    tmp_path: Path, compression: str, tear_at: int, fsync: bool
) -> None:
    """A writer over 48 slots in small regions (reclaiming all the time) is killed with
    SIGKILL again and again (or tears its 23rd write in half and kills itself), reopened
    each time; every block reported stored and not written over since is restored intact,
    and no block ever attempted reads as anything but itself or a miss."""
    stored: set[int] = set()
    attempted = -1
    moved = 0
    rounds = 1 if tear_at else 4
    for number in range(rounds):
        got, attempted, moved_now = _run_writer(
            tmp_path, compression, tear_at, attempted + 1, bursts=8 + 3 * number, fsync=fsync
        )
        stored |= got
        moved = max(moved, moved_now)
        store = open_log(tmp_path, num_blocks=_SLOTS, compression=compression)
        try:
            restored = {int.from_bytes(b.key[:8], "big"): b.slot for b in store.restore()}
            assert all(_slot(i) == slot and i <= attempted for i, slot in restored.items())
            last: dict[int, int] = {}
            for i in range(attempted + 1):
                last[_slot(i)] = i
            survivors = {i for i in stored if last[_slot(i)] == i}
            assert survivors <= set(restored), sorted(survivors - set(restored))
            await assert_intact(store, list(restored), list(restored.values()))
            for first in range(0, attempted + 1, 4):
                ids = list(range(first, min(first + 4, attempted + 1)))
                results, buffers = await read(store, ids, [_slot(i) for i in ids])
                for i, result, buffer in zip(ids, results, buffers, strict=True):
                    if result is None:
                        assert np.array_equal(buffer, deterministic_block(i, BLOCK)), i
        finally:
            await store.aclose()
    if not tear_at:
        assert moved > 0, "no region was reclaimed before a kill"


# --------------------------------------------------------------------------------------------
# In a chain: `layout = "log"` in a config, a restart served from the compact restored view
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["lru", "arc"])
async def test_a_restarted_chain_on_the_log_layout_serves_cold_blocks(
    tmp_path: Path, policy: str
) -> None:
    import torch
    from hierarchy_helpers import blocks_of, chain_config, key

    from kvtier import Hierarchy
    from kvtier.manager import TierManager

    config = chain_config(
        tmp_path, gpu=None, cpu=2, disk=8, policy=policy, write_policy="write-through"
    )
    config["tiers"][-1]["layout"] = "log"
    ks = [key(i) for i in range(8)]
    async with Hierarchy.from_config(config) as h:
        assert isinstance(h._open().storages[-1], LogStore)
        for i in range(8):
            assert await h.put([ks[i]], blocks_of([ks[i]])) == 1
            await h.drain()
    async with Hierarchy.from_config(config) as h:
        disk = h._open().manager.tiers[-1]
        assert isinstance(disk, TierManager)
        assert len(disk) == 8 and disk.num_cold == 8
        assert torch.equal(await h.get([ks[0]]), blocks_of([ks[0]]))
        new = key(100)
        assert await h.put([new], blocks_of([new])) == 1
        await h.drain()
        assert h.where(ks[1]) is None  # the oldest restored block not used since made room
        assert all(h.where(k) is not None for k in [new, ks[0], *ks[2:]])
        h.check()


@pytest.mark.parametrize("how", ["removed", "replaced"])
async def test_a_store_whose_regions_file_is_taken_fails_closed(tmp_path: Path, how: str) -> None:
    store = open_log(tmp_path)
    try:
        await write_ok(store, [1], [0])
        path = store._files.root / "regions.bin"
        path.unlink()
        if how == "replaced":
            path.write_bytes(bytes(store.region_bytes))
        results = await store.write([k(2)], [1], [deterministic_block(2, BLOCK)])
        assert isinstance(results[0], OSError) and results[0].errno == errno.ESTALE
        assert store.disabled_reason is not None and how in store.disabled_reason
        assert len(store) == 0 and k(1) not in store
        misses, _ = await read(store, [1, 2], [0, 1])
        assert misses == [ReadFailure.IO_ERROR] * 2
    finally:
        await store.aclose()


async def test_a_read_only_filesystem_is_one_clear_error_or_failed_stores(
    tmp_path: Path,
) -> None:
    """EROFS opening the regions file fails the open with one line; EROFS on writes (the
    filesystem remounted read-only while open) fails those stores, and reads go on."""
    from kvtier.tiers.disk import FaultyIO

    io = FaultyIO()
    io.inject("open", errno.EROFS, path_suffix="regions.bin")
    with pytest.raises(DiskTierError, match=r"cannot open .*regions\.bin") as caught:
        open_log(tmp_path, io=io)
    assert "\n" not in str(caught.value)
    io.clear()
    store = open_log(tmp_path, io=io)
    try:
        await write_ok(store, [1], [0])
        io.inject("pwritev", errno.EROFS)
        results = await store.write([k(2)], [1], [deterministic_block(2, BLOCK)])
        assert isinstance(results[0], OSError) and results[0].errno == errno.EROFS
        await assert_intact(store, [1], [0])
    finally:
        await store.aclose()


async def test_enospc_while_reclaiming_fails_groups_and_keeps_every_stored_block(
    tmp_path: Path,
) -> None:
    from kvtier.tiers.disk import FaultyIO

    io = FaultyIO()
    store = open_log(tmp_path, num_blocks=32, io=io)
    model: dict[int, int] = {}
    rng = random.Random(5)
    failed = 0
    try:
        for step in range(150):
            if step == 60:
                io.inject("pwritev", errno.ENOSPC, times=6)
            slots = rng.sample(range(32), 4)
            ids = [step * 10 + i for i in range(4)]
            blocks = [deterministic_block(i, BLOCK) for i in ids]
            results = await store.write([k(i) for i in ids], slots, blocks)
            for slot, i, result in zip(slots, ids, results, strict=True):
                if result is None:
                    model[slot] = i
                else:
                    failed += 1
        assert failed > 0 and store.moved_bytes > 0
        held = [slot for slot in model if store._index.row(slot) is not None]
        await assert_intact(store, [model[slot] for slot in held], held)
        assert len(held) == len(model)  # a failed write leaves the slot's last stored block
    finally:
        await store.aclose()


async def test_a_checkpoint_newer_than_the_regions_serves_no_wrong_byte(tmp_path: Path) -> None:
    """The regions file put back as it was before later writes (a restored backup), under
    the checkpoint of those writes: each block reads as itself or a counted miss."""
    import shutil

    store = open_log(tmp_path, num_blocks=32)
    for first in range(0, 32, 4):
        await write_ok(store, list(range(first, first + 4)), list(range(first, first + 4)))
    await store.aclose()
    path = store._files.root / "regions.bin"
    shutil.copy(path, tmp_path / "backup")
    store = open_log(tmp_path, num_blocks=32)
    for first in range(100, 196, 4):
        ids = list(range(first, first + 4))
        await write_ok(store, ids, [i % 32 for i in ids])
    await store.aclose()
    shutil.copy(tmp_path / "backup", path)
    again = open_log(tmp_path, num_blocks=32)
    try:
        served = 0
        for newest in (range(0, 32), range(164, 196)):
            ids = list(newest)
            results, buffers = await read(again, ids, [i % 32 for i in ids])
            for i, result, buffer in zip(ids, results, buffers, strict=True):
                if result is None:
                    served += 1
                    assert np.array_equal(buffer, deterministic_block(i, BLOCK)), i
        assert again.stats.read_failures or served == 32
    finally:
        await again.aclose()


# --------------------------------------------------------------------------------------------
# `kvtier check` of a log store
# --------------------------------------------------------------------------------------------


def test_kvtier_check_reports_and_repairs_a_damaged_log_store(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kvtier.cli import main
    from kvtier.config import load_config
    from kvtier.tiers.disk.kind import DiskTierConfig

    config_path = tmp_path / "chain.toml"
    config_path.write_text(
        f'block_size = {BLOCK}\nmodel_id = "m"\n[[tiers]]\nname = "ssd"\nmedium = "disk"\n'
        f'capacity = 16\nlayout = "log"\npath = "{tmp_path / "tier"}"\n'
    )
    config = load_config(config_path)
    tier = config.tiers[-1]
    assert isinstance(tier, DiskTierConfig) and tier.layout == "log"
    store = LogStore.from_config(tier, config.block_size, config.model_id)
    ids = list(range(6))
    blocks = [deterministic_block(i, BLOCK) for i in ids]
    assert not any(asyncio.run(store.write([k(i) for i in ids], ids, blocks)))
    row = store._index.row(2)
    assert row is not None
    at = store._files.base(row.region) + row.payload_offset + 10
    store.close()
    with open(store._files.root / "regions.bin", "r+b") as file:
        file.seek(at)
        file.write(b"\x55\xaa")

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(main, ["check", *args])
        return result.exit_code, result.stdout + result.stderr

    code, out = run("--config", str(config_path))
    assert code == 1, out
    assert "6 blocks checked" in out and "checksum" in out
    code, out = run("--config", str(config_path), "--repair")
    assert code == 3, out
    code, out = run(str(tmp_path / "tier"))
    assert code == 0, out
    assert "5 blocks checked" in out


@pytest.mark.parametrize("checkpointed", [True, False])
async def test_a_key_moved_to_another_slot_is_restored_only_in_its_newest(
    tmp_path: Path, checkpointed: bool
) -> None:
    store = open_log(tmp_path)
    await write_ok(store, [7, 8], [1, 2])
    if checkpointed:
        await store.aclose()
        store = open_log(tmp_path)
    await write_ok(store, [7], [5])  # the same key, another slot: slot 1 no longer holds it
    assert k(7) in store and store._index.find(k(7)) == 5
    store._lane.close()  # killed: no checkpoint of the move
    store._files.close()
    again = open_log(tmp_path)
    try:
        assert sorted((b.slot, b.key) for b in again.restore()) == [(2, k(8)), (5, k(7))]
        assert again._index.find(k(7)) == 5
        await assert_intact(again, [7, 8], [5, 2])
        misses, _ = await read(again, [7], [1])
        assert misses == [ReadFailure.NOT_INDEXED]
    finally:
        await again.aclose()


async def test_a_checkpoint_shrinks_the_key_dict_and_every_key_is_still_found(
    tmp_path: Path,
) -> None:
    store = open_log(tmp_path, num_blocks=64)
    store.checkpoint_every = store.checkpoint_records = 1 << 30  # none in the background
    try:
        for first in range(0, 64, 8):
            await write_ok(store, list(range(first, first + 8)), list(range(first, first + 8)))
        assert len(store._index.written) == 64
        before = store.index_bytes()
        store.checkpoint()
        assert not store._index.written and store.index_bytes() < before
        await write_ok(store, [100, 3], [3, 40])  # 3 moved from slot 3 to 40; 100 in slot 3
        assert all(k(i) in store for i in [*range(3), *range(4, 40), *range(41, 64), 100, 3])
        assert store._index.find(k(3)) == 40 and store._index.find(k(40)) is None
        await store.forget([k(5)])
        assert k(5) not in store
        await assert_intact(store, [100, 3, 6], [3, 40, 6])
    finally:
        await store.aclose()


async def test_a_large_read_is_one_call_whose_runs_go_over_the_read_threads(
    tmp_path: Path,
) -> None:
    """A batch of many runs is one call to a read thread, which reads the runs with the
    other read threads at once (two preadvs in flight together, or the first would wait
    forever at the barrier), one preadv a run; every block is still verified on its own:
    a rotten byte in one is a checksum failure, the rest are exact."""
    import mmap
    import threading
    from collections.abc import Sequence

    from kvtier.tiers.disk.io import FileIO, IOBuffer
    from kvtier.tiers.disk.log_reader import RUN_BYTES

    class MeetingIO(FileIO):
        """The first two preadvs of the read wait for each other."""

        def __init__(self) -> None:
            self.meet: threading.Barrier | None = None
            self.reads = 0
            self._lock = threading.Lock()

        def preadv(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
            with self._lock:
                self.reads += 1
                meet = self.meet if self.reads <= 2 else None
            if meet is not None:
                meet.wait()
            return super().preadv(fd, buffers, offset)

    block = 64 << 10
    runs = 6
    count = runs * RUN_BYTES // block
    io = MeetingIO()
    store = open_log(
        tmp_path, block_size=block, num_blocks=count, max_workers=4, io=io, direct_io="auto"
    )
    try:
        ids = list(range(count))
        await write_ok(store, ids, ids)
        row = store._index.row(count // 2)
        assert row is not None
        with open(store._files.root / "regions.bin", "r+b") as file:
            file.seek(store._files.base(row.region) + row.offset + 11)
            file.write(b"\xee")
        pool = np.frombuffer(mmap.mmap(-1, count * block), dtype=np.uint8).reshape(count, block)
        io.meet, io.reads = threading.Barrier(2, timeout=30), 0
        results = await store.read([k(i) for i in ids], ids, list(pool))
        calls = io.reads
        expected: list[ReadFailure | None] = [None] * count
        expected[count // 2] = ReadFailure.CHECKSUM
        assert results == expected
        # one preadv a run (the regions' header pages may cut a run in two), then the
        # rotten block read again alone
        assert runs + 1 <= calls <= 2 * runs + 1
        for i in ids:
            if expected[i] is None:
                assert np.array_equal(pool[i], deterministic_block(i, block)), i
    finally:
        await store.aclose()


def test_bad_arguments_are_one_clear_error(tmp_path: Path) -> None:
    from kvtier.errors import InvalidValueError

    for bad in ({"max_workers": 0}, {"region_bytes": 5000}, {"spare": 9}, {"fsync": "yes"}):
        with pytest.raises(InvalidValueError, match=next(iter(bad))):
            open_log(tmp_path, **bad)


@pytest.mark.parametrize("block", [8192, 12288])
async def test_a_record_never_crosses_its_region_when_reclaiming_fills_the_new_one(
    tmp_path: Path, block: int
) -> None:
    """Few regions, each holding a handful of blocks: opening a region reclaims another
    into it, which may leave no room for the record that asked; it goes to the next."""
    store = open_log(tmp_path, block_size=block, num_blocks=8, direct_io="auto")
    try:
        for group in range(24):
            ids = list(range(group * 8, group * 8 + 8))
            await write_ok(store, ids, list(range(8)))
        await assert_intact(store, ids, list(range(8)))
    finally:
        await store.aclose()


async def test_a_group_that_writes_every_slot_over_moves_nothing(tmp_path: Path) -> None:
    """Reclaiming skips the old records of the slots the running group writes over: a store
    rewritten whole, group after group, moves no byte (write amplification 1)."""
    store = open_log(tmp_path, num_blocks=64)
    try:
        for group in range(12):
            ids = list(range(group * 64, group * 64 + 64))
            await write_ok(store, ids, list(range(64)))
        assert store.moved_bytes == 0 and store._lane.opened > store.num_regions
        await assert_intact(store, ids, list(range(64)))
    finally:
        await store.aclose()


async def test_a_groups_first_part_is_cut_for_every_write_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's first part is written as pieces of FIRST_PIECE_BYTES at least (every write
    thread starts: a lone call of a few MiB is not one `pwritev`), its later parts as pieces
    of WRITE_PIECE_BYTES; every block reads back."""
    from kvtier.tiers.disk import log_files
    from kvtier.tiers.disk.log_files import WRITE_PIECE_BYTES, WRITE_THREADS
    from kvtier.tiers.disk.log_lane import FIRST_PIECE_BYTES

    parts: list[list[Any]] = []  # each part's payload pieces, as written
    spread = log_files.spread

    def recorded(ops: list[Any], threads: int = WRITE_THREADS) -> list[list[Any]]:
        parts.append(ops)
        return spread(ops, threads)

    monkeypatch.setattr(log_files, "spread", recorded)
    block = 16 << 10
    store = open_log(tmp_path, num_blocks=4096, block_size=block, region_bytes=16 << 20)
    try:
        for call, count in enumerate((448, 1536)):  # 7 MiB: one part; 24 MiB: several
            ids = list(range(call * 4096, call * 4096 + count))
            parts.clear()
            await write_ok(store, ids, [i % 4096 for i in ids])
            sizes = [sum(op.nbytes for op in ops) for ops in parts]
            assert sum(sizes) == count * block
            assert (len(parts) == 1) == (count == 448)
            assert len(parts[0]) == min(WRITE_THREADS, sizes[0] // FIRST_PIECE_BYTES) > 1
            for ops, nbytes in zip(parts[1:], sizes[1:], strict=True):
                assert len(ops) == max(1, min(WRITE_THREADS, nbytes // WRITE_PIECE_BYTES))
            await assert_intact(store, ids, [i % 4096 for i in ids])
    finally:
        await store.aclose()


@pytest.mark.parametrize("fault", [False, True])
async def test_groups_in_flight_keep_every_stored_block_across_a_crash(
    tmp_path: Path, fault: bool
) -> None:
    """Calls that cannot share a group (each also writes key 999) queue up and run as
    groups one after another, placed while the ones before are still being written and
    synced. Whatever is reported stored reads intact, and still after a crash (no
    checkpoint); with a write failing on the way, the groups placed after it in the same
    region fail too rather than be reported stored where a restart's scan never reaches
    (a failed block may come back after the restart, as its own bytes, or be a miss)."""
    from kvtier.tiers.disk import FaultyIO

    io = FaultyIO()
    store = open_log(tmp_path, num_blocks=64, io=io)
    store.checkpoint_every = store.checkpoint_records = 1 << 30  # none in the background
    await write_ok(store, [500], [40])
    if fault:
        io.inject("pwritev", errno.EIO, times=1)
    calls = [
        store.write(
            [k(j), k(999)], [j, 32 + j % 2], [deterministic_block(i, BLOCK) for i in (j, 999)]
        )
        for j in range(24)
    ]
    results = await asyncio.gather(*calls)
    stored = [j for j, result in enumerate(results) if result[0] is None]
    assert all((r[0] is None) == (r[1] is None) for r in results)
    assert (len(stored) < 24) == fault
    await assert_intact(store, [500, *stored], [40, *stored])
    store._lane.close()  # as a killed process: no last checkpoint
    store._files.close()
    again = open_log(tmp_path, num_blocks=64)
    try:
        await assert_intact(again, [500, *stored], [40, *stored])
        lost = [j for j in range(24) if j not in stored]
        misses, buffers = await read(again, lost, lost)
        for j, result, buffer in zip(lost, misses, buffers, strict=True):
            assert result in (None, ReadFailure.NOT_INDEXED), j
            if result is None:  # a failed write whose bytes all landed: still its own
                assert np.array_equal(buffer, deterministic_block(j, BLOCK)), j
    finally:
        await again.aclose()


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("direct_io", [False, "auto"])
async def test_a_batch_read_verifies_each_block_of_a_run(
    tmp_path: Path, direct_io: bool | str, aligned: bool
) -> None:
    """Blocks written together lie back to back and are read with one preadv (straight
    into page-aligned buffers with O_DIRECT, through a staging buffer into others); each is
    still verified on its own: a rotten payload is a checksum failure, a key the slot does
    not hold is a miss, and every other block of the batch is intact."""
    import mmap

    store = open_log(tmp_path, num_blocks=16, direct_io=direct_io)
    try:
        ids = list(range(12))
        await write_ok(store, ids, ids)
        row = store._index.row(5)
        assert row is not None
        with open(store._files.root / "regions.bin", "r+b") as file:
            file.seek(store._files.base(row.region) + row.offset + 7)
            file.write(b"\xee")
        keys = [k(i) for i in ids]
        keys[9] = k(99)  # slot 9 holds block 9, not 99
        if aligned:
            pool = np.frombuffer(mmap.mmap(-1, 12 * BLOCK), dtype=np.uint8).reshape(12, BLOCK)
            buffers = [pool[i] for i in ids]
        else:
            buffers = [np.zeros(BLOCK + 1, dtype=np.uint8)[1:] for _ in ids]
        results = await store.read(keys, ids, buffers)
        expected: list[ReadFailure | None] = [None] * 12
        expected[5], expected[9] = ReadFailure.CHECKSUM, ReadFailure.NOT_INDEXED
        assert results == expected
        for i in ids:
            if expected[i] is None:
                assert np.array_equal(buffers[i], deterministic_block(i, BLOCK)), i
    finally:
        await store.aclose()


@pytest.mark.parametrize("layout", ["log", "slots"])
async def test_damage_stored_blocks_makes_every_block_a_checksum_failure(
    tmp_path: Path, layout: str
) -> None:
    """The engine and SGLang lanes' damage helper, on both layouts: after it, the store opens
    as before and every block it holds reads as a checksum failure, never its bytes."""
    from kvtier.tiers.disk import DiskStore
    from kvtier.tiers.disk.testing import damage_stored_blocks

    def opened() -> LogStore | DiskStore:
        if layout == "log":
            return open_log(tmp_path, num_blocks=16)
        return DiskStore(tmp_path, block_size=BLOCK, num_blocks=16, direct_io=False)

    ids = list(range(6))
    store = opened()
    await write_ok(store, ids, ids)
    await store.aclose()
    assert damage_stored_blocks(tmp_path, step=256, at=0) > 0
    again = opened()
    try:
        assert sorted(b.slot for b in again.restore()) == ids
        buffers = [np.zeros(BLOCK, dtype=np.uint8) for _ in ids]
        results = await again.read([k(i) for i in ids], ids, buffers)
        assert results == [ReadFailure.CHECKSUM] * len(ids)
    finally:
        await again.aclose()


@pytest.mark.parametrize("direct_io", [False, "auto"])
async def test_a_small_batch_reads_neighbours_with_one_call_and_checks_each(
    tmp_path: Path, direct_io: bool | str
) -> None:
    """A batch of a few blocks (looked up scalar by scalar, not with the arrays) reads the
    blocks that lie back to back with one preadv, straight into page-aligned buffers, and
    still verifies each: a rotten payload is a checksum failure, a key its slot does not
    hold a miss, a single block read alone is intact."""
    import mmap
    import threading
    from collections.abc import Sequence

    from kvtier.tiers.disk.io import FileIO, IOBuffer
    from kvtier.tiers.disk.log_reader import SMALL_BATCH

    class CountingIO(FileIO):
        def __init__(self) -> None:
            self.reads = 0
            self._lock = threading.Lock()

        def preadv(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
            with self._lock:
                self.reads += 1
            return super().preadv(fd, buffers, offset)

    io = CountingIO()
    store = open_log(tmp_path, num_blocks=16, direct_io=direct_io, io=io)
    try:
        ids = list(range(12))
        await write_ok(store, ids, ids)
        pool = np.frombuffer(mmap.mmap(-1, 4 * BLOCK), dtype=np.uint8).reshape(4, BLOCK)
        buffers = [pool[i] for i in range(4)]
        assert SMALL_BATCH > 3
        before = io.reads
        assert await store.read([k(6), k(7), k(8)], [6, 7, 8], buffers[:3]) == [None] * 3
        assert io.reads - before == 1  # one run: one preadv
        for i, buffer in zip([6, 7, 8], buffers, strict=False):
            assert np.array_equal(buffer, deterministic_block(i, BLOCK)), i
        assert await store.read([k(11)], [11], buffers[:1]) == [None]
        assert np.array_equal(buffers[0], deterministic_block(11, BLOCK))
        row = store._index.row(5)
        assert row is not None
        with open(store._files.root / "regions.bin", "r+b") as file:
            file.seek(store._files.base(row.region) + row.offset + 7)
            file.write(b"\xee")
        results = await store.read([k(2), k(3), k(99), k(5)], [2, 3, 9, 5], buffers)
        assert results == [None, None, ReadFailure.NOT_INDEXED, ReadFailure.CHECKSUM]
        for i, buffer in zip([2, 3], buffers, strict=False):
            assert np.array_equal(buffer, deterministic_block(i, BLOCK)), i
    finally:
        await store.aclose()


@pytest.mark.parametrize("seed", [26, 28, 29])
async def test_a_mid_group_flush_never_makes_the_group_its_own_victim(
    tmp_path: Path, seed: int
) -> None:
    """Groups of random slots in a store with little spare space flush mid-group (the
    clean regions run out), after which the regions the group already wrote hold its own
    new blocks, indexed. A reclaim later in the group must not pick one of them as its
    victim: it drops a victim's records of the slots the group writes (as old copies), so
    it would drop blocks reported stored. Every block stored reads back after every call."""
    rng = random.Random(seed)
    store = open_log(tmp_path, num_blocks=64, block_size=16 << 10, spare=0.05)
    held: dict[int, int] = {}  # slot -> block
    try:
        for call in range(30):
            slots = rng.sample(range(64), rng.choice([8, 16, 30, 48, 64]))
            ids = list(range(call * 64, call * 64 + len(slots)))
            await write_ok(store, ids, slots)
            held.update(zip(slots, ids, strict=True))
            await assert_intact(store, list(held.values()), list(held))
    finally:
        await store.aclose()


@pytest.mark.parametrize("seed", range(3))
async def test_failed_syncs_mid_group_and_at_its_end_keep_the_index_true(
    tmp_path: Path, seed: int
) -> None:
    """Groups that flush mid-group (little spare space) with an `fdatasync` failing now and
    then, at the flush or at the group's end: the blocks reported stored read back, and a
    slot whose new block failed still holds its old one (the failed part's planned index
    changes were dropped, none made)."""
    from kvtier.tiers.disk import FaultyIO

    def inject(call: int, io: Any) -> None:
        if call % 3 == 2:
            io.inject("fsync", errno.EIO, times=1)

    io = FaultyIO()
    store = open_log(tmp_path, io=io, num_blocks=64, block_size=16 << 10, spare=0.05)
    try:
        failed = await _calls_keep_the_index_true(
            store, io, random.Random(seed), [8, 16, 30, 48, 64], inject
        )
        assert failed > 0
    finally:
        await store.aclose()


async def _calls_keep_the_index_true(
    store: Any, io: Any, rng: random.Random, sizes: list[int], inject: Any
) -> int:
    """30 calls of random slots (a size from `sizes` each), `inject(call, io)` before each:
    after every call the blocks reported stored (and the old blocks of slots whose new one
    failed) read back and the store counts exactly those. How many blocks failed."""
    held: dict[int, int] = {}  # slot -> block
    failed = 0
    for call in range(30):
        slots = rng.sample(range(64), rng.choice(sizes))
        ids = list(range(call * 64, call * 64 + len(slots)))
        inject(call, io)
        results = await write(store, ids, slots)
        io.clear()
        for slot, block, result in zip(slots, ids, results, strict=True):
            if result is None:
                held[slot] = block
            else:
                failed += 1
        await assert_intact(store, list(held.values()), list(held))
        assert len(store) == len(held)
    return failed


@pytest.mark.parametrize("seed", range(3))
async def test_failed_writes_around_early_flushes_keep_the_index_true(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups that flush mid-group on the sync thread while the lane goes on placing (an
    early flush: little spare space, calls one at a time) with a call's first write or
    first fdatasync (an early flush's, when one ran) failing now and then: the blocks
    reported stored read back, a slot whose new block failed still holds its old one, and
    the store's count stays that of the blocks held. Early flushes ran. (A write failing
    after a mid-group flush can drop the old blocks of slots a later part writes, early
    flush or not: docs/BENCHMARKS.md, "Log writes on a fast device, second round".)"""
    from kvtier.tiers.disk import FaultyIO
    from kvtier.tiers.disk.log_lane import LogLane

    early = 0
    flushed = LogLane._flushed

    def counted(lane: LogLane, done: Any) -> None:
        nonlocal early
        early += threading.current_thread().name.startswith("kvtier-log-sync")
        flushed(lane, done)

    monkeypatch.setattr(LogLane, "_flushed", counted)

    def inject(call: int, io: Any) -> None:
        if call % 3 == 1:  # the call's first write: before any early flush
            io.inject("pwritev", errno.EIO, path_suffix="regions.bin", times=1)
        elif call % 3 == 2:  # its first fdatasync: an early flush's, when one ran
            io.inject("fsync", errno.EIO, times=1)

    io = FaultyIO()
    store = open_log(tmp_path, io=io, num_blocks=64, block_size=16 << 10, spare=0.05)
    try:
        failed = await _calls_keep_the_index_true(
            store, io, random.Random(seed), [32, 48, 64], inject
        )
        assert failed > 0
        assert early > 0
    finally:
        await store.aclose()


async def test_a_lone_queued_call_is_its_group_unless_cancelled(tmp_path: Path) -> None:
    """A lone queued call is its group (`take_group` builds no sets for it); a lone call
    cancelled while queued is dropped, the queue emptied; behind a call, the sets still keep
    a later call on one of its keys out of its group."""
    from collections import deque

    store = open_log(tmp_path)
    try:
        loop = asyncio.get_running_loop()
        rows = [deterministic_block(1, BLOCK)]
        job = WriteJob([k(1)], [1], rows, loop.create_future())
        queue: deque[Any] = deque([job])
        assert store._lane._take_group(queue) == [job] and not queue
        gone = WriteJob([k(2)], [2], rows, loop.create_future())
        assert gone.future is not None
        gone.future.cancel()
        queue.append(gone)
        assert store._lane._take_group(queue) == [] and not queue
        both = [WriteJob([k(3)], [3], rows, None), WriteJob([k(4)], [4], rows, None)]
        queue.extend(both)
        assert store._lane._take_group(queue) == both and not queue
        again = [*both, WriteJob([k(3)], [5], rows, None)]
        queue.extend(again)
        assert store._lane._take_group(queue) == both and list(queue) == again[2:]
    finally:
        await store.aclose()
