"""`kvtier bench --write-path` and the write-path benchmark behind it: what it reports (every
row, sound percentiles, verified bytes, blocks really on disk before their gets), never how
fast."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import InvalidValueError
from kvtier_tools.bench import writepath

TINY = writepath.Settings(
    block_size=4096,
    batch_blocks=16,
    puts=6,
    gets=4,
    cpu_bytes=64 * 4096,
    rounds=2,
    probe_bytes=4 * 16 * 4096,
)
TINY_OPTIONS = (
    "--write-path",
    "--quick",
    "--write-block-size",
    "4KiB",
    "--cpu-size",
    "256KiB",
    "--puts",
    "4",
    "--gets",
    "2",
    "--put-rate",
    "400",
)


def bench(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["bench", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.slow
def test_the_report_has_every_row_and_its_invariants_hold(tmp_path: Path) -> None:
    settings = dataclasses.replace(TINY, directory=tmp_path)
    steps: list[str] = []
    report = writepath.run_writepath_benchmark(settings, progress=steps.append)
    assert len(steps) == writepath.step_count(settings)

    pace = report.pace
    assert pace is not None and "raw" in pace.source  # chosen from the measured bandwidth
    assert pace.probe_gbps > 0 and pace.rate > 0
    assert pace.interval_s == pytest.approx(1 / pace.rate)

    assert [row.chain for row in report.puts] == [label for label, _ in writepath.CHAINS]
    assert report.reference() is report.puts[0]
    for row in report.puts:
        assert len(row.latencies_s) == settings.puts
        assert row.p99_ms >= row.p50_ms > 0
        assert all(isinstance(value, int) for value in row.counters.values())
    assert report.put_ratios(report.puts[0]) == (1.0, 1.0)

    # The prefixes the gets read were all on the disk tier alone before the first get, and
    # each one still was right before its own get.
    assert report.resident_blocks == 2 * settings.gets * settings.batch_blocks
    assert report.resident_on_disk == report.resident_blocks
    assert [row.phase for row in report.gets] == [writepath.IDLE, writepath.STREAM]
    for get in report.gets:
        assert len(get.latencies_s) == settings.gets
        assert get.p99_ms >= get.p50_ms > 0
        assert get.not_on_disk == 0
        assert get.short_gets == 0 and get.mismatched_blocks == 0
        assert get.blocks_read == settings.gets * settings.batch_blocks
    idle, stream = report.gets
    assert idle.stream_puts == 0
    assert stream.stream_puts >= writepath.STREAM_LEAD_PUTS * settings.rounds
    assert stream.written_bytes > 0  # the stream's puts did push blocks to the disk
    assert report.mismatches == 0

    assert [row.chain for row in report.demotion] == [
        label for label, policy in writepath.CHAINS if policy is not None
    ]
    for demotion in report.demotion:
        assert demotion.raw_bytes == settings.puts * settings.put_bytes
        assert demotion.nbytes > 0 and demotion.gbps > 0 and demotion.raw_gbps > 0
        assert demotion.raw_batch_bytes == settings.put_bytes

    env = report.environment
    assert env["directory"].startswith(str(tmp_path)) and env["filesystem"]
    assert len(env["disk_tiers"]) == 2
    assert list(tmp_path.iterdir()) == []  # the run's directory is gone
    document = json.loads(report.to_json())
    assert document["mismatches"] == 0 and len(document["puts"]) == 3


def test_blocks_are_derived_from_their_number_and_a_wrong_byte_is_counted() -> None:
    maker = writepath.BlockMaker(4096, seed=3)
    blocks = maker.blocks(10, 4)
    assert blocks.shape == (4, 4096) and blocks.dtype == torch.uint8
    assert torch.equal(blocks, writepath.BlockMaker(4096, seed=3).blocks(10, 4))
    assert torch.equal(blocks[1:], maker.blocks(11, 3))
    words = blocks.numpy().view("<u8")
    assert (words[0] != words[1]).all()  # two blocks differ in every 8-byte word
    assert writepath.mismatched_blocks(blocks.clone(), blocks) == 0
    assert writepath.mismatched_blocks(blocks[:2].clone(), blocks) == 0  # a short get
    damaged = blocks.clone()
    damaged[2, 4095] ^= 1
    assert writepath.mismatched_blocks(damaged, blocks) == 1


def test_settings_fit_their_rounds_to_a_small_run() -> None:
    settings = writepath.Settings(puts=3, gets=5).fitted()
    assert settings.rounds == 3
    settings.validate()
    with pytest.raises(InvalidValueError, match="--puts"):
        writepath.Settings(puts=3, gets=5).validate()


@pytest.mark.slow
def test_cli_json_is_json_only(tmp_path: Path) -> None:
    code, stdout, stderr = bench(*TINY_OPTIONS, "--json", "--dir", str(tmp_path))
    assert code == 0, stdout + stderr
    document = json.loads(stdout)
    assert document["format"] == "kvtier_tools.bench.writepath/1"
    assert document["settings"]["block_size"] == 4096
    assert document["settings"]["rounds"] == 2  # --quick, and no more than the gets
    assert document["pace"]["rate"] == 400 and document["pace"]["probe_gbps"] == 0
    assert [row["puts"] for row in document["puts"]] == [4, 4, 4]
    assert [row["gets"] for row in document["gets"]] == [2, 2]
    assert document["mismatches"] == 0
    assert document["resident_on_disk"] == document["resident_blocks"] > 0
    for name in ("put_p50_ratio", "put_p99_ratio", "get_ratio", "demotion_ratio"):
        assert name in document["targets"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_cli_prints_the_three_tables(tmp_path: Path) -> None:
    code, stdout, stderr = bench(*TINY_OPTIONS, "--dir", str(tmp_path))
    assert code == 0, stdout + stderr
    assert "Put latency into a full CPU tier" in stdout
    assert "Get latency of 16-block prefixes on the disk tier only" in stdout
    assert "Demotion throughput cpu -> disk" in stdout
    for chain in ("cpu only", "cpu + disk, write-back", "cpu + disk, write-through"):
        assert chain in stdout
    assert "write stream" in stdout and "idle" in stdout
    assert f"Disk files: {tmp_path}" in stdout and "Put rate: 400.0 puts/s" in stdout
    assert "WRONG" not in stdout and "Traceback" not in stdout + stderr


@pytest.mark.slow
def test_cli_exits_1_when_a_get_returns_wrong_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writepath, "mismatched_blocks", lambda got, expected: 1)
    code, stdout, _ = bench(*TINY_OPTIONS, "--dir", str(tmp_path))
    assert code == 1
    assert "WRONG" in stdout and "ERROR:" in stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--write-path", "--pairs", "cpu"), "--pairs does not apply to --write-path"),
        (("--write-path", "--repeats", "3"), "--repeats does not apply to --write-path"),
        (("--puts", "3"), "--puts needs --write-path"),
        (("--cpu-size", "1GiB"), "--cpu-size needs --write-path"),
        (("--write-path", "--write-block-size", "1000"), "--write-block-size"),
        (("--write-path", "--write-block-size", "4KiB,8KiB"), "--write-block-size"),
        (("--write-path", "--cpu-size", "64KiB"), "--cpu-size"),
        (("--write-path", "--put-rate", "0"), "--put-rate"),
        (("--write-path", "--gets", "none"), "--gets"),
        (("--write-path", "--dir", "/nonexistent/kvtier-bench"), "not a directory"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args: tuple[str, ...], message: str) -> None:
    code, stdout, stderr = bench(*args)
    assert code == 2, stdout + stderr
    assert stderr.count("\n") == 1 and stderr.startswith("kvtier: error:")
    assert message in stderr
    assert stdout == ""
