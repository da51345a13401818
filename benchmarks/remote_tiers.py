"""kvtier's shared tiers against the plain client moving the same bytes, in the same run.

- redis: `RedisStorage.write` / `read` (values with the verifying header, checksummed on both
  sides) against redis-py pipelines of plain SET / MGET of the same blocks, with the same
  batch size and the same number of round trips in flight.
- shared-fs: `SharedFSStorage.write` / `read` (header, checksum, temp file + rename) against
  plain write-to-temp + rename / read of the same files on the same thread-pool size.

Prints GB/s (medians of --repeats) and kvtier's share of the plain figure. Needs a Redis:
`scripts/redis.sh start && eval "$(scripts/redis.sh env)"`.

    .venv/bin/python benchmarks/remote_tiers.py
    .venv/bin/python benchmarks/remote_tiers.py --sizes 256KiB --total 64MiB --tiers redis
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis

from kvtier.config import parse_size
from kvtier.keys import key_from_int
from kvtier.tiers.remote.redis import INLINE_CPU_BYTES, RedisStorage
from kvtier.tiers.remote.sharedfs import SharedFSStorage

BATCH = 32
IN_FLIGHT = 8
WORKERS = 8


async def timed(work: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await work()
    return time.perf_counter() - started


async def in_batches(
    count: int, size: int, run: Callable[[range], Awaitable[object]]
) -> None:
    """Plain batches sized as the tier sizes its own (at most BATCH keys and about
    INLINE_CPU_BYTES), IN_FLIGHT at a time: the same round trips for both sides."""
    slots = asyncio.Semaphore(IN_FLIGHT)
    step = max(1, min(BATCH, INLINE_CPU_BYTES // size))

    async def one(batch: range) -> None:
        async with slots:
            await run(batch)

    await asyncio.gather(*(one(range(i, min(count, i + step))) for i in range(0, count, step)))


async def redis_pair(size: int, count: int, url: str, password: str | None) -> tuple[float, ...]:
    blocks = [np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8) for i in range(8)]
    keys = [key_from_int(i) for i in range(count)]
    client = aioredis.Redis.from_url(url, password=password, max_connections=64)
    storage = RedisStorage(
        aioredis.Redis.from_url(url, password=password, max_connections=64),
        block_size=size, num_blocks=count, namespace=f"bench/{size}", prefix=b"bench:k:",
        timeout_s=30.0, max_in_flight=IN_FLIGHT, batch_keys=BATCH,
    )
    try:
        await client.flushall()
        buffers = [blocks[i % 8] for i in range(count)]
        out = [np.empty(size, dtype=np.uint8) for _ in range(count)]
        warm = min(count, BATCH * IN_FLIGHT)  # both clients' connections opened first
        await storage.write(keys[:warm], [0] * warm, buffers[:warm])
        await asyncio.gather(*(client.ping() for _ in range(IN_FLIGHT)))
        kv_put = await timed(lambda: storage.write(keys, [0] * count, buffers))
        kv_get = await timed(lambda: storage.read(keys, [0] * count, out))
        assert all(np.array_equal(out[i], buffers[i]) for i in range(0, count, 97))
        await client.flushall()

        async def plain_set(batch: range) -> None:
            pipe = client.pipeline(transaction=False)
            for i in batch:
                pipe.set(b"bench:p:" + keys[i], buffers[i].data)
            await pipe.execute()

        async def plain_get(batch: range) -> None:
            values = await client.mget([b"bench:p:" + keys[i] for i in batch])
            for i, value in zip(batch, values, strict=True):
                out[i][:] = np.frombuffer(value, dtype=np.uint8)

        plain_put = await timed(lambda: in_batches(count, size, plain_set))
        plain_get_s = await timed(lambda: in_batches(count, size, plain_get))
        await client.flushall()
        return kv_put, kv_get, plain_put, plain_get_s
    finally:
        await storage.aclose()
        await client.aclose()


async def fs_pair(size: int, count: int, root: Path) -> tuple[float, ...]:
    blocks = [np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8) for i in range(8)]
    keys = [key_from_int(i) for i in range(count)]
    buffers = [blocks[i % 8] for i in range(count)]
    out = [np.empty(size, dtype=np.uint8) for _ in range(count)]
    storage = SharedFSStorage(
        root / "kvtier", block_size=size, num_blocks=count, namespace=f"bench/{size}",
        max_size=1 << 40, max_workers=WORKERS, sweep_interval_s=None,
    )
    try:
        kv_put = await timed(lambda: storage.write(keys, [0] * count, buffers))
        kv_get = await timed(lambda: storage.read(keys, [0] * count, out))
        assert all(np.array_equal(out[i], buffers[i]) for i in range(0, count, 97))
    finally:
        await storage.aclose()
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
    return kv_put, kv_get, plain_put, plain_get


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["64KiB", "256KiB", "2MiB"])
    parser.add_argument("--total", default="128MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiers", nargs="+", default=["redis", "shared-fs"])
    args = parser.parse_args()
    url = os.environ.get("KVTIER_REDIS_URL", "redis://127.0.0.1:6390/0")
    password = os.environ.get("KVTIER_REDIS_PASSWORD")
    total = parse_size(args.total)
    print(f"{'tier':<10}{'block':>8}{'kvtier put':>12}{'plain put':>11}{'share':>7}"
          f"{'kvtier get':>12}{'plain get':>11}{'share':>7}   GB/s, median of {args.repeats}")
    for text in args.sizes:
        size = parse_size(text)
        count = max(1, total // size)
        for tier in args.tiers:
            runs = []
            for _ in range(args.repeats):
                if tier == "redis":
                    runs.append(asyncio.run(redis_pair(size, count, url, password)))
                else:
                    root = Path(tempfile.mkdtemp(prefix="kvtier-bench-fs-"))
                    try:
                        runs.append(asyncio.run(fs_pair(size, count, root)))
                    finally:
                        shutil.rmtree(root, ignore_errors=True)
            gbps = [total / statistics.median(run[i] for run in runs) / 1e9 for i in range(4)]
            print(
                f"{tier:<10}{text:>8}{gbps[0]:>12.2f}{gbps[2]:>11.2f}{gbps[0] / gbps[2]:>7.0%}"
                f"{gbps[1]:>12.2f}{gbps[3]:>11.2f}{gbps[1] / gbps[3]:>7.0%}"
            )


if __name__ == "__main__":
    main()
