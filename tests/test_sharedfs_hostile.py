"""The shared-fs tier on hostile ground (issue 19, item 4): the shared directory may hold
FIFOs, symlinks, hard links, sparse or oversized files, directories of other users and
directories swapped after the tier opened. Each test plants the real thing and checks an
invariant: a miss or a clear refusal, nothing read, written or deleted outside the tree, a
bound that holds, a close that returns."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import torch
from hierarchy_helpers import BLOCK, blocks_of, key
from test_sharedfs_tier import chain, fill

from kvtier import Hierarchy
from kvtier.errors import DiskTierError
from kvtier.keys import OffloadKey
from kvtier.tiers.sharedfs import storage as sharedfs
from kvtier.tiers.sharedfs.storage import SharedFSStorage, _CopyGate, _ReadOutcome
from kvtier.tiers.storage import ReadFailure

OTHER_UID = 65534  # nobody
GiB = 1 << 30
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another uid's files needs root")


def make(root: Path, **options: Any) -> SharedFSStorage:
    settings: dict[str, Any] = {
        "block_size": BLOCK,
        "num_blocks": 64,
        "namespace": "hostile",
        "max_size": GiB,
        "sweep_interval_s": None,
        **options,
    }
    return SharedFSStorage(root, **settings)


@pytest_asyncio.fixture
async def storage(tmp_path: Path) -> AsyncIterator[SharedFSStorage]:
    opened = make(tmp_path / "ns")
    try:
        yield opened
    finally:
        await opened.aclose()


def block(i: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.full(BLOCK, i % 251, dtype=np.uint8)


async def write(storage: SharedFSStorage, ids: range | list[int]) -> None:
    ids = list(ids)
    results = await storage.write([key(i) for i in ids], [0] * len(ids), [block(i) for i in ids])
    assert results == [None] * len(ids)


async def read(storage: SharedFSStorage, i: int) -> tuple[ReadFailure | None, np.ndarray[Any, Any]]:
    out = np.full(BLOCK, 0xAB, dtype=np.uint8)
    [result] = await storage.read([key(i)], [0], [out])
    return result, out


async def probe(storage: SharedFSStorage, k: OffloadKey) -> bool:
    for _ in range(1000):
        answer = storage.probe([k])[0]
        if answer is not None:
            return answer
        await asyncio.sleep(0.005)
    raise AssertionError("probe never answered")


def plant_dir(path: Path) -> Path:
    """The directory of a planted file, made as the tier would (ours, 0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def tree_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())


def allocated(root: Path) -> int:
    """Bytes the block files under `root` take (a file removed meanwhile counts nothing)."""
    total = 0
    for path in root.rglob("*.kv"):
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode):
            total += info.st_blocks * 512
    return total


# -- files at a block's path ---------------------------------------------------------------


@pytest.mark.timeout(30)
async def test_a_fifo_at_a_block_path_is_a_prompt_miss(storage: SharedFSStorage) -> None:
    fifo = plant_dir(storage.path_of(key(1)))
    os.mkfifo(fifo)
    result, out = await asyncio.wait_for(read(storage, 1), 10)  # an open that blocks hangs
    assert result is ReadFailure.NOT_INDEXED and (out == 0xAB).all()
    assert storage.stats.problems.get("not_regular") == 1
    assert await asyncio.wait_for(probe(storage, key(1)), 10) is False
    # The other blocks are served meanwhile, and close returns.
    await write(storage, [2])
    assert (await read(storage, 2))[0] is None
    await asyncio.wait_for(storage.aclose(), 10)


@pytest.mark.timeout(60)
async def test_a_fifo_in_a_chain_neither_blocks_get_nor_close(tmp_path: Path) -> None:
    h = Hierarchy.from_config(chain(tmp_path / "nfs"))
    await h.open()
    try:
        shared = h.storages[-1]
        assert isinstance(shared, SharedFSStorage)
        os.mkfifo(plant_dir(shared.path_of(key(3))))
        got = await asyncio.wait_for(h.get([key(3)]), 10)
        assert got.shape[0] == 0
        keys = await fill(h, range(8))
        assert torch.equal(await asyncio.wait_for(h.get(keys), 10), blocks_of(keys))
    finally:
        await asyncio.wait_for(h.close(), 20)


