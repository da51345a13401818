"""kvtier's disk tier against vLLM's own `fs` tier, each as the secondary tier of vLLM 0.33's
`TieringOffloadingManager`, on the same bytes.

For each tier and chunk size: vLLM's CPU tier receives --total bytes of chunks (random bytes,
each chunk stamped with its index), in requests of --per-request chunks; the time until every
cascade to the secondary tier is reported done gives the store GB/s. Then vLLM's cache is reset
(its CPU tier is emptied, the secondary tier keeps its blocks) and one request looks every chunk
up again: the time until every promotion is reported done gives the load GB/s, and every chunk
is compared with what was stored. The longest single call vLLM made into the secondary tier is
printed too (a tier must never block vLLM's scheduler thread).

Both tiers read back what they just wrote, so reads may come from the page cache (dropping it
needs root); both write without fsync (vLLM's `fs` tier never syncs; kvtier's `fsync = false`),
and a `kvtier+fsync` row shows kvtier's crash-safe setting. Medians of --repeats runs.

    scripts/setup.sh --vllm
    VLLM_TARGET_DEVICE=cpu .venv/bin/python -m kvtier_tools.bench.vllm_tiers
    VLLM_TARGET_DEVICE=cpu .venv/bin/python -m kvtier_tools.bench.vllm_tiers \
        --sizes 256KiB --total 64MiB
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.config import parse_size
from kvtier.integrations.vllm.testing import offloading_config


def tier_config(kind: str, directory: Path, chunks: int) -> dict[str, Any]:
    """The `secondary_tiers` entry of `kind`: vLLM's `fs` tier, or kvtier's disk tier (with
    fsync for "kvtier+fsync")."""
    if kind == "fs":
        return {"type": "fs", "root_dir": str(directory)}
    disk = {
        "name": "disk",
        "medium": "disk",
        "capacity": chunks,
        "path": str(directory),
        "fsync": kind == "kvtier+fsync",
    }
    return {
        "type": "KvtierSecondaryTier",
        "module_path": "kvtier.integrations.vllm",
        "config": {"tiers": [disk]},
    }


def time_calls(tier: Any) -> dict[str, float]:
    """Wrap the tier's methods vLLM calls, keeping the longest call of each."""
    longest: dict[str, float] = {}
    for name in (
        "lookup",
        "submit_store",
        "submit_load",
        "get_finished_jobs",
        "touch",
        "on_schedule_end",
        "take_events",
    ):
        method: Callable[..., Any] = getattr(tier, name)

        @functools.wraps(method)
        def timed(*args: Any, _method: Callable[..., Any] = method, _name: str = name) -> Any:
            started = time.perf_counter()
            try:
                result = _method(*args)
                if _name == "get_finished_jobs":
                    result = list(result)
                return result
            finally:
                took = time.perf_counter() - started
                longest[_name] = max(longest.get(_name, 0.0), took)

        setattr(tier, name, timed)
    return longest


def step(manager: Any) -> None:
    """End a scheduler step of vLLM's manager (where a tier hands finished jobs back)."""
    with manager.lock:
        manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))


class Run(NamedTuple):
    """One run of a tier: store and load GB/s, and vLLM's longest call into the tier."""

    store_gbps: float
    load_gbps: float
    longest_call_ms: float
    longest_call: str


