"""How soon a restarted hierarchy serves its disk tier's blocks, and what they cost in memory.

Fills a disk store of `--layout` ("log", the default, a `LogStore`; or "slots", a
`DiskStore`) with `--blocks` blocks of `--block-bytes` bytes (written straight through the
store), then, for each case and repetition, opens a cpu -> disk hierarchy on it in a fresh
child process and measures:

- open -> first hit (s): from the start of `Hierarchy.open` to the first `get` of a stored
  block (the newest one) returning its bytes;
- open -> fully loaded (s): until the disk tier's bookkeeping holds every restored block
  (`Hierarchy.open` itself where the load is not done in the background);
- RSS growth per block (bytes): the child's anonymous resident memory (RssAnon: the
  process's own objects and arrays) once fully loaded less the same before the open (torch
  and kvtier imported), over the blocks stored; and apart, the growth of its file-backed
  resident memory (RssFile: pages of the memory-mapped LMDB index read meanwhile, page cache
  the kernel can reclaim);
- lookup (us a key): `Hierarchy.lookup` of one restored key at a time, `LOOKUPS` keys spread
  over the store, on the caller's event loop as an engine's prefix look-up is, once fully
  loaded; and the read system calls the process made meanwhile (`syscr` of /proc/self/io,
  every thread): 0 when no look-up reads the disk.

Two cases: the store closed cleanly (its index trusted through its stamp, or the log
store's last checkpoint), and the store's last process killed with SIGKILL (a child opens it,
writes its last `--after` blocks again and kills itself: the per-block index is probed before
it is trusted; the log store's checkpoint is older than its regions, so the open scans what
was written since). Prints the median of `--repeats` per case; a figure
to compare, not a test. Other work sharing the cores shows in the figures: run it on a quiet
machine, or compare runs made side by side.

    .venv/bin/python -m kvtier_tools.bench.disk_restart --blocks 100000
    .venv/bin/python -m kvtier_tools.bench.disk_restart --blocks 1000000 --block-bytes 1024
    .venv/bin/python -m kvtier_tools.bench.disk_restart --blocks 1000000 --after 31250
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
from collections.abc import Sequence, Sized
from pathlib import Path
from typing import Any, cast

import numpy as np

from kvtier.keys import key_from_int
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk.log_store import LogStore

FILL_BATCH = 1024
"""Blocks per write while filling the store."""

CPU_BLOCKS = 64
"""Slots of the cpu tier above the disk tier."""

LOOKUPS = 20_000
"""Restored keys looked up one at a time after the restart."""


def config_of(root: Path, blocks: int, block_bytes: int, layout: str) -> dict[str, Any]:
    """The cpu -> disk hierarchy the children open (fsync off: the fill is not timed on it)."""
    return {
        "block_size": block_bytes,
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": CPU_BLOCKS},
            {
                "name": "disk",
                "medium": "disk",
                "capacity": blocks,
                "path": str(root / "disk"),
                "fsync": False,
                "layout": layout,
            },
        ],
    }


def open_store(root: Path, blocks: int, block_bytes: int, layout: str) -> DiskStore | LogStore:
    """The store of `layout` the hierarchy's disk tier opens (fsync off, plain I/O)."""
    if layout == "log":
        return LogStore(
            root / "disk", block_size=block_bytes, num_blocks=blocks, fsync=False, direct_io=False
        )
    return DiskStore(root / "disk", block_size=block_bytes, num_blocks=blocks, fsync=False)


async def fill(root: Path, blocks: int, block_bytes: int, layout: str) -> None:
    """Write `blocks` blocks (key i in slot i, i's low byte repeated) into a new store."""
    disk = open_store(root, blocks, block_bytes, layout)
    try:
        data = [np.full(block_bytes, i, dtype=np.uint8) for i in range(256)]
        for first in range(0, blocks, FILL_BATCH):
            ids = list(range(first, min(blocks, first + FILL_BATCH)))
            failures = await disk.write(
                [key_from_int(i) for i in ids], ids, [data[i % 256] for i in ids]
            )
            if any(failures):
                raise RuntimeError(f"the fill failed: {[f for f in failures if f][:1]}")
    finally:
        await disk.aclose()


_KILL_CHILD = """
import asyncio, os, signal, sys
import numpy as np
from pathlib import Path
from kvtier.keys import key_from_int
from kvtier_tools.bench.disk_restart import open_store

async def main(root, blocks, block_bytes, layout, after):
    disk = open_store(Path(root), blocks, block_bytes, layout)
    for first in range(blocks - after, blocks, 1024):  # the last slot's block stays the newest
        ids = list(range(first, min(blocks, first + 1024)))
        data = [np.full(block_bytes, i % 256, np.uint8) for i in ids]
        await disk.write([key_from_int(i) for i in ids], ids, data)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])))
"""


