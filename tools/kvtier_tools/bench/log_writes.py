"""The disk tier's write and read paths, both layouts, against the raw device (issue 33).

    PYTHONPATH=tools python -m kvtier_tools.bench.log_writes [--dir DIR] [--unaligned]

In one run, in one directory: a demotion group of `--group` blocks of `--block-bytes`
(240 x 16 KiB = 3.9 MB by default) written

- raw: one pwrite of the group's bytes (O_DIRECT where the filesystem takes it, from
  page-aligned memory) + fdatasync, to a preallocated file (the device's write row);
- by a per-block store (`layout = "slots"`) and a log store (`layout = "log"`), fsync on and
  off, one group at a time, and four groups in flight at once (group commit);

then `--reads` random single-block reads: raw preads (O_DIRECT where possible), and each
store's `read` of one block. The blocks are rows of one page-aligned pool, as a CPU tier's
are (`--unaligned`: each its own numpy array, which O_DIRECT cannot write from). Prints
medians (GB/s for writes, microseconds a block for reads) and each store's figure as a
ratio of the raw one. Other work on the machine shows in the figures: compare rows of one
run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import mmap
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.keys import key_from_int
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk.io import staging_buffer
from kvtier.tiers.disk.log_store import LogStore


def raw_rows(
    directory: Path, nbytes: int, block: int, repeats: int, reads: int
) -> tuple[float, float]:
    """(seconds per group write + fdatasync, seconds per random block read), medians."""
    path = directory / "raw.bin"
    size = nbytes * 8
    flags = os.O_RDWR | os.O_CREAT
    fd = os.open(path, flags, 0o600)
    os.posix_fallocate(fd, 0, size)
    direct = fd
    with contextlib.suppress(OSError, AttributeError):
        direct = os.open(path, os.O_RDWR | os.O_DIRECT)
    data = staging_buffer(nbytes)
    data[:] = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    times = []
    for number in range(repeats):
        started = time.perf_counter()
        os.pwrite(direct, data.data, (number % 8) * nbytes)
        os.fdatasync(fd)
        times.append(time.perf_counter() - started)
    buffer = staging_buffer(block)
    rng = random.Random(1)
    read_times = []
    for _ in range(reads):
        at = rng.randrange(size // block) * block
        started = time.perf_counter()
        os.preadv(direct, [buffer.data], at)
        read_times.append(time.perf_counter() - started)
    for descriptor in {fd, direct}:
        os.close(descriptor)
    return statistics.median(times), statistics.median(read_times)


def make_blocks(group: int, block: int, aligned: bool) -> list[np.ndarray[Any, Any]]:
    """`group` blocks of random bytes: rows of one page-aligned pool, or separate arrays."""
    rng = np.random.default_rng(2)
    if not aligned:
        return [rng.integers(0, 256, block, dtype=np.uint8) for _ in range(group)]
    pool = staging_buffer(group * block).reshape(group, block)
    pool[:] = rng.integers(0, 256, (group, block), dtype=np.uint8)
    return [pool[i] for i in range(group)]


async def store_rows(
    store: Any, group: int, block: int, repeats: int, reads: int, aligned: bool = True
) -> tuple[float, float, float]:
    """(seconds per group alone, per group with four in flight, per block read), medians."""
    blocks = make_blocks(group, block, aligned)
    slots_total = store.num_blocks
    next_id = 0

    async def one() -> None:
        nonlocal next_id
        ids = range(next_id, next_id + group)
        next_id += group
        results = await store.write(
            [key_from_int(i) for i in ids], [i % slots_total for i in ids], blocks
        )
        if any(result is not None for result in results):
            raise RuntimeError(f"a write failed: {results}")

    alone = []
    for _ in range(repeats):
        started = time.perf_counter()
        await one()
        alone.append(time.perf_counter() - started)
    together = []
    for _ in range(max(2, repeats // 4)):
        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(4)))
        together.append((time.perf_counter() - started) / 4)
    held = list(range(max(0, next_id - slots_total), next_id))
    pick = random.Random(3)
    # the read lands in page-aligned memory (a CPU tier's row), or a plain array
    buffer = (
        np.frombuffer(mmap.mmap(-1, block), dtype=np.uint8)
        if aligned
        else np.empty(block, dtype=np.uint8)
    )
    read_times = []
    for _ in range(reads):
        i = pick.choice(held)
        started = time.perf_counter()
        result = await store.read([key_from_int(i)], [i % slots_total], [buffer])
        read_times.append(time.perf_counter() - started)
        if result != [None]:
            raise RuntimeError(f"read of block {i} failed: {result}")
    return statistics.median(alone), statistics.median(together), statistics.median(read_times)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--block-bytes", type=int, default=16 << 10)
    parser.add_argument("--group", type=int, default=240)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--reads", type=int, default=400)
    parser.add_argument("--unaligned", action="store_true", help="blocks as separate arrays")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kvtier-log-writes-", dir=args.dir))
    nbytes = args.group * args.block_bytes
    gb = nbytes / 1e9
    try:
        raw_write, raw_read = raw_rows(root, nbytes, args.block_bytes, args.repeats, args.reads)
        print(
            f"raw     write {gb / raw_write:.2f} GB/s ({raw_write * 1e3:.1f} ms a group),"
            f" read {raw_read * 1e6:.0f} us a block"
        )
        for layout, cls in (("slots", DiskStore), ("log", LogStore)):
            for fsync in (True, False):
                where = root / f"{layout}-{fsync}"
                store = cls(
                    where,
                    block_size=args.block_bytes,
                    num_blocks=args.group * 16,
                    fsync=fsync,
                )
                try:
                    alone, together, read = asyncio.run(
                        store_rows(
                            store,
                            args.group,
                            args.block_bytes,
                            args.repeats,
                            args.reads,
                            not args.unaligned,
                        )
                    )
                finally:
                    store.close()
                print(
                    f"{layout:5s} fsync={'on ' if fsync else 'off'} write {gb / alone:.2f} GB/s"
                    f" ({alone * 1e3:.1f} ms, {raw_write / alone:.0%} of raw), 4 in flight"
                    f" {gb / together:.2f} GB/s ({raw_write / together:.0%} of raw); read"
                    f" {read * 1e6:.0f} us a block ({raw_read / read:.0%} of raw)"
                )
                shutil.rmtree(where, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
