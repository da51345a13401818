"""`kvtier check`: every block of a config's disk tiers verified; exit status says what it found."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import lmdb
import numpy as np
import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.config import load_config
from kvtier.keys import key_from_int
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk.kind import DiskTierConfig

BLOCK = 4096
BLOCKS = 6


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def write_config(tmp_path: Path, capacity: int = 16, extra_tier: str = "") -> Path:
    config = tmp_path / "chain.toml"
    config.write_text(
        f"block_size = {BLOCK}\n"
        'model_id = "test-model"\n'
        f"{extra_tier}"
        '[[tiers]]\nname = "ssd"\nmedium = "disk"\n'
        f'capacity = {capacity}\npath = "{tmp_path / "tier"}"\n'
        'layout = "slots"\n'  # these tests damage the per-block store's own files
    )
    return config


def open_store(config_path: Path) -> DiskStore:
    config = load_config(config_path)
    tier = config.tiers[-1]
    assert isinstance(tier, DiskTierConfig)
    return DiskStore.from_config(tier, config.block_size, config.model_id)


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, list[int]]:
    """A config whose disk tier holds BLOCKS blocks (keys 0..5 in slots 10..15)."""
    config = write_config(tmp_path)
    store = open_store(config)
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (BLOCKS, BLOCK), dtype=np.uint8)
    slots = list(range(10, 10 + BLOCKS))
    keys = [key_from_int(i) for i in range(BLOCKS)]
    try:
        assert not any(asyncio.run(store.write(keys, slots, list(blocks))))
    finally:
        store.close()
    return config, slots


def flip_byte(config: Path, slot: int) -> None:
    store = open_store(config)
    try:
        slab, offset = store.slot_location(slot)
    finally:
        store.close()
    with open(slab, "r+b") as file:
        file.seek(offset + 123)
        byte = file.read(1)[0]
        file.seek(offset + 123)
        file.write(bytes([byte ^ 0x5A]))


def test_a_sound_disk_tier_exits_0(stored: tuple[Path, list[int]]) -> None:
    config, _ = stored
    code, stdout, stderr = run("check", "--config", str(config))
    assert code == 0, stdout + stderr
    assert "disk tier 'ssd'" in stdout
    assert f"{BLOCKS} index records checked" in stdout
    assert "all sound" in stdout


def test_a_flipped_byte_is_listed_with_its_key_and_exits_1(
    stored: tuple[Path, list[int]],
) -> None:
    config, slots = stored
    flip_byte(config, slots[2])
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 1
    key = key_from_int(2).hex()
    line = next(line for line in stdout.splitlines() if key in line)
    assert f"slot {slots[2]}" in line and "checksum mismatch" in line
    assert "1 problem:" in stdout and "--repair" in stdout
    # Nothing was dropped: a second check finds the same problem.
    assert run("check", "--config", str(config))[0] == 1


def test_repair_drops_the_bad_block_exits_3_and_then_the_tier_is_clean(
    stored: tuple[Path, list[int]],
) -> None:
    config, slots = stored
    flip_byte(config, slots[4])
    code, stdout, _ = run("check", "--config", str(config), "--repair")
    assert code == 3, stdout
    assert key_from_int(4).hex() in stdout and "dropped 1 bad record" in stdout
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 0, stdout
    assert f"{BLOCKS - 1} index records checked" in stdout
    store = open_store(config)
    try:
        assert key_from_int(4) not in store and key_from_int(3) in store
    finally:
        store.close()


def test_a_tier_in_use_cannot_be_checked_exit_4(stored: tuple[Path, list[int]]) -> None:
    config, _ = stored
    store = open_store(config)  # holds the lock, as a running hierarchy does
    try:
        code, stdout, _ = run("check", "--config", str(config))
    finally:
        store.close()
    assert code == 4
    assert "in use" in stdout and "running kvtier" in stdout
    assert "Traceback" not in stdout


@pytest.mark.usefixtures("stored")
def test_a_config_of_another_capacity_is_reported_and_never_resizes_the_store(
    tmp_path: Path,
) -> None:
    smaller = write_config(tmp_path, capacity=12)  # slots 12..15 would be cut off
    for repair in ([], ["--repair"]):
        code, stdout, _ = run("check", "--config", str(smaller), *repair)
        assert code == 0, stdout
        assert "the config says" in stdout and "capacity 12 blocks" in stdout
        assert "built with block_size 4096, model_id 'test-model', capacity 16 blocks" in stdout
        assert f"{BLOCKS} index records checked" in stdout
    store = open_store(write_config(tmp_path))  # the 16-block config that built it
    try:
        assert len(store) == BLOCKS and store.stats.dropped_at_open == 0
    finally:
        store.close()


def test_a_tier_directory_that_does_not_exist_holds_nothing_and_is_not_created(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path)
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 0
    assert "nothing stored yet" in stdout
    assert not (tmp_path / "tier").exists()


def test_a_config_without_disk_tiers_has_nothing_to_check(tmp_path: Path) -> None:
    config = tmp_path / "cpu.toml"
    config.write_text('block_size = 4096\n[[tiers]]\nname = "c"\nmedium = "cpu"\ncapacity = 4\n')
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 0
    assert "no disk tier, nothing to check" in stdout


def test_a_missing_config_is_one_line_exit_2(tmp_path: Path) -> None:
    code, stdout, stderr = run("check", "--config", str(tmp_path / "nope.toml"))
    assert code == 2
    assert stderr.count("\n") == 1 and "config file not found" in stderr
    assert "Traceback" not in stdout + stderr


def test_no_config_option_is_one_line_exit_2() -> None:
    code, _, stderr = run("check")
    assert code == 2
    assert stderr.count("\n") == 1 and "--config" in stderr


def test_help_documents_the_exit_status() -> None:
    code, stdout, _ = run("check", "--help")
    assert code == 0
    for status in ("0  every store is sound", "1  problems found", "3  problems found"):
        assert status in stdout
    assert "kvtier check --config" in stdout


# --------------------------------------------------------------------------------------------
# Checking a store by its directory; missing, stray and lost pieces (issue 9, item 7)
# --------------------------------------------------------------------------------------------


def store_dir_of(config: Path) -> Path:
    store = open_store(config)
    try:
        return store.path
    finally:
        store.close()


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` with its bytes (to show that nothing changed)."""
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name not in ("lock.mdb",)
    }


