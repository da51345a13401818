"""`python -m kvtier_tools.bench.saturation`: what it reports (both phases, every column, the ratio
line), never how fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier_tools.bench import saturation

TINY = [
    "--tiers",
    "disk",
    "--block-size",
    "4KiB",
    "--getters",
    "2",
    "--putters",
    "2",
    "--cpu-blocks",
    "16",
    "--lower-blocks",
    "256",
    "--seconds",
    "0.3",
    "--repeats",
    "1",
]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--split"]], ids=["mixed", "split"])
def test_the_benchmark_reports_both_phases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: list[str]
) -> None:
    saturation.main([*TINY, *mode, "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith(("idle ", "loaded ")) and not line.startswith("loaded /")
    }
    assert "cpu -> disk: medians of 1 repeats" in out
    for phase in ("idle", "loaded"):
        assert len(rows[phase]) == 11, rows[phase]
        assert float(rows[phase][3]) > 0  # gets/s: the phase served gets
    assert float(rows["idle"][4]) == 0  # no puts while idle
    assert float(rows["loaded"][4]) > 0  # the loaded phase put
    assert "loaded / idle get p99:" in out and "deadline 5000 ms" in out
    assert list(tmp_path.iterdir()) == []  # its disk tier is gone


def test_keys_of_a_group_are_consecutive_and_distinct() -> None:
    keys = saturation.keys_of(1 << 40, 4)
    assert len(set(keys)) == 4
    assert keys == saturation.keys_of(1 << 40, 4)
    assert set(keys).isdisjoint(saturation.keys_of((1 << 40) + 4, 4))
