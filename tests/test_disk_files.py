"""`kvtier.tiers.disk.files`: the disk store's file-system safety and space rules (issue 9,
items 4 and 5), function by function: no symlink followed, directories created 0700 (the
intermediate ones too), a directory others can write refused and never chmod-ed, the tier
directory's owner and sticky bit, a mistyped path refused, the free-space message, and a
failed open's roll-back of what it created and grew.

Run as root, the ownership tests make a directory really foreign with chown; run as another
user, they make this user look like someone else by faking `os.geteuid`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvtier.errors import DiskTierError, InvalidValueError
from kvtier.tiers.disk.files import (
    CreatedFiles,
    allocated_bytes,
    check_free_space,
    check_parent_dir,
    check_private_dir,
    ensure_private_dir,
    format_bytes,
    free_bytes,
    open_dir_fd,
    open_file,
    open_or_create,
    preallocate,
)

MiB = 1 << 20
GiB = 1 << 30
NOBODY = 65534


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def snapshot(path: Path) -> tuple[int, int, bytes]:
    """(mode, size, content) of a file: to show that nothing changed it."""
    info = os.lstat(path)
    return stat.S_IMODE(info.st_mode), info.st_size, path.read_bytes()


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def make_foreign(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `path` (ours) owned by another, non-root user: for real with chown when root,
    else by faking this process's effective uid."""
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    else:
        fake = os.geteuid() + 4242
        monkeypatch.setattr(os, "geteuid", lambda: fake)
    assert os.lstat(path).st_uid != os.geteuid()


# --------------------------------------------------------------------------------------------
# Opening: O_NOFOLLOW | O_CLOEXEC
# --------------------------------------------------------------------------------------------


