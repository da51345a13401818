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


def test_log_idle_merges_the_store_threads_calls_and_splits_each_calls_idle_time() -> None:
    """`idle_of_calls` on a made-up trace: two threads' writes overlapping, a sync, another
    thread's and another descriptor's calls ignored, a call in flight across a marker."""
    from kvtier_tools.bench.log_idle import idle_of_calls

    def line(tid: int, at: float, text: str) -> str:
        return f"          python-{tid}   [001] ..... {at:.6f}: {text}"

    lines = [
        "# tracer: nop",
        line(1, 10.000, "tracing_mark_write: call-start 0"),
        line(2, 10.002, "sys_pwritev2(fd: 0xb, vec: 0x7f, vlen: 0x10, pos_l: 0, pos_h: 0)"),
        line(3, 10.003, "sys_pwritev(fd: 11, vec: 0x7f, vlen: 0x10, pos_l: 0, pos_h: 0)"),
        line(2, 10.004, "sys_pwritev2 -> 0x100000"),
        line(9, 10.0045, "sys_pwritev2(fd: 0xb, vec: 0x7f, vlen: 0x1, pos_l: 0, pos_h: 0)"),
        line(3, 10.005, "sys_pwritev -> 0x100000"),
        line(2, 10.0055, "sys_fdatasync(fd: 0x5)"),
        line(2, 10.0057, "sys_fdatasync -> 0x0"),
        line(9, 10.006, "sys_pwritev2 -> 0x1000"),
        line(2, 10.007, "sys_fdatasync(fd: 0xb)"),
        line(2, 10.008, "sys_fdatasync -> 0x0"),
        line(1, 10.010, "tracing_mark_write: call-end 0"),
        line(1, 10.020, "tracing_mark_write: call-start 1"),
        line(3, 10.025, "sys_fdatasync(fd: 11)"),
        line(1, 10.030, "tracing_mark_write: call-end 1"),
        line(3, 10.031, "sys_fdatasync -> 0x0"),
    ]
    first, second = idle_of_calls(lines, {1, 2, 3}, {11}, [(0.010, 0.004), (0.010, 0.003)])
    assert (first.wall, first.cpu) == (0.010, 0.004)
    assert first.before == pytest.approx(0.002) and first.after == pytest.approx(0.002)
    assert first.longest_gap == pytest.approx(0.002)  # 10.005 -> 10.007 (fd 5: not the store's)
    assert first.idle == pytest.approx(0.006)
    assert second.before == pytest.approx(0.005) and second.after == 0.0
    assert second.idle == pytest.approx(0.005)
