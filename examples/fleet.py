"""A fleet of two serving nodes sharing one KV cache.

Two processes, each with its own kvtier hierarchy (its own CPU tier) over one shared tier:
a Redis (`--shared redis`, started by `scripts/redis.sh start`) or a shared directory
(`--shared shared-fs`). Node A serves the first half of the shipped Mooncake trace, then
node B serves the second half: every prompt prefix B finds in the shared tier is a prefix A
computed, loaded instead of recomputed, and verified bit for bit (each block's bytes are a
function of its key, as a model's KV is of its tokens).

    scripts/redis.sh start && eval "$(scripts/redis.sh env)"
    .venv/bin/python examples/fleet.py --shared redis
    .venv/bin/python examples/fleet.py --shared shared-fs --dir /mnt/nfs/kvtier

Both nodes authenticate every value with one key file (`auth_key_file`): $KVTIER_AUTH_KEY_FILE
(`scripts/redis.sh env` exports the one it made), else a fresh one made for this run, as
`kvtier keys new PATH` makes them (0600). Whoever can write the shared store cannot make the
nodes serve forged blocks.

Exit status 0 when B loaded some of A's blocks and no block came back wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from kvtier import Hierarchy
from kvtier.keys import OffloadKey
from kvtier_tools.workloads.traces import read_mooncake

BLOCK_SIZE = 16 * 1024


def key_of(block: int) -> OffloadKey:
    return OffloadKey(b"fleet:" + block.to_bytes(8, "big"))


def bytes_of(keys: list[OffloadKey]) -> torch.Tensor:
    """The KV of each block: a deterministic function of its key."""
    rows = [
        np.random.default_rng(xxhash.xxh3_64_intdigest(key)).integers(
            0, 256, BLOCK_SIZE, dtype=np.uint8
        )
        for key in keys
    ]
    return (
        torch.from_numpy(np.stack(rows)) if rows else torch.empty(0, BLOCK_SIZE, dtype=torch.uint8)
    )


def key_file(directory: str) -> str:
    """The fleet's key file: $KVTIER_AUTH_KEY_FILE, else a new one (0600) for this run."""
    configured = os.environ.get("KVTIER_AUTH_KEY_FILE")
    if configured:
        return configured
    from kvtier.tiers.shared.auth import new_key, write_key_file

    path = Path(tempfile.mkdtemp(prefix="kvtier-fleet-key-")) / "fleet.key"
    write_key_file(path, new_key())
    return str(path)


def chain(
    shared: str, directory: str, auth_key_file: str, timeout_ms: int | None = None
) -> dict[str, Any]:
    if shared == "redis":
        tier: dict[str, Any] = {
            "name": "fleet",
            "medium": "redis",
            "capacity": 65536,
            "url": os.environ.get("KVTIER_REDIS_URL", "redis://127.0.0.1:6390/0"),
            "password_env": "KVTIER_REDIS_PASSWORD",
        }
        if timeout_ms is not None:
            tier["timeout_ms"] = timeout_ms
    else:
        tier = {"name": "fleet", "medium": "shared-fs", "capacity": 65536, "path": directory}
    tier["auth_key_file"] = auth_key_file  # the values' key: never the key itself
    return {
        "block_size": BLOCK_SIZE,
        "model_id": "fleet-demo",
        "strict": True,
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 512}, tier],
    }


async def serve(config: dict[str, Any], requests: list[list[int]]) -> dict[str, int]:
    """Serve the requests as an engine would: load the longest prefix some tier holds (a
    shared tier is asked, and answers, within `get`), verify it, compute and store the rest.
    A block served that this node never computed came from the other node."""
    counts = {"requests": 0, "blocks": 0, "loaded": 0, "from_other": 0, "stored": 0, "wrong": 0}
    counts["failed"] = 0  # copies that failed (a shared tier's timeout, an error): misses
    mine: set[OffloadKey] = set()
    async with Hierarchy.from_config(config) as h:
        for blocks in requests:
            keys = [key_of(block) for block in blocks]
            out = await h.get(keys)
            served = int(out.shape[0])
            if served:
                wrong = (out.cpu() != bytes_of(keys[:served])).any(dim=1)
                counts["wrong"] += int(wrong.sum())
            counts["loaded"] += served
            counts["from_other"] += sum(1 for key in keys[:served] if key not in mine)
            rest = keys[served:]
            if rest:
                counts["stored"] += await h.put(rest, bytes_of(rest))
                mine.update(rest)
            counts["requests"] += 1
            counts["blocks"] += len(keys)
        await h.flush()
        counts["failed"] = h.stats().failed_blocks
    return counts


def node(config: dict[str, Any], requests: list[list[int]], results: Any, name: str) -> None:
    results.put((name, asyncio.run(serve(config, requests))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", choices=["redis", "shared-fs"], default="redis")
    parser.add_argument("--dir", help="the shared directory (shared-fs; default: a temp dir)")
    parser.add_argument("--requests", type=int, default=600, help="requests of the trace")
    parser.add_argument(
        "--timeout-ms",
        type=int,
        help="the Redis tier's deadline of each call (default: the tier's, 500 ms); a call "
        "past it is a miss or a failed store, so a slower machine shares fewer blocks",
    )
    args = parser.parse_args(argv)
    directory = args.dir or tempfile.mkdtemp(prefix="kvtier-fleet-")
    requests = [
        list(r.hash_ids) for r, _ in zip(read_mooncake(), range(args.requests), strict=False)
    ]
    half = len(requests) // 2
    config = chain(args.shared, directory, key_file(directory), args.timeout_ms)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    counts: dict[str, dict[str, int]] = {}
    for name, part in (("A", requests[:half]), ("B", requests[half:])):
        process = context.Process(target=node, args=(config, part, results, name))
        process.start()
        got_name, got = results.get(timeout=600)
        process.join()
        if process.exitcode != 0:
            print(f"node {name} failed (exit {process.exitcode})", file=sys.stderr)
            return 1
        counts[got_name] = got
    print(f"shared tier: {args.shared}" + ("" if args.shared == "redis" else f" at {directory}"))
    print(
        f"{'node':<6}{'requests':>9}{'blocks':>8}{'loaded':>8}{'computed by the other':>23}"
        f"{'stored':>8}{'wrong':>7}{'failed':>8}"
    )
    for name, c in counts.items():
        print(
            f"{name:<6}{c['requests']:>9}{c['blocks']:>8}{c['loaded']:>8}"
            f"{c['from_other']:>23}{c['stored']:>8}{c['wrong']:>7}{c['failed']:>8}"
        )
    wrong = sum(c["wrong"] for c in counts.values())
    shared_hits = counts["B"]["from_other"]
    print(f"node B loaded {shared_hits} blocks that node A computed; {wrong} wrong blocks")
    return 0 if wrong == 0 and shared_hits > 0 else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
