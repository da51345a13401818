"""Cache-policy bookkeeping speed: kvtier's LRU / ARC / S3-FIFO / lct / auto against vLLM
0.33.0's own `LRUCachePolicy` / `ARCCachePolicy`, driven the same way, in block accesses per
second.

    VLLM_TARGET_DEVICE=cpu .venv/bin/python -m kvtier_tools.bench.policy_speed \
        [--repeats 5] [--limit N]

Workload: the shipped Mooncake trace (`kvtier_tools.workloads.traces.read_mooncake()`); each
request's `hash_ids` (a prompt prefix of block keys, duplicates within a request dropped) is
one request; capacities are 1 % and 10 % of the distinct blocks. `--trace zipf`: 200,000
one-key requests of a Zipf(0.8) mix over 80,000 keys instead (every call is one access).

Two drivers, identical for both sides, one request at a time (and a third, kvtier's alone):
  - `loop` (the plain access loop, as `kvtier.policies.simulate` drives a policy): hits
    (`get(key) is not None`) are touched with one `touch(hits)` call; the misses are announced
    with one `on_store_miss(misses)` call, then admitted (kvtier's `lct`: `admit`), then
    `evict(n, protected=request keys)` makes the room needed and each admitted key is inserted
    with a fresh ready block (`ref_cnt = 0`; kvtier `BlockStatus`, vLLM `ChunkStatus`; slots of
    evicted blocks are reused). vLLM's calls take one `ReqContext` (no key positions).
  - `manager`: kvtier's `make_tier_manager(capacity, 16, "cpu", policy)` against vLLM's
    `CPUOffloadingManager(capacity, policy)` (the real class, events off on both): `lookup` per
    key; the hits go through `prepare_load`, `touch`, `complete_load`; the misses through
    `prepare_store` and `complete_store` of the keys it chose. vLLM gets a fresh `ReqContext`
    per request (its per-request access tracking runs as in the engine);
    `on_request_finished` is not called (its recency update would repeat `touch`).
  - `shadow` (`--drivers shadow`, kvtier only): one `policy.access(keys, block)` per
    request with one shared ready block, as `auto` drives each of its shadows: what a
    full-size shadow of that policy adds to `auto`'s cost per access.

Floor (on by default, `--no-floor` skips it): for `lru` and `arc`, the kvtier drivers once
more with `FloorPolicy`, which replays the evictions the real policy chose in that driver
(recorded in an untimed run) at the least cost a policy can have: the resident blocks in
one dict (C-level `get` and `insert`), a no-op `touch`, `evict` popping the recorded
victims. Same calls, same hits, no bookkeeping: what is left is the driver's own per-key
work (list comprehensions, a block object and an `insert` call per stored key, the
manager's `lookup` per key, slot allocation, specs), shared by both sides in the loop. No
implementation of the policy, compiled or not, can beat it, so it says how much a faster
core could still win and whether 2x vLLM is reachable at all.

kvtier's side runs the compiled bookkeeping core when `scripts/build-core` built it (the
first line says which; `KVTIER_PURE_PYTHON=1` times the pure-Python one); the drivers are
plain Python for both sides.

Figures: accesses (block keys of the requests) per second, median over `--repeats` timed
replays after one untimed warm-up, kvtier's and vLLM's replays taking turns (the order
rotating every repeat), each replay on a fresh policy or manager,
`time.perf_counter` (`--cpu-time`: `time.process_time`, the process's CPU time, steadier
where other processes load the machine), garbage collector disabled while timing. Sanity:
both LRUs must make the same decisions (equal hit counts), else the script exits 1.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import ClassVar

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from kvtier.blocks import BlockStatus
from kvtier.compiled import core_status
from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager import TierManager
from kvtier.manager.backend import SlotPoolBackend
from kvtier.policies import CachePolicy, get_policy_class
from kvtier_tools.bench.policy_traces import zipf
from kvtier_tools.workloads.traces import read_mooncake

Requests = list[list[OffloadKey]]  # each request's keys, head first
ZIPF_ACCESSES = 200_000
ZIPF_KEYS = 80_000
"""`--trace zipf`: this many one-key requests drawn from this many keys, Zipf(0.8)."""


class FloorPolicy(CachePolicy):
    """Replays recorded evictions with no bookkeeping: the drivers' cost floor."""

    name: ClassVar[str] = "floor"

    def __init__(self, cache_capacity: int, victims: list[list[OffloadKey] | None]) -> None:
        super().__init__(cache_capacity)
        self._blocks: dict[OffloadKey, BlockStatus] = {}
        self._victims = iter(victims)
        self.get = self._blocks.get  # type: ignore[method-assign,assignment]
        self.insert = self._blocks.__setitem__  # type: ignore[method-assign,assignment]

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._blocks.get

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._blocks[key] = block

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        self._blocks.update(zip(keys, blocks, strict=True))

    def remove(self, key: OffloadKey) -> None:
        del self._blocks[key]

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        return

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        keys = next(self._victims)
        if keys is None:  # the real policy found too few evictable blocks here
            return None
        return list(zip(keys, map(self._blocks.pop, keys), strict=True))

    def clear(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(list(self._blocks.items()))


def make_policy(
    name: str,
    capacity: int,
    victims: list[list[OffloadKey] | None] | None = None,
    record: list[list[OffloadKey] | None] | None = None,
) -> CachePolicy:
    """The named policy; with `victims`, a FloorPolicy replaying them instead; with `record`,
    the policy appends the keys of each eviction to it (None for one that found too few)."""
    if victims is not None:
        return FloorPolicy(capacity, victims)
    policy = get_policy_class(name)(capacity)
    if record is not None:
        evict = policy.evict

        def recording_evict(
            n: int, protected: Collection[OffloadKey] = ()
        ) -> list[tuple[OffloadKey, BlockStatus]] | None:
            evicted = evict(n, protected)
            record.append(None if evicted is None else [key for key, _ in evicted])
            return evicted

        policy.evict = recording_evict  # type: ignore[method-assign]
    return policy


def load_requests(limit: int | None, trace: str = "mooncake") -> tuple[Requests, int]:
    """The requests (each its keys, head first) and how many distinct keys they have."""
    if trace == "zipf":  # one key per request: the cost of a call per access shows
        draws = zipf(ZIPF_ACCESSES, ZIPF_KEYS)[:limit]
        return [[key_from_int(h)] for h in draws], len(set(draws))
    requests: Requests = []
    for i, req in enumerate(read_mooncake()):
        if limit is not None and i >= limit:
            break
        requests.append([key_from_int(h) for h in dict.fromkeys(req.hash_ids)])
    distinct = len({k for keys in requests for k in keys})
    return requests, distinct


# -- driver (a): the plain access loop ------------------------------------------------------


def loop_kvtier(
    name: str,
    capacity: int,
    requests: Requests,
    victims: list[list[OffloadKey] | None] | None = None,
    record: list[list[OffloadKey] | None] | None = None,
) -> int:
    policy = make_policy(name, capacity, victims, record)
    get, touch, announce = policy.get, policy.touch, policy.on_store_miss
    evict, insert, admit = policy.evict, policy.insert, policy.admit
    admits_all = policy.admits_all
    free: list[int] = []
    next_slot = 0
    resident = 0
    hits_total = 0
    for keys in requests:
        hits = [k for k in keys if get(k) is not None]
        if hits:
            touch(hits)
            hits_total += len(hits)
        if len(hits) == len(keys):
            continue
        misses = [k for k in keys if get(k) is None]
        announce(misses)
        if not admits_all:
            misses = [k for k, ok in zip(misses, admit(misses), strict=True) if ok]
        n = resident + len(misses) - capacity
        if n > 0:
            evicted = evict(n, set(keys))
            if evicted is None:
                continue
            resident -= n
            free.extend(block.block_id for _, block in evicted)
        for k in misses:
            if free:
                block = BlockStatus(free.pop())
            else:
                block = BlockStatus(next_slot)
                next_slot += 1
            block.ref_cnt = 0
            insert(k, block)
        resident += len(misses)
    return hits_total


def shadow_kvtier(name: str, capacity: int, requests: Requests) -> int:
    """Driver `shadow`: what `auto` does with each of its shadows, one
    `CachePolicy.access(keys, block)` per request, every key stored with one shared ready
    block (metadata only)."""
    policy = make_policy(name, capacity, None, None)
    access = policy.access
    block = BlockStatus(0)
    block.ref_cnt = 0
    hits_total = 0
    for keys in requests:
        hits_total += access(keys, block)
    return hits_total


def loop_vllm(name: str, capacity: int, requests: Requests) -> int:
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    policy = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}[name](capacity)
    ctx = ReqContext(req_id="bench")
    get, touch, announce = policy.get, policy.touch, policy.on_store_miss
    evict, insert = policy.evict, policy.insert
    free: list[int] = []
    next_slot = 0
    resident = 0
    hits_total = 0
    for keys in requests:
        hits = [k for k in keys if get(k) is not None]
        if hits:
            touch(hits, ctx)
            hits_total += len(hits)
        if len(hits) == len(keys):
            continue
        misses = [k for k in keys if get(k) is None]
        announce(misses, ctx)
        n = resident + len(misses) - capacity
        if n > 0:
            evicted = evict(n, set(keys))
            if evicted is None:
                continue
            resident -= n
            free.extend(chunk.chunk_id for _, chunk in evicted)
        for k in misses:
            if free:
                chunk = ChunkStatus(free.pop())
            else:
                chunk = ChunkStatus(next_slot)
                next_slot += 1
            chunk.ref_cnt = 0
            insert(k, chunk, ctx)
        resident += len(misses)
    return hits_total