@pytest.mark.parametrize("which", ["store", "tier"])
def test_a_store_is_checked_by_its_directory_alone(
    stored: tuple[Path, list[int]], which: str
) -> None:
    config, _ = stored
    store_dir = store_dir_of(config)
    target = store_dir if which == "store" else store_dir.parent
    code, stdout, _ = run("check", str(target))
    assert code == 0, stdout
    assert f"{BLOCKS} index records checked" in stdout and "capacity 16 blocks" in stdout


def test_a_missing_slab_file_is_reported_and_not_recreated_without_repair(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, capacity=4096)  # 16 MiB: one slab file of 4096 slots
    store = open_store(config)
    try:
        keys = [key_from_int(i) for i in range(3)]
        blocks = [np.full(BLOCK, i, np.uint8) for i in range(3)]
        assert not any(asyncio.run(store.write(keys, [0, 1, 2], blocks)))
        slab, _ = store.slot_location(0)
    finally:
        store.close()
    slab.unlink()
    before = snapshot(tmp_path / "tier")
    for _ in range(2):  # and again: nothing was dropped
        code, stdout, _ = run("check", "--config", str(config))
        assert code == 1, stdout
        assert stdout.count("slab-00000.bin is missing") == 3
    assert not slab.exists() and snapshot(tmp_path / "tier") == before
    code, stdout, _ = run("check", "--config", str(config), "--repair")
    assert code == 3, stdout
    assert run("check", "--config", str(config))[0] == 0


