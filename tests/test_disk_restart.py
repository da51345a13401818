"""A restarted disk tier serves at once: its records are settled as arrays at open and held
compactly (tiers/disk/cold.py), their keys loaded in the background, and the tier's
bookkeeping holds the restored blocks in a cold set outside its policy (manager/cold.py).

Invariants, not timings (the figures are `python -m kvtier_tools.bench.disk_restart`'s): a restored
block is served with its bytes before the background load has finished; a record the open
drops is never served; the memory kept per restored block is bounded; the bookkeeping of every
policy stays consistent as cold blocks are used, evicted and discarded."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import BlockStateError
from kvtier.keys import MAX_KEY_BYTES, OffloadKey, key_from_int
from kvtier.manager.tier import TierManager, make_tier_manager
from kvtier.policies.registry import POLICIES
from kvtier.specs.base import BlockIDsLoadStoreSpec
from kvtier.tiers.disk import DiskStore, index_check
from kvtier.tiers.disk.cold import ColdRecords
from kvtier.tiers.disk.index import BlockIndex
from kvtier.tiers.disk.index_check import PROBED_KEYS_SUFFIX, ProbedKeys, probe_index
from kvtier.tiers.disk.inflight import InflightLog
from kvtier.tiers.disk.layout import IndexRecord
from kvtier.tiers.disk.testing import damage_every_page

BLOCK = 512


def k(i: int) -> OffloadKey:
    return key_from_int(i)


def data(i: int) -> np.ndarray:
    return np.full(BLOCK, i % 251, dtype=np.uint8)


def open_store(tmp_path: Path, num_blocks: int) -> DiskStore:
    return DiskStore(
        tmp_path, block_size=BLOCK, num_blocks=num_blocks, fsync=False, direct_io=False
    )


async def fill(tmp_path: Path, count: int, num_blocks: int | None = None) -> None:
    """Blocks 0..count-1 (key i in slot i), then a clean close."""
    disk = open_store(tmp_path, num_blocks or count)
    try:
        for first in range(0, count, 1024):
            ids = list(range(first, min(count, first + 1024)))
            failures = await disk.write([k(i) for i in ids], ids, [data(i) for i in ids])
            assert not any(failures)
    finally:
        await disk.aclose()


async def read(disk: DiskStore, i: int, slot: int) -> np.ndarray | None:
    out = np.zeros(BLOCK, dtype=np.uint8)
    (failure,) = await disk.read([k(i)], [slot], [out])
    return None if failure is not None else out


def loaded(disk: DiskStore) -> bool:
    return disk.loaded


@pytest.fixture
def held_loader(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold every background load of restored keys until the event is set."""
    release = threading.Event()
    load_keys = ColdRecords.load_keys

    def held(self: ColdRecords, index: object) -> None:
        while not release.wait(0.01) and not self.stop.is_set():
            pass
        load_keys(self, index)  # type: ignore[arg-type]

    monkeypatch.setattr(ColdRecords, "load_keys", held)
    return release


async def test_a_restored_block_is_served_before_the_background_load_ends(
    tmp_path: Path, held_loader: threading.Event
) -> None:
    await fill(tmp_path, 64)
    disk = open_store(tmp_path, 64)
    try:
        assert not loaded(disk)
        assert disk.record(k(5)) is not None and disk.record(k(5)).slot == 5  # type: ignore[union-attr]
        out = await read(disk, 5, 5)
        assert out is not None and np.array_equal(out, data(5))
        assert await read(disk, 5, 6) is None  # another slot: never another block's bytes
        assert not loaded(disk)
        held_loader.set()
        await disk.wait_loaded()
        assert disk.loaded
        assert sorted(disk.keys()) == sorted(k(i) for i in range(64))
    finally:
        held_loader.set()
        await disk.aclose()


