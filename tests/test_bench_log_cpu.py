"""`kvtier_tools.bench.log_cpu`: what it reports (each block size's CPU a call, its threads,
the collections, item 5's write and read lines) and that it checks the bytes it read back;
never how fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier_tools.bench import log_cpu

pytestmark = pytest.mark.timeout(120)


def test_log_cpu_reports_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_cpu.main(
        ["--dir", str(tmp_path), "--block-sizes", "16KiB,64KiB", "--call-bytes", "1MiB",
         "--calls", "3"]
    )  # fmt: skip
    out = capsys.readouterr().out
    for size, blocks in (("16 KiB", 64), ("64 KiB", 16)):
        assert f"{size}, {blocks} blocks a call: write CPU" in out
    assert out.count("\n  kvtier-log-head ") == 2 and out.count("collections in 2 calls") == 2
    assert out.count("item 5, write: store") == 2 and out.count("item 5, read: store") == 2
    assert list(tmp_path.iterdir()) == []  # its store and raw file removed


def test_log_cpu_fails_on_a_wrong_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_cpu.np, "array_equal", lambda a, b: False)  # type: ignore[attr-defined]
    with pytest.raises(SystemExit, match="differs"):
        log_cpu.main(
            ["--dir", str(tmp_path), "--block-sizes", "16KiB", "--call-bytes", "256KiB",
             "--calls", "2"]
        )  # fmt: skip
