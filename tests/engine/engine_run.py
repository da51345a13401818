"""One life of a vLLM CPU engine with kvtier underneath, run as its own process by the engine
tests (tests/engine/test_vllm_cpu_engine.py): a restart is a new process, as in production.

    python tests/engine/engine_run.py MODEL_DIR DISK_DIR OUT.json [--again]

Starts vLLM's CPU engine in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) with
`KvtierOffloadingSpec` over a kvtier chain of a cpu tier (vLLM's host memory) and a disk tier
in DISK_DIR, warms up (one request shorter than a block), serves the prompts of `prompts()`
greedily (8 tokens, top-3 logprobs), waits until every block vLLM offloaded has reached
kvtier's disk tier, and with `--again` serves them once more from vLLM's own prefix cache
(the reference for a cached prefix: same kernels, same order of sums), then resets vLLM's
prefix cache and serves them a third time (from vLLM's host tier: kvtier's cpu tier). Then it
shuts the engine down (kvtier closes its disk tier cleanly) and writes OUT.json: per serve,
per request, the tokens, the top-3 logprobs, the prompt tokens vLLM reports as cached and the
time to the first token; vLLM's counters of prompt tokens by source; kvtier's disk-tier
activity (hits, stores, corrupt blocks).

`make_model(directory, kind)` writes the tiny random-weight model the tests serve (a Llama, or
a hybrid-attention model: MODEL_KINDS). OUT.json also names the engine's KV-cache groups (the
spec type of each) and its block size in tokens (vLLM raises it for a linear-attention model).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache, not a share of RAM
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

BLOCK_TOKENS = 32
"""Tokens per KV block (vLLM's CPU attention wants 32); one block is one kvtier block."""

VOCAB = 1000
WARM_UP_TOKENS = BLOCK_TOKENS - 1
"""The warm-up request's prompt: shorter than a block, so nothing of it is offloaded."""
MAX_TOKENS = 8
LOGPROBS = 3


MODEL_KINDS = ("llama", "sliding-window", "linear-attention")
"""The tiny models the lane serves: a Llama (full attention: one KV-cache group); a Gemma 3
with sliding-window layers beside full-attention ones (two groups: vLLM keeps and offloads
only the window's blocks of the sliding ones); a Qwen3-Next with Gated DeltaNet
linear-attention (Mamba-style state) layers beside full-attention ones (two groups: one state
per block, vLLM's `mamba_cache_mode = "align"`; vLLM raises its block size to 96 tokens so
that a state fits a page)."""


def make_model(directory: Path, kind: str = "llama") -> None:
    """A tiny model of `kind` (MODEL_KINDS) with random weights (seeded), saved for vLLM to
    load: no hub access, no tokenizer (prompts are token ids)."""
    import torch
    import transformers

    common: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "intermediate_size": 256,
        "max_position_embeddings": 2048,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "tie_word_embeddings": False,
        "initializer_range": 0.1,  # outputs that depend on the whole prompt
    }
    if kind == "llama":
        config: Any = transformers.LlamaConfig(
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **common
        )
        model_class: Any = transformers.LlamaForCausalLM
    elif kind == "sliding-window":
        # A 64-token window (2 blocks): prompts of 9-12 blocks reach far past it.
        config = transformers.Gemma3TextConfig(
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=2 * BLOCK_TOKENS,
            layer_types=["sliding_attention", "full_attention"] * 2,
            **common,
        )
        model_class = transformers.Gemma3ForCausalLM
    elif kind == "linear-attention":
        # vLLM's CPU Gated DeltaNet kernel takes head dims of 128 only; 4 KV heads of 128
        # keep the block vLLM aligns to the state's page at 96 tokens.
        config = transformers.Qwen3NextConfig(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=128,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            num_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            layer_types=["linear_attention", "full_attention"],
            **common,
        )
        model_class = transformers.Qwen3NextForCausalLM
    else:
        raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")
    torch.manual_seed(0)
    model = model_class(config).to(torch.bfloat16)
    model.save_pretrained(directory)


def prompts() -> list[list[int]]:
    """Four prompts sharing a 256-token prefix (8 blocks), then tails of their own; lengths
    are a whole number of blocks plus 16 tokens, so every full block can be loaded."""
    rng = random.Random(0)
    prefix = [rng.randrange(3, VOCAB) for _ in range(8 * BLOCK_TOKENS)]
    return [
        prefix + [rng.randrange(3, VOCAB) for _ in range((index + 1) * BLOCK_TOKENS + 16)]
        for index in range(4)
    ]


def kvtier_config(disk: Path) -> dict[str, Any]:
    """The chain under vLLM: its host memory as kvtier's cpu tier, then a disk tier."""
    return {
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": 64},
            {"name": "disk", "medium": "disk", "capacity": 256, "path": str(disk)},
        ]
    }