async def test_a_write_over_a_restored_block_waits_for_its_key_and_replaces_it(
    tmp_path: Path, held_loader: threading.Event
) -> None:
    await fill(tmp_path, 8)
    disk = open_store(tmp_path, 8)
    try:
        writing = asyncio.ensure_future(disk.write([k(100)], [3], [data(100)]))
        await asyncio.sleep(0.05)
        assert await read(disk, 3, 3) is not None  # still the restored block
        held_loader.set()
        assert await writing == [None]
        assert await read(disk, 3, 3) is None
        out = await read(disk, 100, 3)
        assert out is not None and np.array_equal(out, data(100))
        assert len(disk) == 8 and k(3) not in disk
    finally:
        held_loader.set()
        await disk.aclose()
    disk = open_store(tmp_path, 8)  # the next open agrees
    try:
        assert k(3) not in disk and disk.record(k(100)) is not None
        assert disk.check().problems == ()
    finally:
        await disk.aclose()


async def test_records_the_open_drops_are_never_served(tmp_path: Path) -> None:
    await fill(tmp_path, 32)
    disk = open_store(tmp_path, 32)
    slab, _ = disk.slot_location(0)
    await disk.aclose()
    os.truncate(slab, 20 * BLOCK + 100)  # slots 20.. cut off
    disk = open_store(tmp_path, 32)
    try:
        assert disk.stats.dropped_at_open == 12
        for i in range(32):
            out = await read(disk, i, i)
            if i < 20:
                assert out is not None and np.array_equal(out, data(i))
            else:
                assert out is None and disk.record(k(i)) is None and k(i) not in disk
        assert len(disk) == 20
        assert [block.slot for block in disk.restore()] == list(range(20))
    finally:
        await disk.aclose()


async def test_a_forgotten_restored_block_is_gone_now_and_after_a_reopen(tmp_path: Path) -> None:
    await fill(tmp_path, 16)
    disk = open_store(tmp_path, 16)
    try:
        await disk.forget([k(2), k(7)])
        assert k(2) not in disk and len(disk) == 14
        assert await read(disk, 2, 2) is None
    finally:
        await disk.aclose()
    disk = open_store(tmp_path, 16)
    try:
        assert k(2) not in disk and k(7) not in disk and len(disk) == 14
    finally:
        await disk.aclose()


@pytest.mark.slow
async def test_memory_per_restored_block_is_bounded(tmp_path: Path) -> None:
    count = 20_000
    await fill(tmp_path, count)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        disk = open_store(tmp_path, count)
        manager = make_tier_manager(count, BLOCK, "disk", "lru")
        cold = disk.restore_cold()
        assert cold is not None
        manager.restore_cold(cold)
        await disk.wait_loaded()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    try:
        assert len(manager) == count and manager.num_cold == count
        assert held / count <= 100, held / count  # the bound is 250
    finally:
        await disk.aclose()


class FakeSource:
    """A `ColdSource` over a dict, its keys nameable once `loaded`."""

    def __init__(self, blocks: dict[OffloadKey, int], *, loaded: bool = True) -> None:
        self.blocks = dict(blocks)
        self.loaded = loaded

    def slots(self) -> np.ndarray:
        return np.array(list(self.blocks.values()), dtype=np.int64)

    def slot_of(self, key: OffloadKey) -> int | None:
        return self.blocks.get(key)

    def key_of(self, slot: int) -> OffloadKey | None:
        if not self.loaded:
            return None
        return next((key for key, s in self.blocks.items() if s == slot), None)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_cold_blocks_are_used_evicted_oldest_first_and_counted(policy: str) -> None:
    manager = make_tier_manager(8, BLOCK, "disk", policy)
    # Oldest first: key 10+i in slot 7-i; slot 0 and 1 free.
    manager.restore_cold(FakeSource({k(10 + i): 7 - i for i in range(6)}))
    manager.check()
    assert len(manager) == 6 and manager.num_free == 2 and manager.num_cold == 6
    assert manager.lookup(k(12)) is True and manager.num_cold == 6  # a look moves nothing
    spec = manager.prepare_load([k(12)])  # a use: the block enters the policy
    assert isinstance(spec, BlockIDsLoadStoreSpec)
    assert spec.block_ids.tolist() == [5] and manager.num_cold == 5
    manager.complete_load([k(12)])
    manager.check()
    out = manager.prepare_store([k(i) for i in range(4)])
    assert out is not None
    # Two free slots, then the two oldest cold blocks (never the one in use since).
    assert out.evicted_keys == [k(10), k(11)]
    manager.complete_store([k(i) for i in range(4)])
    manager.check()
    assert len(manager) == 8 and manager.num_cold == 3
    assert manager.discard([k(13)]) == [k(13)] and manager.num_cold == 2
    manager.check()
    stats = manager.stats()
    assert stats.free == 1 and stats.evictable == 7 and stats.pinned == 0


