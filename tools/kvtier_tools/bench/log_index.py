"""What the log store's index costs per record applied (`LogIndex.apply`, the write lane's
last step of every group), without any I/O.

    PYTHONPATH=tools python -m kvtier_tools.bench.log_index --blocks 1000000 --batch 256

Builds an index of `--blocks` slots, half of them held as a restart leaves them (their keys
found through the checkpoint's sorted hashes), then applies `--batches` groups of `--batch`
records, as many of each kind: a new key into a free or held slot, a key held since the open
written again into another slot (it leaves its old one), a key written since the open
written again into its own slot, and a forget of a held block. Prints the median over
`--repeats` runs (a fresh index each) of the time per record applied; a figure to compare
between versions of the code run side by side, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvtier.keys import OffloadKey, key_from_int
from kvtier.tiers.disk.log_format import TOMBSTONE
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex, Placed, sorted_hashes

REGIONS = 1024


def restarted_index(blocks: int) -> LogIndex:
    """An index of `blocks` slots whose even slots hold key i in slot i, loaded as from a
    checkpoint (sorted key hashes, nothing written since the open)."""
    index = LogIndex(blocks, REGIONS)
    held = np.arange(0, blocks, 2)
    keys = np.zeros((blocks, 16), dtype=np.uint8)
    ids = held.astype(">u8").view(np.uint8).reshape(-1, 8)
    keys[held, :8] = ids
    key_len = np.zeros(blocks, dtype=np.uint8)
    key_len[held] = 8
    region = np.full(blocks, NO_REGION, dtype=np.int32)
    region[held] = held % REGIONS
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "region": region,
        "offset": np.zeros(blocks, dtype=np.uint32),
        "length": np.full(blocks, 1024, dtype=np.uint32),
        "codec": np.zeros(blocks, dtype=np.uint8),
        "key_len": key_len,
        "seq": np.arange(blocks, dtype=np.uint64) + 1,
        "checksum": np.zeros(blocks, dtype=np.uint64),
        "keys": keys,
        "epoch": np.ones(REGIONS, dtype=np.uint64),
        "fill": np.zeros(REGIONS, dtype=np.int64),
    }
    arrays["hashes"], arrays["hashed_slots"] = sorted_hashes(
        keys, key_len, region, codec=arrays["codec"]
    )
    index.load(arrays)
    index.rebuild(hashed=True)
    return index


def batches(blocks: int, count: int, size: int, seed: int) -> list[Placed]:
    """`count` groups of `size` records of the four kinds (module docstring)."""
    rng = np.random.default_rng(seed)
    seq = blocks + 1
    fresh = blocks
    written: list[tuple[OffloadKey, int]] = []
    groups = []
    for _ in range(count):
        keys: list[OffloadKey] = []
        slots: list[int] = []
        codecs: list[int] = []
        quarter = size // 4
        for _ in range(quarter):  # a new key
            slot = int(rng.integers(blocks))
            keys.append(key_from_int(fresh))
            slots.append(slot)
            codecs.append(0)
            written.append((keys[-1], slot))
            fresh += 1
        for _ in range(quarter):  # a key held since the open, into another slot
            held = int(rng.integers(blocks // 2)) * 2
            keys.append(key_from_int(held))
            slots.append((held + 1 + 2 * int(rng.integers(blocks // 2 - 1))) % blocks)
            codecs.append(0)
        for _ in range(quarter):  # a key written since the open, into its own slot
            key, slot = written[int(rng.integers(len(written)))]
            keys.append(key)
            slots.append(slot)
            codecs.append(0)
        for _ in range(size - 3 * quarter):  # a forget of a held block
            held = int(rng.integers(blocks // 2)) * 2
            keys.append(key_from_int(held))
            slots.append(held)
            codecs.append(TOMBSTONE)
        count_here = len(keys)
        region = np.full(count_here, int(rng.integers(REGIONS)), dtype=np.int64)
        groups.append(
            Placed(
                keys=keys,
                slot=np.array(slots, dtype=np.int64),
                region=region,
                offset=np.arange(count_here, dtype=np.int64) * 1100,
                length=np.where(np.array(codecs) == TOMBSTONE, 0, 1024).astype(np.int64),
                codec=np.array(codecs, dtype=np.int64),
                seq=np.arange(seq, seq + count_here, dtype=np.uint64),
                checksum=np.zeros(count_here, dtype=np.uint64),
                moved_from=np.full(count_here, NO_REGION, dtype=np.int64),
            )
        )
        seq += count_here
    return groups


def one_run(blocks: int, count: int, size: int, seed: int) -> float:
    """Microseconds per record of applying the groups to a fresh restarted index."""
    index = restarted_index(blocks)
    groups = batches(blocks, count, size, seed)
    started = time.perf_counter()
    for placed in groups:
        index.apply(placed)
    elapsed = time.perf_counter() - started
    return elapsed / (count * size) * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    runs = [one_run(args.blocks, args.batches, args.batch, seed) for seed in range(args.repeats)]
    print(
        f"LogIndex.apply: {args.blocks:,} slots, {args.batches} groups of {args.batch}: "
        f"{statistics.median(runs):.2f} us a record (median of {len(runs)}; runs "
        + ", ".join(f"{run:.2f}" for run in runs)
        + ")"
    )


if __name__ == "__main__":
    main()