@pytest.mark.timeout(30)
async def test_a_symlink_or_hard_link_at_a_block_path_is_not_served(
    storage: SharedFSStorage, tmp_path: Path
) -> None:
    # A valid value of keys 1 and 2, made outside the tree (same namespace, same file system).
    outside = make(tmp_path / "outside")
    try:
        await write(outside, [1, 2])
    finally:
        await outside.aclose()
    os.symlink(outside.path_of(key(1)), plant_dir(storage.path_of(key(1))))
    os.link(outside.path_of(key(2)), plant_dir(storage.path_of(key(2))))
    assert (await read(storage, 1))[0] is ReadFailure.NOT_INDEXED
    assert (await read(storage, 2))[0] is ReadFailure.NOT_INDEXED
    assert storage.stats.problems == {"symlink": 1, "linked": 1}
    assert await probe(storage, key(1)) is False and await probe(storage, key(2)) is False
    # A sweep never follows the symlink: its target is left alone; the planted name of the
    # hard link is removed (never served), not the file outside.
    storage.max_size = 1
    report = await storage.sweep()
    assert report.swept and report.oversized == 1
    assert outside.path_of(key(1)).exists() and outside.path_of(key(2)).exists()
    # A store of the key replaces what was planted (a rename), and is served.
    await write(storage, [1, 2])
    assert not storage.path_of(key(1)).is_symlink()
    assert (await read(storage, 1))[0] is None and (await read(storage, 2))[0] is None