def test_cold_blocks_are_not_evicted_before_their_keys_are_known() -> None:
    source = FakeSource({k(i): i for i in range(4)}, loaded=False)
    manager = make_tier_manager(4, BLOCK, "disk", "lru")
    manager.restore_cold(source)
    assert manager.prepare_store([k(9)]) is None  # full, and no victim can be named yet
    manager.check()
    source.loaded = True
    out = manager.prepare_store([k(9)])
    assert out is not None and out.evicted_keys == [k(0)]


def test_a_tier_restores_once() -> None:
    manager = make_tier_manager(4, BLOCK, "disk", "lru")
    manager.restore_cold(FakeSource({k(1): 0}))
    with pytest.raises(BlockStateError, match="empty"):
        manager.restore_cold(FakeSource({k(2): 1}))
    with pytest.raises(BlockStateError, match="empty"):
        manager.restore([(k(2), 1)])


async def test_a_damaged_records_snapshot_is_not_used(tmp_path: Path) -> None:
    await fill(tmp_path, 16)
    disk = open_store(tmp_path, 16)
    snapshot = disk.path / "index" / "records.bin"
    await disk.aclose()
    assert snapshot.exists()  # written by the clean close
    raw = bytearray(snapshot.read_bytes())
    raw[0] ^= 0xFF  # record 0's slot: a wrong slot, were it believed
    snapshot.write_bytes(bytes(raw))
    disk = open_store(tmp_path, 16)
    try:
        assert not snapshot.exists()  # taken by the open
        assert len(disk) == 16 and disk.record(k(0)).slot == 0  # type: ignore[union-attr]
        out = await read(disk, 0, 0)
        assert out is not None and np.array_equal(out, data(0))
    finally:
        await disk.aclose()


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("layout", ["log", "slots"])
async def test_a_restarted_chain_serves_cold_blocks_and_evicts_the_unused_oldest_first(
    tmp_path: Path, policy: str, layout: str
) -> None:
    import torch
    from hierarchy_helpers import blocks_of, chain_config, key

    from kvtier import Hierarchy

    config = chain_config(
        tmp_path,
        gpu=None,
        cpu=2,
        disk=8,
        policy=policy,
        write_policy="write-through",
        layout=layout,
    )
    ks = [key(i) for i in range(8)]
    async with Hierarchy.from_config(config) as h:
        for i in range(8):
            assert await h.put([ks[i]], blocks_of([ks[i]])) == 1
            await h.drain()
    async with Hierarchy.from_config(config) as h:
        disk = h._open().manager.tiers[-1]
        assert isinstance(disk, TierManager)
        assert len(disk) == 8 and disk.num_cold == 8
        for storage in h._open().storages:
            wait = getattr(storage, "wait_loaded", None)
            if wait is not None:
                await wait()
        assert torch.equal(await h.get([ks[0]]), blocks_of([ks[0]]))  # used since
        assert disk.num_cold == 7
        new = key(100)
        assert await h.put([new], blocks_of([new])) == 1
        await h.drain()
        # The disk tier was full: the oldest restored block not used since made room.
        assert h.where(ks[1]) is None
        assert h.where(new) is not None
        assert all(h.where(k) is not None for k in [ks[0], *ks[2:]])
        h.check()
        for stats in h.stats().tiers:
            assert stats.pinned == 0 and stats.pending == 0 and stats.used <= stats.num_blocks


