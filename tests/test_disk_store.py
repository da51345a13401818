"""DiskStore: the BlockStorage suite (raw and zstd, buffered and O_DIRECT), then what only a
disk store promises: persistence across reopening, namespaces, file modes, locking, resizing,
multi-file slabs, O_DIRECT selection and its fallback, and the index kept around writes."""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import pytest_asyncio
from disk_helpers import open_or_skip

from kvtier.config import parse_config
from kvtier.errors import (
    DirectIOError,
    DiskLayoutError,
    DiskLockedError,
    DiskTierError,
    InvalidValueError,
    KeyFormatError,
    KvtierError,
    StorageClosedError,
)
from kvtier.keys import OffloadKey, key_from_int
from kvtier.testing.storage import StorageTests, empty_buffers
from kvtier.tiers.disk import (
    ALIGNMENT,
    Codec,
    DiskStore,
    FaultyIO,
    FileIO,
    IndexRecord,
    layout_fingerprint,
)
from kvtier.tiers.disk.io import IOV_MAX
from kvtier.tiers.disk.layout import StoreLayout
from kvtier.tiers.disk.testing import backdoor_read, backdoor_write, deterministic_block
from kvtier.tiers.storage import BlockStorage, ReadFailure, RestoredBlock

BLOCK = 4096


def k(i: int) -> OffloadKey:
    return key_from_int(i)


def blocks(ids: list[int], block_size: int = BLOCK) -> list[np.ndarray[Any, np.dtype[np.uint8]]]:
    return [deterministic_block(i, block_size) for i in ids]


def open_store(directory: Path, **kwargs: Any) -> DiskStore:
    options: dict[str, Any] = {"block_size": BLOCK, "num_blocks": 16, "direct_io": False}
    options.update(kwargs)
    return DiskStore(directory, **options)


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[DiskStore]:
    disk = open_store(tmp_path)
    try:
        yield disk
    finally:
        await disk.aclose()


async def write_ok(disk: DiskStore, ids: list[int], slots: list[int]) -> None:
    assert await disk.write([k(i) for i in ids], slots, blocks(ids, disk.block_size)) == [
        None
    ] * len(ids)


async def read_all(
    disk: DiskStore, ids: list[int], slots: list[int]
) -> tuple[list[ReadFailure | None], list[bytes]]:
    buffers = empty_buffers(len(ids), disk.block_size)
    results = await disk.read([k(i) for i in ids], slots, buffers)
    return results, [buffer.tobytes() for buffer in buffers]


async def assert_intact(disk: DiskStore, ids: list[int], slots: list[int]) -> None:
    results, data = await read_all(disk, ids, slots)
    assert results == [None] * len(ids)
    for i, got in zip(ids, data, strict=True):
        assert got == deterministic_block(i, disk.block_size).tobytes(), f"block {i} differs"


# --------------------------------------------------------------------------------------------
# The BlockStorage suite, four ways
# --------------------------------------------------------------------------------------------


class DiskStorageTests(StorageTests):
    compression: ClassVar[str] = "none"
    direct_io: ClassVar[bool] = False

    def make_storage(self, num_blocks: int, block_size: int, tmp_path: Path) -> BlockStorage:
        return open_or_skip(
            DiskStore, tmp_path / "disk", num_blocks, block_size, self.compression, self.direct_io
        )

    def backdoor_read(self, storage: BlockStorage, slot: int) -> bytes:
        assert isinstance(storage, DiskStore)
        return backdoor_read(storage, slot)

    def backdoor_write(
        self, storage: BlockStorage, key: OffloadKey, slot: int, data: bytes
    ) -> None:
        assert isinstance(storage, DiskStore)
        backdoor_write(storage, key, slot, data)

    async def test_store_is_healthy_after_the_suite_workload(self, storage: BlockStorage) -> None:
        assert isinstance(storage, DiskStore)
        assert storage.direct_io_active is self.direct_io
        await self.test_random_workload_matches_a_model(storage)
        report = storage.check()
        assert report.ok, str(report)
        assert report.records == len(storage) == self.num_blocks


class TestDiskStoreRaw(DiskStorageTests):
    pass


