"""`kvtier replay`: a trace through the real Hierarchy, every loaded block verified.

Covers the command's happy path and report, the relation with `kvtier simulate --config`
(per-tier hits equal, exactly), that verification catches wrong bytes, bad inputs (one line,
exit 2), and Ctrl-C (a partial report, exit 130).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.config import format_size, load_default_config, parse_config
from kvtier.errors import InvalidValueError
from kvtier.hierarchy import Hierarchy
from kvtier.keys import key_from_int, make_offload_key
from kvtier.tiers.tensor_copy import TensorCopier
from kvtier_tools.workloads.replay import (
    DEFAULT_REPLAY_BLOCK_BYTES,
    BlockContents,
    Replayer,
    ReplayResult,
    load_replay_trace,
    prepare_disk_dirs,
    replay,
    replay_block_bytes,
    replay_config,
    write_report,
)
from kvtier_tools.workloads.simulation.chain import offload_key_of

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LIMIT = "300"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


SMALL_CHAIN = """
block_size = "256KiB"
write_policy = "{write_policy}"
[[tiers]]
name = "ram"
medium = "cpu"
capacity = 150
policy = "{policy}"
pin_memory = false
[[tiers]]
name = "ssd"
medium = "disk"
capacity = "400MiB"
policy = "lru"
fsync = false
"""

THREE_TIERS = """
block_size = 65536
[[tiers]]
name = "hbm"
medium = "gpu"
capacity = 30
device = "cpu"
[[tiers]]
name = "dram"
medium = "cpu"
capacity = 100
policy = "arc"
pin_memory = false
[[tiers]]
name = "nvme"
medium = "disk"
capacity = 2000
fsync = false
"""

ONE_CPU_TIER_TOML = """
block_size = 4096
[[tiers]]
name = "cpu"
medium = "cpu"
capacity = 64
pin_memory = false
"""
"""A one-tier chain small enough to replay a few hundred requests in a second."""

ONE_CPU_TIER = tomllib.loads(ONE_CPU_TIER_TOML)


# -- the command's happy path -----------------------------------------------------------------


@pytest.mark.slow
def test_default_config_replay_writes_table_report_and_chart(tmp_path: Path) -> None:
    code, stdout, stderr = run(
        "replay", "--limit", LIMIT, "--block-bytes", "4KiB", "--out", str(tmp_path)
    )
    assert code == 0, stderr
    assert "Traceback" not in stdout + stderr
    for text in (
        "mismatches (must be 0)",
        "Prefix hits per tier",
        "Bytes moved per tier pair",
        "prefix tokens reused",
        "block size scaled: config 256KiB per block, replayed 4KiB",
        "emptied: the replay starts cold",
    ):
        assert text in stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["partial"] is False
    assert report["requests"] == 300
    assert report["block_bytes"] == {
        **report["block_bytes"],
        "config": 256 * 1024,
        "replayed": 4096,
        "scaled": True,
    }
    verification = report["verification"]
    assert verification["mismatches"] == 0
    assert verification["verified"] > 0
    assert verification["verified"] == report["hits"]
    assert sum(tier["hits"] for tier in report["tiers"]) == report["hits"]
    assert report["hit_ratio"] == pytest.approx(report["hits"] / report["block_accesses"])
    assert report["hit_ratio"] <= report["infinite_cache_hit_ratio"]
    # Mooncake blocks are 512 tokens, the last one of a request partial.
    prefill = report["prefill"]
    assert 0 < prefill["tokens_reused"] <= report["hits"] * 512
    assert prefill["tokens_reused"] <= prefill["input_tokens"]
    # The put and get traffic is all there, and the series ends at the totals.
    # The caller meets the top tier only: the gpu tier where CUDA is, else the cpu tier.
    pairs = {(p["source"], p["destination"]): p for p in report["pairs"]}
    top = report["tiers"][0]["name"]
    assert top == ("gpu" if torch.cuda.is_available() else "cpu")
    assert pairs[top, "caller"]["blocks"] == report["hits"]
    assert pairs["caller", top]["bytes"] == pairs["caller", top]["blocks"] * 4096
    assert {source for source, destination in pairs if destination == "caller"} == {top}
    for pair in pairs.values():  # every pair made copies of whole blocks
        assert 0 < pair["copies"] <= pair["blocks"]
        assert pair["blocks_per_copy"] == pytest.approx(pair["blocks"] / pair["copies"])
        assert 1 <= pair["peak_in_flight"] <= pair["copies"]
    # What each tier was written: every copy whose destination it is.
    for tier in report["tiers"]:
        into = [p for (_, destination), p in pairs.items() if destination == tier["name"]]
        assert tier["blocks_written"] == sum(p["blocks"] for p in into)
        assert tier["bytes_written"] == sum(p["bytes"] for p in into)
    assert report["tiers"][0]["blocks_written"] > 0
    series = report["series"]
    assert series["requests"][-1] == 300
    assert series["block_accesses"][-1] == report["block_accesses"]
    assert {name: hits[-1] for name, hits in series["tier_hits"].items()} == {
        tier["name"]: tier["hits"] for tier in report["tiers"]
    }
    assert [tier["name"] for tier in report["tiers"]] == [
        tier.name for tier in load_default_config().active_tiers()
    ]
    assert (tmp_path / "disk" / "disk").is_dir()
    assert (tmp_path / "replay.png").read_bytes().startswith(PNG_MAGIC)


def test_json_output_is_the_report(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.toml", SMALL_CHAIN.format(write_policy="write-back", policy="lru")
    )
    code, stdout, stderr = run(
        "replay", "--config", str(config), "--limit", "100", "--block-bytes", "4096",
        "--out", str(tmp_path / "out"), "--json", "--no-plot",
    )  # fmt: skip
    assert code == 0, stderr
    assert json.loads(stdout) == json.loads((tmp_path / "out" / "report.json").read_text())
    assert "wrote" in stderr and "wrote" not in stdout
    assert not (tmp_path / "out" / "replay.png").exists()


@pytest.mark.slow
def test_a_second_replay_starts_cold_and_gives_the_same_hits(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.toml", SMALL_CHAIN.format(write_policy="write-back", policy="arc")
    )
    args = ["replay", "--config", str(config), "--limit", "200", "--block-bytes", "4KiB"]
    args += ["--out", str(tmp_path / "out"), "--json", "--no-plot"]
    first = json.loads(run(*args)[1])
    second = json.loads(run(*args)[1])
    assert [t["hits"] for t in first["tiers"]] == [t["hits"] for t in second["tiers"]]
    assert first["hits"] > 0


# -- the relation with `kvtier simulate --config` --------------------------------------------


def tier_hits_of_simulate(config: Path, limit: str, tmp_path: Path, *trace: str) -> dict[str, int]:
    code, stdout, stderr = run(
        "simulate", "--config", str(config), "--limit", limit, *trace,
        "--out", str(tmp_path / "sim"), "--json", "--no-plot",
    )  # fmt: skip
    assert code == 0, stderr
    return {tier["name"]: tier["hits"] for tier in json.loads(stdout)["chain"]["tiers"]}


def tier_hits_of_replay(config: Path, limit: str, tmp_path: Path, *trace: str) -> dict[str, int]:
    code, stdout, stderr = run(
        "replay", "--config", str(config), "--limit", limit, *trace, "--block-bytes", "4KiB",
        "--out", str(tmp_path / "replay"), "--json", "--no-plot",
    )  # fmt: skip
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["verification"]["mismatches"] == 0
    return {tier["name"]: tier["hits"] for tier in report["tiers"]}


@pytest.mark.parametrize(
    ("config_text", "limit"),
    [
        (SMALL_CHAIN.format(write_policy="write-back", policy="arc"), "400"),
        (SMALL_CHAIN.format(write_policy="write-through", policy="lru"), "400"),
        (THREE_TIERS, "500"),
    ],
    ids=["write-back-arc", "write-through-lru", "three-tiers"],
)
@pytest.mark.slow
def test_per_tier_hits_equal_simulate_config(tmp_path: Path, config_text: str, limit: str) -> None:
    config = write_config(tmp_path / "chain.toml", config_text)
    simulated = tier_hits_of_simulate(config, limit, tmp_path)
    replayed = tier_hits_of_replay(config, limit, tmp_path)
    assert replayed == simulated
    assert all(hits > 0 for hits in replayed.values()), replayed  # every tier takes part


@pytest.mark.slow
def test_per_tier_hits_equal_simulate_config_on_a_key_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    keys = rng.zipf(1.3, size=3000) % 500
    trace = tmp_path / "keys.txt"
    trace.write_text("# one key per line\n" + "\n".join(f"k{key}" for key in keys) + "\n")
    config = write_config(
        tmp_path / "chain.toml",
        SMALL_CHAIN.format(write_policy="write-back", policy="lru").replace('"400MiB"', "50"),
    )
    simulated = tier_hits_of_simulate(config, "3000", tmp_path, "--trace", str(trace))
    replayed = tier_hits_of_replay(config, "3000", tmp_path, "--trace", str(trace))
    assert replayed == simulated
    assert all(hits > 0 for hits in replayed.values()), replayed


# -- block contents and verification ----------------------------------------------------------


def test_block_contents_are_deterministic_and_differ_in_every_word() -> None:
    keys = [key_from_int(i) for i in range(64)]
    contents = BlockContents(4096)
    blocks = contents.make(keys)
    assert blocks.dtype == torch.uint8 and tuple(blocks.shape) == (64, 4096)
    assert torch.equal(blocks, BlockContents(4096).make(keys))
    words = blocks.numpy().view(np.uint64)
    for i in range(1, 64):
        assert (words[i] != words[0]).all()
    assert len(np.unique(words[0])) == words.shape[1]
    assert contents.bad_rows(keys, blocks) == []
    assert not torch.equal(BlockContents(4096, salt=b"other").make(keys), blocks)


def test_bad_rows_finds_a_flipped_bit_a_swapped_block_and_a_wrong_shape() -> None:
    keys = [make_offload_key(bytes([i]) * 8) for i in range(8)]
    contents = BlockContents(1000)  # not a whole number of words
    blocks = contents.make(keys).clone()
    blocks[3, 999] ^= 1
    blocks[[5, 6]] = blocks[[6, 5]]
    assert contents.bad_rows(keys, blocks) == [3, 5, 6]
    assert contents.bad_rows(keys, blocks[:, :999]) == list(range(8))
    assert contents.bad_rows(keys[:1], contents.make(keys[:1])) == []


async def test_replayer_counts_mismatches_when_a_pool_is_corrupted_behind_its_back(
    tmp_path: Path,
) -> None:
    config = parse_config(
        {
            "block_size": 4096,
            "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 4000, "pin_memory": False}],
        }
    )
    trace = load_replay_trace(None, 200)
    async with Hierarchy.from_config(config) as h:
        replayer = Replayer(h, BlockContents(4096))
        for request in trace.requests[:100]:
            await replayer.serve([offload_key_of(key) for key in request])
        assert replayer.counters.verified > 0
        assert replayer.counters.mismatches == 0
        pool = h.storages[0]
        pool.tensor[:, 100] ^= 0xFF  # type: ignore[attr-defined]
        before = replayer.counters.verified
        for request in trace.requests[100:]:
            await replayer.serve([offload_key_of(key) for key in request])
    counters = replayer.counters
    assert counters.verified > before
    assert counters.mismatches == counters.verified - before > 0
    assert counters.mismatch_examples[0].tier == "cpu"
    assert counters.mismatch_examples[0].request > 100


@pytest.mark.slow
def test_command_exits_1_when_loaded_bytes_are_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = TensorCopier.copy

    async def corrupting_copy(
        self: TensorCopier, src: torch.Tensor, src_ids: Any, dst: torch.Tensor, dst_ids: Any
    ) -> None:
        await copy(self, src, src_ids, dst, dst_ids)
        if len(dst_ids):
            dst[int(np.asarray(dst_ids)[0]), 0] += 1  # one wrong byte per copy (never undone)

    monkeypatch.setattr(TensorCopier, "copy", corrupting_copy)
    config = write_config(
        tmp_path / "c.toml", SMALL_CHAIN.format(write_policy="write-back", policy="lru")
    )
    code, _, stderr = run(
        "replay", "--config", str(config), "--limit", "150", "--block-bytes", "4KiB",
        "--out", str(tmp_path / "out"), "--no-plot",
    )  # fmt: skip
    assert code == 1
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("kvtier: error: ") and "did not match" in last
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verification"]["mismatches"] > 0
    assert report["verification"]["examples"]


# -- bad inputs --------------------------------------------------------------------------------


def assert_one_line_error(args: list[str], *fragments: str) -> None:
    code, stdout, stderr = run(*args)
    assert code == 2, (stdout, stderr)
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("kvtier: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert_one_line_error(
        ["replay", "--config", str(missing), "--out", str(tmp_path)], str(missing), "not found"
    )


def test_bad_config_key(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.toml",
        'block_size = "4KiB"\n[[tiers]]\nname = "cpu"\nmedium = "cpu"\ncapacity = 10\nsize = 3\n',
    )
    assert_one_line_error(["replay", "--config", str(config), "--out", str(tmp_path)], "size")


def test_missing_trace_file(tmp_path: Path) -> None:
    missing = tmp_path / "trace.jsonl"
    assert_one_line_error(
        ["replay", "--trace", str(missing), "--no-plot", "--out", str(tmp_path)],
        str(missing),
        "no such file",
    )


def test_malformed_trace_line_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    good = '{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}'
    trace.write_text(good + "\n" + good.replace("[1, 2]", '[1, "x"]') + "\n")
    assert_one_line_error(
        ["replay", "--trace", str(trace), "--no-plot", "--out", str(tmp_path)], f"{trace}:2:"
    )


def test_a_request_naming_a_block_twice_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1500, "output_length": 1, "hash_ids": [1, 2, 1]}\n'
    )
    assert_one_line_error(
        ["replay", "--trace", str(trace), "--no-plot", "--out", str(tmp_path)],
        "request 1",
        "twice",
    )


@pytest.mark.parametrize("value", ["lots", "0", "-4", "12 parsecs", "1.5"])
def test_bad_block_bytes(tmp_path: Path, value: str) -> None:
    assert_one_line_error(
        ["replay", "--block-bytes", value, "--no-plot", "--out", str(tmp_path)], "--block-bytes"
    )


@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_limit(tmp_path: Path, value: str) -> None:
    assert_one_line_error(
        ["replay", "--limit", value, "--no-plot", "--out", str(tmp_path)], "--limit", value
    )


def test_an_out_dir_whose_disk_place_holds_other_files_is_left_alone(tmp_path: Path) -> None:
    foreign = tmp_path / "disk" / "disk"
    foreign.mkdir(parents=True)
    (foreign / "precious.txt").write_text("keep me")
    assert_one_line_error(
        ["replay", "--limit", "5", "--no-plot", "--out", str(tmp_path)], "precious.txt"
    )
    assert (foreign / "precious.txt").read_text() == "keep me"


def test_help_has_examples() -> None:
    code, stdout, _ = run("replay", "--help")
    assert code == 0
    assert "Examples:" in stdout and "kvtier replay --limit" in stdout
    for option in ("--config", "--trace", "--limit", "--block-bytes", "--out", "--json"):
        assert option in stdout


# -- the pieces --------------------------------------------------------------------------------


def test_replay_config_keeps_block_counts_and_moves_disk_tiers(tmp_path: Path) -> None:
    given = load_default_config()
    config = replay_config(given, 4096, tmp_path / "disk")
    assert config.block_size == 4096
    assert [t.num_blocks for t in config.tiers] == [t.num_blocks for t in given.tiers]
    assert [t.policy for t in config.tiers] == [t.policy for t in given.tiers]
    assert config.write_policy == given.write_policy
    assert config.tiers[2].path == tmp_path / "disk" / "disk"  # type: ignore[union-attr]
    assert replay_block_bytes(given, None) == DEFAULT_REPLAY_BLOCK_BYTES
    assert replay_block_bytes(given, 256 * 1024) == 256 * 1024
    small = parse_config({"block_size": 1024, "tiers": [{"name": "c", "medium": "cpu",
                                                          "capacity": 4}]})  # fmt: skip
    assert replay_block_bytes(small, None) == 1024  # never scaled up
    with pytest.raises(InvalidValueError):
        replay_block_bytes(given, 0)
    assert format_size(16 * 1024) == "16KiB" and format_size(1536 * 1024**2) == "1.5GiB"


async def test_cancelling_the_replay_closes_the_hierarchy_and_returns_a_partial_result(
    tmp_path: Path,
) -> None:
    config = replay_config(
        parse_config(
            {
                "block_size": 4096,
                "tiers": [
                    {"name": "cpu", "medium": "cpu", "capacity": 100, "pin_memory": False},
                    {"name": "disk", "medium": "disk", "capacity": 800, "fsync": False},
                ],
            }
        ),
        4096,
        tmp_path / "disk",
    )
    prepare_disk_dirs(config)  # as `kvtier replay` does: a disk tier creates only its last level
    trace = load_replay_trace(None, 400)
    served = 0
    task: asyncio.Task[ReplayResult] | None = None

    def progress(n: int) -> None:
        nonlocal served
        served += n
        if served == 50 and task is not None:
            task.cancel()

    task = asyncio.create_task(replay(config, trace, progress=progress))
    result = await task
    assert result.interrupted and result.partial
    assert result.counters.requests == 50
    assert result.counters.mismatches == 0
    report = result.to_dict()
    assert report["partial"] is True and report["trace"]["requests_replayed"] == 50
    assert report["series"]["requests"][-1] == 50
    path = write_report(result, tmp_path / "out")
    assert json.loads(path.read_text())["partial"] is True
    # The disk tier was closed cleanly: it opens again at once, with what it held.
    async with Hierarchy.from_config(config) as h:
        assert h.stats().tiers[1].used > 0


@pytest.mark.slow
def test_ctrl_c_writes_a_partial_report_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "kvtier.cli", "replay", "--block-bytes", "4KiB", "--no-plot",
         "--out", str(out)],  # the whole trace: minutes, so the signal comes mid-replay
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        store = out / "disk" / "disk"
        for _ in range(1200):  # the disk tier is opened just before the first request
            if store.is_dir() and any(store.glob("kvtier-*")):
                break
            if process.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted after" in stderr and "partial" in stderr
    assert "PARTIAL" in stdout
    report = json.loads((out / "report.json").read_text())
    assert report["partial"] is True and report["interrupted"] is True
    assert 0 < report["requests"] < report["trace"]["requests_planned"]
    assert report["verification"]["mismatches"] == 0


def test_the_tier_table_names_a_disk_tiers_io_mode_from_the_hierarchy() -> None:
    """The replay table shortens `Hierarchy.tiers[i].where`; both sides of that contract."""
    from kvtier.tiers.disk import DiskStore
    from kvtier_tools.cli.replay import _where

    class Fake(DiskStore):
        def __init__(self, direct: bool, compression: str) -> None:
            self.path = "/x/kvtier-ab"  # type: ignore[assignment]
            self._direct, self._compression = direct, compression
            self.other_stores = []

        @property
        def direct_io_active(self) -> bool:
            return self._direct

        @property
        def compression(self) -> str:  # type: ignore[override]
            return self._compression

    assert _where("disk", Fake(True, "none").describe()) == "files, O_DIRECT"
    assert _where("disk", Fake(False, "zstd").describe()) == "files, buffered, zstd"
    assert _where("cpu", "cpu (fallback: ...)") == "cpu (fallback: ...)"


# -- blocks a shared store no longer holds ------------------------------------------------------


async def test_blocks_a_shared_store_evicted_are_gone_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request's blocks spill from a 4-block CPU tier into a shared directory; then
    the store drops every file (as its own sweeper, or another node's, does), and the second
    request asks for them again: misses reported as "gone", none as "failed"."""
    from rich.console import Console

    from kvtier.testing.keyed import AUTH_KEY_ENV, fixed_key_hex
    from kvtier_tools.cli.replay import summary_table

    monkeypatch.setenv(AUTH_KEY_ENV, fixed_key_hex())
    shared = tmp_path / "nfs"
    config = parse_config(
        {
            "block_size": 4096,
            "model_id": "test-model",
            "tiers": [
                {"name": "cpu", "medium": "cpu", "capacity": 4, "pin_memory": False},
                {"name": "shared", "medium": "shared-fs", "capacity": 64, "path": str(shared),
                 "sweep_interval_s": None, "auth_key_env": AUTH_KEY_ENV},
            ],
        }
    )  # fmt: skip
    request = {"timestamp": 0, "input_length": 12 * 512, "output_length": 1}
    lines = [json.dumps({**request, "hash_ids": list(range(12))}) for _ in range(2)]
    (tmp_path / "trace.jsonl").write_text("\n".join(lines) + "\n")
    trace = load_replay_trace(tmp_path / "trace.jsonl", None)
    assert [len(request) for request in trace.requests] == [12, 12]

    def evict_every_file(_: int) -> None:
        for path in shared.rglob("*.kv"):
            path.unlink()

    result = await replay(config, trace, progress=evict_every_file)
    report = result.to_dict()
    assert report["requests"] == 2 and report["verification"]["mismatches"] == 0
    assert report["gone_blocks"] > 0
    assert report["failed_blocks"] == 0 and report["corrupt_blocks"] == 0
    # The hierarchy counts a gone block among its failed ones too: the report takes it out.
    assert result.stats.failed_blocks == result.stats.gone_blocks
    console = Console(width=200, record=True)
    console.print(summary_table(report))
    assert f"0 / 0 / {report['gone_blocks']:,}" in console.export_text()


