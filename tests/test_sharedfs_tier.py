"""The shared-filesystem tier (issue 11, item 2): the KeyedStorageTests conformance suite,
a chain spilling into it and reading back bit for bit, two nodes sharing one directory, two
writers of the same block, the sweeper keeping the bound under concurrent writers (and one
node sweeping at a time), and files that are torn, foreign or left by a crashed writer."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, key

from kvtier import Hierarchy
from kvtier.keys import OffloadKey
from kvtier.namespaces import namespace_fingerprint
from kvtier.testing.keyed import AUTH_KEY_ENV, KeyedStorageTests, fixed_key_hex, keyed_auth
from kvtier.tiers.keyed import KeyedStorage
from kvtier.tiers.shared.auth import ValueAuth
from kvtier.tiers.sharedfs.storage import SharedFSStorage
from kvtier.tiers.sharedfs.sweeper import LOCK_FILE, STALE_TEMP_S

pytestmark = pytest.mark.timeout(120)

os.environ[AUTH_KEY_ENV] = fixed_key_hex()  # the key every test chain names (auth_key_env)


def storage_at(root: Path, *, max_size: int = 1 << 30, namespace: str = "ns") -> SharedFSStorage:
    return SharedFSStorage(
        root,
        block_size=BLOCK,
        num_blocks=64,
        namespace=namespace,
        max_size=max_size,
        sweep_interval_s=None,
    )


class TestSharedFSStorage(KeyedStorageTests):
    shared = True

    def make_storage(self, num_blocks: int, block_size: int, tmp_path: Path) -> KeyedStorage:
        namespace = self.shared_namespace()
        return self.open_shared(tmp_path, namespace, keyed_auth(namespace))

    def open_shared(self, tmp_path: Path, namespace: str, auth: ValueAuth | None) -> KeyedStorage:
        root = tmp_path / "shared" / f"kvtier-{namespace_fingerprint(namespace)}"
        return SharedFSStorage(
            root,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            namespace=namespace,
            max_size=1 << 30,
            sweep_interval_s=None,
            auth=auth,
        )

    def backdoor_get_raw(self, storage: KeyedStorage, key: OffloadKey) -> bytes | None:
        path = self._path(storage, key)
        return path.read_bytes() if path.exists() else None

    def backdoor_put_raw(self, storage: KeyedStorage, key: OffloadKey, value: bytes) -> None:
        path = self._path(storage, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)

    def _path(self, storage: KeyedStorage, key: OffloadKey) -> Path:
        assert isinstance(storage, SharedFSStorage)
        return storage.path_of(key)

    def backdoor_delete(self, storage: KeyedStorage, key: OffloadKey) -> None:
        self._path(storage, key).unlink()

    def backdoor_damage(self, storage: KeyedStorage, key: OffloadKey) -> None:
        path = self._path(storage, key)
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x10
        path.write_bytes(bytes(data))

    def backdoor_move(self, storage: KeyedStorage, src: OffloadKey, dst: OffloadKey) -> None:
        target = self._path(storage, dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._path(storage, src), target)


def chain(path: Path, **options: Any) -> dict[str, Any]:
    tier = {
        "name": "shared",
        "medium": "shared-fs",
        "capacity": 256,
        "path": str(path),
        "sweep_interval_s": None,
        "auth_key_env": AUTH_KEY_ENV,
        **options,
    }
    return {
        "block_size": BLOCK,
        "model_id": "test-model",
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 4}, tier],
    }


async def fill(h: Hierarchy, ids: range) -> list[OffloadKey]:
    keys = [key(i) for i in ids]
    for first in range(0, len(keys), 4):
        await h.put(keys[first : first + 4], blocks_of(keys[first : first + 4]))
    await h.flush()
    await h.drain()
    return keys


async def test_blocks_spill_to_the_shared_directory_and_come_back(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain(tmp_path / "nfs", fsync=True)) as h:
        keys = await fill(h, range(24))
        assert sum(h.where(k) == "shared" for k in keys) >= 20
        assert torch.equal(await h.get(keys), blocks_of(keys))
        h.check()


@pytest.mark.slow
async def test_a_second_node_loads_what_the_first_stored(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain(tmp_path / "nfs")) as a:
        keys = await fill(a, range(12))
    async with Hierarchy.from_config(chain(tmp_path / "nfs")) as b:
        for _ in range(100):
            if b.lookup(keys) == len(keys):
                break
            await asyncio.sleep(0.01)
        assert torch.equal(await b.get(keys), blocks_of(keys))


async def test_another_model_never_reads_these_files(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain(tmp_path / "nfs")) as a:
        keys = await fill(a, range(8))
    other = chain(tmp_path / "nfs")
    other["model_id"] = "another"
    async with Hierarchy.from_config(other) as b:
        await asyncio.sleep(0.05)
        assert (await b.get(keys[:1])).shape[0] == 0


async def test_two_writers_of_one_block_leave_a_whole_block(tmp_path: Path) -> None:
    a, b = storage_at(tmp_path), storage_at(tmp_path)
    try:
        block = np.arange(BLOCK, dtype=np.uint8)
        for _ in range(20):
            results = await asyncio.gather(
                a.write([key(1)], [0], [block]), b.write([key(1)], [0], [block])
            )
            assert results == [[None], [None]]
        out = np.zeros(BLOCK, dtype=np.uint8)
        assert await a.read([key(1)], [0], [out]) == [None]
        assert np.array_equal(out, block)
        leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and ".tmp-" in p.name]
        assert leftovers == []
    finally:
        await a.aclose()
        await b.aclose()


async def test_the_sweeper_keeps_the_bound_under_concurrent_writers(tmp_path: Path) -> None:
    one_file = BLOCK + 200
    bound = 40 * one_file
    a = storage_at(tmp_path, max_size=bound)
    b = storage_at(tmp_path, max_size=bound)
    try:

        async def writer(storage: SharedFSStorage, first: int) -> None:
            for start in range(first, first + 120, 10):
                ids = range(start, start + 10)
                blocks = [np.full(BLOCK, i % 251, dtype=np.uint8) for i in ids]
                assert await storage.write([key(i) for i in ids], [0] * 10, blocks) == [None] * 10
                await storage.sweep()

        await asyncio.gather(writer(a, 0), writer(b, 1000))
        await asyncio.sleep(0.05)  # file times are coarse (a few ms): make it the newest
        newest = np.full(BLOCK, 7, dtype=np.uint8)
        assert await a.write([key(5000)], [0], [newest]) == [None]
        report = await a.sweep()
        assert report.swept and report.bytes_after <= bound
        on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*.kv"))
        assert on_disk <= bound
        # The newest block survived, the oldest were removed.
        out = np.zeros(BLOCK, dtype=np.uint8)
        assert await a.read([key(5000)], [0], [out]) == [None]
        assert await a.read([key(0)], [0], [out]) != [None]
    finally:
        await a.aclose()
        await b.aclose()


async def test_only_one_node_sweeps_at_a_time(tmp_path: Path) -> None:
    storage = storage_at(tmp_path, max_size=1)
    try:
        await storage.write([key(1)], [0], [np.zeros(BLOCK, dtype=np.uint8)])
        fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)  # another node is sweeping
        try:
            report = await storage.sweep()
            assert not report.swept and storage.path_of(key(1)).exists()
        finally:
            os.close(fd)
        report = await storage.sweep()
        assert report.swept and report.removed == 1
    finally:
        await storage.aclose()


async def test_a_crashed_writers_temporary_file_is_swept(tmp_path: Path) -> None:
    storage = storage_at(tmp_path)
    try:
        await storage.write([key(1)], [0], [np.zeros(BLOCK, dtype=np.uint8)])
        final = storage.path_of(key(1))
        stale = final.with_name(final.name + ".tmp-999-1")
        fresh = final.with_name(final.name + ".tmp-999-2")
        stale.write_bytes(b"half a blo")
        fresh.write_bytes(b"being writ")
        old = time.time() - STALE_TEMP_S - 10
        os.utime(stale, (old, old))
        report = await storage.sweep()
        assert report.stale_temps == 1 and not stale.exists() and fresh.exists()
        assert final.exists()
    finally:
        await storage.aclose()


async def test_a_torn_or_foreign_file_is_a_miss_and_counted(tmp_path: Path) -> None:
    storage = storage_at(tmp_path)
    try:
        blocks = [np.full(BLOCK, i, dtype=np.uint8) for i in range(3)]
        await storage.write([key(0), key(1), key(2)], [0, 0, 0], blocks)
        path = storage.path_of(key(0))
        path.write_bytes(path.read_bytes()[:100])  # torn
        storage.path_of(key(2)).write_bytes(b"KVTR" + b"\0" * 80)  # not ours
        out = [np.zeros(BLOCK, dtype=np.uint8) for _ in range(3)]
        results = await storage.read([key(0), key(1), key(2)], [0, 0, 0], out)
        assert results[1] is None and np.array_equal(out[1], blocks[1])
        assert results[0] is not None and results[2] is not None
        assert storage.stats.problems == {"damaged": 1, "foreign": 1}
    finally:
        await storage.aclose()


async def test_the_background_sweeper_runs_in_a_chain(tmp_path: Path) -> None:
    config = chain(tmp_path / "nfs", sweep_interval_s=0.05, max_size=8 * (BLOCK + 200))
    async with Hierarchy.from_config(config) as h:
        await fill(h, range(40))
        storage = h.storages[-1]
        assert isinstance(storage, SharedFSStorage)
        after = storage.stats.sweeps + 2  # one whole sweep begun after the last write
        for _ in range(6000):  # sweeps run every 0.05 s; a busy machine may slow them
            if storage.stats.sweeps >= after:
                break
            await asyncio.sleep(0.01)
        on_disk = sum(p.stat().st_size for p in (tmp_path / "nfs").rglob("*.kv"))
        assert on_disk <= 8 * (BLOCK + 200)
        assert storage.stats.sweeps > 0


async def test_the_tier_says_where_its_values_live(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain(tmp_path / "nfs")) as h:
        where = h.tiers[-1].where  # the namespace's own directory under the shared one
        assert where.startswith(f"shared directory {tmp_path / 'nfs'}/kvtier-"), where