def kill_a_writer(root: Path, blocks: int, block_bytes: int, layout: str, after: int) -> None:
    """Leave the store as a process killed with SIGKILL while it had it open leaves it, once
    it wrote its last `after` blocks again."""
    child = subprocess.run(
        [
            *(sys.executable, "-c", _KILL_CHILD, str(root), str(blocks), str(block_bytes)),
            *(layout, str(max(1, min(after, blocks)))),
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    if child.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the writer was not killed: {child.returncode}: {child.stderr}")


def rss_bytes() -> tuple[int, int]:
    """This process's resident memory now: (anonymous, file-backed) bytes. File-backed
    pages are mapped files (the LMDB index is read through a memory map): page cache the
    kernel can take back, counted apart."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem"):
                found[name] = int(value.split()[0]) * 1024
    return found["RssAnon"], found["RssFile"] + found.get("RssShmem", 0)


async def measure(root: Path, blocks: int, block_bytes: int, layout: str) -> dict[str, float]:
    """Open the hierarchy on the filled store: the figures of one restart (in the child)."""
    import time

    import torch

    from kvtier import Hierarchy

    hierarchy = Hierarchy.from_config(config_of(root, blocks, block_bytes, layout))
    before = rss_bytes()
    started = time.perf_counter()
    await hierarchy.open()
    opened = time.perf_counter()
    last = blocks - 1
    out = await hierarchy.get([key_from_int(last)])
    first_hit = time.perf_counter()
    if not bool(torch.all(out[0] == last % 256)):
        raise RuntimeError("the first hit served wrong bytes")
    await wait_loaded(hierarchy)
    loaded = time.perf_counter()
    restored = len(cast(Sized, hierarchy._open().manager.tiers[-1]))  # a benchmark's look inside
    after = rss_bytes()
    keys = [key_from_int(i) for i in range(0, blocks, max(1, blocks // LOOKUPS))][:LOOKUPS]
    reads = read_syscalls()
    looked = time.perf_counter()
    held = sum(hierarchy.lookup([key]) for key in keys)
    lookup_s = time.perf_counter() - looked
    reads = read_syscalls() - reads
    if held != len(keys):
        raise RuntimeError(f"{len(keys) - held} of {len(keys)} restored keys were not found")
    await hierarchy.close()
    return {
        "open_s": opened - started,
        "first_hit_s": first_hit - started,
        "loaded_s": loaded - started,
        "rss_per_block": (after[0] - before[0]) / max(1, blocks),
        "file_per_block": (after[1] - before[1]) / max(1, blocks),
        "restored": float(restored),
        "lookup_us": lookup_s / max(1, len(keys)) * 1e6,
        "lookup_reads": float(reads),
    }


def read_syscalls() -> int:
    """Read system calls this process has made (every thread), from /proc/self/io."""
    with open("/proc/self/io") as counters:
        for line in counters:
            name, _, value = line.partition(":")
            if name == "syscr":
                return int(value)
    return 0


async def wait_loaded(hierarchy: Any) -> None:
    """Until the disk tier's background load (where there is one) has finished."""
    for storage in hierarchy._open().storages:  # a benchmark's look inside
        loading = getattr(storage, "wait_loaded", None)
        if loading is not None:
            await loading()


def run_child(root: Path, blocks: int, block_bytes: int, layout: str) -> dict[str, float]:
    """`measure` in a fresh interpreter (so its RSS is its own)."""
    child = subprocess.run(
        [
            *(sys.executable, "-m", "kvtier_tools.bench.disk_restart", "--child", str(root)),
            *("--blocks", str(blocks), "--block-bytes", str(block_bytes), "--layout", layout),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m kvtier_tools.bench.disk_restart [--blocks N] [--block-bytes B] [--repeats R]`"""
    parser = argparse.ArgumentParser(
        prog="python -m kvtier_tools.bench.disk_restart", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--block-bytes", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layout", choices=("log", "slots"), default="log")
    parser.add_argument(
        "--after", type=int, default=1, help="blocks the killed writer writes before SIGKILL"
    )
    parser.add_argument("--dir", type=Path, default=None, help="where to build the store")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        measured = measure(args.child, args.blocks, args.block_bytes, args.layout)
        print(json.dumps(asyncio.run(measured)))
        return
    root = Path(tempfile.mkdtemp(prefix="kvtier-restart-", dir=args.dir))
    try:
        asyncio.run(fill(root, args.blocks, args.block_bytes, args.layout))
        print(
            f"{args.blocks:,} blocks of {args.block_bytes:,} bytes, cpu -> disk hierarchy, "
            f"layout {args.layout}, {args.after:,} blocks written before each SIGKILL"
        )
        header = f"{'case':<16} {'open s':>8} {'first hit s':>12} {'loaded s':>9}"
        print(
            header + f" {'anon B/block':>13} {'file B/block':>13} {'restored':>9}"
            f" {'lookup us':>10} {'reads':>6}"
        )
        for case in ("clean close", "after SIGKILL"):
            rows = []
            for _ in range(args.repeats):
                if case == "after SIGKILL":
                    kill_a_writer(root, args.blocks, args.block_bytes, args.layout, args.after)
                rows.append(run_child(root, args.blocks, args.block_bytes, args.layout))
            med = {name: statistics.median(row[name] for row in rows) for name in rows[0]}
            print(
                f"{case:<16} {med['open_s']:>8.3f} {med['first_hit_s']:>12.3f} "
                f"{med['loaded_s']:>9.3f} {med['rss_per_block']:>13.0f} "
                f"{med['file_per_block']:>13.0f} {med['restored']:>9,.0f}"
                f" {med['lookup_us']:>10.1f} {med['lookup_reads']:>6.0f}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
