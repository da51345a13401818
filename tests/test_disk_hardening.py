"""The disk store under a damaged index (issue 9, items 1 to 3): no record can serve another
key's bytes, a damaged `data.mdb` is never mapped into a SIGBUS, and a damaged or missing
index is rebuilt from the slab headers instead of bricking the store.

Opens of a damaged store run in a child process: if a regression made kvtier map a damaged
index, the child dies of SIGBUS and the test fails, instead of pytest dying with it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

from kvtier.keys import OffloadKey, key_from_int
from kvtier.testing.storage import empty_buffers
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk.index import BlockIndex
from kvtier.tiers.disk.testing import deterministic_block
from kvtier.tiers.storage import ReadFailure

BLOCK = 4096
SLOTS = 256
STORED = 200


def k(i: int) -> OffloadKey:
    return key_from_int(i)


def open_store(directory: Path, **kwargs: Any) -> DiskStore:
    options: dict[str, Any] = {"block_size": BLOCK, "num_blocks": SLOTS, "direct_io": False}
    options.update(kwargs)
    return DiskStore(directory, **options)


async def fill(directory: Path, count: int = STORED) -> Path:
    """A closed store holding blocks 0..count-1 in slots 0..count-1; its store directory."""
    disk = open_store(directory)
    try:
        ids = list(range(count))
        blocks = [deterministic_block(i, BLOCK) for i in ids]
        assert await disk.write([k(i) for i in ids], ids, blocks) == [None] * count
        return disk.path
    finally:
        await disk.aclose()


async def read_all(disk: DiskStore, ids: list[int]) -> tuple[int, int, int]:
    """(right, wrong, missed) over `ids`, each read at its recorded slot."""
    right = wrong = missed = 0
    for i in ids:
        record = disk.record(k(i))
        if record is None:
            missed += 1
            continue
        (buffer,) = empty_buffers(1, BLOCK)
        (result,) = await disk.read([k(i)], [record.slot], [buffer])
        if result is not None:
            missed += 1
        elif np.array_equal(buffer, deterministic_block(i, BLOCK)):
            right += 1
        else:
            wrong += 1
    return right, wrong, missed


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[4])
    from test_disk_hardening import deterministic_block, k, open_store, read_all

    async def main(directory, ids, extra):
        disk = open_store(directory)
        right, wrong, missed = await read_all(disk, ids)
        failed = 0
        if extra:
            blocks = [deterministic_block(i, 4096) for i in extra]
            results = await disk.write([k(i) for i in extra], extra, blocks)
            failed = sum(result is not None for result in results)
        answer = {"right": right, "wrong": wrong, "missed": missed, "write_failed": failed,
                  "rebuilt": disk.rebuilt_index}
        await disk.aclose()
        print(json.dumps(answer))

    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])))
    """
)