@pytest.mark.slow
@pytest.mark.parametrize("after", ["a crash", "a clean close"])
async def test_every_damaged_block_is_dropped_restored_again_and_served_after_a_restart(
    tmp_path: Path, after: str
) -> None:
    """The engine lane's damaged-disk lives, at the chain: every page of every slab file
    damaged after `after`; the next life finds each block corrupt, stores it again; the one
    after serves every block, with its bytes, none corrupt."""
    import torch
    from hierarchy_helpers import blocks_of, chain_config, key

    from kvtier import Hierarchy

    config = chain_config(  # the per-block store's files are damaged below
        tmp_path,
        gpu=None,
        cpu=4,
        disk=32,
        policy="lru",
        write_policy="write-through",
        layout="slots",
    )
    ks = [key(i) for i in range(18)]
    async with Hierarchy.from_config(config) as h:
        assert await h.put(ks, blocks_of(ks)) == len(ks)
        await h.drain()
        root = h._open().storages[-1].path
    if after == "a crash":
        crashed(root)
    assert damage_every_page(sorted(root.glob("slab-*.bin"))) >= len(ks)
    async with Hierarchy.from_config(config) as h:
        for one in ks:  # each read apart, as an engine asks: a miss, counted corrupt
            assert (
                await h.get_into([one], torch.zeros(1, h.block_size, dtype=torch.uint8), [0]) == 0
            )
            assert h.where(one) is None
        assert h.stats().corrupt_blocks == len(ks)
        assert await h.put(ks, blocks_of(ks)) == len(ks)
        await h.drain()
    async with Hierarchy.from_config(config) as h:
        into = torch.zeros(len(ks), h.block_size, dtype=torch.uint8)
        assert await h.get_into(ks, into, list(range(len(ks)))) == len(ks)
        assert torch.equal(into, blocks_of(ks))
        assert h.stats().corrupt_blocks == 0


def crashed(disk_root: Path) -> None:
    """Leave a closed store's index as a killed process leaves it: no clean stamp, no
    records snapshot (the open then walks the index in the probe child)."""
    (disk_root / "index" / "clean").unlink()
    (disk_root / "index" / "records.bin").unlink(missing_ok=True)


async def test_after_a_crash_an_interrupted_groups_slots_are_judged_from_the_probes_walk(
    tmp_path: Path,
) -> None:
    """The keys of the records to verify come from the probe's walk: the torn slot's record
    is dropped, the intact suspect and the others serve their own bytes."""
    await fill(tmp_path, 8)
    disk = open_store(tmp_path, 8)
    root = disk.path
    slab, offset = disk.slot_location(1)
    await disk.aclose()
    crashed(root)
    with slab.open("r+b") as file:  # slot 1: as a torn rewrite leaves it
        file.seek(offset + 7)
        byte = file.read(1)
        file.seek(offset + 7)
        file.write(bytes([byte[0] ^ 0xFF]))
    log = InflightLog(root / "inflight", 0o600)
    log.record([1, 3])
    log.close()
    disk = open_store(tmp_path, 8)
    try:
        assert disk.stats.dropped_at_open == 1
        assert sorted(path.name for path in (root / "index").iterdir()) == [
            "data.mdb",
            "lock.mdb",
        ]  # the probe's files read and removed
        for i in range(8):
            out = await read(disk, i, i)
            if i == 1:
                assert out is None and k(1) not in disk
            else:
                assert out is not None and np.array_equal(out, data(i))
    finally:
        await disk.aclose()


