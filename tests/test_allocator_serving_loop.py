"""examples/serving_loop.py: blocks the GPU allocator evicts are demoted into a CPU -> disk
hierarchy and served back, bit-exact, to later requests that share their prefix."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kvtier_tools.workloads.traces import read_mooncake

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "serving_loop.py"

# The first request of the shipped trace that reuses an older prefix is number 134 (0-based
# 133, reusing request 66's blocks): serve a few more than that.
LIMIT = 140


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvtier_example_serving_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


serving_loop = load_example()


async def test_evicted_blocks_come_back_from_a_lower_tier_bit_exact(tmp_path: Path) -> None:
    requests = list(itertools.islice(read_mooncake(), LIMIT))
    config = serving_loop.tier_config(tmp_path, 1024, cpu_blocks=64, disk_blocks=8192)
    stats = await serving_loop.run(requests, config, gpu_blocks=32, block_tokens=16, device="cpu")
    assert stats.requests == LIMIT
    assert stats.evicted > 1000 and stats.demoted > 1000  # the GPU cache overflowed, often
    assert stats.lower_tier_hits > 0  # later requests found their prefix below the GPU
    assert stats.verified == stats.lower_tier_hits and stats.mismatches == 0
    assert stats.hierarchy["served"] == stats.lower_tier_hits
    assert stats.hierarchy["disk->cpu"] > 0  # some came all the way back from disk
    assert stats.gpu_hits > 0 and stats.computed > 0
    assert stats.gpu_hits + stats.lower_tier_hits + stats.computed == stats.prompt_blocks


def test_main_runs_and_prints_the_counters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--limit", "20", "--gpu-blocks", "16", "--block-bytes", "1024"]
    assert serving_loop.main([*argv, "--disk-dir", str(tmp_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "requests            20" in out and "mismatches: 0" in out
    with pytest.raises(SystemExit):
        serving_loop.main(["--limit", "-1"])