@pytest.mark.timeout(30)
async def test_an_oversized_file_is_a_miss_not_read_whole(
    storage: SharedFSStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = plant_dir(storage.path_of(key(4)))
    path.touch()
    os.truncate(path, 100 * GiB)  # sparse: 100 GiB apparent, nothing allocated
    reads: list[int] = []
    real_read = sharedfs._read_up_to

    def counting(fd: int, size: int) -> memoryview:
        reads.append(size)
        return real_read(fd, size)

    monkeypatch.setattr(sharedfs, "_read_up_to", counting)
    assert (await read(storage, 4))[0] is ReadFailure.NOT_INDEXED
    assert reads == [] and storage.stats.problems == {"oversized": 1}


# -- the sweeper ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_a_100_gib_sparse_file_does_not_make_the_sweep_remove_genuine_blocks(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ns"
    storage = make(root, max_size=40 * 8192)
    try:
        await write(storage, range(20))
        genuine = allocated(root)
        assert genuine <= storage.max_size
        sparse = plant_dir(storage.path_of(key(999)))
        sparse.touch()
        os.truncate(sparse, 100 * GiB)
        junk = plant_dir(root / "ab" / "not-a-block")
        junk.touch()
        os.truncate(junk, 100 * GiB)
        report = await storage.sweep()
        assert report.swept and report.removed == 0 and report.oversized == 1
        assert not sparse.exists() and junk.exists()  # not ours by name: left alone
        assert report.bytes_after == genuine
        for i in range(20):
            assert (await read(storage, i))[0] is None
    finally:
        await storage.aclose()


@pytest.mark.timeout(60)
async def test_oversized_files_go_first(tmp_path: Path) -> None:
    root = tmp_path / "ns"
    storage = make(root)
    try:
        await write(storage, range(10))
        genuine = allocated(root)
        big = plant_dir(storage.path_of(key(500)))
        big.write_bytes(os.urandom(16 * BLOCK))  # allocated, and the newest file
        future = time.time() + 3600
        os.utime(big, (future, future))
        storage.max_size = genuine + 4 * BLOCK  # over with the big file, under without it
        report = await storage.sweep()
        assert report.oversized == 1 and report.removed == 0 and not big.exists()
        assert [(await read(storage, i))[0] for i in range(10)] == [None] * 10
        assert report.bytes_after == genuine <= storage.max_size
    finally:
        await storage.aclose()


@pytest.mark.timeout(120)
@pytest.mark.slow
async def test_two_writers_keep_the_directory_within_1_2x_of_max_size(tmp_path: Path) -> None:
    root = tmp_path / "ns"
    one = 8192  # a 4 KiB block's file takes two 4 KiB blocks
    bound = 100 * one
    # Sweeping nodes (an interval far beyond the test: only the writers' own sweeps run).
    a = make(root, max_size=bound, sweep_interval_s=3600.0)
    b = make(root, max_size=bound, sweep_interval_s=3600.0)
    try:
        # Taking turns, measured between writes (only a sweep may run then: it only removes).
        peak = 0
        for i in range(300):
            await write(a, [i])
            await write(b, [10_000 + i])
            peak = max(peak, allocated(root))
        assert peak <= 1.2 * bound, f"peak {peak / bound:.2f}x max_size"

        # At once, two blocks a write, some written a second time (writes racing sweeps).
        async def writer(storage: SharedFSStorage, first: int) -> None:
            for i in range(first, first + 300):
                await write(storage, [i, i - 150])

        await asyncio.gather(writer(a, 20_000), writer(b, 30_000))
        for storage in (a, b):
            if storage.sweeper.task is not None:
                await asyncio.wait([storage.sweeper.task])
        assert allocated(root) <= 1.2 * bound
        assert a.stats.sweeps > 0 and b.stats.sweeps > 0
        assert a.stats.swept_files + b.stats.swept_files > 500
    finally:
        await a.aclose()
        await b.aclose()


# -- directories ---------------------------------------------------------------------------


@as_root
@pytest.mark.timeout(30)
async def test_a_directory_of_another_uid_open_to_all_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ns"
    planter = make(root)
    try:
        await write(planter, range(8))  # blocks another user could have planted
    finally:
        await planter.aclose()
    os.chown(root, OTHER_UID, OTHER_UID)
    os.chmod(root, 0o777)
    with pytest.raises(DiskTierError, match=rf"{re.escape(str(root))}.*owned by uid {OTHER_UID}"):
        make(root)
    os.chown(root, os.geteuid(), os.getegid())  # ours again, but open to every user
    with pytest.raises(DiskTierError, match=r"writable by every user \(mode 777\)"):
        make(root)


@as_root
@pytest.mark.timeout(60)
async def test_a_chain_refuses_a_planted_namespace_directory(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain(tmp_path / "nfs")) as h:
        await fill(h, range(8))
        shared = h.storages[-1]
        assert isinstance(shared, SharedFSStorage)
        root = shared.root
    os.chown(root, OTHER_UID, OTHER_UID)
    os.chmod(root, 0o777)
    where = re.escape(str(root))
    with pytest.raises(DiskTierError, match=rf"(?s)tier 'shared'.*{where}.*owned by uid"):
        async with Hierarchy.from_config(chain(tmp_path / "nfs")):
            pass


@pytest.mark.timeout(30)
async def test_a_symlinked_namespace_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    victim = elsewhere / "ab" / ("ab" + "0" * 30 + ".kv")
    plant_dir(victim).write_bytes(b"someone else's file")
    (tmp_path / "ns").symlink_to(elsewhere)
    with pytest.raises(DiskTierError, match="symlink"):
        make(tmp_path / "ns", max_size=1)
    assert victim.exists() and tree_files(elsewhere) == [victim]


@pytest.mark.timeout(30)
async def test_a_namespace_directory_swapped_after_open_is_never_followed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ns"
    storage = make(root, max_size=1)
    try:
        await write(storage, [1])
        elsewhere = tmp_path / "elsewhere"
        victim = elsewhere / "ab" / ("ab" + "0" * 30 + ".kv")
        plant_dir(victim).write_bytes(b"x" * 100)
        root.rename(tmp_path / "moved")
        root.symlink_to(elsewhere)
        await write(storage, range(2, 40))
        report = await storage.sweep()
        assert report.swept
        assert tree_files(elsewhere) == [victim]  # nothing written or deleted there
    finally:
        await storage.aclose()


@pytest.mark.timeout(30)
async def test_symlinked_subdirectories_are_refused_and_counted(tmp_path: Path) -> None:
    root = tmp_path / "ns"
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / ("00" + "0" * 30 + ".kv")
    victim.write_bytes(b"not kvtier's")
    root.mkdir(mode=0o700)
    for i in range(256):
        (root / f"{i:02x}").symlink_to(outside)
    storage = make(root, max_size=1)
    try:
        results = await storage.write(
            [key(i) for i in range(64)], [0] * 64, [block(i) for i in range(64)]
        )
        assert all(isinstance(result, OSError) for result in results)
        assert storage.stats.unsafe_dirs == 64 and storage.stats.write_errors == 64
        assert (await read(storage, 1))[0] is ReadFailure.NOT_INDEXED
        assert storage.stats.problems == {"unsafe_dir": 1}
        report = await storage.sweep()
        assert report.swept and report.unsafe_dirs == 256 and report.removed == 0
        assert tree_files(outside) == [victim]  # nothing written there, nothing deleted
    finally:
        await storage.aclose()


@as_root
@pytest.mark.timeout(30)
async def test_a_subdirectory_of_another_uid_is_refused(storage: SharedFSStorage) -> None:
    await write(storage, [1])
    directory = storage.path_of(key(1)).parent
    os.chown(directory, OTHER_UID, OTHER_UID)
    os.chmod(directory, 0o777)
    assert (await read(storage, 1))[0] is ReadFailure.NOT_INDEXED
    [error] = await storage.write([key(1)], [0], [block(1)])
    assert isinstance(error, OSError) and "owned by uid" in str(error)
    assert storage.stats.unsafe_dirs == 1


@pytest.mark.timeout(30)
async def test_under_umask_000_nothing_is_created_writable_by_others(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        root = tmp_path / "a" / "b" / "ns"
        storage = make(root)
        try:
            await write(storage, range(64))
        finally:
            await storage.aclose()
    finally:
        os.umask(old)
    created = [tmp_path / "a", tmp_path / "a" / "b", *[p for p in root.rglob("*")], root]
    directories = [p for p in created if p.is_dir()]
    assert len(directories) > 3
    for path in created:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert not mode & 0o022, f"{path} is mode {mode:o}"
    assert {stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_dir()} == {0o700}
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*.kv")} == {0o600}


# -- forget and self-healing ---------------------------------------------------------------


@pytest.mark.timeout(30)
async def test_forget_deletes_nothing(tmp_path: Path) -> None:
    a, b = make(tmp_path / "ns"), make(tmp_path / "ns")
    try:
        await write(a, [5])
        await a.forget([key(5)])
        assert a.path_of(key(5)).exists()
        assert (await read(a, 5))[0] is not None  # this node does not read it again ...
        assert (await read(b, 5))[0] is None  # ... the other nodes still do
        await write(a, [5])  # a new file at the path: read again
        result, out = await read(a, 5)
        assert result is None and (out == block(5)).all()
    finally:
        await a.aclose()
        await b.aclose()


def _garbage(path: Path) -> None:
    path.write_bytes(b"KVTR" + os.urandom(BLOCK))


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _oversized(path: Path) -> None:
    path.touch()
    os.truncate(path, 100 * GiB)


def _symlink(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere")


@pytest.mark.parametrize("plant", [_garbage, _fifo, _oversized, _symlink])
@pytest.mark.timeout(60)
async def test_a_planted_file_heals_with_the_next_put(
    tmp_path: Path, plant: Callable[[Path], None]
) -> None:
    async with Hierarchy.from_config(chain(tmp_path / "nfs")) as a:
        shared = a.storages[-1]
        assert isinstance(shared, SharedFSStorage)
        path = plant_dir(shared.path_of(key(7)))
        plant(path)
        assert (await asyncio.wait_for(a.get([key(7)]), 10)).shape[0] == 0  # a miss
        assert path.exists() or path.is_symlink()  # nothing deleted on a reader's word
        await fill(a, range(7, 8))  # computed again, stored again: replaces it by rename
        assert stat.S_ISREG(path.lstat().st_mode)
    async with Hierarchy.from_config(chain(tmp_path / "nfs")) as b:  # another node
        assert torch.equal(await b.get([key(7)]), blocks_of([key(7)]))


# -- close ---------------------------------------------------------------------------------


@pytest.mark.timeout(180)
async def test_close_returns_within_its_budget_while_a_read_hangs(tmp_path: Path) -> None:
    storage = make(tmp_path / "ns", close_timeout_s=0.5)
    await write(storage, [1])
    entered, release = threading.Event(), threading.Event()
    real = storage._read_one

    def hung(k: OffloadKey, buffer: Any, gate: _CopyGate) -> _ReadOutcome:
        entered.set()
        release.wait(120)  # a read stuck on a hung mount, until the test releases it
        return real(k, buffer, gate)

    storage._read_one = hung  # type: ignore[method-assign]
    out = np.full(BLOCK, 0xAB, dtype=np.uint8)
    reading = asyncio.ensure_future(storage.read([key(1)], [0], [out]))
    try:
        assert await asyncio.to_thread(entered.wait, 10)
        # A close that waited for the read would hang here (the read is released only after
        # close returns): returning at all is the proof, not how soon.
        await asyncio.wait_for(storage.aclose(), 60)
        assert not release.is_set()
    finally:
        release.set()
    # The read finishes after close: it is a miss, and copies nothing into the buffer.
    assert await asyncio.wait_for(reading, 10) == [ReadFailure.IO_ERROR]
    assert (out == 0xAB).all()


@pytest.mark.timeout(180)
async def test_close_returns_while_a_fifo_open_blocks(
    storage: SharedFSStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = plant_dir(storage.path_of(key(1)))
    os.mkfifo(fifo)
    # As if O_NONBLOCK were lost (a file system that ignores it): the open blocks for real.
    monkeypatch.setattr(sharedfs, "_OPEN_FILE", sharedfs._OPEN_FILE & ~os.O_NONBLOCK)
    storage.close_timeout_s = 0.5
    out = np.zeros(BLOCK, dtype=np.uint8)
    reading = asyncio.ensure_future(storage.read([key(1)], [0], [out]))
    for _ in range(2000):  # until a thread runs it (it then blocks in open)
        if any(future.running() for future in list(storage._inflight)):
            break
        await asyncio.sleep(0.005)
    # The open blocks until a writer appears (below, after close): a close that waited for
    # it would hang here, so returning at all is the proof.
    await asyncio.wait_for(storage.aclose(), 60)
    # Let the stuck open return (a writer appears), so its thread ends.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader (yet, or any more)
            if reading.done():
                break
            await asyncio.sleep(0.01)
            continue
        break
    result = await asyncio.wait_for(reading, 10)
    assert result[0] is not None