async def test_the_isolated_probe_finds_lmdb_where_this_process_found_it(tmp_path: Path) -> None:
    """The probe runs `python -I`, blind to PYTHONPATH: an lmdb installed there (or by `pip
    install --target`) is found through the folder its parent names. Here the child also
    runs without site-packages (-S), so only that folder can give it lmdb."""
    await fill(tmp_path, 20)
    disk = open_store(tmp_path, 20)
    index = disk.path / "index"
    await disk.aclose()
    script = str(Path(index_check.__file__).with_name("index_probe.py"))
    command = [sys.executable, "-I", "-S", script, str(index), str(IndexRecord.FORMAT.size), "64"]
    bare = {k: v for k, v in os.environ.items() if k != index_check.LMDB_HOME_ENV}
    blind = subprocess.run(command, capture_output=True, text=True, env=bare, check=False)
    assert blind.returncode != 0 and "No module named 'lmdb'" in blind.stderr
    told = {**bare, index_check.LMDB_HOME_ENV: index_check._lmdb_home()}
    seen = subprocess.run(command, capture_output=True, text=True, env=told, check=False)
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout.splitlines()[-1]) == {"records": 20, "bad": 0}


async def test_the_probes_keys_are_the_index_keys_at_every_position(tmp_path: Path) -> None:
    await fill(tmp_path, 300)
    disk = open_store(tmp_path, 300)
    root = disk.path
    await disk.aclose()
    crashed(root)
    index = root / "index"
    out = tmp_path / "walked"
    assert probe_index(index, IndexRecord.FORMAT.size, MAX_KEY_BYTES, 60.0, out) is None
    probed = ProbedKeys.open(out.with_name(out.name + PROBED_KEYS_SUFFIX), 300)
    positions = [299, 0, 7, 7, 150, 300, -1, 1]  # unordered, repeated, out of range
    lmdb_index = BlockIndex(index, map_size=1 << 20, durable=False)
    try:
        expected = lmdb_index.keys_at(positions)
        assert sorted(expected) == [0, 1, 7, 150, 299]
        assert probed.keys_at(positions) == expected
        assert sorted(probed.keys_at(range(300)).values()) == sorted(k(i) for i in range(300))
    finally:
        lmdb_index.close()


@pytest.mark.parametrize("damage", ["truncated", "zero-size key", "longer", "missing"])
def test_a_malformed_probed_keys_file_is_refused(tmp_path: Path, damage: str) -> None:
    """A keys file that does not hold exactly its count of keys is never used (the open
    then finds keys in the index itself)."""
    raw = bytes([3, 2]) + b"abc" + b"de"
    path = tmp_path / "keys"
    if damage != "missing":
        path.write_bytes(
            {
                "truncated": raw[:-1],
                "zero-size key": bytes([0, 2]) + b"de",
                "longer": raw + b"f",
            }[damage]
        )
    with pytest.raises(ValueError if damage != "missing" else OSError):
        ProbedKeys.open(path, 2)
    path.write_bytes(raw)
    assert ProbedKeys.open(path, 2).keys_at([1, 0]) == {0: b"abc", 1: b"de"}


def test_a_walk_with_a_malformed_record_writes_no_records(tmp_path: Path) -> None:
    """An index whose walk finds a malformed record is reported damaged and the probe
    writes neither records nor keys for the open to trust."""
    asyncio.run(fill(tmp_path, 4))
    disk = open_store(tmp_path, 4)
    root = disk.path
    disk.close()
    crashed(root)
    index = BlockIndex(root / "index", map_size=1 << 20, durable=False)
    try:
        index.write_all([(k(9), b"short")])
    finally:
        index.close()
    out = tmp_path / "walked"
    problem = probe_index(root / "index", IndexRecord.FORMAT.size, MAX_KEY_BYTES, 60.0, out)
    assert problem is not None and "malformed" in problem
    assert not out.exists() and not out.with_name(out.name + PROBED_KEYS_SUFFIX).exists()
