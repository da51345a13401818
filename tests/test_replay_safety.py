"""`kvtier replay` failure paths (issue 9, item 9): an --out that cannot be written is one
line and exit 2 before the run, a second replay never deletes the disk store a running one
holds, the disk the run will use is said up front and --clean removes it afterwards."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.tiers.disk.log_store import LogStore, read_layout


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["replay", "--limit", "5", "--no-plot", *args])
    return result.exit_code, result.stdout, result.stderr


def the_store(out: Path) -> Path:
    (store,) = (out / "disk" / "disk").glob("kvtier-*")
    return store


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_out_that_cannot_be_written_is_one_line_before_the_run(
    tmp_path: Path, where: str
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker if where == "a file" else blocker / "out"
    code, stdout, stderr = run("--out", str(out))
    assert code == 2, stdout + stderr
    assert stderr.count("\n") == 1 and "--out" in stderr and "Traceback" not in stderr
    assert "replaying" not in stdout and "kvtier replay" not in stdout  # nothing ran


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory anyway")
def test_a_read_only_out_is_one_line_before_the_run(tmp_path: Path) -> None:
    out = tmp_path / "ro"
    out.mkdir()
    os.chmod(out, 0o500)
    try:
        code, _, stderr = run("--out", str(out))
    finally:
        os.chmod(out, 0o700)
    assert code == 2 and "cannot write there" in stderr


def test_a_second_replay_refuses_an_out_whose_store_is_in_use(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("--out", str(out))[0] == 0
    store_dir = the_store(out)
    assert store_dir.name.startswith("kvtier-log-")  # the default layout
    shape = read_layout(store_dir)
    assert shape is not None
    running = LogStore(  # holds the store's lock, as a replay in progress does
        store_dir.parent,
        block_size=shape["block_size"],
        num_blocks=shape["num_blocks"],
        model_id=shape["model_id"],
        region_bytes=shape["region_bytes"],
    )
    try:
        before = sorted(path.name for path in store_dir.iterdir())
        code, _, stderr = run("--out", str(out))
        assert code == 2
        assert stderr.count("\n") == 1 and "in use by a running kvtier" in stderr
        assert sorted(path.name for path in store_dir.iterdir()) == before
    finally:
        running.close()
    assert run("--out", str(out))[0] == 0  # once it is gone, the out is reused


def test_the_disk_use_is_said_and_clean_removes_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, _ = run("--out", str(out), "--clean")
    assert code == 0, stdout
    assert "disk tiers allocate" in stdout and "free there" in stdout
    assert not (out / "disk" / "disk").exists()
    assert (out / "report.json").exists()
    assert not list(out.glob(".*.tmp"))


def test_directories_the_replay_creates_are_private(tmp_path: Path) -> None:
    out = tmp_path / "a" / "out"
    old = os.umask(0o022)
    try:
        assert run("--out", str(out))[0] == 0
    finally:
        os.umask(old)
    for path in (tmp_path / "a", out, out / "disk", out / "disk" / "disk", the_store(out)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_simulate_checks_its_out_before_the_run_too(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(
        main, ["simulate", "--limit", "5", "--no-plot", "--out", str(blocker / "out")]
    )
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "cannot write there" in result.stderr