# -- driver (b): through the tier manager ---------------------------------------------------


def manager_kvtier(
    name: str,
    capacity: int,
    requests: Requests,
    victims: list[list[OffloadKey] | None] | None = None,
    record: list[list[OffloadKey] | None] | None = None,
) -> int:
    # make_tier_manager(capacity, 16, "cpu", name) with admission "all", built here so that
    # the policy can be a FloorPolicy or a recording one
    policy = make_policy(name, capacity, victims, record)
    mgr = TierManager(SlotPoolBackend(capacity, 16, "cpu"), policy, enable_events=False)
    lookup = mgr.lookup
    hits_total = 0
    for keys in requests:
        hits: list[OffloadKey] = []
        misses: list[OffloadKey] = []
        for k in keys:
            (hits if lookup(k) is True else misses).append(k)
        if hits:
            mgr.prepare_load(hits)
            mgr.touch(hits)
            mgr.complete_load(hits)
            hits_total += len(hits)
        if misses:
            out = mgr.prepare_store(misses)
            if out is not None and out.keys_to_store:
                mgr.complete_store(out.keys_to_store)
    return hits_total


def manager_vllm(name: str, capacity: int, requests: Requests) -> int:
    from vllm.v1.kv_offload.base import LookupResult, ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    mgr = CPUOffloadingManager(capacity, name, enable_events=False)
    lookup = mgr.lookup
    hit = LookupResult.HIT
    hits_total = 0
    for i, keys in enumerate(requests):
        ctx = ReqContext(req_id=str(i))
        hits: list[OffloadKey] = []
        misses: list[OffloadKey] = []
        for k in keys:
            (hits if lookup(k, ctx) is hit else misses).append(k)
        if hits:
            mgr.prepare_load(hits, ctx)
            mgr.touch(hits, ctx)
            mgr.complete_load(hits, ctx)
            hits_total += len(hits)
        if misses:
            out = mgr.prepare_store(misses, ctx)
            if out is not None and out.keys_to_store:
                mgr.complete_store(out.keys_to_store, ctx)
    return hits_total


