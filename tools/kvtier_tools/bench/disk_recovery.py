"""How long a disk store takes to open in each recovery case, and what it finds.

Fills a store, then times four opens of it: after a clean close (the index is trusted
through its stamp), after a killed process (the index is walked in a child process first),
without its index (rebuilt from the slot headers, every block verified), and with a
truncated index (found before mapping, then rebuilt). Prints one row per case: seconds
(median of --repeats) and blocks found. A figure to compare, not a test.

    .venv/bin/python -m kvtier_tools.bench.disk_recovery                  # 65,536 blocks of 16 KiB
    .venv/bin/python -m kvtier_tools.bench.disk_recovery --blocks 8192 --block-bytes 65536
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from kvtier.config import format_size
from kvtier.keys import key_from_int
from kvtier.tiers.disk import DiskStore

FILL_BATCH = 256
"""Blocks per write while filling the store."""


async def fill(directory: Path, blocks: int, block_bytes: int) -> Path:
    """Write `blocks` blocks of random bytes into a new store under `directory`; the store's
    own directory (where its index lives)."""
    disk = DiskStore(directory, block_size=block_bytes, num_blocks=blocks, fsync=False)
    try:
        rng = np.random.default_rng(0)
        data = [rng.integers(0, 256, block_bytes, dtype=np.uint8) for _ in range(FILL_BATCH)]
        for first in range(0, blocks, FILL_BATCH):
            ids = list(range(first, min(blocks, first + FILL_BATCH)))
            await disk.write([key_from_int(i) for i in ids], ids, data[: len(ids)])
        return disk.path
    finally:
        await disk.aclose()


def timed_open(directory: Path, blocks: int, block_bytes: int) -> tuple[float, int]:
    """(seconds to open the store under `directory`, blocks it found)."""
    started = time.perf_counter()
    disk = DiskStore(directory, block_size=block_bytes, num_blocks=blocks, fsync=False)
    seconds = time.perf_counter() - started
    found = len(disk)
    disk.close()
    return seconds, found


def damages(index: Path) -> list[tuple[str, Callable[[], None]]]:
    """The four cases, each as (name, what to do to the store's `index` directory first)."""

    def clean() -> None:
        pass

    def killed() -> None:
        (index / "clean").unlink(missing_ok=True)

    def no_index() -> None:
        shutil.rmtree(index)

    def truncated() -> None:
        os.truncate(index / "data.mdb", 8192)

    return [
        ("clean close (stamp trusted)", clean),
        ("killed process (index probed)", killed),
        ("index missing (rebuilt, verified)", no_index),
        ("index truncated (rebuilt)", truncated),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m kvtier_tools.bench.disk_recovery [--blocks N] [--block-bytes B] ...`"""
    parser = argparse.ArgumentParser(
        prog="python -m kvtier_tools.bench.disk_recovery", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--blocks", type=int, default=65536)
    parser.add_argument("--block-bytes", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to build the store")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kvtier-recovery-", dir=args.dir))
    try:
        store_dir = asyncio.run(fill(root, args.blocks, args.block_bytes))
        size = format_size(args.blocks * args.block_bytes)
        print(f"{args.blocks:,} blocks of {args.block_bytes:,} bytes ({size})")
        print(f"{'case':<34} {'open s (median)':>16} {'blocks found':>13}")
        for name, damage in damages(store_dir / "index"):
            times: list[float] = []
            found = 0
            for _ in range(args.repeats):
                damage()
                seconds, found = timed_open(root, args.blocks, args.block_bytes)
                times.append(seconds)
            print(f"{name:<34} {statistics.median(times):>16.3f} {found:>13,}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