class TestDiskStoreZstd(DiskStorageTests):
    compression = "zstd"

    async def test_compressible_blocks_are_stored_compressed(self, storage: BlockStorage) -> None:
        assert isinstance(storage, DiskStore)
        ids = [2, 3]  # block 2 is low-entropy runs, block 3 random bytes
        await write_ok(storage, ids, [0, 1])
        compressed, raw = storage.record(k(2)), storage.record(k(3))
        assert compressed is not None and compressed.codec == Codec.ZSTD
        assert compressed.length < BLOCK // 4
        assert raw is not None and raw.codec == Codec.NONE and raw.length == BLOCK
        stats = storage.stats
        assert stats.raw_bytes_written == 2 * BLOCK
        assert stats.bytes_written == compressed.length + BLOCK
        await assert_intact(storage, ids, [0, 1])


class TestDiskStoreDirect(DiskStorageTests):
    direct_io = True


class TestDiskStoreDirectZstd(DiskStorageTests):
    compression = "zstd"
    direct_io = True


# --------------------------------------------------------------------------------------------
# Persistence
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("compression", "direct_io"), [("none", False), ("zstd", "auto")])
async def test_reopened_store_restores_every_block_oldest_first(
    tmp_path: Path, compression: str, direct_io: bool | str
) -> None:
    disk = open_store(tmp_path, compression=compression, direct_io=direct_io)
    await write_ok(disk, [10, 11, 12], [5, 0, 9])
    await write_ok(disk, [13, 14], [1, 2])
    await write_ok(disk, [15], [0])  # overwrites block 11
    await disk.forget([k(12)])
    await disk.aclose()

    disk = open_store(tmp_path, compression=compression, direct_io=direct_io)
    try:
        assert disk.restore() == [
            RestoredBlock(k(10), 5),
            RestoredBlock(k(13), 1),
            RestoredBlock(k(14), 2),
            RestoredBlock(k(15), 0),
        ]
        await assert_intact(disk, [10, 13, 14, 15], [5, 1, 2, 0])
        assert (await read_all(disk, [11, 12], [0, 9]))[0] == [ReadFailure.NOT_INDEXED] * 2
        seqs = [record.seq for key in disk if (record := disk.record(key))]
        await write_ok(disk, [16], [3])
        newest = disk.record(k(16))
        assert newest is not None and newest.seq > max(seqs)
        # restore() lists what was found at open, less what was overwritten or forgotten since.
        await write_ok(disk, [17], [5])
        await disk.forget([k(13)])
        assert [block.key for block in disk.restore()] == [k(14), k(15)]
    finally:
        await disk.aclose()


async def test_aclose_closes_cleanly_when_no_thread_can_be_started(tmp_path: Path) -> None:
    """An embedder's interpreter exiting without closing its serving engine closes the store
    after the loop's executor is shut down: the store still closes, and the next open finds
    every block."""
    disk = open_store(tmp_path)
    await write_ok(disk, [1, 2], [0, 1])
    await asyncio.get_running_loop().shutdown_default_executor()
    await disk.aclose()
    assert disk.closed
    disk = open_store(tmp_path)
    try:
        assert [block.key for block in disk.restore()] == [k(1), k(2)]
        await assert_intact(disk, [1, 2], [0, 1])
    finally:
        disk.close()


async def test_a_store_opened_with_other_compression_reads_the_old_blocks(tmp_path: Path) -> None:
    disk = open_store(tmp_path, compression="zstd")
    await write_ok(disk, [2, 4], [0, 1])
    await disk.aclose()
    disk = open_store(tmp_path, compression="none")
    try:
        await assert_intact(disk, [2, 4], [0, 1])
    finally:
        await disk.aclose()


async def test_from_config(tmp_path: Path) -> None:
    config = parse_config(
        {
            "block_size": "8KiB",
            "model_id": "llama",
            "tiers": [
                {
                    "name": "ssd",
                    "medium": "disk",
                    "capacity": "64KiB",
                    "path": str(tmp_path),
                    "compression": "zstd",
                    "zstd_level": 5,
                    "direct_io": False,
                    "fsync": False,
                }
            ],
        }
    )
    tier = config.tiers[0]
    disk = DiskStore.from_config(tier, config.block_size, config.model_id)  # type: ignore[arg-type]
    try:
        assert (disk.block_size, disk.num_blocks, disk.model_id) == (8192, 8, "llama")
        assert disk.compression == "zstd" and not disk.fsync and not disk.direct_io_active
        assert disk.path == tmp_path / f"kvtier-{layout_fingerprint(8192, 'llama')}"
        await write_ok(disk, [1, 2], [0, 7])
        await assert_intact(disk, [1, 2], [0, 7])
    finally:
        await disk.aclose()