def test_a_stray_slab_file_is_a_note_that_repair_removes(stored: tuple[Path, list[int]]) -> None:
    config, _ = stored
    stray = store_dir_of(config) / "slab-xyz.bin"
    stray.write_bytes(b"junk")
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 0 and "unknown file in the store directory: slab-xyz.bin" in stdout
    assert stray.exists()
    code, stdout, _ = run("check", "--config", str(config), "--repair")
    assert code == 0 and "removed the stray slab file slab-xyz.bin" in stdout
    assert not stray.exists()
    assert "slab-xyz" not in run("check", "--config", str(config))[1]


def delete_records(store_dir: Path, keys: list[bytes]) -> None:
    env = lmdb.open(str(store_dir / "index"), max_dbs=2)
    try:
        with env.begin(db=env.open_db(b"blocks"), write=True) as txn:
            for key in keys:
                assert txn.delete(key)
    finally:
        env.close()


@pytest.mark.parametrize(
    "lose",
    ["one record", "every record", "the index directory", "the index file", "a damaged index"],
)
def test_lost_records_are_found_and_repair_brings_every_block_back(
    stored: tuple[Path, list[int]], lose: str
) -> None:
    config, slots = stored
    store_dir = store_dir_of(config)
    index = store_dir / "index"
    if lose == "one record":
        delete_records(store_dir, [key_from_int(3)])
    elif lose == "every record":
        delete_records(store_dir, [key_from_int(i) for i in range(BLOCKS)])
    elif lose == "the index directory":
        shutil.rmtree(index)
    elif lose == "the index file":
        (index / "data.mdb").unlink()
    else:
        with (index / "data.mdb").open("r+b") as file:
            file.write(bytes(8192))  # both meta pages
    before = snapshot(store_dir)
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 1, stdout
    if lose in ("one record", "every record"):
        lost = 1 if lose == "one record" else BLOCKS
        assert stdout.count("lost record") == lost
    else:
        assert "--repair" in stdout and ("index" in stdout)
    assert snapshot(store_dir) == before  # nothing changed without --repair
    code, stdout, _ = run("check", "--config", str(config), "--repair")
    assert code == 3, stdout
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 0, stdout
    assert f"{BLOCKS} index records checked" in stdout
    store = open_store(config)
    try:
        assert sorted(store.record(key_from_int(i)).slot for i in range(BLOCKS)) == slots  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_replays_out_directory_is_searched_for_its_stores(tmp_path: Path) -> None:
    """`kvtier check kvtier-out` after a replay: its stores are OUT/disk/<tier>/kvtier-<fp>,
    three levels down; each is found and checked, named as the user can give it."""
    out = tmp_path / "kvtier-out"
    stores = []
    for tier, block in (("disk", BLOCK), ("ssd", 2 * BLOCK)):
        store = DiskStore(out / "disk" / tier, block_size=block, num_blocks=4, direct_io=False)
        store.close()
        stores.append(store.path)
    (out / "report.json").write_text("{}")
    (out / "charts" / "kvtier-notastore").mkdir(parents=True)  # no headers, not a store name
    code, stdout, _ = run("check", str(out))
    assert code == 0, stdout
    assert [line for line in stdout.splitlines() if line.startswith("store ")] == [
        f"store {path}:" for path in sorted(stores)
    ]
    assert stdout.count("0 index records checked") == 2


