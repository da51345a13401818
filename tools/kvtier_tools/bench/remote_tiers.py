"""kvtier's shared tiers against the plain client moving the same bytes, in the same run.

- redis: `RedisStorage.write` / `read` (values with the verifying header, checksummed on both
  sides) against redis-py pipelines of plain SET / MGET of the same blocks, with the same
  batch size and the same number of round trips in flight.
- shared-fs: `SharedFSStorage.write` / `read` (header, checksum, temp file + rename) against
  plain write-to-temp + rename / read of the same files on the same thread-pool size.

Each kvtier figure is taken with the values' authentication off (an unkeyed xxh3 checksum,
`authenticate = false`), on (keyed BLAKE3, the default) and with encryption (AES-256-GCM,
`encrypt = true`), interleaved in every repeat, so the cost of each is read off one run.

Prints GB/s (medians of --repeats), kvtier's share of the plain figure and each mode's share
of the unauthenticated one. Needs a Redis: `scripts/redis.sh start && eval "$(scripts/redis.sh
env)"`.

    .venv/bin/python -m kvtier_tools.bench.remote_tiers
    .venv/bin/python -m kvtier_tools.bench.remote_tiers --sizes 256KiB --total 64MiB --tiers redis
    .venv/bin/python -m kvtier_tools.bench.remote_tiers --modes off mac   # without encryption
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import redis.asyncio as aioredis

from kvtier.config import parse_size
from kvtier.keys import key_from_int
from kvtier.tiers.redis.storage import INLINE_CPU_BYTES, RedisStorage
from kvtier.tiers.shared.auth import ValueAuth, ValueKey, new_key
from kvtier.tiers.sharedfs.storage import SharedFSStorage

BATCH = 32
IN_FLIGHT = 8
WORKERS = 8
MODES = ("off", "mac", "encrypt")
"""Authentication off (unkeyed checksum), on (keyed BLAKE3), on with AES-256-GCM."""
BENCH_KEY = ValueKey(new_key(), "the benchmark's key")


def auth_of(mode: str, namespace: str) -> ValueAuth | None:
    """The values' authentication of `mode` for `namespace` (None: unkeyed checksums)."""
    if mode == "off":
        return None
    return ValueAuth.for_namespace(namespace, BENCH_KEY, encrypt=mode == "encrypt")


class Timing(NamedTuple):
    """Wall seconds, and CPU seconds of this process (all its threads): the CPU figure is
    what a mode costs, little changed by other work on the machine."""

    wall_s: float
    cpu_s: float


async def timed(work: Callable[[], Awaitable[object]]) -> Timing:
    """How long awaiting `work()` took."""
    wall, cpu = time.perf_counter(), time.process_time()
    await work()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


