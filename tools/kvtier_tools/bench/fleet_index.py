"""The fleet's prefix index (`kvtier.fleet.index`): its memory per entry, how fast it applies
the nodes' events, how long a score takes.

- memory: `--entries` keys stored on one node, in 512-key batches; the bytes tracemalloc
  sees allocated (the decoded keys included: the index keeps them) per entry, beside the
  index's own `memory_bytes` estimate;
- apply: the same batches as payloads (`apply_payload`: msgpack decoding included), and
  decoded (`apply`) as moves: a store on CPU, a store on DISK, the removal from CPU;
- score: `--nodes` nodes each holding a prefix of a 64-key request (node i the first
  64 * (i + 1) / nodes keys), the request scored against all of them.

Times are process time (the CPU this process spent, less disturbed by other processes than
wall time on a shared machine), the median of `--repeats`. Nothing here asserts a speed.

    python -m kvtier_tools.bench.fleet_index [--entries N] [--key-bytes B] [--nodes K] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

from kvtier.fleet.events import BlockRemoved, BlockStored, KVEventBatch, block_stored, encode_batch
from kvtier.fleet.index import SEQ_BITS, PrefixIndex

BATCH_KEYS = 512
"""Keys per batch (the publisher's MAX_BATCH_EVENTS is per event; a put's keys are one)."""
REQUEST_KEYS = 64
INCARNATION = 7


def _key(i: int, size: int) -> bytes:
    return i.to_bytes(size, "big")


def _stored(keys: list[bytes], medium: str) -> BlockStored:
    return block_stored(keys, medium, block_size=16, ownership=medium.lower())


def _median(runs: int, once: Callable[[], float]) -> float:
    return statistics.median(once() for _ in range(runs))


def measure(entries: int, key_bytes: int, nodes: int, repeats: int) -> dict[str, Any]:
    """The figures, as a dict (the `--json` output)."""
    keys = [_key(i, key_bytes) for i in range(entries)]
    chunks = [keys[i : i + BATCH_KEYS] for i in range(0, entries, BATCH_KEYS)]
    payloads = [encode_batch(KVEventBatch(ts=0.0, events=[_stored(c, "CPU")])) for c in chunks]
    del keys, chunks

    def fill(index: PrefixIndex) -> None:
        for n, payload in enumerate(payloads):
            index.apply_payload("node", INCARNATION << SEQ_BITS | n, payload)

    tracemalloc.start()
    index = PrefixIndex()
    before = tracemalloc.get_traced_memory()[0]
    fill(index)
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    estimate = index.stats().memory_bytes
    del index

    def payload_rate() -> float:
        index = PrefixIndex()
        start = time.process_time()
        fill(index)
        return entries / max(time.process_time() - start, 1e-9)

    moves = _moves(entries, key_bytes)

    def move_rate() -> float:
        index = PrefixIndex()
        start = time.process_time()
        for n, batch in enumerate(moves):
            index.apply("node", INCARNATION << SEQ_BITS | n, batch)
        return 3 * entries / max(time.process_time() - start, 1e-9)

    return {
        "entries": entries,
        "key_bytes": key_bytes,
        "traced_bytes_per_entry": round(traced / entries, 1),
        "estimated_bytes_per_entry": round(estimate / entries, 1),
        "apply_payload_key_events_per_s": round(_median(repeats, payload_rate)),
        "apply_moves_key_events_per_s": round(_median(repeats, move_rate)),
        "nodes": nodes,
        "score_us": round(_score_us(nodes, key_bytes, repeats), 1),
    }


def _moves(entries: int, key_bytes: int) -> list[KVEventBatch]:
    batches = []
    for first in range(0, entries, BATCH_KEYS):
        chunk = [_key(i, key_bytes) for i in range(first, min(first + BATCH_KEYS, entries))]
        batches.append(KVEventBatch(ts=0.0, events=[_stored(chunk, "CPU")]))
        batches.append(KVEventBatch(ts=0.0, events=[_stored(chunk, "DISK")]))
        batches.append(KVEventBatch(ts=0.0, events=[BlockRemoved(list(chunk), "CPU")]))
    return batches


def _score_us(nodes: int, key_bytes: int, repeats: int) -> float:
    request = [_key(i, key_bytes) for i in range(REQUEST_KEYS)]
    index = PrefixIndex()
    for node in range(nodes):
        held = request[: REQUEST_KEYS * (node + 1) // nodes]
        batch = KVEventBatch(ts=0.0, events=[_stored(held, "GPU" if node % 2 else "CPU")])
        index.apply(f"node-{node}", INCARNATION << SEQ_BITS, batch)
    calls = 2000

    def once() -> float:
        start = time.process_time()
        for _ in range(calls):
            index.score(request)
        return (time.process_time() - start) / calls * 1e6

    return _median(repeats, once)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtier_tools.bench.fleet_index")
    parser.add_argument("--entries", type=int, default=1_000_000, help="keys stored (1M)")
    parser.add_argument("--key-bytes", type=int, default=36, help="bytes per key (36)")
    parser.add_argument("--nodes", type=int, default=8, help="nodes a score ranks (8)")
    parser.add_argument("--repeats", type=int, default=3, help="runs, the median kept (3)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    for name in ("entries", "key_bytes", "nodes", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.key_bytes > 255:
        parser.error("--key-bytes must be <= 255 (kvtier's longest key)")
    figures = measure(args.entries, args.key_bytes, args.nodes, args.repeats)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"fleet index, {args.entries:,} entries of {args.key_bytes}-byte keys")
    print(
        f"  memory: {figures['traced_bytes_per_entry']} B/entry traced, "
        f"{figures['estimated_bytes_per_entry']} B/entry estimated (memory_bytes)"
    )
    print(f"  apply_payload: {figures['apply_payload_key_events_per_s']:,} key-events/s")
    print(f"  apply (moves): {figures['apply_moves_key_events_per_s']:,} key-events/s")
    print(f"  score: {figures['score_us']} us over {args.nodes} nodes, {REQUEST_KEYS} keys")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
