"""The log layout's faults that tests/test_disk_log.py does not cover (issue 33, "Bad input
and faults"): a checkpoint older than the regions, a checkpoint whose records disagree with
the regions, and the tier directory's trust rules through the disk kind's opener. Each is a
counted miss or a refused open, never a wrong byte, and `kvtier check --repair` leaves a
store a second check finds sound.

Whole files are swapped (the checkpoint directory, `regions.bin`), never bytes inside them,
so the tests hold whatever the record format (log_format.py) is."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from disk_helpers import BLOCK, k, open_small, read, write_ok
from hierarchy_helpers import chain_config

from kvtier import Hierarchy
from kvtier.cli import main
from kvtier.errors import DiskTierError
from kvtier.tiers.disk.log_store import LogStore
from kvtier.tiers.disk.testing import deterministic_block
from kvtier.tiers.storage import ReadFailure

pytestmark = pytest.mark.timeout(120)

SLOTS = 32


def open_log(directory: Path, **kwargs: Any) -> LogStore:
    return open_small(LogStore, directory, num_blocks=SLOTS, **kwargs)


def crash_image(store: LogStore, to: Path) -> Path:
    """A copy of the open store's directory as a kill -9 would leave it (every write it
    reported stored was fsynced; no last checkpoint): what a restart opens. The copy's
    `layout.json` names the copied regions file, whose identity (its inode) is new, so its
    checkpoint is believed as the original's would be."""
    import json

    from kvtier.tiers.disk.log_files import file_identity

    target = to / store.path.name
    shutil.copytree(store.path, target)
    layout = json.loads((target / "layout.json").read_text())
    fd = os.open(target / "regions.bin", os.O_RDONLY)
    try:
        layout["regions_file"] = file_identity(fd)
    finally:
        os.close(fd)
    (target / "layout.json").write_text(json.dumps(layout))
    return target


async def assert_each_is_itself_or_a_miss(
    store: LogStore, expected: dict[int, int]
) -> tuple[int, int]:
    """Every slot in `expected` (slot -> block id) read as that block: intact or a miss,
    never another block's bytes. (served, missed)."""
    slots = sorted(expected)
    results, buffers = await read(store, [expected[s] for s in slots], slots)
    served = 0
    for slot, result, buffer in zip(slots, results, buffers, strict=True):
        if result is None:
            served += 1
            assert np.array_equal(buffer, deterministic_block(expected[slot], BLOCK)), slot
        else:
            assert isinstance(result, ReadFailure)
    return served, len(slots) - served


async def test_a_checkpoint_older_than_the_regions_loses_no_stored_block(tmp_path: Path) -> None:
    """A clean close (its checkpoint), then writes over some slots, forgets of others and
    new blocks, then a crash: the restart reads the older checkpoint and replays the regions
    written after it, so every block stored since is there and nothing overwritten or
    forgotten comes back."""
    store = open_log(tmp_path / "a")
    model = {slot: slot for slot in range(16)}  # slot -> block id stored there now
    await write_ok(store, list(range(16)), list(range(16)))
    await store.aclose()  # the checkpoint the restart will find
    store = open_log(tmp_path / "a")
    await write_ok(store, [100 + s for s in range(4)], list(range(4)))  # over slots 0..3
    model.update({s: 100 + s for s in range(4)})
    await store.forget([k(s) for s in range(4, 8)])
    for s in range(4, 8):
        del model[s]
    await write_ok(store, list(range(20, 28)), list(range(20, 28)))
    model.update({s: s for s in range(20, 28)})
    image = crash_image(store, tmp_path / "b")
    await store.aclose()
    again = LogStore(
        image.parent, block_size=BLOCK, num_blocks=SLOTS, direct_io=False, create_parents=False
    )
    try:
        assert again.opened.from_checkpoint and again.opened.scanned_records > 0
        restored = {block.slot: block.key for block in again.restore()}
        assert restored == {slot: k(i) for slot, i in model.items()}
        served, missed = await assert_each_is_itself_or_a_miss(again, model)
        assert (served, missed) == (len(model), 0)
        results, _ = await read(again, list(range(4, 8)), list(range(4, 8)))  # forgotten
        assert all(result is not None for result in results)
        results, _ = await read(again, list(range(4)), list(range(4)))  # overwritten
        assert all(result is not None for result in results)
        assert again.check().ok
    finally:
        again.close()