async def test_a_ctrl_c_stops_the_replay_at_the_next_request_with_a_partial_result() -> None:
    """The first SIGINT is a flag the replay reads between requests (not a cancellation that
    an await along the data path could swallow): the replay stops within a request or two,
    closes its hierarchy and says it was interrupted; asyncio.run's handler comes back."""
    config = parse_config(ONE_CPU_TIER)
    trace = load_replay_trace(None, 400)
    before = signal.getsignal(signal.SIGINT)
    served = 0

    def interrupt_after_five(count: int) -> None:
        nonlocal served
        served += count
        if served == 5:
            os.kill(os.getpid(), signal.SIGINT)

    result = await replay(config, trace, progress=interrupt_after_five)
    assert result.interrupted
    assert 5 <= result.counters.requests < 400
    assert result.to_dict()["partial"] is True
    assert result.counters.mismatches == 0
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("freeze_gc", [True, False])
async def test_a_replay_freezes_the_set_up_heap_only_when_asked(freeze_gc: bool) -> None:
    """With `freeze_gc`, what the set-up made (interpreter, torch, trace, the open hierarchy)
    is frozen out of the collector's sight while requests are served, and thawed after;
    without it the collector's state is left alone."""
    config = parse_config(ONE_CPU_TIER)
    gc.unfreeze()  # Python 3.12 starts with a few hundred objects frozen
    seen: list[int] = []
    result = await replay(
        config,
        load_replay_trace(None, 20),
        progress=lambda _: seen.append(gc.get_freeze_count()),
        freeze_gc=freeze_gc,
    )
    assert result.counters.requests == 20 and result.counters.mismatches == 0
    assert len(seen) == 20
    if freeze_gc:
        assert min(seen) > 10_000  # torch alone brings more than that
    else:
        assert max(seen) == 0
    assert gc.get_freeze_count() == 0


def test_the_replay_command_freezes_its_own_heap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvtier_tools.workloads.replay as module

    asked: list[bool] = []
    real = module.replay

    async def spy(*args: Any, **kwargs: Any) -> ReplayResult:
        asked.append(kwargs.get("freeze_gc", False))
        return await real(*args, **kwargs)

    monkeypatch.setattr(module, "replay", spy)
    config = write_config(tmp_path / "cpu.toml", ONE_CPU_TIER_TOML)
    code, stdout, stderr = run(
        "replay", "--config", str(config), "--limit", "5", "--no-plot", "--out", str(tmp_path)
    )
    assert code == 0, stdout + stderr
    assert asked == [True]
    assert gc.get_freeze_count() == 0
