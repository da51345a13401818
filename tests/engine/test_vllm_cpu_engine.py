"""kvtier under a running vLLM engine (issue 21, item 2): vLLM's CPU build serves a tiny
random-weight Llama with `KvtierOffloadingSpec` over a cpu -> disk kvtier chain.

Four lives of the engine, each a process of its own (engine_run.py), on one disk directory:

1. cold: four prompts sharing a prefix are computed; every full block reaches kvtier's disk
   tier; the prompts are served again from vLLM's own prefix cache (the reference: see
   below), then vLLM's prefix cache is reset and they are served from vLLM's host tier
   (kvtier's cpu tier): tokens and logprobs identical to the reference.
2. restart: a new engine serves them from kvtier's disk tier: tokens and logprobs identical
   to the reference, vLLM reports every full block's tokens as loaded from disk (none
   recomputed but the partial last blocks), kvtier counts the disk hits.
3. damaged: a byte of every block on disk is flipped, then a new engine serves the prompts:
   kvtier's checksums reject the blocks (counted as corrupt), vLLM recomputes them; nothing
   damaged is served.
4. healed: the blocks recomputed in life 3 were stored again: the next engine loads them.

The reference for a cached prefix is the engine's own prefix-cache hit, which computes the
same sums in the same order as a load from kvtier; a computed prompt sums in another order,
so where the model's two best tokens tie it may pick the other one (greedy_match): such a
difference is reported with its margin, any other fails with the position and logprobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engine_run  # noqa: E402

from kvtier.tiers.disk.testing import damage_stored_blocks  # noqa: E402
from kvtier_tools.bench.greedy_match import compare_greedy, steps_of  # noqa: E402

LIFE_TIMEOUT_S = 300
"""One engine life (start, serve, shut down) takes 20-40 s on 2 busy cores."""

PROMPTS = engine_run.prompts()
BLOCK = engine_run.BLOCK_TOKENS
FULL = [len(prompt) // BLOCK * BLOCK for prompt in PROMPTS]
"""Prompt tokens in full blocks: what can be loaded instead of computed."""
UNIQUE_BLOCKS = len(
    {
        tuple(prompt[: (index + 1) * BLOCK])
        for prompt in PROMPTS
        for index in range(len(prompt) // BLOCK)
    }
)
"""Distinct full blocks of the prompts (the shared prefix's once): what kvtier stores."""
COMPUTED = engine_run.WARM_UP_TOKENS + sum(
    len(prompt) - full for prompt, full in zip(PROMPTS, FULL, strict=True)
)
"""Prompt tokens always computed in a life: the warm-up request's and the partial last
blocks'."""
PREFIX = 8 * BLOCK
"""The shared prefix: in vLLM's own prefix cache for every prompt after the first."""

Life = dict[str, Any]


def run_life(work: Path, name: str, *extra: str) -> Life:
    """One engine life in a process of its own; its log is kept beside its result."""
    out = work / f"{name}.json"
    log = work / f"{name}.log"
    command = [
        sys.executable,
        str(HERE / "engine_run.py"),
        str(work / "model"),
        str(work / "disk"),
        str(out),
        *extra,
    ]
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
    }
    with log.open("w") as sink:
        try:
            done = subprocess.run(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=LIFE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"engine life {name!r} ran past {LIFE_TIMEOUT_S} s:\n{tail(log)}")
    if done.returncode != 0 or not out.exists():
        pytest.fail(f"engine life {name!r} failed (exit {done.returncode}):\n{tail(log)}")
    life: Life = json.loads(out.read_text())
    return life


