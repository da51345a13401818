"""`kvtier_tools.bench.gil_load`: every row it reports, the switch interval put back, its
store removed, bad options refused naming them; never how fast."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvtier_tools.bench import gil_load

pytestmark = pytest.mark.timeout(120)


def test_gil_load_reports_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = sys.getswitchinterval()
    gil_load.main(
        ["--dir", str(tmp_path), "--block-size", "16KiB", "--call-bytes", "256KiB",
         "--read-blocks", "4", "--store-bytes", "1MiB", "--calls", "2",
         "--loads", "none,1/1", "--switch-intervals", "5ms,500us"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "64 blocks of 16 KiB, writes of 16 blocks (0.25 MiB), reads of 4 and 16" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("5ms", "0.5ms"))]
    assert [(row[0], row[1]) for row in rows] == [
        ("5ms", "none"), ("5ms", "1/1"), ("0.5ms", "none"), ("0.5ms", "1/1")
    ]  # fmt: skip
    assert all(len(row) == 2 + 3 * 3 for row in rows)  # median / p90 of three kinds of call
    assert sys.getswitchinterval() == before  # put back
    assert list(tmp_path.iterdir()) == []  # its store removed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--loads", "busy"], "a load is 'none', 'full' or 'B/I'"),
        (["--loads", "0/1"], "a load is 'none', 'full' or 'B/I'"),
        (["--switch-intervals", "0ms"], "a switch interval is like '5ms'"),
        (["--switch-intervals", "fast"], "a switch interval is like '5ms'"),
        (["--calls", "1"], "--calls must be at least 2"),
    ],
)
def test_gil_load_refuses_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        gil_load.main(["--dir", str(tmp_path), *argv])
    assert message in capsys.readouterr().err
