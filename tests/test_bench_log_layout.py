"""The log layout's benchmarks run end to end at a small size and print their rows (figures
are not asserted: only that every row is there and every block read back was intact)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)


def test_log_restart_prints_both_cases(capsys: pytest.CaptureFixture[str]) -> None:
    from kvtier_tools.bench import log_restart

    log_restart.main(["--blocks", "3000", "--after", "600", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "clean    3000 blocks" in out and "kill -9  3000 blocks" in out
    assert "B/block" in out


def test_log_writes_prints_raw_and_both_layouts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvtier_tools.bench import log_writes

    small = ["--block-bytes", "4096", "--group", "8", "--repeats", "4", "--reads", "8"]
    log_writes.main(["--dir", str(tmp_path), *small])
    out = capsys.readouterr().out
    assert out.startswith("raw ")
    for row in ("slots fsync=on ", "slots fsync=off", "log   fsync=on ", "log   fsync=off"):
        assert row in out, out
    assert not list(tmp_path.iterdir())  # its files removed


def test_log_reads_prints_both_layouts_and_undoes_its_timing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvtier.tiers.disk.facade import StoreFacade
    from kvtier_tools.bench import log_reads

    original = StoreFacade._run
    log_reads.main(["--limit", "700", "--out", str(tmp_path)])  # the disk tier serves some
    out = capsys.readouterr().out
    assert StoreFacade._run is original
    for layout in ("log  ", "slots"):
        line = next(row for row in out.splitlines() if row.startswith(f"{layout}  disk -> cpu"))
        assert "mismatches 0" in line, line
        calls = int(line.split("; ")[1].split(" read calls")[0])
        assert calls > 0, line


def test_log_index_bench_prints_its_cost_per_record(capsys: pytest.CaptureFixture[str]) -> None:
    from kvtier_tools.bench import log_index

    log_index.main(["--blocks", "4000", "--batch", "64", "--batches", "20", "--repeats", "2"])
    out = capsys.readouterr().out
    assert out.startswith("LogIndex.apply: 4,000 slots, 20 groups of 64: ") and "us a record" in out


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["log", "slots"])
def test_disk_restart_reopens_a_hierarchy_on_either_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str
) -> None:
    """Its children open a cpu -> disk hierarchy of `layout` on the store it filled (they
    were refused once the default layout changed) and find every restored key."""
    from kvtier_tools.bench import disk_restart

    small = ["--blocks", "2000", "--repeats", "1", "--after", "300"]
    disk_restart.main([*small, "--layout", layout, "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert f"layout {layout}" in out
    assert "clean close" in out and "after SIGKILL" in out and "2,000" in out
    assert not list(tmp_path.iterdir())  # its store removed