def run_once(kind: str, chunk_bytes: int, chunks: int, per_request: int) -> Run:
    """Store `chunks` chunks of `chunk_bytes` through vLLM's manager into tier `kind`, load
    them back after a cache reset, and compare every chunk."""
    directory = Path(tempfile.mkdtemp(prefix=f"kvtier-bench-{kind}-"))
    extra = {
        "cpu_bytes_to_use": chunks * chunk_bytes,
        "secondary_tiers": [tier_config(kind, directory, chunks)],
    }
    config = offloading_config(extra, block_bytes=chunk_bytes, events=False)
    spec = TieringOffloadingSpec(config)
    manager = spec.get_manager()
    try:
        (tier,) = manager.secondary_tiers
        longest = time_calls(tier)
        view = manager.primary_tier.get_kv_memoryview()
        rows = torch.frombuffer(view, dtype=torch.uint8).view(view.shape[0], -1)
        rng = np.random.default_rng(0)
        base = torch.from_numpy(rng.integers(0, 256, chunk_bytes, dtype=np.uint8))
        keys = [make_offload_key(i.to_bytes(8, "big") * 4, 0) for i in range(chunks)]

        def expected(index: int) -> torch.Tensor:
            data = base.clone()
            data[:8] = torch.tensor(list(index.to_bytes(8, "big")), dtype=torch.uint8)
            return data

        started = time.perf_counter()
        for first in range(0, chunks, per_request):
            context = ReqContext(req_id=f"store-{first}")
            batch = keys[first : first + per_request]
            with manager.lock:
                manager.on_new_request(context)
                out = manager.prepare_store(batch, context)
                assert out is not None
                for chunk, key in zip(out.store_spec.block_ids, out.keys_to_store, strict=True):
                    rows[int(chunk)] = expected(keys.index(key))
                manager.complete_store(out.keys_to_store, context)
                manager.on_request_finished(context)
            step(manager)
        while True:
            with manager.lock:
                manager._process_finished_jobs()
                busy = bool(manager._jobs)
            if not busy:
                break
            step(manager)
            time.sleep(0.0005)
        store_s = time.perf_counter() - started

        with manager.lock:
            manager.reset_cache()
            manager.on_reset_flushed()
        context = ReqContext(req_id="load")
        with manager.lock:
            manager.on_new_request(context)
        started = time.perf_counter()
        pending = list(keys)
        while pending:
            still = []
            with manager.lock:
                for key in pending:
                    if manager.lookup(key, context) is not LookupResult.HIT:
                        still.append(key)
            pending = still
            if pending:
                step(manager)
                time.sleep(0.0005)
        load_s = time.perf_counter() - started
        for index, key in enumerate(keys):
            with manager.lock:
                (chunk,) = manager.prepare_load([key], context).block_ids
                same = torch.equal(rows[int(chunk)], expected(index))
                manager.complete_load([key], context)
            if not same:
                raise AssertionError(f"{kind}: chunk {index} came back with other bytes")
        del rows
        total = chunks * chunk_bytes
        return Run(
            store_gbps=total / store_s / 1e9,
            load_gbps=total / load_s / 1e9,
            longest_call_ms=max(longest.values()) * 1e3,
            longest_call=max(longest, key=longest.__getitem__),
        )
    finally:
        manager.shutdown()
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m kvtier_tools.bench.vllm_tiers [--sizes ...] [--total ...] [--tiers ...]`"""
    parser = argparse.ArgumentParser(
        prog="python -m kvtier_tools.bench.vllm_tiers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sizes", nargs="+", default=["64KiB", "256KiB", "2MiB"])
    parser.add_argument("--total", default="256MiB", help="bytes stored per run")
    parser.add_argument("--per-request", type=int, default=16, help="chunks per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiers", nargs="+", default=["fs", "kvtier", "kvtier+fsync"])
    args = parser.parse_args(argv)
    total = parse_size(args.total)
    print(
        f"{'tier':<14}{'chunk':>8}{'chunks':>8}{'store GB/s':>12}{'load GB/s':>11}"
        f"{'longest call':>14}  (median of {args.repeats})"
    )
    for size_text in args.sizes:
        size = parse_size(size_text)
        chunks = max(1, total // size)
        for kind in args.tiers:
            runs = [run_once(kind, size, chunks, args.per_request) for _ in range(args.repeats)]
            store = statistics.median(run.store_gbps for run in runs)
            load = statistics.median(run.load_gbps for run in runs)
            worst = max(runs, key=lambda run: run.longest_call_ms)
            print(
                f"{kind:<14}{size_text:>8}{chunks:>8}{store:>12.2f}{load:>11.2f}"
                f"{worst.longest_call_ms:>10.2f} ms  {worst.longest_call}"
            )


if __name__ == "__main__":
    main()
