"""The log layout's faults (issue 33, "Bad input and faults") through `kvtier check`: for each,
the store opens with the damage a counted miss (never a wrong byte, never a crash), `kvtier
check` reports it (exit 1), `--repair` repairs it (exit 3), and the next check finds the store
sound (exit 0) with every block the damage did not reach still served.

Real files damaged in place or swapped whole; write faults injected through `FaultyIO`; no
timing."""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from disk_helpers import BLOCK, k, open_small, read, write_ok

from kvtier.cli import main
from kvtier.tiers.disk import FaultyIO
from kvtier.tiers.disk.log_checkpoint import load, save
from kvtier.tiers.disk.log_recovery import checkpoint_meta
from kvtier.tiers.disk.log_store import LogStore
from kvtier.tiers.disk.testing import deterministic_block
from kvtier.tiers.storage import ReadFailure

pytestmark = pytest.mark.timeout(120)

SLOTS = 32


def open_log(directory: Path, **kwargs: Any) -> LogStore:
    return open_small(LogStore, directory, num_blocks=SLOTS, **kwargs)


def check(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["check", *args])
    return result.exit_code, result.output


def assert_reported_repaired_sound(tier: Path, *reported: str) -> None:
    """`kvtier check` of the tier reports a problem naming each of `reported` (exit 1),
    `--repair` repairs it (exit 3), and a second check finds nothing (exit 0)."""
    code, out = check(str(tier))
    assert code == 1, out
    for words in reported:
        assert words in out, (words, out)
    code, out = check(str(tier), "--repair")
    assert code == 3, out
    code, out = check(str(tier))
    assert code == 0, out


async def filled(tier: Path, groups: int = 8) -> tuple[LogStore, dict[int, int]]:
    """A store with `groups` groups of 4 blocks (block i in slot i), closed cleanly."""
    store = open_log(tier)
    for first in range(0, 4 * groups, 4):
        await write_ok(store, list(range(first, first + 4)), list(range(first, first + 4)))
    await store.aclose()
    return store, {slot: slot for slot in range(4 * groups)}


async def served_or_missed(tier: Path, expected: dict[int, int]) -> tuple[set[int], set[int]]:
    """Open the store and read every slot of `expected` (slot -> block id): each is that
    block bit for bit, or a counted miss. (slots served, slots missed)."""
    store = open_log(tier)
    try:
        slots = sorted(expected)
        results, buffers = await read(store, [expected[s] for s in slots], slots)
        served, missed = set(), set()
        for slot, result, buffer in zip(slots, results, buffers, strict=True):
            if result is None:
                assert np.array_equal(buffer, deterministic_block(expected[slot], BLOCK)), slot
                served.add(slot)
            else:
                assert isinstance(result, ReadFailure)
                missed.add(slot)
        return served, missed
    finally:
        await store.aclose()


async def test_a_damaged_region_header_is_reported_and_repaired(tmp_path: Path) -> None:
    store, expected = await filled(tmp_path)
    region = int(store._index.region[0])
    with open(store.path / "regions.bin", "r+b") as file:
        file.seek(store._files.base(region) + 8)
        file.write(b"\xff\xff")
    assert_reported_repaired_sound(tmp_path, "damaged")
    served, missed = await served_or_missed(tmp_path, expected)
    assert 0 in missed and served  # that region's blocks are misses, the others served


async def test_a_truncated_regions_file_is_reported_and_repaired(tmp_path: Path) -> None:
    store, expected = await filled(tmp_path)
    with open(store.path / "regions.bin", "r+b") as file:
        file.truncate(store.region_bytes * 2)
    assert_reported_repaired_sound(tmp_path, "lost")
    served, missed = await served_or_missed(tmp_path, expected)
    assert missed and served


async def test_a_region_cut_inside_its_groups_is_reported_and_repaired(tmp_path: Path) -> None:
    """The regions file cut in the middle of the region holding the newest groups (a torn
    tail after a crash, or a short copy): the groups cut off are misses."""
    store, expected = await filled(tmp_path, groups=8)
    row = store._index.row(SLOTS - 1)
    assert row is not None
    with open(store.path / "regions.bin", "r+b") as file:
        file.truncate(store._files.base(row.region) + row.payload_offset + 100)
    assert_reported_repaired_sound(tmp_path, "lost")
    served, missed = await served_or_missed(tmp_path, expected)
    assert missed == {SLOTS - 1} and len(served) == SLOTS - 1  # the region's rest served


async def test_a_checkpoint_newer_than_the_regions_is_reported_and_repaired(
    tmp_path: Path,
) -> None:
    """The regions file put back as it was before later writes, under the checkpoint of
    those writes: what the checkpoint names but the regions do not hold is reported and
    dropped; every block read after is one really stored in its slot, or a miss."""
    store, _ = await filled(tmp_path, groups=4)
    regions = store.path / "regions.bin"
    shutil.copy(regions, tmp_path / "backup")
    store = open_log(tmp_path)
    for first in range(100, 196, 4):  # over every slot, several times: regions reused
        await write_ok(
            store, list(range(first, first + 4)), [i % SLOTS for i in range(first, first + 4)]
        )
    await store.aclose()
    shutil.copy(tmp_path / "backup", regions)
    assert_reported_repaired_sound(tmp_path)
    newest = {i % SLOTS: i for i in range(164, 196)}
    older = {slot: slot for slot in range(16)}
    store = open_log(tmp_path)
    try:
        for expected in (newest, older):
            slots = sorted(expected)
            results, buffers = await read(store, [expected[s] for s in slots], slots)
            for slot, result, buffer in zip(slots, results, buffers, strict=True):
                if result is None:
                    assert np.array_equal(buffer, deterministic_block(expected[slot], BLOCK))
        assert store.check().ok
    finally:
        await store.aclose()