# -- timing ---------------------------------------------------------------------------------


Driver = Callable[[str, int, Requests], int]


CLOCK: Callable[[], float] = time.perf_counter
"""The clock of `timed`: wall time, or this process's CPU time with `--cpu-time`."""


def timed(
    fns: Sequence[Driver], name: str, capacity: int, requests: Requests, repeats: int
) -> list[tuple[float, int]]:
    """For each driver: the median seconds of `repeats` replays after one warm-up, and its
    hit count. The drivers take turns, each repeat in a rotated order, so that the drift of
    a shared machine falls on all of them alike."""
    clock = CLOCK
    hits = [fn(name, capacity, requests) for fn in fns]  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        for i in [(r + j) % len(fns) for j in range(len(fns))]:
            gc.collect()
            gc.disable()
            try:
                t0 = clock()
                h = fns[i](name, capacity, requests)
                times[i].append(clock() - t0)
            finally:
                gc.enable()
            if h != hits[i]:
                raise RuntimeError(f"{fns[i].__name__} {name}: hits {h} != {hits[i]} before")
    return [(statistics.median(t), h) for t, h in zip(times, hits, strict=True)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--limit", type=int, default=None, help="first N requests (default all)")
    ap.add_argument(
        "--trace",
        choices=["mooncake", "zipf"],
        default="mooncake",
        help="the shipped trace (default), or 200,000 one-key requests of a Zipf(0.8) mix "
        "over 80,000 keys (kvtier_tools.bench.policy_traces.zipf)",
    )
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.01, 0.10])
    ap.add_argument("--policies", nargs="+", default=["lru", "arc", "s3fifo", "lct", "auto"])
    ap.add_argument(
        "--drivers",
        nargs="+",
        choices=["loop", "manager", "shadow"],
        default=["loop", "manager"],
        help="shadow: a shadow's one `access(keys, block)` call per request, as `auto` "
        "drives it (kvtier only)",
    )
    ap.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the FloorPolicy rows (the drivers' cost with a do-nothing FIFO)",
    )
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by this process's CPU time (time.process_time), not wall time: steadier "
        "on a machine other processes load",
    )
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter

    requests, distinct = load_requests(args.limit, args.trace)
    accesses = sum(map(len, requests))
    print(
        f"{len(requests)} requests, {accesses} block accesses, {distinct} distinct blocks; "
        f"median of {args.repeats} after 1 warm-up"
        f"{' (CPU time)' if args.cpu_time else ''}; kvtier's bookkeeping: {core_status()}"
    )
    drivers: dict[str, tuple[Callable[..., int], Driver | None]] = {
        "loop": (loop_kvtier, loop_vllm),
        "manager": (manager_kvtier, manager_vllm),
        "shadow": (shadow_kvtier, None),
    }
    header = (
        f"{'driver':8} {'policy':10} {'capacity':>13} {'kvtier acc/s':>13} "
        f"{'vLLM acc/s':>12} {'kvtier/vLLM':>11} {'hits kvtier':>11} {'hits vLLM':>10}"
    )
    print(header)
    print("-" * len(header))
    ok = True
    for driver in args.drivers:
        kv_fn, vl_fn = drivers[driver]
        for frac in args.fractions:
            capacity = max(1, int(frac * distinct))
            for name in args.policies:
                if name in ("lru", "arc") and vl_fn is not None:
                    (kt, kh), (vt, vh) = timed(
                        [kv_fn, vl_fn], name, capacity, requests, args.repeats
                    )
                    v_rate, ratio, v_hits = accesses / vt, f"{vt / kt:10.2f}x", str(vh)
                    vs = f"{v_rate:12,.0f}"
                else:
                    ((kt, kh),) = timed([kv_fn], name, capacity, requests, args.repeats)
                    vs, ratio, v_hits = f"{'-':>12}", f"{'-':>11}", "-"
                print(
                    f"{driver:8} {name:10} {capacity:>7} ({frac:4.0%}) {accesses / kt:13,.0f} "
                    f"{vs} {ratio} {kh:11} {v_hits:>10}",
                    flush=True,
                )
                if args.floor and name in ("lru", "arc") and vl_fn is not None:
                    recorded: list[list[OffloadKey] | None] = []
                    kv_fn(name, capacity, requests, record=recorded)
                    floor_fn = functools.partial(kv_fn, victims=recorded)
                    floor_fn.__name__ = f"{kv_fn.__name__} floor"  # type: ignore[attr-defined]
                    ((ft, fh),) = timed([floor_fn], name, capacity, requests, args.repeats)
                    label = f"{name} floor"
                    print(
                        f"{driver:8} {label:10} {capacity:>7} ({frac:4.0%}) {accesses / ft:13,.0f} "
                        f"{'-':>12} {'-':>11} {fh:11} {'-':>10}",
                        flush=True,
                    )
                    if fh != kh:
                        print(
                            f"ERROR: {driver} {name} floor: hits {fh} != {kh}, replay out of step",
                            file=sys.stderr,
                        )
                        ok = False
                if name == "lru" and vl_fn is not None and kh != vh:
                    print(
                        f"ERROR: {driver} lru hit counts differ: kvtier {kh}, vLLM {vh}",
                        file=sys.stderr,
                    )
                    ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
