"""The disk tier's layouts side by side (issue 33, items 2 and 6): a tier whose directory holds
a store of the other layout is refused at open in one line that says what the store holds
and what to do, and `kvtier migrate` copies a store's verified blocks into the other layout
(in place, or into another directory), never a damaged one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from disk_helpers import BLOCK, assert_intact, k, write_ok
from hierarchy_helpers import chain_config, store_class, tier_store

from kvtier import Hierarchy
from kvtier.cli import main
from kvtier.errors import DiskLayoutError
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk.facade import StoreFacade
from kvtier.tiers.disk.testing import deterministic_block, flip_byte

pytestmark = pytest.mark.timeout(120)

BLOCKS = 12


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout + result.stderr


def fill(layout: str, directory: Path, ids: list[int]) -> Path:
    """A store of `layout` in the tier directory `directory` holding blocks `ids` (block i
    in slot i); its own directory."""
    store = tier_store(layout, directory, 32)
    try:
        asyncio.run(write_ok(store, ids, ids))
    finally:
        store.close()
    return store.path


def expected_blocks(ids: list[int]) -> torch.Tensor:
    return torch.stack([torch.as_tensor(deterministic_block(i, BLOCK)) for i in ids])


def open_tier(layout: str, directory: Path) -> StoreFacade:
    return store_class(layout)(directory, block_size=BLOCK, num_blocks=32, direct_io=False)


@pytest.mark.parametrize(("found", "wanted"), [("slots", "log"), ("log", "slots")])
async def test_a_store_of_the_other_layout_is_refused_in_one_line(
    tmp_path: Path, found: str, wanted: str
) -> None:
    old = await asyncio.to_thread(fill, found, tmp_path / "disk", list(range(BLOCKS)))
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=32, layout=wanted)
    with pytest.raises(DiskLayoutError) as refused:
        await Hierarchy.from_config(config).open()
    line = str(refused.value)
    assert "\n" not in line
    assert str(old) in line
    assert f"holding {BLOCKS} blocks" in line  # what is lost, counted
    assert f'set layout = "{found}"' in line  # keep using it
    assert f"kvtier migrate {old}" in line  # or copy it
    assert "remove that directory to start empty" in line and "are lost" in line
    assert not any(p.name.startswith("kvtier-") and p != old for p in old.parent.iterdir())
    # Naming its layout opens it with every block.
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=32, layout=found)
    async with Hierarchy.from_config(config) as h:
        ks = [k(i) for i in range(BLOCKS)]
        assert torch.equal((await h.get(ks)).cpu(), expected_blocks(list(range(BLOCKS))))


async def test_the_default_layout_is_log_and_an_empty_directory_opens(tmp_path: Path) -> None:
    from kvtier.tiers.disk.log_store import LogStore

    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, cpu=4, disk=32)) as h:
        assert isinstance(h.storages[-1], LogStore)


def test_migrate_in_place_copies_every_sound_block_and_skips_a_damaged_one(
    tmp_path: Path,
) -> None:
    ids = list(range(BLOCKS))
    old = fill("slots", tmp_path / "disk", ids)
    store = DiskStore(tmp_path / "disk", block_size=BLOCK, num_blocks=32, direct_io=False)
    try:
        slab, offset = store.slot_location(5)
    finally:
        store.close()
    flip_byte(slab, offset + 99)  # block 5 no longer verifies
    code, output = run("migrate", str(old))
    assert code == 1, output  # done, with a block skipped
    assert f"{BLOCKS} blocks found, {BLOCKS - 1} copied" in output
    assert "1 skipped as damaged" in output and "0 failed to store" in output
    assert not old.exists()  # replaced ...
    (new,) = [p for p in (tmp_path / "disk").iterdir()]  # ... by the log store, no staging
    assert new.name.startswith("kvtier-log-")
    store = open_tier("log", tmp_path / "disk")
    try:
        assert k(5) not in store  # the damaged block was never copied
        sound = [i for i in ids if i != 5]
        assert sorted(store.keys()) == sorted(k(i) for i in sound)
        asyncio.run(assert_intact(store, sound, sound))
    finally:
        store.close()


async def test_a_migrated_store_serves_its_blocks_to_a_default_chain(tmp_path: Path) -> None:
    ids = list(range(BLOCKS))
    old = await asyncio.to_thread(fill, "slots", tmp_path / "disk", ids)
    code, output = await asyncio.to_thread(run, "migrate", str(old))
    assert code == 0, output
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, cpu=4, disk=32)) as h:
        ks = [k(i) for i in ids]
        assert torch.equal((await h.get(ks)).cpu(), expected_blocks(ids))


def test_migrate_a_log_store_into_another_directory_keeps_it(tmp_path: Path) -> None:
    ids = list(range(BLOCKS))
    old = fill("log", tmp_path / "disk", ids)
    (tmp_path / "new").mkdir()
    code, output = run("migrate", str(old), str(tmp_path / "new"))
    assert code == 0, output
    assert f"{BLOCKS} blocks found, {BLOCKS} copied ({BLOCKS * BLOCK:,} bytes)" in output
    assert old.exists()  # DEST given: the old store is left alone
    store = open_tier("slots", tmp_path / "new")
    try:
        asyncio.run(assert_intact(store, ids, ids))
    finally:
        store.close()
    code, output = run("check", str(tmp_path / "new"))
    assert code == 0 and "all sound" in output, output


def test_migrate_refuses_what_is_not_a_store_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    code, output = run("migrate", str(tmp_path / "plain"))
    assert code == 2 and output.count("\n") == 1 and "not a store directory" in output
    old = fill("slots", tmp_path / "disk", [0])
    code, output = run("migrate", str(old), "--to", "slots")
    assert code == 2 and "already" in output


def test_migrate_of_a_store_in_use_changes_nothing(tmp_path: Path) -> None:
    ids = list(range(4))
    old = fill("slots", tmp_path / "disk", ids)
    holder = tier_store("slots", tmp_path / "disk", 32)  # a running kvtier holds it
    try:
        code, output = run("migrate", str(old))
    finally:
        holder.close()
    assert code == 4 and "in use" in output, output
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == [old.name]  # no staging
    store = open_tier("slots", tmp_path / "disk")
    try:
        asyncio.run(assert_intact(store, ids, ids))
    finally:
        store.close()


def test_migrate_copies_nothing_damaged_whatever_the_damage(tmp_path: Path) -> None:
    """Every block's bytes rotten: nothing is copied, and the new store is empty."""
    ids = list(range(6))
    old = fill("slots", tmp_path / "disk", ids)
    store = DiskStore(tmp_path / "disk", block_size=BLOCK, num_blocks=32, direct_io=False)
    try:
        places = [store.slot_location(i) for i in ids]
    finally:
        store.close()
    for slab, offset in places:
        flip_byte(slab, offset + 7)
    code, output = run("migrate", str(old))
    assert code == 1 and "0 copied" in output and "6 skipped as damaged" in output, output
    store = open_tier("log", tmp_path / "disk")
    try:
        assert store.restore() == []
    finally:
        store.close()