async def test_open_async(tmp_path: Path) -> None:
    disk = await DiskStore.open_async(tmp_path, block_size=BLOCK, num_blocks=4)
    try:
        await write_ok(disk, [1], [3])
        await assert_intact(disk, [1], [3])
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# Namespaces
# --------------------------------------------------------------------------------------------


async def test_other_model_or_block_size_never_sees_the_blocks(tmp_path: Path) -> None:
    disk = open_store(tmp_path, model_id="model-a")
    await write_ok(disk, [1, 2], [0, 1])
    await disk.aclose()
    for other in ({"model_id": "model-b"}, {"model_id": "model-a", "block_size": 2 * BLOCK}):
        options = {"model_id": "model-a", **other}
        twin = open_store(tmp_path, **options)
        try:
            assert twin.path != disk.path
            assert twin.restore() == [] and len(twin) == 0
            buffers = empty_buffers(2, twin.block_size)
            results = await twin.read([k(1), k(2)], [0, 1], buffers)
            assert results == [ReadFailure.NOT_INDEXED] * 2
        finally:
            await twin.aclose()
    disk = open_store(tmp_path, model_id="model-a")
    try:
        await assert_intact(disk, [1, 2], [0, 1])
    finally:
        await disk.aclose()


def test_fingerprint_depends_on_block_size_model_and_layout() -> None:
    base = layout_fingerprint(4096, "m")
    assert layout_fingerprint(4096, "m") == base
    assert layout_fingerprint(8192, "m") != base
    assert layout_fingerprint(4096, "n") != base
    assert layout_fingerprint(4096, "") != base


async def test_a_directory_whose_index_records_another_fingerprint_is_refused(
    tmp_path: Path,
) -> None:
    disk = open_store(tmp_path, model_id="a")
    await write_ok(disk, [1], [0])
    await disk.aclose()
    impostor = tmp_path / f"kvtier-{layout_fingerprint(BLOCK, 'b')}"
    disk.path.rename(impostor)
    with pytest.raises(DiskLayoutError, match="fingerprint") as raised:
        open_store(tmp_path, model_id="b")
    assert isinstance(raised.value, KvtierError)
    # The refused open released everything: the rightful owner opens it once moved back.
    impostor.rename(disk.path)
    disk = open_store(tmp_path, model_id="a")
    try:
        await assert_intact(disk, [1], [0])
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# Files: modes, locking, resizing, several slab files
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=[0o000, 0o277])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


async def test_files_are_0600_and_directories_0700(tmp_path: Path, umask: int) -> None:
    disk = open_store(tmp_path / "root", num_blocks=8, slab_file_bytes=4 * BLOCK)
    try:
        await write_ok(disk, [1], [0])
        entries = [disk.path, *disk.path.rglob("*")]
        files = [entry for entry in entries if entry.is_file()]
        assert {entry.name for entry in files} >= {
            "lock",
            "slab-00000.bin",
            "slab-00001.bin",
            "data.mdb",
            "lock.mdb",
        }
        for entry in entries:
            mode = stat.S_IMODE(entry.stat().st_mode)
            assert mode == (0o700 if entry.is_dir() else 0o600), f"{entry}: {oct(mode)}"
        assert stat.S_IMODE((tmp_path / "root").stat().st_mode) & 0o077 == 0
    finally:
        await disk.aclose()


async def test_slab_files_are_preallocated(tmp_path: Path) -> None:
    disk = open_store(tmp_path, num_blocks=10, slab_file_bytes=4 * BLOCK)
    try:
        sizes = [(disk.path / f"slab-0000{i}.bin").stat().st_size for i in range(3)]
        assert sizes == [4 * BLOCK, 4 * BLOCK, 2 * BLOCK]
    finally:
        await disk.aclose()


async def test_a_second_store_on_the_same_directory_is_refused(store: DiskStore) -> None:
    with pytest.raises(DiskLockedError, match="already open"):
        open_store(store.path.parent)
    await write_ok(store, [1], [0])  # the refused open disturbed nothing
    await assert_intact(store, [1], [0])