def test_open_file_refuses_a_symlink_to_a_file_and_leaves_its_target_alone(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.chmod(victim, 0o644)
    link = tmp_path / "slab-00000.bin"
    link.symlink_to(victim)
    before = snapshot(victim)
    for flags in (os.O_RDONLY, os.O_RDWR, os.O_RDWR | os.O_CREAT, os.O_RDWR | os.O_TRUNC):
        with pytest.raises(DiskTierError, match="is a symlink; refusing to follow it") as caught:
            open_file(link, flags)
        assert str(link) in str(caught.value)
    assert snapshot(victim) == before


def test_open_file_sets_close_on_exec_and_opens_plain_files(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    fd = open_file(path, os.O_RDWR | os.O_CREAT)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert not os.get_inheritable(fd)
        os.write(fd, b"abc")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abc"
    with pytest.raises(FileNotFoundError):
        open_file(tmp_path / "missing", os.O_RDONLY)


def test_every_open_asks_for_nofollow_and_cloexec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python makes descriptors non-inheritable anyway; the flags show the intent is explicit.
    real_open = os.open
    asked: list[int] = []

    def spy(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        asked.append(flags)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", spy)
    os.close(open_file(tmp_path / "a", os.O_RDWR | os.O_CREAT))
    os.close(open_or_create(tmp_path / "b")[0])
    os.close(open_or_create(tmp_path / "b")[0])
    os.close(open_dir_fd(tmp_path))
    ensure_private_dir(tmp_path / "c" / "d", create_parents=True)
    assert len(asked) >= 6
    for flags in asked:
        assert flags & os.O_NOFOLLOW and flags & os.O_CLOEXEC


def test_open_file_names_a_symlink_loop_in_the_directories_above(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(DiskTierError, match=r"cannot open .*a/lock"):
        open_file(tmp_path / "a" / "lock", os.O_RDONLY)


@pytest.mark.parametrize("name", ["lock", "slab-00000.bin", "headers.bin"])
def test_a_planted_symlink_for_a_store_file_is_never_followed(tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * 100)
    os.chmod(victim, 0o644)
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    (store / name).symlink_to(victim)
    before = snapshot(victim)
    created = CreatedFiles()
    with pytest.raises(DiskTierError, match="is a symlink; refusing to follow it"):
        open_or_create(store / name, os.O_RDWR, record=created)
    assert created.files == ()
    assert snapshot(victim) == before
    assert os.path.islink(store / name)


def test_a_dangling_symlink_does_not_create_its_target(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "planted"
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "lock"
    link.symlink_to(target)
    with pytest.raises(DiskTierError, match="is a symlink"):
        open_or_create(link)
    with pytest.raises(DiskTierError, match="is a symlink"):
        open_file(link, os.O_RDWR | os.O_CREAT)
    assert not target.exists()


def test_open_or_create_says_whether_it_created_and_sets_the_mode_only_then(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lock"
    old = os.umask(0o277)  # would leave a new file 0400: not reopenable for writing
    try:
        fd, created = open_or_create(path)
    finally:
        os.umask(old)
    os.close(fd)
    assert created
    assert mode_of(path) == 0o600
    os.chmod(path, 0o640)  # the user's choice on an existing file is kept
    fd, created = open_or_create(path)
    os.close(fd)
    assert not created
    assert mode_of(path) == 0o640


def test_open_or_create_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DiskTierError, match="fifo is not a regular file"):
        open_or_create(tmp_path / "fifo")


def test_open_dir_fd_opens_a_directory_and_refuses_a_symlink_or_a_file(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "file").write_bytes(b"")
    fd = open_dir_fd(real)
    try:
        os.fsync(fd)
        assert stat.S_ISDIR(os.fstat(fd).st_mode)
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(fd)
    with pytest.raises(DiskTierError, match="link is a symlink; refusing to follow it"):
        open_dir_fd(tmp_path / "link")
    with pytest.raises(DiskTierError, match="file is not a directory"):
        open_dir_fd(tmp_path / "file")


# --------------------------------------------------------------------------------------------
# Private directories
# --------------------------------------------------------------------------------------------


def test_created_directories_are_0700_intermediates_too(tmp_path: Path, umask_022: None) -> None:
    top = tmp_path / "a"
    path = top / "b" / "c" / "kvtier-x"
    os.chmod(tmp_path, 0o755)
    created = CreatedFiles()
    assert ensure_private_dir(path, create_parents=True, record=created)
    for directory in (top, top / "b", top / "b" / "c", path):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
    assert created.dirs == tuple(str(d) for d in (top, top / "b", top / "b" / "c", path))
    assert mode_of(tmp_path) == 0o755  # existed: untouched
    assert not ensure_private_dir(path, create_parents=True)  # exists now: not created again


def test_created_directories_are_0700_even_under_a_narrowing_umask(tmp_path: Path) -> None:
    old = os.umask(0o277)  # mkdir would give 0500: nothing could be created inside
    try:
        ensure_private_dir(tmp_path / "a" / "b", create_parents=True)
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "a") == 0o700
    assert mode_of(tmp_path / "a" / "b") == 0o700


def test_a_mistyped_path_is_refused_without_create_parents(tmp_path: Path) -> None:
    path = tmp_path / "dat" / "kvtier"  # "dat" was meant to be an existing "data"
    with pytest.raises(DiskTierError, match=r"parent directory .*dat does not exist") as caught:
        ensure_private_dir(path, create_parents=False)
    assert "mistyped" in str(caught.value)
    assert not (tmp_path / "dat").exists()
    assert ensure_private_dir(tmp_path / "kvtier", create_parents=False)  # parent exists
    assert mode_of(tmp_path / "kvtier") == 0o700


@pytest.mark.parametrize("mode", [0o720, 0o702, 0o777])
def test_a_store_dir_others_can_write_is_refused_and_not_chmodded(
    tmp_path: Path, mode: int
) -> None:
    path = tmp_path / "kvtier-x"
    path.mkdir()
    os.chmod(path, mode)
    with pytest.raises(DiskTierError, match="writable by group or others") as caught:
        ensure_private_dir(path, create_parents=False)
    message = str(caught.value)
    assert f"{mode:04o}" in message
    assert f"chmod go-w {path}" in message
    assert mode_of(path) == mode


@pytest.mark.parametrize(("racer_mode", "accepted"), [(0o755, True), (0o777, False)])
def test_a_directory_another_process_creates_meanwhile_is_not_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, racer_mode: int, accepted: bool
) -> None:
    path = tmp_path / "tier" / "kvtier-x"
    real_mkdir = os.mkdir

    def racing_mkdir(target: str | os.PathLike[str], mode: int = 0o777) -> None:
        if Path(target) == path:  # another process wins the race for the store directory
            real_mkdir(target)
            os.chmod(target, racer_mode)
            raise FileExistsError(errno.EEXIST, "File exists", target)
        real_mkdir(target, mode)

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    created = CreatedFiles()
    if accepted:
        assert not ensure_private_dir(path, create_parents=True, record=created)
    else:
        with pytest.raises(DiskTierError, match="writable by group or others"):
            ensure_private_dir(path, create_parents=True, record=created)
    assert created.dirs == (str(tmp_path / "tier"),)  # only what this call made
    assert mode_of(path) == racer_mode  # never chmod-ed


def test_an_existing_private_dir_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "kvtier-x"
    path.mkdir()
    os.chmod(path, 0o750)  # not writable by others: accepted as it is
    assert not ensure_private_dir(path, create_parents=False)
    assert mode_of(path) == 0o750


def test_a_store_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.chmod(real, 0o755)
    link = tmp_path / "kvtier-x"
    link.symlink_to(real)
    with pytest.raises(DiskTierError, match="kvtier-x is a symlink; refusing to follow it"):
        ensure_private_dir(link, create_parents=False)
    assert mode_of(real) == 0o755
    dangling = tmp_path / "kvtier-y"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(DiskTierError, match="kvtier-y is a symlink"):
        ensure_private_dir(dangling, create_parents=True)
    assert not (tmp_path / "nowhere").exists()


def test_a_file_where_a_directory_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(DiskTierError, match="file is not a directory"):
        ensure_private_dir(tmp_path / "file", create_parents=False)
    with pytest.raises(
        DiskTierError, match=r"cannot create the directory .*file/sub: Not a directory"
    ):
        ensure_private_dir(tmp_path / "file" / "sub", create_parents=True)


def test_a_store_dir_owned_by_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kvtier-x"
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    make_foreign(path, monkeypatch)
    with pytest.raises(DiskTierError, match="choose a directory you own") as caught:
        ensure_private_dir(path, create_parents=False)
    assert f"owned by uid {os.lstat(path).st_uid}" in str(caught.value)
    assert mode_of(path) == 0o700


@pytest.mark.skipif(os.geteuid() == 0, reason="root owns / itself")
def test_a_root_owned_directory_is_not_private_to_a_user() -> None:
    with pytest.raises(DiskTierError, match="owned by uid 0, not by this user"):
        check_private_dir("/")


# --------------------------------------------------------------------------------------------
# The tier directory (the store directory's parent)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o1777, 0o1770, 0o3777])
def test_parent_dir_accepted_when_only_we_can_write_or_sticky(tmp_path: Path, mode: int) -> None:
    parent = tmp_path / "tier"
    parent.mkdir()
    os.chmod(parent, mode)
    check_parent_dir(parent)
    assert stat.S_IMODE(os.stat(parent).st_mode) == mode


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o2777])
def test_parent_dir_others_can_write_without_sticky_bit_is_refused(
    tmp_path: Path, mode: int
) -> None:
    parent = tmp_path / "tier"
    parent.mkdir()
    os.chmod(parent, mode)
    with pytest.raises(DiskTierError, match="without the sticky bit") as caught:
        check_parent_dir(parent)
    assert f"chmod go-w {parent}" in str(caught.value)
    assert stat.S_IMODE(os.stat(parent).st_mode) == mode


def test_parent_dir_owned_by_root_is_accepted_by_another_owner_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() == 0:  # look like another user, to whom root's directories are trusted
        monkeypatch.setattr(os, "geteuid", lambda: 4242)
    for path in ("/", "/tmp"):  # root's, 0755 and 1777 (sticky) on most systems
        info = os.stat(path)
        if info.st_uid == 0 and (not info.st_mode & 0o022 or info.st_mode & stat.S_ISVTX):
            check_parent_dir(path)
    monkeypatch.undo()
    parent = tmp_path / "tier"
    parent.mkdir(mode=0o755)
    make_foreign(parent, monkeypatch)
    with pytest.raises(DiskTierError, match=r"neither this user .* nor root"):
        check_parent_dir(parent)


def test_parent_dir_must_exist_and_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(DiskTierError, match="missing does not exist"):
        check_parent_dir(tmp_path / "missing")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(DiskTierError, match="file is not a directory"):
        check_parent_dir(tmp_path / "file")


# --------------------------------------------------------------------------------------------
# Space
# --------------------------------------------------------------------------------------------


def fake_statvfs(monkeypatch: pytest.MonkeyPatch, free: int) -> list[str]:
    """Make every statvfs report `free` bytes available (4 KiB fragments); the paths asked."""
    asked: list[str] = []

    def statvfs(path: str | os.PathLike[str]) -> SimpleNamespace:
        asked.append(os.fspath(path))
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return SimpleNamespace(f_bavail=free // 4096, f_frsize=4096)

    monkeypatch.setattr(os, "statvfs", statvfs)
    return asked


def test_format_bytes() -> None:
    assert format_bytes(12) == "12 bytes"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(16 * GiB) == "16.0 GiB"
    assert format_bytes(3 << 50) == "3.0 PiB"


def test_free_bytes_of_the_file_system_and_of_a_path_not_created_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = free_bytes(tmp_path)
    assert isinstance(real, int) and real > 0  # (others may write meanwhile: no exact value)
    asked = fake_statvfs(monkeypatch, 10 * 4096)
    assert free_bytes(tmp_path / "not" / "yet") == 10 * 4096
    assert asked[-1] == str(tmp_path)


def test_check_free_space_names_both_sizes_the_tier_and_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_statvfs(monkeypatch, GiB)
    with pytest.raises(DiskTierError) as caught:
        check_free_space(tmp_path, 16 * GiB, "at /data/kvtier-ab12")
    message = str(caught.value)
    assert message.startswith("disk tier at /data/kvtier-ab12: needs ")
    assert f"{16 * GiB} more bytes (16.0 GiB)" in message
    assert f"only {GiB} bytes (1.0 GiB) free" in message
    assert str(tmp_path) in message
    check_free_space(tmp_path, GiB, "fits exactly")
    with pytest.raises(DiskTierError, match=f"needs {GiB + 4096} more bytes"):
        check_free_space(tmp_path, GiB + 4096, "one page too many")
    check_free_space(tmp_path, 0, "nothing needed")
    check_free_space(tmp_path, -5 * GiB, "already allocated")


def test_check_free_space_against_the_real_file_system(tmp_path: Path) -> None:
    check_free_space(tmp_path, 4096, "a page")
    too_much = free_bytes(tmp_path) + (1 << 50)
    with pytest.raises(DiskTierError, match=f"needs {too_much} more bytes"):
        check_free_space(tmp_path, too_much, "huge")


def test_allocated_bytes_by_fd_and_path(tmp_path: Path) -> None:
    path = tmp_path / "slab"
    assert allocated_bytes(path) == 0  # missing
    fd = open_file(path, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, 64 * MiB)  # sparse: long, nothing allocated
        assert allocated_bytes(fd) < MiB
        reserved = preallocate(fd, 8 * MiB)
        if reserved:
            assert allocated_bytes(fd) >= 8 * MiB
        assert allocated_bytes(path) == allocated_bytes(fd)
    finally:
        os.close(fd)
    link = tmp_path / "link"
    link.symlink_to(path)
    assert allocated_bytes(link) == os.lstat(link).st_blocks * 512  # the link, not its target
    if reserved:
        assert allocated_bytes(link) < MiB


# --------------------------------------------------------------------------------------------
# Preallocation
# --------------------------------------------------------------------------------------------


def test_preallocate_reserves_and_never_shrinks(tmp_path: Path) -> None:
    path = tmp_path / "slab"
    fd, _ = open_or_create(path)
    try:
        reserved = preallocate(fd, 4 * MiB)
        assert os.fstat(fd).st_size == 4 * MiB
        if reserved:  # ext4, xfs, tmpfs, btrfs: the space is held now
            assert allocated_bytes(fd) >= 4 * MiB
        os.pwrite(fd, b"kept", 0)
        preallocate(fd, MiB)
        assert os.fstat(fd).st_size == 4 * MiB
        assert os.pread(fd, 4, 0) == b"kept"
        assert preallocate(fd, 0)
        with pytest.raises(InvalidValueError, match="negative"):
            preallocate(fd, -1)
    finally:
        os.close(fd)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_preallocate_falls_back_to_a_sparse_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    fd, _ = open_or_create(tmp_path / "slab")
    try:
        assert preallocate(fd, 16 * MiB) is False
        assert os.fstat(fd).st_size == 16 * MiB
        assert allocated_bytes(fd) < MiB  # sparse
    finally:
        os.close(fd)


def test_preallocate_on_a_full_disk_names_the_file_and_size_and_gives_back_the_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "slab-00000.bin"
    path.write_bytes(b"old bytes")

    def partly_then_full(fd: int, offset: int, length: int) -> None:
        os.ftruncate(fd, length // 2)  # what a file system may do before it runs out
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", partly_then_full)
    fd = open_file(path, os.O_RDWR)
    try:
        with pytest.raises(DiskTierError) as caught:
            preallocate(fd, 16 * GiB)
        message = str(caught.value)
        assert str(path) in message  # named through /proc
        assert f"{16 * GiB} bytes (16.0 GiB)" in message
        assert "No space left on device" in message
        with pytest.raises(DiskTierError, match="for the slab file: No space"):
            preallocate(fd, GiB, name="the slab file")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"old bytes"


def test_preallocate_passes_other_errors_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "posix_fallocate", broken)
    fd, _ = open_or_create(tmp_path / "slab")
    try:
        with pytest.raises(OSError) as caught:
            preallocate(fd, MiB)
        assert caught.value.errno == errno.EIO
        assert not isinstance(caught.value, DiskTierError)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Rolling back a failed open
# --------------------------------------------------------------------------------------------


def failed_open(tier: Path, existing: Path, created: CreatedFiles) -> None:
    """What a store's open does, up to a full disk: directories, new files, a grown file."""
    store = tier / "kvtier-x"
    ensure_private_dir(store, create_parents=True, record=created)
    ensure_private_dir(store / "index", create_parents=False, record=created)
    for name in ("lock", "slab-00000.bin", "index/data.mdb"):
        fd, _ = open_or_create(store / name, record=created)
        try:
            preallocate(fd, MiB)
        finally:
            os.close(fd)
    fd = open_file(existing, os.O_RDWR)
    try:
        created.grown(fd, os.fstat(fd).st_size)
        preallocate(fd, 2 * MiB)
    finally:
        os.close(fd)
    raise DiskTierError("disk tier at x: needs 16.0 GiB, only 1.0 GiB free")


def test_rollback_removes_what_an_open_created_and_shrinks_what_it_grew(
    tmp_path: Path,
) -> None:
    existing = tmp_path / "headers.bin"
    existing.write_bytes(b"header page")
    os.chmod(existing, 0o640)
    before = snapshot(existing)
    used_before = allocated_bytes(existing)
    tier = tmp_path / "tier" / "sub"
    with pytest.raises(DiskTierError, match=r"needs 16\.0 GiB"), CreatedFiles() as created:
        failed_open(tier, existing, created)
    assert not (tmp_path / "tier").exists()  # the intermediates and the store dir too
    assert sorted(os.listdir(tmp_path)) == ["headers.bin"]
    assert snapshot(existing) == before
    assert allocated_bytes(existing) <= used_before  # the 2 MiB it reserved are given back
    assert created.files == () and created.dirs == ()  # rolled back once, then forgotten


def test_commit_keeps_everything(tmp_path: Path) -> None:
    existing = tmp_path / "headers.bin"
    existing.write_bytes(b"h")
    created = CreatedFiles()
    with pytest.raises(DiskTierError):
        failed_open(tmp_path / "tier", existing, created)
    created.commit()
    assert created.rollback() == []
    assert (tmp_path / "tier" / "kvtier-x" / "slab-00000.bin").stat().st_size == MiB
    assert existing.stat().st_size == 2 * MiB
    with CreatedFiles() as kept:
        ensure_private_dir(tmp_path / "more", create_parents=False, record=kept)
    assert (tmp_path / "more").is_dir()  # a normal exit commits


def test_rollback_leaves_a_directory_holding_unrecorded_files_and_says_so(
    tmp_path: Path,
) -> None:
    created = CreatedFiles()
    ensure_private_dir(tmp_path / "kvtier-x", create_parents=False, record=created)
    fd, _ = open_or_create(tmp_path / "kvtier-x" / "lock", record=created)
    os.close(fd)
    (tmp_path / "kvtier-x" / "lock.mdb").write_bytes(b"made by a library")
    problems = created.rollback()
    assert len(problems) == 1
    assert "cannot remove the directory" in problems[0] and "kvtier-x" in problems[0]
    assert os.listdir(tmp_path / "kvtier-x") == ["lock.mdb"]


def test_rollback_never_truncates_a_file_that_replaced_the_grown_one(tmp_path: Path) -> None:
    path = tmp_path / "slab-00000.bin"
    path.write_bytes(b"a" * 10)
    victim = tmp_path / "victim"
    victim.write_bytes(b"v" * 4096)
    created = CreatedFiles()
    fd = open_file(path, os.O_RDWR)
    created.grown(fd, 10)
    preallocate(fd, MiB)
    os.close(fd)
    path.unlink()
    path.symlink_to(victim)  # planted after the open grew the file
    other = tmp_path / "other.bin"
    other.write_bytes(b"o" * 4096)
    created.grown(other, 0)
    other.rename(tmp_path / "other.old")  # still there: its inode cannot be reused
    other.write_bytes(b"n" * 4096)  # a new file (another inode) under the recorded name
    problems = created.rollback()
    assert victim.read_bytes() == b"v" * 4096
    assert other.read_bytes() == b"n" * 4096
    assert (tmp_path / "other.old").read_bytes() == b"o" * 4096  # not grown: left as it is
    assert len(problems) == 2
    assert any("is a symlink" in problem for problem in problems)
    assert any("no longer the same file" in problem for problem in problems)


def test_rollback_removes_a_symlink_planted_in_place_of_a_created_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    created = CreatedFiles()
    fd, _ = open_or_create(store / "slab-00000.bin", record=created)
    os.close(fd)
    (store / "slab-00000.bin").unlink()
    (store / "slab-00000.bin").symlink_to(victim)
    assert created.rollback() == []
    assert os.listdir(store) == []
    assert victim.read_bytes() == b"precious"


def test_grown_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    created = CreatedFiles()
    with pytest.raises(DiskTierError, match="is not a regular file"):
        created.grown(tmp_path, 0)
    with pytest.raises(InvalidValueError, match="old_size"):
        created.grown(tmp_path, -1)
