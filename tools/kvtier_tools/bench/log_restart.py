"""How fast a log store (`layout = "log"`) opens again, and what its index costs in memory.

    PYTHONPATH=tools python -m kvtier_tools.bench.log_restart --blocks 100000
    PYTHONPATH=tools python -m kvtier_tools.bench.log_restart --blocks 1000000 --block-bytes 1024

Fills a `LogStore` with `--blocks` blocks (fsync off: the fill is not timed), closes it (a
last checkpoint), then for each case opens it in a fresh child process and measures the
open (checkpoint read, region headers, the regions written since scanned, index rebuilt)
and the first read of the newest block after it; and the index's memory per block
(`LogStore.index_bytes`: its arrays and the key map with its keys). Cases: "clean" (opened
after a clean close) and "kill -9" (a child opened the store, wrote `--after` more blocks in
groups of 256 with fsync on and was killed with SIGKILL, so the checkpoint is older than the
regions and the open scans those blocks; each measuring child closes cleanly, so every
repeat scans exactly `--after` blocks). Prints the median of `--repeats`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.keys import key_from_int
from kvtier.tiers.disk.log_store import LogStore

FILL_BATCH = 2048

_OPEN = """
import asyncio, json, sys, time
import numpy as np
from kvtier.keys import key_from_int
from kvtier.tiers.disk.log_store import LogStore
root, blocks, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
started = time.perf_counter()
store = LogStore(root, block_size=size, num_blocks=blocks, direct_io=False, fsync=False)
opened = time.perf_counter()
async def first():
    buffer = np.empty(size, dtype=np.uint8)
    cold = store.restore_cold()
    slot = int(cold.slots()[-1])
    return await store.read([cold.key_of(slot)], [slot], [buffer])
result = asyncio.run(first())
served = time.perf_counter()
print(json.dumps({"open_s": opened - started, "first_s": served - started,
                  "ok": result == [None], "blocks": len(store),
                  "index_bytes": store.index_bytes(), "scanned": store.opened.scanned_regions}))
store.close()  # a checkpoint: each kill -9 repeat scans exactly --after blocks
"""

_KILL = """
import asyncio, os, signal, sys
import numpy as np
from kvtier.keys import key_from_int
from kvtier.tiers.disk.log_store import LogStore
root, blocks, size, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = LogStore(root, block_size=size, num_blocks=blocks, direct_io=False, fsync=True)
async def more():
    data = [np.full(size, 7, dtype=np.uint8)] * 256
    for first in range(0, after, 256):
        ids = range(blocks + first, blocks + first + 256)
        await store.write([key_from_int(i) for i in ids], [i % blocks for i in ids], data)
asyncio.run(more())
os.kill(os.getpid(), signal.SIGKILL)
"""


async def fill(root: Path, blocks: int, block_bytes: int) -> None:
    """`blocks` blocks in a new store at `root`, closed cleanly."""
    store = await LogStore.open_async(
        root, block_size=block_bytes, num_blocks=blocks, direct_io=False, fsync=False
    )
    rng = np.random.default_rng(1)
    data = [rng.integers(0, 256, block_bytes, dtype=np.uint8) for _ in range(16)]
    for first in range(0, blocks, FILL_BATCH):
        ids = range(first, min(first + FILL_BATCH, blocks))
        await store.write([key_from_int(i) for i in ids], list(ids), [data[i % 16] for i in ids])
    await store.aclose()


def _child(code: str, *args: object) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True
    )
    if done.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(done.stderr)
    return json.loads(done.stdout) if done.stdout.strip() else {}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--block-bytes", type=int, default=4096)
    parser.add_argument("--after", type=int, default=4096, help="blocks written before kill")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kvtier-log-restart-"))
    try:
        asyncio.run(fill(root, args.blocks, args.block_bytes))
        for case in ("clean", "kill -9"):
            runs = []
            for _ in range(args.repeats):
                if case == "kill -9":
                    _child(_KILL, root, args.blocks, args.block_bytes, args.after)
                runs.append(_child(_OPEN, root, args.blocks, args.block_bytes))
            assert all(run["ok"] for run in runs), runs
            open_s = statistics.median(run["open_s"] for run in runs)
            first_s = statistics.median(run["first_s"] for run in runs)
            per_block = runs[-1]["index_bytes"] / max(1, runs[-1]["blocks"])
            print(
                f"{case:8s} {args.blocks} blocks of {args.block_bytes} B: open {open_s:.3f} s, "
                f"first hit {first_s:.3f} s, regions scanned {runs[-1]['scanned']}, "
                f"index {per_block:.0f} B/block (median of {len(runs)})"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