async def test_a_closed_store_refuses_work_and_releases_the_lock(tmp_path: Path) -> None:
    disk = open_store(tmp_path)
    await write_ok(disk, [1], [0])
    await disk.aclose()
    assert disk.closed
    block = blocks([1])
    with pytest.raises(StorageClosedError):
        await disk.write([k(1)], [0], block)
    with pytest.raises(StorageClosedError):
        await disk.read([k(1)], [0], block)
    with pytest.raises(StorageClosedError):
        await disk.forget([k(1)])
    with pytest.raises(StorageClosedError):
        disk.check()
    again = open_store(tmp_path)
    await again.aclose()
    disk.close()  # sync close is idempotent too


async def test_reopening_smaller_drops_the_slots_that_are_gone(tmp_path: Path) -> None:
    disk = open_store(tmp_path, num_blocks=12, slab_file_bytes=4 * BLOCK)
    await write_ok(disk, list(range(12)), list(range(12)))
    await disk.aclose()

    disk = open_store(tmp_path, num_blocks=6, slab_file_bytes=4 * BLOCK)
    try:
        assert [block.slot for block in disk.restore()] == list(range(6))
        assert disk.stats.dropped_at_open == 6
        assert not (disk.path / "slab-00002.bin").exists()
        assert (disk.path / "slab-00001.bin").stat().st_size == 2 * BLOCK
        await assert_intact(disk, list(range(6)), list(range(6)))
        assert disk.check().ok
    finally:
        await disk.aclose()

    disk = open_store(tmp_path, num_blocks=12, slab_file_bytes=4 * BLOCK)
    try:
        assert len(disk.restore()) == 6
        await write_ok(disk, [50, 51], [6, 11])
        await assert_intact(disk, [0, 5, 50, 51], [0, 5, 6, 11])
    finally:
        await disk.aclose()


async def test_batches_spanning_several_slab_files(tmp_path: Path) -> None:
    disk = open_store(tmp_path, num_blocks=10, slab_file_bytes=3 * BLOCK)
    ids = list(range(100, 110))
    await write_ok(disk, ids, list(range(10)))
    assert disk.slot_location(4) == (disk.path / "slab-00001.bin", BLOCK)
    await disk.aclose()
    # A store keeps the slab split it was created with, whatever a later open asks for.
    disk = open_store(tmp_path, num_blocks=10, slab_file_bytes=1 << 20)
    try:
        assert disk.slot_location(4) == (disk.path / "slab-00001.bin", BLOCK)
        await assert_intact(disk, ids[::-1], list(range(10))[::-1])
    finally:
        await disk.aclose()


async def test_a_batch_longer_than_iov_max(tmp_path: Path) -> None:
    count = IOV_MAX + 5
    disk = DiskStore(tmp_path, block_size=512, num_blocks=count, direct_io=False, fsync=False)
    try:
        ids = list(range(count))
        assert await disk.write([k(i) for i in ids], ids, blocks(ids, 512)) == [None] * count
        await assert_intact(disk, ids, ids)
    finally:
        await disk.aclose()


def test_runs_are_cut_at_gaps_files_short_blocks_and_iov_max() -> None:
    layout = StoreLayout(num_blocks=4000, block_size=10, slots_per_file=2000)
    slots = [5, 3, 4, 7, 1999, 2000, 2001]
    runs = layout.runs(range(len(slots)), slots, ends_run=lambda member: member == 2)
    assert [[slots[m] for m in run.members] for run in runs] == [
        [3, 4],
        [5],
        [7],
        [1999],
        [2000, 2001],
    ]
    assert [(run.file, run.offset) for run in runs] == [
        (0, 30),
        (0, 50),
        (0, 70),
        (0, 19990),
        (1, 0),
    ]
    many = list(range(IOV_MAX + 3))
    assert [len(run.members) for run in layout.runs(many, many)] == [IOV_MAX, 3]


# --------------------------------------------------------------------------------------------
# O_DIRECT
# --------------------------------------------------------------------------------------------


def test_direct_io_auto_falls_back_when_open_with_o_direct_fails(tmp_path: Path) -> None:
    io = FaultyIO()
    io.inject("open", errno.EINVAL, flags=os.O_DIRECT)
    disk = open_store(tmp_path, direct_io="auto", io=io)
    try:
        assert not disk.direct_io_active
        assert io.faults[0].fired == 1
    finally:
        disk.close()
    with pytest.raises(DirectIOError, match="O_DIRECT"):
        open_store(tmp_path, direct_io=True, io=io)