def tail(log: Path, lines: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def agree(reference: list[dict[str, Any]], served: list[dict[str, Any]], *, loaded: bool) -> str:
    """Compare a serve with the reference serve, request by request, and fail on any real
    difference, naming the request, the position and both runs' logprobs. `loaded`: the serve
    came from cached KV (vLLM's or kvtier's), like the reference, so its logprobs must be
    exactly the reference's too; a computed serve may part from it on a top-2 tie.
    Returns what was found, for the lane's summary."""
    found = []
    for index, (ref, cand) in enumerate(zip(reference, served, strict=True)):
        verdict = compare_greedy(
            steps_of(ref["tokens"], ref["logprobs"]),
            steps_of(cand["tokens"], cand["logprobs"]),
            logprob_tolerance=0.0 if loaded else float("inf"),
        )
        if not verdict.ok:
            pytest.fail(f"request {index}: {verdict.describe()}")
        if verdict.kind == "tie":
            found.append(f"request {index} {verdict.describe()}")
    return "; ".join(found) or "tokens identical" + (" and logprobs identical" if loaded else "")


def cached(serve: list[dict[str, Any]]) -> list[int]:
    return [request["cached_tokens"] for request in serve]


def damage_disk(disk: Path) -> int:
    """Flip one byte in every 4 KiB of every block the disk tier stores, whatever its layout
    and block size: every block on disk fails its checksum. Returns the pages or payloads
    damaged."""
    return damage_stored_blocks(disk)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model (created here, random weights) and the disk tier's directory."""
    directory = tmp_path_factory.mktemp("engine")
    engine_run.make_model(directory / "model")
    (directory / "disk").mkdir()
    return directory


@pytest.fixture(scope="module")
def cold(work: Path, report: Callable[[str], None]) -> Life:
    life = run_life(work, "cold", "--again")
    computed, hit, _ = life["serves"]
    report(f"computed vs vLLM's own prefix-cache hit: {agree(hit, computed, loaded=False)}")
    report(
        f"engine started in {life['start_s']:.1f} s; {len(PROMPTS)} prompts computed, "
        f"{life['kvtier_disk']['stored']} blocks offloaded to kvtier's disk tier"
    )
    return life


@pytest.fixture(scope="module")
def restarted(cold: Life, work: Path, report: Callable[[str], None]) -> Life:
    life = run_life(work, "restarted")
    same = agree(cold["serves"][1], life["serves"][0], loaded=True)
    report(
        f"after a restart: prompt tokens loaded {cached(life['serves'][0])} of "
        f"{[len(prompt) for prompt in PROMPTS]}, from disk "
        f"{life['vllm'].get('prompt_tokens_cached_by_source:disk', 0):.0f} (vLLM), kvtier disk "
        f"hits {life['kvtier_disk']['hits']}; against vLLM's own prefix-cache hit: {same}"
    )
    return life


@pytest.fixture(scope="module")
def damaged(restarted: Life, work: Path, report: Callable[[str], None]) -> Life:
    pages = damage_disk(work / "disk")
    assert pages > 0, "no stored block found to damage"
    life = run_life(work, "damaged")
    same = agree(restarted["serves"][0], life["serves"][0], loaded=False)
    report(
        f"every block on disk damaged: kvtier corrupt {life['kvtier_disk']['corrupt']}, "
        f"from disk {life['vllm'].get('prompt_tokens_cached_by_source:disk', 0):.0f} (vLLM); "
        f"recomputed, against the load from disk: {same}"
    )
    return life


@pytest.fixture(scope="module")
def healed(damaged: Life, work: Path) -> Life:
    return run_life(work, "healed")


def test_first_life_offloads_every_block_and_serves_from_the_host_tier(cold: Life) -> None:
    computed, hit, again = cold["serves"]
    # Served cold: only vLLM's own prefix cache (the shared prefix, after the first prompt).
    assert cached(computed) == [0] + [PREFIX] * (len(PROMPTS) - 1)
    # Served again: every full block from vLLM's own prefix cache (the reference).
    assert cached(hit) == FULL
    agree(hit, computed, loaded=False)
    # Every distinct full block reached kvtier's disk tier.
    assert cold["kvtier_disk"]["stored"] == UNIQUE_BLOCKS
    assert cold["kvtier_disk"]["held"] == UNIQUE_BLOCKS
    # vLLM's prefix cache reset: every full block comes back from the host tier instead.
    agree(hit, again, loaded=True)
    assert cached(again) == FULL
    assert cold["vllm"]["prompt_tokens_cached_by_source:host"] == UNIQUE_BLOCKS * BLOCK
    assert cold["vllm"]["prompt_tokens_cached_by_source:disk"] == 0


def test_restart_serves_the_prefixes_from_kvtier_disk(cold: Life, restarted: Life) -> None:
    (served,) = restarted["serves"]
    agree(cold["serves"][1], served, loaded=True)  # tokens and top-3 logprobs, exactly
    assert cached(served) == FULL
    vllm = restarted["vllm"]
    # Each distinct block loaded once from disk (vLLM's prefix cache has it afterwards), and
    # nothing computed but the partial last blocks.
    assert vllm["prompt_tokens_cached_by_source:disk"] == UNIQUE_BLOCKS * BLOCK
    assert vllm["prompt_tokens_by_source:external_kv_transfer"] == UNIQUE_BLOCKS * BLOCK
    assert vllm["prompt_tokens_by_source:local_compute"] == COMPUTED
    disk = restarted["kvtier_disk"]
    assert disk["hits"] == UNIQUE_BLOCKS
    assert disk["corrupt"] == 0
    assert disk["stored"] == 0  # nothing new to store


def test_damaged_blocks_are_recomputed_never_served(cold: Life, damaged: Life) -> None:
    (served,) = damaged["serves"]
    agree(cold["serves"][1], served, loaded=False)  # computed: a tie may part them
    # Nothing came from disk: the first prompt computed everything, the others the blocks
    # after the shared prefix (which vLLM's own prefix cache had by then).
    assert cached(served) == [0] + [PREFIX] * (len(PROMPTS) - 1)
    vllm = damaged["vllm"]
    assert vllm["prompt_tokens_cached_by_source:disk"] == 0
    assert vllm["prompt_tokens_by_source:external_kv_transfer"] == 0
    disk = damaged["kvtier_disk"]
    assert disk["corrupt"] == UNIQUE_BLOCKS  # every damaged block read was rejected, counted
    # The recomputed blocks were offloaded again, replacing the damaged ones.
    assert disk["stored"] == UNIQUE_BLOCKS


def test_recomputed_blocks_serve_the_next_restart(cold: Life, healed: Life) -> None:
    (served,) = healed["serves"]
    agree(cold["serves"][1], served, loaded=True)
    assert cached(served) == FULL
    assert healed["vllm"]["prompt_tokens_cached_by_source:disk"] == UNIQUE_BLOCKS * BLOCK
    assert healed["kvtier_disk"]["hits"] == UNIQUE_BLOCKS
    assert healed["kvtier_disk"]["corrupt"] == 0