async def test_records_that_disagree_with_the_checkpoint_are_misses_and_check_repairs(
    tmp_path: Path,
) -> None:
    """The checkpoint of one store over the regions of another of the same geometry: every
    place the checkpoint names holds another record (another key, slot, sequence). Each
    block reads as a block really stored under its key and slot, or a miss; `kvtier check`
    reports the disagreement and `--repair` leaves a store the next check finds sound."""
    first = open_log(tmp_path / "p")
    await write_ok(first, list(range(16)), list(range(16)))
    await first.aclose()
    second = open_log(tmp_path / "q")  # the same keys, other bytes, other slots and order
    for ids in ([15, 3, 9, 0], [7, 12, 1, 5], [14, 2, 8, 11], [6, 13, 4, 10]):
        await write_ok(second, [100 + i for i in ids], [31 - i for i in ids])
    await second.aclose()
    # q's regions under p's checkpoint (same fingerprint, so the same store name).
    shutil.rmtree(second.path / "checkpoint")
    shutil.copytree(first.path / "checkpoint", second.path / "checkpoint")
    try:
        again = LogStore(
            tmp_path / "q",
            block_size=BLOCK,
            num_blocks=SLOTS,
            direct_io=False,
            create_parents=False,
        )
    except DiskTierError as error:  # refusing to open is a failed tier, also allowed
        assert "\n" not in str(error)
        return
    try:
        # What p stored (key i in slot i, block i) and what q stored (its block 100 + i in
        # slot 31 - i): a served block must be one of them, bit for bit.
        for slot in range(SLOTS):
            i = slot if slot < 16 else 31 - slot
            candidates = {deterministic_block(i, BLOCK).tobytes()} | {
                deterministic_block(100 + i, BLOCK).tobytes()
            }
            results, buffers = await read(again, [i], [slot])
            if results[0] is None:
                assert buffers[0].tobytes() in candidates, slot
        # The disagreement was noticed: records dropped at open or reads that failed.
        assert again.stats.dropped_at_open + again.stats.read_failures.total() > 0
    finally:
        again.close()
    runner = CliRunner()
    checked = runner.invoke(main, ["check", "--repair", str(tmp_path / "q")])
    assert checked.exit_code in (0, 3), checked.output
    checked = runner.invoke(main, ["check", str(tmp_path / "q")])
    assert checked.exit_code == 0, checked.output


async def test_a_symlinked_log_store_directory_is_refused_by_the_opener(tmp_path: Path) -> None:
    store = open_log(tmp_path / "elsewhere")
    await write_ok(store, [1], [1])
    await store.aclose()
    (tmp_path / "disk").mkdir(mode=0o700)
    os.symlink(store.path, tmp_path / "disk" / store.path.name)
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=SLOTS, layout="log")
    with pytest.raises(DiskTierError, match=r"symlink|not a directory") as refused:
        await Hierarchy.from_config(config).open()
    assert "\n" not in str(refused.value)


async def test_a_tier_path_others_can_write_is_refused_for_the_log_layout(tmp_path: Path) -> None:
    (tmp_path / "disk").mkdir()
    os.chmod(tmp_path / "disk", 0o777)  # not sticky: another user could plant a store
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=SLOTS, layout="log")
    with pytest.raises(DiskTierError, match="chmod go-w"):
        await Hierarchy.from_config(config).open()
    assert not any((tmp_path / "disk").iterdir())  # nothing was created there


async def test_a_mistyped_log_tier_path_grows_no_directory_tree(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=SLOTS, layout="log")
    config["tiers"][-1]["path"] = str(tmp_path / "typo" / "disk")
    with pytest.raises(DiskTierError, match="does not exist"):
        await Hierarchy.from_config(config).open()
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("what", ["regions.bin", "checkpoint"])
async def test_a_directory_or_file_in_place_of_a_log_file_is_one_error_or_a_scan(
    tmp_path: Path, what: str
) -> None:
    """`regions.bin` replaced by a directory: the open fails with one DiskTierError naming the
    store, and leaves the lock free. The checkpoint replaced by a file: the store opens from
    its regions alone (a lost checkpoint costs a scan, no block)."""
    store = open_log(tmp_path)
    await write_ok(store, list(range(8)), list(range(8)))
    await store.aclose()
    target = store.path / what
    if what == "regions.bin":
        saved = target.read_bytes()
        target.unlink()
        target.mkdir()
        with pytest.raises(DiskTierError) as caught:
            open_log(tmp_path)
        assert "\n" not in str(caught.value) and str(store.path) in str(caught.value)
        target.rmdir()
        target.write_bytes(saved)
    else:
        shutil.rmtree(target)
        target.write_bytes(b"not a checkpoint")
    again = open_log(tmp_path)  # the lock was given back; every block is there
    try:
        assert sorted(block.slot for block in again.restore()) == list(range(8))
        served, missed = await assert_each_is_itself_or_a_miss(again, {s: s for s in range(8)})
        assert (served, missed) == (8, 0)
    finally:
        again.close()