async def test_direct_io_auto_falls_back_when_the_probe_read_fails(tmp_path: Path) -> None:
    io = FaultyIO()
    io.inject("preadv", errno.EINVAL, times=1)  # the first read is the probe
    disk = open_store(tmp_path, direct_io="auto", io=io)
    try:
        assert not disk.direct_io_active and io.faults[0].fired == 1
        await write_ok(disk, [1, 2], [0, 1])
        await assert_intact(disk, [1, 2], [0, 1])
    finally:
        await disk.aclose()


def test_direct_io_needs_a_block_size_multiple_of_4096(tmp_path: Path) -> None:
    disk = DiskStore(tmp_path, block_size=1000, num_blocks=4, direct_io="auto")
    assert not disk.direct_io_active
    disk.close()
    with pytest.raises(DirectIOError, match="multiple of 4096"):
        DiskStore(tmp_path, block_size=1000, num_blocks=4, direct_io=True)


async def test_direct_io_auto_is_used_where_it_works(tmp_path: Path) -> None:
    disk = open_store(tmp_path, direct_io="auto")
    try:
        if not disk.direct_io_active:
            pytest.skip("the filesystem of tmp_path has no O_DIRECT")
        aligned = np.frombuffer(mmap.mmap(-1, BLOCK), dtype=np.uint8)
        assert aligned.ctypes.data % ALIGNMENT == 0
        aligned[:] = deterministic_block(7, BLOCK)
        assert await disk.write([k(7)], [3], [aligned]) == [None]
        await assert_intact(disk, [7], [3])
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# Validation and the index around writes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"block_size": 0}, "block_size"),
        ({"num_blocks": -1}, "num_blocks"),
        ({"num_blocks": True}, "num_blocks"),
        ({"compression": "lz4"}, "compression"),
        ({"zstd_level": 0}, "zstd_level"),
        ({"direct_io": "yes"}, "direct_io"),
        ({"direct_io": 1}, "direct_io"),
        ({"fsync": "no"}, "fsync"),
        ({"slab_file_bytes": 0}, "slab_file_bytes"),
        ({"max_workers": 0}, "max_workers"),
        ({"model_id": 3}, "model_id"),
    ],
)
def test_bad_options_are_clear_errors(tmp_path: Path, options: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        open_store(tmp_path, **options)
    assert list(tmp_path.iterdir()) == []  # validated before touching the disk


@pytest.mark.parametrize("key", [b"", "text", b"x" * 600])
async def test_bad_keys_are_clear_errors(store: DiskStore, key: object) -> None:
    with pytest.raises(KeyFormatError, match=r"keys\[0\]"):
        await store.write([key], [0], blocks([1]))  # type: ignore[list-item]
    with pytest.raises(KeyFormatError, match=r"keys\[0\]"):
        await store.forget([key])  # type: ignore[list-item]


async def test_a_key_moved_to_another_slot_is_served_only_from_the_new_one(
    store: DiskStore,
) -> None:
    await write_ok(store, [1, 2], [0, 1])
    new = deterministic_block(99, BLOCK)
    assert await store.write([k(1)], [5], [new]) == [None]
    buffers = empty_buffers(2, BLOCK)
    assert await store.read([k(1)], [0], buffers[:1]) == [ReadFailure.NOT_INDEXED]
    assert await store.read([k(1)], [5], buffers[1:]) == [None]
    assert np.array_equal(buffers[1], new)
    # Slot 0 is free for another key, and block 2 was never disturbed.
    await write_ok(store, [3], [0])
    await assert_intact(store, [3, 2], [0, 1])
    assert store.check().ok and len(store) == 3


async def test_a_key_written_twice_in_one_batch_is_an_error(store: DiskStore) -> None:
    with pytest.raises(InvalidValueError, match="distinct"):
        await store.write([k(1), k(1)], [0, 1], blocks([1, 2]))


async def test_stats_count_blocks_and_bytes(store: DiskStore) -> None:
    await write_ok(store, [1, 3], [0, 1])
    await read_all(store, [1, 3, 5], [0, 1, 2])
    stats = store.stats
    assert (stats.blocks_written, stats.raw_bytes_written, stats.write_failures) == (
        2,
        2 * BLOCK,
        0,
    )
    assert stats.bytes_written == 2 * BLOCK  # compression is off
    assert (stats.blocks_read, stats.bytes_read) == (2, 2 * BLOCK)
    assert stats.read_failures == {ReadFailure.NOT_INDEXED: 1}
    stats.blocks_read = 99  # a snapshot, not the live counters
    assert store.stats.blocks_read == 2


class _ShortIO(FileIO):
    """Moves at most `limit` bytes per call, as a signal-interrupted or very busy kernel may."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    @staticmethod
    def _cut(buffers: list[memoryview], limit: int) -> list[memoryview]:
        cut, left = [], limit
        for view in buffers:
            if left <= 0:
                break
            cut.append(view[:left])
            left -= view.nbytes
        return cut

    def pwritev(self, fd: int, buffers: Any, offset: int) -> int:
        views = [memoryview(buffer).cast("B") for buffer in buffers]
        return super().pwritev(fd, self._cut(views, self.limit), offset)

    def preadv(self, fd: int, buffers: Any, offset: int) -> int:
        views = [memoryview(buffer).cast("B") for buffer in buffers]
        return super().preadv(fd, self._cut(views, self.limit), offset)


async def test_partial_reads_and_writes_are_continued(tmp_path: Path) -> None:
    disk = open_store(tmp_path, io=_ShortIO(limit=1000), compression="zstd")
    try:
        ids = [1, 2, 3, 4, 5]
        await write_ok(disk, ids, [0, 1, 2, 3, 7])
        await assert_intact(disk, ids, [0, 1, 2, 3, 7])
        assert disk.check().ok
    finally:
        await disk.aclose()


def test_record_packing_round_trips() -> None:
    record = IndexRecord(slot=7, length=1234, codec=1, checksum=(1 << 64) - 1, seq=42)
    assert IndexRecord.unpack(record.pack()) == record
    with pytest.raises(ValueError, match="bytes"):
        IndexRecord.unpack(record.pack()[:-1])


def test_open_errors_are_disk_tier_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(DiskTierError, match="file is not a directory"):
        open_store(blocker)
    io = FaultyIO()
    io.inject("allocate", errno.ENOSPC)
    with pytest.raises(DiskTierError, match="No space"):
        open_store(tmp_path / "full", io=io)
    # The failed open left nothing locked, and nothing behind: it created the directory.
    assert not (tmp_path / "full").exists()
    open_store(tmp_path / "full").close()


async def test_batch_errors_name_the_bad_value(store: DiskStore) -> None:
    good = blocks([1, 2])
    with pytest.raises(InvalidValueError, match=r"buffers\[1\].*4096.*shape \(4095,\)"):
        await store.write([k(1), k(2)], [0, 1], [good[0], np.zeros(BLOCK - 1, np.uint8)])
    with pytest.raises(InvalidValueError, match=r"buffers\[0\].*not contiguous"):
        await store.read([k(1)], [0], [np.zeros(2 * BLOCK, np.uint8)[::2]])
    with pytest.raises(InvalidValueError, match=r"slots\[1\] must be in \[0, 16\), got 16"):
        await store.write([k(1), k(2)], [0, 16], good)
    with pytest.raises(InvalidValueError, match="same length, got 2, 1 and 2"):
        await store.write([k(1), k(2)], [0], good)
    with pytest.raises(InvalidValueError, match=r"distinct within a batch, got \[4\]"):
        await store.write([k(1), k(2)], [4, 4], good)
    assert len(store) == 0


@pytest.mark.parametrize("slot", [1.0, True, "1", None])
async def test_a_slot_that_is_not_an_int_is_an_error(store: DiskStore, slot: object) -> None:
    with pytest.raises(InvalidValueError, match=r"slots\[0\] must be an int"):
        await store.write([k(1)], [slot], blocks([1]))  # type: ignore[list-item]


async def test_numpy_integer_slots_are_accepted(store: DiskStore) -> None:
    slots = np.array([3, 4], dtype=np.int64)
    assert await store.write([k(1), k(2)], list(slots), blocks([1, 2])) == [None, None]
    await assert_intact(store, [1, 2], [3, 4])