def test_check_of_a_config_finds_the_store_of_the_other_layout(tmp_path: Path) -> None:
    """`kvtier check --config` of a log tier (the default) over a per-block store: the store
    is checked as built, with a note saying that opening the tier refuses it and how on."""
    old = fill("slots", tmp_path / "disk", [0, 1, 2])
    config = tmp_path / "chain.toml"
    config.write_text(
        f'block_size = {BLOCK}\n[[tiers]]\nname = "disk"\nmedium = "disk"\ncapacity = 32\n'
        f'path = "{tmp_path / "disk"}"\n'
    )
    code, output = run("check", "--config", str(config))
    assert code == 0, output
    assert 'the config says layout = "log"' in output and f"kvtier migrate {old}" in output
    assert "3 index records checked" in output


@pytest.mark.parametrize("in_place", [True, False])
def test_migrate_never_writes_into_a_store_that_is_there(tmp_path: Path, in_place: bool) -> None:
    """Both layouts' stores in one directory (or DEST holding the target's store already):
    refused before anything is copied or removed, both stores as they were."""
    where = tmp_path / "disk" if in_place else tmp_path / "dest"
    there = fill("log", where, [7])  # first: a log store refuses to open beside a slots one
    old = fill("slots", tmp_path / "disk", [0, 1])
    before = files_of(there)
    args = ["migrate", str(old)] if in_place else ["migrate", str(old), str(where)]
    code, output = run(*args)
    assert code == 2 and "already exists" in output and output.count("\n") == 1, output
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == sorted(
        {old.name} | ({there.name} if in_place else set())
    )
    assert files_of(there) == before  # the store that was there: not a byte changed
    store = open_tier("slots", tmp_path / "disk")
    try:
        asyncio.run(assert_intact(store, [0, 1], [0, 1]))
    finally:
        store.close()


def files_of(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*") if p.is_file()}


async def test_a_log_store_of_another_log_format_is_refused_in_one_line(tmp_path: Path) -> None:
    """A log store this kvtier's log format does not read (its directory named by an older
    format's fingerprint, its layout.json recording that format): refused, not shadowed by
    an empty store beside it."""
    import json

    from kvtier.tiers.disk.log_format import LOG_FORMAT_VERSION

    store = await asyncio.to_thread(fill, "log", tmp_path / "disk", [0, 1])
    layout = json.loads((store / "layout.json").read_text())
    layout["format"] = LOG_FORMAT_VERSION - 1
    (store / "layout.json").write_text(json.dumps(layout))
    older = store.parent / "kvtier-log-00000000000000000000"
    store.rename(older)
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=32)
    with pytest.raises(DiskLayoutError) as refused:
        await Hierarchy.from_config(config).open()
    line = str(refused.value)
    assert "\n" not in line and str(older) in line
    assert f"format {LOG_FORMAT_VERSION - 1}" in line and "remove that directory" in line
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == [older.name]
    # Another model's log store of another format is none of this tier's business.
    layout["model_id"] = "another model"
    (older / "layout.json").write_text(json.dumps(layout))
    async with Hierarchy.from_config(config) as h:
        assert h.disabled_tiers == {}