def test_a_directory_without_stores_near_it_says_how_deep_it_looked(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c" / "d" / "e"
    store = DiskStore(deep, block_size=BLOCK, num_blocks=4, direct_io=False)
    store.close()  # five levels down (its store six): out of reach
    code, stdout, _ = run("check", str(tmp_path))
    assert code == 0
    assert (
        stdout.strip()
        == f"{tmp_path}: no kvtier store here or up to 4 levels below, nothing to check"
    )
    code, stdout, _ = run("check", str(deep.parent.parent))  # within reach from here
    assert code == 0 and f"store {store.path}:" in stdout


# --------------------------------------------------------------------------------------------
# Issue 31, item 12.6: what --repair reports is what it did, and it leaves an openable store
# --------------------------------------------------------------------------------------------


def served(config: Path) -> list[int]:
    """The keys (of 0..19) the store serves: a record, and a read that verifies."""
    store = open_store(config)
    found = []
    try:
        for i in range(20):
            record = store.record(key_from_int(i))
            if record is None:
                continue
            out = np.zeros(BLOCK, np.uint8)
            if asyncio.run(store.read([key_from_int(i)], [record.slot], [out])) == [None]:
                found.append(i)
    finally:
        store.close()
    return found


def test_a_slab_file_replaced_by_a_directory_is_named_and_repaired_to_an_openable_store(
    stored: tuple[Path, list[int]],
) -> None:
    config, _ = stored
    slab = store_dir_of(config) / "slab-00000.bin"
    slab.unlink()
    slab.mkdir()
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 1, stdout
    assert "slab-00000.bin is a directory, not a regular file" in stdout
    assert "ends at byte" not in stdout  # not taken for a short file
    code, stdout, _ = run("check", "--config", str(config), "--repair")
    assert code == 3, stdout  # repaired, not "cannot check"
    assert "moved aside" in stdout and "the blocks of its slots are lost" in stdout
    assert run("check", "--config", str(config))[0] == 0
    assert slab.is_file() and served(config) == []  # opens; its blocks are gone


def test_an_interrupted_write_groups_blocks_are_reported_as_what_repair_clears(
    stored: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """A write group killed after its slot headers, before its index commit: check called
    its blocks lost records, --repair cleared them instead and still exited 3."""
    from kvtier.tiers.disk.inflight import InflightLog

    config, _ = stored
    store_dir = store_dir_of(config)
    shutil.copytree(store_dir / "index", tmp_path / "index-before")
    store = open_store(config)
    rng = np.random.default_rng(7)
    try:  # key 7 into a free slot, key 8 over key 1's block (slot 11)
        blocks = list(rng.integers(0, 256, (2, BLOCK), dtype=np.uint8))
        assert not any(
            asyncio.run(store.write([key_from_int(7), key_from_int(8)], [2, 11], blocks))
        )
    finally:
        store.close()
    shutil.rmtree(store_dir / "index")
    shutil.copytree(tmp_path / "index-before", store_dir / "index")  # the commit never was
    log = InflightLog(store_dir / "inflight", 0o600)
    log.record([2, 11])
    log.close()
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 1, stdout
    assert "lost record" not in stdout  # nothing a repair would not restore
    assert stdout.count("did not finish (never reported stored)") == 2
    code, stdout, _ = run("check", "--config", str(config), "--repair")
    assert code == 3, stdout
    assert "cleared the headers of 2 slots" in stdout and "dropped when the store opened" in stdout
    assert run("check", "--config", str(config))[0] == 0
    assert served(config) == [0, 2, 3, 4, 5]  # key 1's block was overwritten: gone


def test_a_cut_header_file_never_shrinks_the_store_nor_drops_its_blocks(
    stored: tuple[Path, list[int]],
) -> None:
    config, _ = stored
    headers = store_dir_of(config) / "headers.bin"
    size = headers.stat().st_size
    headers.write_bytes(headers.read_bytes()[: size - 1])  # the last slot's entry cut
    code, stdout, _ = run("check", "--config", str(config))
    assert code == 1, stdout
    assert "headers.bin is cut short: entries for 15 of the store's 16 slots" in stdout
    assert "capacity 16 blocks" in stdout and "slot beyond" not in stdout
    code, stdout, _ = run("check", "--config", str(config), "--repair")
    assert code == 3, stdout
    assert run("check", "--config", str(config))[0] == 0
    assert headers.stat().st_size == size and served(config) == list(range(BLOCKS))