def start_engine(model: Path, disk: Path) -> Any:
    """vLLM's CPU engine with kvtier's offloading spec, in this process."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    return LLM(
        model=str(model),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        block_size=BLOCK_TOKENS,
        max_model_len=1024,
        max_num_seqs=4,
        enforce_eager=True,
        enable_prefix_caching=True,
        disable_log_stats=False,  # the prompt-token counters by source
        seed=0,
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={
                "spec_name": "KvtierOffloadingSpec",
                "spec_module_path": "kvtier.integrations.vllm",
                "kvtier_config": kvtier_config(disk),
            },
        ),
    )


def engine_core(llm: Any) -> Any:
    """The in-process EngineCore behind `llm`."""
    return llm.llm_engine.engine_core.engine_core


def kvtier_tier(llm: Any) -> Any:
    """kvtier's secondary tier inside the engine's offloading manager."""
    manager = engine_core(llm).scheduler.connector.connector_scheduler.manager
    (tier,) = manager.secondary_tiers
    return tier


def serve(llm: Any, batch: list[list[int]]) -> list[dict[str, Any]]:
    """Each prompt as a request of its own, in order (so that TTFT is one prompt's, and each
    finds what the ones before it left): tokens, top-3 logprobs, the prompt tokens vLLM
    reports as cached, and TTFT (vLLM's own: arrival to first token, loads included)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=LOGPROBS)
    served = []
    for prompt in batch:
        (output,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        completion = output.outputs[0]
        served.append(
            {
                "prompt_tokens": len(prompt),
                "cached_tokens": int(output.num_cached_tokens or 0),
                "tokens": list(completion.token_ids),
                "logprobs": [
                    {str(token): float(entry.logprob) for token, entry in step.items()}
                    for step in completion.logprobs
                ],
                "ttft_s": float(output.metrics.first_token_latency),
            }
        )
    return served


def warm_up(llm: Any) -> None:
    """One short request first, so that the first TTFT measured is not the engine's first
    forward pass (kernel set-up); shorter than a block, so nothing of it is offloaded."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = list(range(3, 3 + WARM_UP_TOKENS))
    llm.generate(
        [TokensPrompt(prompt_token_ids=prompt)], SamplingParams(max_tokens=1), use_tqdm=False
    )


def settle(llm: Any, timeout_s: float = 120.0) -> None:
    """Step the idle engine until the offloading connector has no work left (stores to the
    host tier, cascades to kvtier), then wait for kvtier's own writes."""
    core = engine_core(llm)
    deadline = time.monotonic() + timeout_s
    while core.scheduler.has_requests():
        if time.monotonic() > deadline:
            raise TimeoutError(f"offloading did not settle within {timeout_s} s")
        core.step()
        time.sleep(0.01)
    kvtier_tier(llm).hierarchy.drain()


def prompt_counters(llm: Any) -> dict[str, float]:
    """vLLM's counters of prompt tokens, by source ('prompt_tokens_by_source:local_compute',
    'prompt_tokens_cached_by_source:disk', ...)."""
    counters: dict[str, float] = {}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:")
        if name.startswith("prompt_tokens") and hasattr(metric, "value"):
            source = metric.labels.get("source")
            counters[f"{name}:{source}" if source else name] = float(metric.value)
    return counters


def disk_activity(llm: Any) -> dict[str, int]:
    """kvtier's counters of its disk tier (the only tier of its secondary chain): lookups it
    answered, blocks stored, blocks that failed their checksum, blocks it holds."""
    stats = kvtier_tier(llm).hierarchy.stats()
    (disk,) = [tier for tier in stats.activity if tier.name == "disk"]
    (held,) = [tier for tier in stats.tiers if tier.name == "disk"]
    return {
        "hits": disk.hits,
        "misses": disk.misses,
        "stored": disk.stored,
        "corrupt": disk.corrupt,
        "held": held.used,
    }


def kv_cache_groups(llm: Any) -> list[dict[str, Any]]:
    """The engine's KV-cache groups: each one's spec type, block size in tokens and layers."""
    config = engine_core(llm).scheduler.kv_cache_config
    return [
        {
            "spec": type(group.kv_cache_spec).__name__,
            "block_tokens": int(group.kv_cache_spec.block_size),
            "layers": len(group.layer_names),
        }
        for group in config.kv_cache_groups
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("disk", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--again",
        action="store_true",
        help="serve again from the prefix cache, then from the host tier",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    llm = start_engine(args.model, args.disk)
    result: dict[str, Any] = {"start_s": time.perf_counter() - started, "serves": []}
    try:
        warm_up(llm)
        batch = prompts()
        result["serves"].append(serve(llm, batch))
        settle(llm)
        if args.again:
            # The reference for a cached prefix: this engine's own prefix-cache hit.
            result["serves"].append(serve(llm, batch))
            llm.reset_prefix_cache()
            result["serves"].append(serve(llm, batch))
            settle(llm)
        result["vllm"] = prompt_counters(llm)
        result["kvtier_disk"] = disk_activity(llm)
        result["kv_cache_groups"] = kv_cache_groups(llm)
        result["block_tokens"] = int(engine_core(llm).scheduler.block_size)
    finally:
        # Before the interpreter's exit: kvtier closes its disk tier (a clean close) here.
        llm.llm_engine.engine_core.shutdown()
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