async def test_a_checkpoint_naming_places_outside_the_store_is_not_used(tmp_path: Path) -> None:
    """A checkpoint sound by its digest but whose arrays name regions, offsets or key
    lengths the store does not have (written by a faulty kvtier): ignored, the regions
    scanned, every block served; no crash."""
    store, expected = await filled(tmp_path, groups=4)
    path = store.path / "checkpoint"
    wanted = checkpoint_meta(store.fingerprint, store._store_id, store._index, store.region_bytes)
    arrays = load(path, wanted)
    assert arrays is not None
    saved_meta = {
        **wanted,
        "next_seq": int(arrays["meta"][0]),
        "next_epoch": int(arrays["meta"][1]),
    }
    del arrays["meta"]
    for name, bad in (("region", 10_000), ("offset", 1 << 31), ("key_len", 250)):
        broken = {key: value.copy() for key, value in arrays.items()}
        broken[name][0] = bad
        save(path, saved_meta, broken)
        assert load(path, wanted) is None, name
        again = open_log(tmp_path)
        try:
            assert not again.opened.from_checkpoint
            assert sorted(block.slot for block in again.restore()) == sorted(expected)
        finally:
            await again.aclose()
    served, missed = await served_or_missed(tmp_path, expected)
    assert missed == set() and served == set(expected)


async def test_enospc_while_reclaiming_then_a_restart_keeps_every_stored_block(
    tmp_path: Path,
) -> None:
    """ENOSPC on the writes of groups that reclaim regions: those stores fail; after a
    restart every block reported stored is served and the check finds the store sound."""
    io = FaultyIO()
    store = open_log(tmp_path, io=io)
    model: dict[int, int] = {}
    failed = 0
    rng = random.Random(7)
    for step in range(150):
        if step == 60:
            io.inject("pwritev", errno.ENOSPC, times=8)
        slots = rng.sample(range(SLOTS), 4)
        ids = [1000 + step * 4 + j for j in range(4)]
        results = await store.write(
            [k(i) for i in ids], slots, [deterministic_block(i, BLOCK) for i in ids]
        )
        for slot, i, result in zip(slots, ids, results, strict=True):
            if result is None:
                model[slot] = i
            else:
                failed += 1
    assert failed and store.moved_bytes > 0
    await store.aclose()
    served, missed = await served_or_missed(tmp_path, model)
    assert missed == set() and served == set(model)
    code, out = check(str(tmp_path))
    assert code == 0, out


async def test_a_read_only_filesystem_is_checked_and_never_written(tmp_path: Path) -> None:
    """Every open for writing fails with EROFS (the filesystem mounted or remounted
    read-only): a store opened to check reads it all and writes nothing; opening it to
    write is one DiskTierError line."""
    from kvtier.errors import DiskTierError
    from kvtier.tiers.disk.open_checks import open_recorded_log_store

    store, expected = await filled(tmp_path, groups=4)
    before = {p: p.read_bytes() for p in store.path.rglob("*") if p.is_file()}
    io = FaultyIO()
    io.inject("open", errno.EROFS, flags=os.O_RDWR)
    with pytest.raises(DiskTierError, match=r"[Rr]ead-only") as caught:
        open_log(tmp_path, io=io)
    assert "\n" not in str(caught.value)
    inspected = open_recorded_log_store(store.path, inspect=True, io=io)
    assert inspected is not None
    try:
        report = inspected.check()
        assert report.ok and report.records == len(expected)
    finally:
        inspected.close()
    assert {p: p.read_bytes() for p in store.path.rglob("*") if p.is_file()} == before


_CRASHING_WRITER = """
import asyncio, os, random, signal, sys
from kvtier.keys import key_from_int
from kvtier.tiers.disk.log_store import LogStore
from kvtier.tiers.disk.testing import deterministic_block

async def main(directory):
    store = LogStore(directory, block_size=4096, num_blocks=32, direct_io=False)
    store.checkpoint_every = store.checkpoint_records = 1 << 30  # the close's stays the last
    for slot, i in steps():
        await store.write([key_from_int(i)], [slot], [deterministic_block(i, 4096)])
    os.kill(os.getpid(), signal.SIGKILL)

def steps():
    rng = random.Random(3)
    for step in range(160):
        slot = step % 8 if step < 8 else rng.randrange(16, 32)  # 0..7 over, 8..15 kept
        yield slot, 500 + step

if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
"""


async def test_blocks_a_reclaim_moved_after_the_checkpoint_are_not_reported_lost(
    tmp_path: Path,
) -> None:
    """A checkpoint, then (in a process killed with SIGKILL at the end) writes over some of
    its blocks and enough others that its regions are reclaimed, their live blocks moved:
    the open drops the checkpoint's records in the reused regions, the scan finds the moved
    ones again, so nothing is counted lost, every stored block is served and `kvtier check`
    finds the store sound (it used to report every moved block as dropped)."""
    import subprocess
    import sys

    _, model = await filled(tmp_path, groups=6)
    child = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert child.returncode == -9, child.stderr
    namespace: dict[str, Any] = {}
    exec(_CRASHING_WRITER.replace('if __name__ == "__main__"', "if False"), namespace)
    model.update(namespace["steps"]())
    code, out = check(str(tmp_path))  # what the open after the crash finds, said
    assert code == 0, out
    again = open_log(tmp_path)
    try:
        assert again.opened.from_checkpoint
        assert again.opened.dropped == 0 and not again.opened.problems, again.opened.problems
    finally:
        await again.aclose()
    served, missed = await served_or_missed(tmp_path, model)
    assert missed == set() and served == set(model)