def open_in_child(directory: Path, ids: list[int], extra: list[int]) -> dict[str, Any]:
    """Open the store in a child process, read `ids`, write `extra` (id = slot), close."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(directory),
            json.dumps(ids),
            json.dumps(extra),
            str(Path(__file__).parent),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


# --------------------------------------------------------------------------------------------
# 1. Records bound to their key
# --------------------------------------------------------------------------------------------


def rewrite_index(store_dir: Path, change: Any) -> None:
    """Edit the closed store's index records with plain LMDB (behind the store's back)."""
    env = lmdb.open(str(store_dir / "index"), max_dbs=2, subdir=True)
    try:
        blocks = env.open_db(b"blocks")
        with env.begin(db=blocks, write=True) as txn:
            change(txn)
    finally:
        env.close()


async def test_swapped_records_serve_no_wrong_bytes_and_check_finds_them(tmp_path: Path) -> None:
    store_dir = await fill(tmp_path, 8)

    def swap(txn: Any) -> None:
        one, two = txn.get(k(1)), txn.get(k(2))
        txn.put(k(1), two)
        txn.put(k(2), one)
        txn.put(k(99), txn.get(k(3)))  # a key never stored, pointing at block 3's slot

    rewrite_index(store_dir, swap)
    disk = open_store(tmp_path)
    try:
        # One of k(2) / k(3) and k(99) claim the same slot: the open keeps the newer claim.
        right, wrong, missed = await read_all(disk, [1, 2, 99])
        assert wrong == 0 and right == 0, (right, wrong, missed)
        report = disk.check()
        bad_keys = {problem.key for problem in report.problems}
        assert {k(1), k(2)} <= bad_keys
        whats = sorted(p.what.split(" (")[0].split(":")[0] for p in report.problems)
        assert whats == ["lost record"] * 2 + ["the slot holds the block of another key"] * 2
        assert await read_all(disk, [0, 4, 5, 6, 7]) == (5, 0, 0)
        # Repair drops the swapped records and indexes both blocks again from their headers.
        repaired = disk.check(repair=True)
        assert (repaired.repaired, repaired.reindexed) == (2, 2)
        assert await read_all(disk, [1, 2]) == (2, 0, 0)
        assert disk.check().ok
    finally:
        await disk.aclose()


async def test_a_stale_record_of_an_older_block_in_the_slot_is_a_miss(tmp_path: Path) -> None:
    store_dir = await fill(tmp_path, 4)
    old_record = {}

    def remember(txn: Any) -> None:
        old_record["k1"] = txn.get(k(1))

    rewrite_index(store_dir, remember)
    disk = open_store(tmp_path)
    try:  # the slot of block 1 now holds block 1 again, rewritten: a newer seq
        await disk.forget([k(1)])
        assert await disk.write([k(1)], [1], [deterministic_block(5, BLOCK)]) == [None]
    finally:
        await disk.aclose()
    rewrite_index(store_dir, lambda txn: txn.put(k(1), old_record["k1"]))  # the stale record
    disk = open_store(tmp_path)
    try:
        (buffer,) = empty_buffers(1, BLOCK)
        assert await disk.read([k(1)], [1], [buffer]) == [ReadFailure.CHECKSUM]
        assert not disk.check().ok
    finally:
        await disk.aclose()


# --------------------------------------------------------------------------------------------
# 2 and 3. A damaged index file is never mapped, and is rebuilt from the headers
# --------------------------------------------------------------------------------------------


def damage(data: Path, how: str) -> None:
    size = data.stat().st_size
    if how == "half":  # half of the pages in use (the rest of the file is reserved space)
        env = lmdb.open(str(data.parent), readonly=True, lock=False, max_dbs=2)
        used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        env.close()
        os.truncate(data, used // 2)
    elif how == "8KiB":
        os.truncate(data, 8192)
    elif how == "zero-meta":
        with data.open("r+b") as file:
            file.write(bytes(8192))
    else:
        count = int(how.removeprefix("flip"))
        used = min(size, 256 * 1024)  # where the records are, not the preallocated tail
        rng = np.random.default_rng(count)
        with data.open("r+b") as file:
            for offset in rng.choice(used, size=count, replace=False):
                file.seek(int(offset))
                value = file.read(1)[0]
                file.seek(int(offset))
                file.write(bytes([value ^ 0xFF]))


@pytest.mark.parametrize("how", ["half", "8KiB", "zero-meta", "flip16", "flip300", "flip3000"])
@pytest.mark.slow
async def test_a_damaged_index_never_crashes_and_never_bricks_the_store(
    tmp_path: Path, how: str
) -> None:
    store_dir = await fill(tmp_path)
    damage(store_dir / "index" / "data.mdb", how)
    ids = list(range(STORED))
    first = open_in_child(tmp_path, ids, extra=[230, 231])
    assert first["wrong"] == 0
    if how in ("half", "8KiB", "zero-meta"):
        # Found before mapping: the index is rebuilt from the headers, every block is back.
        assert first["rebuilt"] and "damaged index file" in first["rebuilt"]
        assert first["right"] == STORED
    # Whatever the first open made of it, every later open works and serves what it did,
    # plus what it wrote.
    second = open_in_child(tmp_path, [*ids, 230, 231], extra=[])
    assert second["wrong"] == 0 and second["write_failed"] == 0
    assert second["right"] >= first["right"] + 2 - first["write_failed"]
    third = open_in_child(tmp_path, [*ids, 230, 231], extra=[])
    assert third["right"] == second["right"] and third["rebuilt"] is None


async def test_a_missing_index_is_rebuilt_from_the_headers(tmp_path: Path) -> None:
    store_dir = await fill(tmp_path)
    shutil.rmtree(store_dir / "index")
    disk = open_store(tmp_path)
    try:
        assert disk.rebuilt_index == "the index is missing"
        assert await read_all(disk, list(range(STORED))) == (STORED, 0, 0)
        assert disk.check().ok
    finally:
        await disk.aclose()


async def test_forgotten_blocks_stay_forgotten_after_a_rebuild(tmp_path: Path) -> None:
    store_dir = await fill(tmp_path, 10)
    disk = open_store(tmp_path)
    try:
        await disk.forget([k(3), k(4)])
    finally:
        await disk.aclose()
    shutil.rmtree(store_dir / "index")
    disk = open_store(tmp_path)
    try:
        assert k(3) not in disk and k(4) not in disk and len(disk) == 8
    finally:
        await disk.aclose()


async def test_a_clean_close_is_trusted_and_a_crash_is_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_dir = await fill(tmp_path, 4)
    assert (store_dir / "index" / "clean").exists()
    probes: list[Path] = []
    import kvtier.tiers.disk.recovery as recovery_module

    real_probe = recovery_module.probe_index

    def counting_probe(path: Path, *args: Any) -> str | None:
        probes.append(path)
        return real_probe(path, *args)

    monkeypatch.setattr(recovery_module, "probe_index", counting_probe)
    disk = open_store(tmp_path)
    assert not (store_dir / "index" / "clean").exists()  # taken while open
    disk.close()
    assert probes == []
    (store_dir / "index" / "clean").unlink()  # as after a killed process
    disk = open_store(tmp_path)
    disk.close()
    assert len(probes) == 1


async def test_an_index_damaged_while_open_is_replaced_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_dir = await fill(tmp_path, 10)
    disk = open_store(tmp_path)
    real_update = BlockIndex.update
    calls = {"n": 0}

    def failing_once(self: BlockIndex, deleted: Any, records: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise lmdb.CorruptedError("mdb_put: MDB_CORRUPTED: Located page was wrong type")
        real_update(self, deleted, records)

    monkeypatch.setattr(BlockIndex, "update", failing_once)
    try:
        assert await disk.write([k(50)], [50], [deterministic_block(50, BLOCK)]) == [None]
        assert disk.stats.index_rebuilds == 1
        assert any(path.name.startswith("index.damaged-") for path in store_dir.iterdir())
    finally:
        await disk.aclose()
    monkeypatch.setattr(BlockIndex, "update", real_update)
    disk = open_store(tmp_path)
    try:
        assert await read_all(disk, [*range(10), 50]) == (11, 0, 0)
        assert disk.rebuilt_index is None
    finally:
        await disk.aclose()


def test_a_groups_entries_are_the_ones_a_single_block_would_get() -> None:
    from kvtier.tiers.disk.layout import (
        BlockHeader,
        bound_checksum,
        group_entries,
        namespace_bytes,
        unpack_entry,
    )

    namespace = namespace_bytes("0123456789abcdef0123")
    keys = [OffloadKey(b"\x01"), OffloadKey(bytes(range(255))), k(7), OffloadKey(b"\x00" * 9)]
    slots, lengths, codecs, seqs = [3, 0, 9, 1], [4096, 100, 4096, 1], [0, 1, 0, 1], [5, 6, 7, 8]
    blocks = [bytes([i]) * length for i, length in enumerate(lengths)]
    entries = group_entries(namespace, keys, slots, lengths, codecs, seqs, blocks)
    raw = entries.tobytes()
    for i, key in enumerate(keys):
        checksum = bound_checksum(
            namespace, key, slots[i], lengths[i], codecs[i], seqs[i], blocks[i]
        )
        assert int(entries["checksum"][i]) == checksum
        header = BlockHeader(key, seqs[i], lengths[i], codecs[i], checksum)
        entry = raw[i * 320 : (i + 1) * 320]
        assert header.pack(namespace, slots[i]) == entry
        assert unpack_entry(entry, namespace, slots[i]) == header
        assert unpack_entry(entry, namespace, slots[i] + 1) is None  # another slot's
        assert unpack_entry(entry, namespace_bytes("x" * 20), slots[i]) is None
        assert (
            bound_checksum(namespace, key, slots[i] + 1, lengths[i], codecs[i], seqs[i], blocks[i])
            != checksum
        )


@pytest.mark.parametrize(
    "break_it",
    ["headers of another store", "a directory for a slab"],
)
async def test_a_store_that_cannot_open_says_why_in_one_disk_tier_error(
    tmp_path: Path, break_it: str
) -> None:
    from kvtier.errors import DiskTierError

    store_dir = await fill(tmp_path, 4)
    if break_it == "headers of another store":
        other = DiskStore(tmp_path / "other", block_size=BLOCK, num_blocks=SLOTS, model_id="m")
        other_headers = (other.path / "headers.bin").read_bytes()
        other.close()
        (store_dir / "headers.bin").write_bytes(other_headers)
    else:
        (store_dir / "slab-00000.bin").unlink()
        (store_dir / "slab-00000.bin").mkdir()
    with pytest.raises(DiskTierError) as caught:
        open_store(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and str(store_dir) in message
    # Nothing is left open: the lock is free for the next try.
    if break_it == "a directory for a slab":
        (store_dir / "slab-00000.bin").rmdir()
        open_store(tmp_path).close()


async def test_a_file_in_place_of_the_index_is_moved_aside_and_rebuilt(tmp_path: Path) -> None:
    store_dir = await fill(tmp_path, 4)
    shutil.rmtree(store_dir / "index")
    (store_dir / "index").write_text("not a directory")
    disk = open_store(tmp_path)
    try:
        assert disk.rebuilt_index == "the index is missing"
        assert await read_all(disk, list(range(4))) == (4, 0, 0)
    finally:
        await disk.aclose()
    assert [p.name.startswith("index.damaged-") for p in store_dir.glob("index.*")] == [True]


async def test_an_interrupted_rebuild_is_done_again(tmp_path: Path) -> None:
    store_dir = await fill(tmp_path, 10)
    shutil.rmtree(store_dir / "index")
    disk = open_store(tmp_path)  # rebuilt ...
    disk.close()
    (store_dir / "index" / "rebuilding").touch()  # ... as if killed before it was committed
    disk = open_store(tmp_path)
    try:
        assert disk.rebuilt_index == "a rebuild of the index was interrupted"
        assert await read_all(disk, list(range(10))) == (10, 0, 0)
    finally:
        await disk.aclose()
    assert not (store_dir / "index" / "rebuilding").exists()
