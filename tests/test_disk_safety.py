"""The disk store's file-system rules (issue 9, items 4 and 5): no symlink followed, no
directory trusted that others can write, every directory it creates 0700, nothing chmod-ed
that it did not create, the space it needs checked before it allocates, and a failed open
leaves the file system as it found it."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.errors import DiskTierError
from kvtier.keys import key_from_int
from kvtier.tiers.disk import DiskStore, FaultyIO
from kvtier.tiers.disk import safety as safety_module
from kvtier.tiers.disk.testing import deterministic_block

BLOCK = 4096


def open_store(directory: Path, **kwargs: Any) -> DiskStore:
    options: dict[str, Any] = {"block_size": BLOCK, "num_blocks": 16, "direct_io": False}
    options.update(kwargs)
    return DiskStore(directory, **options)


async def filled(directory: Path, count: int = 4, **kwargs: Any) -> Path:
    disk = open_store(directory, **kwargs)
    try:
        ids = list(range(count))
        blocks = [deterministic_block(i, BLOCK) for i in ids]
        assert await disk.write([key_from_int(i) for i in ids], ids, blocks) == [None] * count
        return disk.path
    finally:
        await disk.aclose()


def tree(directory: Path) -> dict[str, tuple[int, int]]:
    """Every entry under `directory` with (size, mode): to show that nothing changed."""
    return {
        str(path.relative_to(directory)): (os.lstat(path).st_size, os.lstat(path).st_mode)
        for path in sorted(directory.rglob("*"))
    }


# --------------------------------------------------------------------------------------------
# Symlinks and hostile directories
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["slab-00000.bin", "lock", "headers.bin", "inflight", "index/data.mdb"]
)
async def test_a_planted_symlink_is_refused_and_its_target_untouched(
    tmp_path: Path, name: str
) -> None:
    store_dir = await filled(tmp_path / "tier")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.chmod(victim, 0o644)
    link = store_dir / name
    link.unlink()
    link.symlink_to(victim)
    with pytest.raises(DiskTierError, match="symlink"):
        open_store(tmp_path / "tier")
    assert victim.read_bytes() == b"precious"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert link.is_symlink()  # not replaced either


async def test_a_symlinked_store_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = await filled(tmp_path / "elsewhere")
    (tmp_path / "tier").mkdir(mode=0o700)
    (tmp_path / "tier" / elsewhere.name).symlink_to(elsewhere)
    with pytest.raises(DiskTierError, match="symlink"):
        open_store(tmp_path / "tier")


async def test_a_store_directory_others_can_write_is_refused_and_not_chmodded(
    tmp_path: Path,
) -> None:
    store_dir = await filled(tmp_path / "tier")
    os.chmod(store_dir, 0o770)
    with pytest.raises(DiskTierError, match=r"writable by its group \d+ \(mode 770\).*chmod go-w"):
        open_store(tmp_path / "tier")
    assert stat.S_IMODE(store_dir.stat().st_mode) == 0o770


@pytest.mark.parametrize(("mode", "ok"), [(0o777, False), (0o775, False), (0o1777, True)])
def test_a_parent_others_can_write_is_refused_unless_sticky(
    tmp_path: Path, mode: int, ok: bool
) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, mode)
    if ok:
        open_store(parent).close()
    else:
        with pytest.raises(DiskTierError, match="without the sticky bit"):
            open_store(parent)
        assert list(parent.iterdir()) == []  # nothing created in it
    assert stat.S_IMODE(parent.stat().st_mode) == mode


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
async def test_as_root_a_store_built_by_another_user_is_refused(tmp_path: Path) -> None:
    store_dir = await filled(tmp_path / "tier")
    os.chown(store_dir, 12345, 12345)
    with pytest.raises(DiskTierError, match="owned by uid 12345"):
        open_store(tmp_path / "tier")


def test_created_directories_are_0700_even_under_a_loose_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        open_store(tmp_path / "a" / "b" / "c").close()
    finally:
        os.umask(old)
    for path in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    store_dir = next((tmp_path / "a" / "b" / "c").iterdir())
    assert stat.S_IMODE(store_dir.stat().st_mode) == 0o700


async def test_existing_files_keep_their_mode(tmp_path: Path) -> None:
    store_dir = await filled(tmp_path / "tier")
    os.chmod(store_dir / "slab-00000.bin", 0o400)  # the owner made it read-only
    os.chmod(store_dir / "headers.bin", 0o640)
    open_store(tmp_path / "tier").close()
    assert stat.S_IMODE((store_dir / "slab-00000.bin").stat().st_mode) == 0o400
    assert stat.S_IMODE((store_dir / "headers.bin").stat().st_mode) == 0o640


def test_a_mistyped_path_grows_no_directory_tree(tmp_path: Path) -> None:
    with pytest.raises(DiskTierError, match=r"parent directory .*typo.* does not exist"):
        open_store(tmp_path / "typo" / "kvtier", create_parents=False)
    assert not (tmp_path / "typo").exists()
    open_store(tmp_path / "kvtier", create_parents=False).close()  # one level is fine


# --------------------------------------------------------------------------------------------
# Space
# --------------------------------------------------------------------------------------------


def test_a_tier_larger_than_the_file_system_fails_at_open_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    free = safety_module.free_bytes(tmp_path)
    blocks = free // (1 << 20) + 1024  # 1 GiB more than is free
    with pytest.raises(DiskTierError) as caught:
        DiskStore(tmp_path / "tier", block_size=1 << 20, num_blocks=blocks, direct_io=False)
    message = str(caught.value)
    assert "needs" in message and "free" in message and str(tmp_path / "tier") in message
    assert not (tmp_path / "tier").exists()
    assert safety_module.free_bytes(tmp_path) >= free - (64 << 20)  # nothing left allocated


def test_the_shortfall_message_names_the_tier_and_both_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(safety_module, "free_bytes", lambda path: 1 << 20)
    with pytest.raises(DiskTierError) as caught:
        DiskStore(tmp_path / "tier", block_size=1 << 20, num_blocks=16, direct_io=False)
    message = str(caught.value)
    assert f"the disk tier at {tmp_path / 'tier'}" in message
    assert "needs 17.0 MiB more" in message and "only 1.0 MiB free" in message


async def test_a_failed_growth_is_rolled_back_and_the_store_still_opens(tmp_path: Path) -> None:
    store_dir = await filled(tmp_path / "tier", count=4, slab_file_bytes=8 * BLOCK)
    before = tree(store_dir)
    io = FaultyIO()
    io.inject("allocate", errno.ENOSPC, path_suffix="slab-00003.bin")
    with pytest.raises(DiskTierError, match="No space"):
        open_store(tmp_path / "tier", num_blocks=32, io=io, slab_file_bytes=8 * BLOCK)
    after = tree(store_dir)
    assert {name: size for name, (size, _) in after.items() if "slab" in name} == {
        name: size for name, (size, _) in before.items() if "slab" in name
    }
    assert (store_dir / "headers.bin").stat().st_size == before["headers.bin"][0]
    disk = open_store(tmp_path / "tier", slab_file_bytes=8 * BLOCK)
    try:
        assert len(disk) == 4
        (buffer,) = [np.empty(BLOCK, np.uint8)]
        assert await disk.read([key_from_int(2)], [2], [buffer]) == [None]
        assert np.array_equal(buffer, deterministic_block(2, BLOCK))
    finally:
        await disk.aclose()


async def test_the_index_space_is_reserved_at_open(tmp_path: Path) -> None:
    store_dir = await filled(tmp_path / "tier")
    data = store_dir / "index" / "data.mdb"
    assert data.stat().st_blocks * 512 >= 1 << 20  # allocated, not sparse


async def test_a_failed_open_of_an_existing_store_removes_the_files_it_created(
    tmp_path: Path,
) -> None:
    """A store directory that exists but lost its header file, lock, in-flight log and index
    (say, a user cleaned it by hand) and then fails to open leaves nothing new behind."""
    store_dir = await filled(tmp_path / "tier", count=0, slab_file_bytes=8 * BLOCK)
    for name in ("headers.bin", "lock", "inflight"):
        (store_dir / name).unlink(missing_ok=True)
    for path in (store_dir / "index").iterdir():
        path.unlink()
    (store_dir / "index").rmdir()
    before = tree(store_dir)
    io = FaultyIO()
    io.inject("allocate", errno.ENOSPC, path_suffix="slab-00003.bin")
    with pytest.raises(DiskTierError, match="No space"):
        open_store(tmp_path / "tier", num_blocks=32, io=io, slab_file_bytes=8 * BLOCK)
    assert tree(store_dir) == before


def test_preallocate_gives_back_a_partial_allocation_on_no_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "file"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 4096)

        def partial(fd: int, offset: int, length: int) -> None:
            os.ftruncate(fd, length // 2)  # what a file system may keep of a failed fallocate
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

        monkeypatch.setattr(os, "posix_fallocate", partial)
        with pytest.raises(DiskTierError, match=r"no space left to allocate 1\.0 MiB for .*file"):
            safety_module.preallocate(fd, 1 << 20, path)
        assert os.fstat(fd).st_size == 4096
    finally:
        os.close(fd)