async def in_batches(count: int, size: int, run: Callable[[range], Awaitable[object]]) -> None:
    """Plain batches sized as the tier sizes its own (at most BATCH keys and about
    INLINE_CPU_BYTES), IN_FLIGHT at a time: the same round trips for both sides."""
    slots = asyncio.Semaphore(IN_FLIGHT)
    step = max(1, min(BATCH, INLINE_CPU_BYTES // size))

    async def one(batch: range) -> None:
        async with slots:
            await run(batch)

    await asyncio.gather(*(one(range(i, min(count, i + step))) for i in range(0, count, step)))


def bench_blocks(size: int, count: int) -> list[npt.NDArray[np.uint8]]:
    """`count` blocks of `size` random bytes (eight distinct ones, repeated)."""
    blocks = [np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8) for i in range(8)]
    return [blocks[i % 8] for i in range(count)]


async def redis_kvtier(
    size: int, count: int, url: str, password: str | None, mode: str
) -> tuple[Timing, Timing]:
    """(put, get) seconds of `count` blocks through a RedisStorage in `mode`."""
    keys = [key_from_int(i) for i in range(count)]
    namespace = f"bench/{size}"
    client = aioredis.Redis.from_url(url, password=password, max_connections=64)
    storage = RedisStorage(
        aioredis.Redis.from_url(url, password=password, max_connections=64),
        block_size=size,
        num_blocks=count,
        namespace=namespace,
        prefix=b"bench:k:",
        timeout_s=30.0,
        max_in_flight=IN_FLIGHT,
        batch_keys=BATCH,
        auth=auth_of(mode, namespace),
    )
    try:
        await client.flushall()
        buffers = bench_blocks(size, count)
        out = [np.empty(size, dtype=np.uint8) for _ in range(count)]
        warm = min(count, BATCH * IN_FLIGHT)  # the connections opened first
        await storage.write(keys[:warm], [0] * warm, buffers[:warm])
        kv_put = await timed(lambda: storage.write(keys, [0] * count, buffers))
        kv_get = await timed(lambda: storage.read(keys, [0] * count, out))
        assert all(np.array_equal(out[i], buffers[i]) for i in range(0, count, 97))
        await client.flushall()
        return kv_put, kv_get
    finally:
        await storage.aclose()
        await client.aclose()


async def redis_plain(
    size: int, count: int, url: str, password: str | None
) -> tuple[Timing, Timing]:
    """(put, get) seconds of the same blocks as plain pipelined SET / MGET."""
    keys = [key_from_int(i) for i in range(count)]
    client = aioredis.Redis.from_url(url, password=password, max_connections=64)
    try:
        await client.flushall()
        buffers = bench_blocks(size, count)
        out = [np.empty(size, dtype=np.uint8) for _ in range(count)]
        await asyncio.gather(*(client.ping() for _ in range(IN_FLIGHT)))

        async def plain_set(batch: range) -> None:
            pipe = client.pipeline(transaction=False)
            for i in batch:
                pipe.set(b"bench:p:" + keys[i], buffers[i].data)
            await pipe.execute()

        async def plain_get(batch: range) -> None:
            values = await client.mget([b"bench:p:" + keys[i] for i in batch])
            for i, value in zip(batch, values, strict=True):
                assert isinstance(value, bytes), f"plain GET of block {i} returned {value!r}"
                out[i][:] = np.frombuffer(value, dtype=np.uint8)

        plain_put = await timed(lambda: in_batches(count, size, plain_set))
        plain_get_s = await timed(lambda: in_batches(count, size, plain_get))
        await client.flushall()
        return plain_put, plain_get_s
    finally:
        await client.aclose()


async def fs_kvtier(size: int, count: int, root: Path, mode: str) -> tuple[Timing, Timing]:
    """(put, get) seconds of `count` blocks through a SharedFSStorage in `mode`."""
    keys = [key_from_int(i) for i in range(count)]
    buffers = bench_blocks(size, count)
    out = [np.empty(size, dtype=np.uint8) for _ in range(count)]
    namespace = f"bench/{size}"
    storage = SharedFSStorage(
        root / "kvtier",
        block_size=size,
        num_blocks=count,
        namespace=namespace,
        max_size=1 << 40,
        max_workers=WORKERS,
        sweep_interval_s=None,
        auth=auth_of(mode, namespace),
    )
    try:
        kv_put = await timed(lambda: storage.write(keys, [0] * count, buffers))
        kv_get = await timed(lambda: storage.read(keys, [0] * count, out))
        assert all(np.array_equal(out[i], buffers[i]) for i in range(0, count, 97))
        return kv_put, kv_get
    finally:
        await storage.aclose()


async def fs_plain(size: int, count: int, root: Path) -> tuple[Timing, Timing]:
    """(put, get) seconds of the same blocks as plain temp file + rename / read."""
    buffers = bench_blocks(size, count)
    out = [np.empty(size, dtype=np.uint8) for _ in range(count)]
    plain = root / "plain"
    for i in range(256):
        (plain / f"{i:02x}").mkdir(parents=True, exist_ok=True)
    pool = ThreadPoolExecutor(WORKERS)
    loop = asyncio.get_running_loop()

    def path(i: int) -> Path:
        return plain / f"{i % 256:02x}" / f"{i}.bin"

    def write(i: int) -> None:
        temp = path(i).with_suffix(".tmp")
        with open(temp, "wb") as file:
            file.write(buffers[i].data)
        os.replace(temp, path(i))

    def read(i: int) -> None:
        with open(path(i), "rb") as file:
            out[i][:] = np.frombuffer(file.read(), dtype=np.uint8)

    try:
        plain_put = await timed(
            lambda: asyncio.gather(*(loop.run_in_executor(pool, write, i) for i in range(count)))
        )
        plain_get = await timed(
            lambda: asyncio.gather(*(loop.run_in_executor(pool, read, i) for i in range(count)))
        )
    finally:
        pool.shutdown()
    return plain_put, plain_get


def one_repeat(
    tier: str, size: int, count: int, modes: list[str]
) -> dict[str, tuple[Timing, Timing]]:
    """Seconds of (put, get) for "plain" and each mode, one after the other."""
    url = os.environ.get("KVTIER_REDIS_URL", "redis://127.0.0.1:6390/0")
    password = os.environ.get("KVTIER_REDIS_PASSWORD")
    times: dict[str, tuple[Timing, Timing]] = {}
    for mode in ["plain", *modes]:
        if tier == "redis":
            if mode == "plain":
                times[mode] = asyncio.run(redis_plain(size, count, url, password))
            else:
                times[mode] = asyncio.run(redis_kvtier(size, count, url, password, mode))
            continue
        root = Path(tempfile.mkdtemp(prefix="kvtier-bench-fs-"))
        try:
            if mode == "plain":
                times[mode] = asyncio.run(fs_plain(size, count, root))
            else:
                times[mode] = asyncio.run(fs_kvtier(size, count, root, mode))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return times


def share(gbps: dict[str, list[float]], mode: str, of: str, i: int) -> str:
    """`mode`'s figure `i` as a share of mode `of`'s ("" for `of` itself or when absent)."""
    if of not in gbps or mode == of:
        return ""
    return f"{gbps[mode][i] / gbps[of][i]:.0%}"


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m kvtier_tools.bench.remote_tiers [--sizes ...] [--tiers ...] [--modes ...]`"""
    parser = argparse.ArgumentParser(
        prog="python -m kvtier_tools.bench.remote_tiers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sizes", nargs="+", default=["64KiB", "256KiB", "2MiB"])
    parser.add_argument("--total", default="128MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiers", nargs="+", default=["redis", "shared-fs"])
    parser.add_argument(
        "--modes",
        nargs="+",
        default=list(MODES),
        choices=MODES,
        help="kvtier's value modes: off (unkeyed checksum), mac, encrypt",
    )
    args = parser.parse_args(argv)
    total = parse_size(args.total)
    print(
        f"{'tier':<10}{'block':>8}  {'values':<9}{'put':>7}{'of plain':>9}{'of off':>8}"
        f"{'cpu us':>8}{'get':>8}{'of plain':>9}{'of off':>8}{'cpu us':>8}"
    )
    for text in args.sizes:
        size = parse_size(text)
        count = max(1, total // size)
        for tier in args.tiers:
            runs = [one_repeat(tier, size, count, args.modes) for _ in range(args.repeats)]
            gbps = {
                mode: [
                    total / statistics.median(run[mode][i].wall_s for run in runs) / 1e9
                    for i in range(2)
                ]
                for mode in runs[0]
            }
            cpu_us = {
                mode: [
                    statistics.median(run[mode][i].cpu_s for run in runs) / count * 1e6
                    for i in range(2)
                ]
                for mode in runs[0]
            }
            for mode, (put, get) in gbps.items():
                print(
                    f"{tier:<10}{text:>8}  {mode:<9}{put:>7.2f}"
                    f"{share(gbps, mode, 'plain', 0):>9}{share(gbps, mode, 'off', 0):>8}"
                    f"{cpu_us[mode][0]:>8.0f}{get:>8.2f}{share(gbps, mode, 'plain', 1):>9}"
                    f"{share(gbps, mode, 'off', 1):>8}{cpu_us[mode][1]:>8.0f}"
                )
    print(
        f"GB/s: medians of {args.repeats}; cpu us: this process's CPU time per block (all "
        "threads; Redis's own excluded), median"
    )


if __name__ == "__main__":
    main()
