"""Whether a block's place in its request tells which blocks pay for their room where lct
refuses them: the shipped conversation trace at 1 % (issue 34 item 3; docs/BENCHMARKS.md,
"lct, sixth round").

    PYTHONPATH=tools .venv/bin/python -m kvtier_tools.bench.policy_request_features
    PYTHONPATH=tools .venv/bin/python -m kvtier_tools.bench.policy_request_features \
        --fraction 0.05 --trace other.jsonl

lct classes a block by its own accesses within the horizon (class 1: its first, 2: its
second, ...) and at 1 % refuses class 1 at almost every solve. A serving engine gives kvtier
more than a key's history: a request's keys together, in prefix order. This measures, on the
trace (no policy involved), each class's reuse split by what is known of the request when it
arrives: the block's depth in it, its length, the share of its blocks seen before (within
lct's memory), the block's place past the request's seen prefix. A group of blocks kept up to
T accesses yields, per slot, `density` = (its blocks read again within T) / (the slots they
hold: the sum of min(reuse distance, T)); times the capacity, it compares with the price per
slot of lct's solution (the slope of the allocation's marginal segment at each solve, also
printed): a group is worth storing only where its density is above that price. Then a
request-driven replay of lct reports the same split by the request's resident prefix (what
its lookup hit), and what refusing class 2 in the requests a band of seen shares marks as
weak gives. Deterministic: every figure is a count on the trace or a hit ratio.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

import kvtier.policies.lct as lct_module
from kvtier.blocks import BlockStatus
from kvtier.keys import OffloadKey
from kvtier.policies import partial_block_flags, simulate
from kvtier.policies.lct import HORIZONS, MEMORY, LCTCachePolicy
from kvtier_tools.workloads.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest, read_mooncake

SPANS = (1.0, 2.0, 4.0, 6.0, 8.0)
"""How long a group is kept in the density table, in capacities' worth of accesses."""
NEVER = -1
"""`next_uses` of an access whose key is not read again."""
Group = tuple[int, str, str]
"""(class, feature, bucket)."""


@dataclass
class Reuse:
    """A group's arrivals and, per span of `SPANS`, how many are read again within it and
    the slot-accesses they hold when kept up to it."""

    arrivals: int = 0
    reused: list[int] = field(default_factory=lambda: [0] * len(SPANS))
    held: list[float] = field(default_factory=lambda: [0.0] * len(SPANS))

    def add(self, distance: int, capacity: int) -> None:
        """One arrival whose next access is `distance` accesses later (NEVER: none)."""
        self.arrivals += 1
        for index, span in enumerate(SPANS):
            limit = span * capacity
            if distance != NEVER and distance <= limit:
                self.reused[index] += 1
                self.held[index] += distance
            else:
                self.held[index] += limit

    def density(self, index: int, capacity: int) -> float:
        """Reuses per slot-access when kept up to `SPANS[index]`, times the capacity."""
        held = self.held[index]
        return self.reused[index] / held * capacity if held else 0.0

    def best(self, capacity: int) -> int:
        """The index of the span of highest density."""
        return max(range(len(SPANS)), key=lambda i: self.density(i, capacity))


def flatten(requests: Sequence[TraceRequest]) -> tuple[list[int], list[bool]]:
    """The trace's block accesses and their partial-last-block flags (never stored)."""
    ids = [list(request.hash_ids) for request in requests]
    lengths = [request.input_length for request in requests]
    flags = partial_block_flags(ids, lengths, MOONCAKE_BLOCK_TOKENS)
    return list(itertools.chain.from_iterable(ids)), flags


def next_uses(keys: Sequence[int]) -> list[int]:
    """Per access, the index of the next access of its key (NEVER: none)."""
    following = [NEVER] * len(keys)
    last: dict[int, int] = {}
    for index in range(len(keys) - 1, -1, -1):
        following[index] = last.get(keys[index], NEVER)
        last[keys[index]] = index
    return following


def bucket(value: float, edges: Sequence[float], unit: str = "") -> str:
    """A label for the bucket of `value` among ascending `edges`."""
    low = 0.0
    for edge in edges:
        if value < edge:
            return f"{low:g}-{edge:g}{unit}"
        low = edge
    return f">={low:g}{unit}"


def request_features(hash_ids: Sequence[int], seen: Sequence[bool], index: int) -> dict[str, str]:
    """What is known of access `index` of a request when the request arrives: its depth,
    the request's length, the share of its blocks `seen` before, and the block's place past
    the request's seen prefix; and all four together."""
    length = len(hash_ids)
    prefix = next((i for i, known in enumerate(seen) if not known), length)
    share = sum(seen) / length
    features = {
        "all": "all",
        "depth": bucket(index, (8, 32, 128)),
        "length": bucket(length, (16, 64, 128)),
        "seen share": bucket(share, (0.1, 0.7, 0.9)),
        "past the seen prefix": "in it" if index < prefix else bucket(index - prefix, (1, 8, 32)),
    }
    features["combined"] = " / ".join(features[name] for name in list(features)[1:])
    return features


def trace_reuse(requests: Sequence[TraceRequest], capacity: int) -> dict[Group, Reuse]:
    """The reuse of the classes 1-3 of lct's shortest horizon by request features (see the
    module doc), partial last blocks left out; a key is seen if accessed within lct's
    memory."""
    keys, flags = flatten(requests)
    following = next_uses(keys)
    horizon, memory = int(HORIZONS[0] * capacity), int(MEMORY * capacity)
    history: dict[int, list[int]] = {}
    groups: dict[Group, Reuse] = defaultdict(Reuse)
    clock = 0
    for request in requests:
        ids = request.hash_ids
        seen = [
            key in history and clock + i - history[key][-1] <= memory for i, key in enumerate(ids)
        ]
        for i, key in enumerate(ids):
            now = clock + i
            past = history.setdefault(key, [])
            cls = 1 + sum(1 for t in past[-3:] if now - t <= horizon)
            past.append(now)
            if flags[now] or cls > 3:
                continue
            distance = NEVER if following[now] == NEVER else following[now] - now
            for name, label in request_features(ids, seen, i).items():
                groups[(cls, name, label)].add(distance, capacity)
        clock += len(ids)
    return groups


@contextmanager
def marginal_prices(prices: list[float]) -> Iterator[None]:
    """While inside, every solve of any lct appends the price per slot of its allocation
    (the slope of the first segment that does not fit; none when every one fits), patching
    lct's `_allocate` and restoring it on exit."""
    original = lct_module._allocate

    def allocate(
        curves: list[lct_module._Curve], capacity: float
    ) -> tuple[list[float], list[float], float, bool]:
        slopes = []
        for curve in curves:
            hull = lct_module._hull(curve)
            for a, b in itertools.pairwise(hull):
                slots, hits = curve[b][0] - curve[a][0], curve[b][1] - curve[a][1]
                slopes.append((hits / slots if slots > 0 else float("inf"), slots))
        used = 0.0
        for slope, slots in sorted(slopes, reverse=True):
            if used + slots > capacity:
                prices.append(slope)
                break
            used += slots
        return original(curves, capacity)

    lct_module._allocate = allocate
    try:
        yield
    finally:
        lct_module._allocate = original


@dataclass
class Replay:
    """A request-driven replay of lct: hits, and the reuse of its class-1/2 misses by the
    request's resident prefix (the blocks its lookup hit) and place past it."""

    hits: int = 0
    accesses: int = 0
    groups: dict[Group, Reuse] = field(default_factory=lambda: defaultdict(Reuse))

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0


def replay(
    requests: Sequence[TraceRequest],
    capacity: int,
    refuse: Callable[[float], bool] | None = None,
) -> Replay:
    """lct over the requests as `simulate` drives it (one access per block, head first),
    each request looked up first; a class-2 miss is refused when `refuse(seen share)` says so
    (None: never), the share being the request's blocks lct remembers before it."""
    keys, flags = flatten(requests)
    following = next_uses(keys)
    policy = LCTCachePolicy(capacity)
    result = Replay()
    for request in requests:
        ids = cast(Sequence[OffloadKey], request.hash_ids)  # keys as `simulate` gives them
        length = len(ids)
        resident = [policy.get(key) is not None for key in ids]
        prefix = next((i for i, hit in enumerate(resident) if not hit), length)
        weak = refuse is not None and refuse(sum(policy.count(k) > 0 for k in ids) / length)
        for i, key in enumerate(ids):
            now = result.accesses
            result.accesses += 1
            one = (key,)
            if policy.get(key) is not None:
                result.hits += 1
                policy.touch(one)
                continue
            if flags[now]:
                continue
            policy.on_store_miss(one)
            cls = policy.count(key)
            if cls <= 2:
                distance = NEVER if following[now] == NEVER else following[now] - now
                for name, label in (
                    ("all", "all"),
                    ("resident prefix", bucket(prefix / length, (0.01, 0.3, 0.7, 0.9))),
                    ("past it", bucket(i - prefix, (1, 4, 16, 64))),
                ):
                    result.groups[(cls, name, label)].add(distance, capacity)
            if not policy.admit(one)[0] or (weak and cls == 2):
                continue
            if len(policy) >= capacity:
                policy.evict(1)
            block = BlockStatus(0)
            block.ref_cnt = 0
            policy.insert(key, block)
    return result


def table(groups: dict[Group, Reuse], capacity: int, skip: tuple[str, ...] = ()) -> list[str]:
    """Markdown rows: per group of at least 300 arrivals, its share of its class, and its
    reuse and density at each span and at its best."""
    spans = " / ".join(f"{span:g}" for span in SPANS)
    rows = [
        f"| class | feature | bucket | arrivals | share | density at {spans} caps | "
        f"best (reused within) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (cls, name, label), reuse in sorted(groups.items()):
        if name in skip or reuse.arrivals < 300:
            continue
        share = reuse.arrivals / groups[(cls, "all", "all")].arrivals
        best = reuse.best(capacity)
        densities = " / ".join(f"{reuse.density(i, capacity):.3f}" for i in range(len(SPANS)))
        rows.append(
            f"| {cls} | {name} | {label} | {reuse.arrivals:,} | {share:.3f} | {densities} | "
            f"{reuse.density(best, capacity):.3f} at {SPANS[best]:g} "
            f"({reuse.reused[best] / reuse.arrivals:.3f}) |"
        )
    return rows


def reachable(
    groups: dict[Group, Reuse], capacity: int, price: float, accesses: int
) -> tuple[int, float, float]:
    """What storing class 1's combined groups of density at least `price` (times the
    capacity) up to their best span could bring, chosen on the trace itself (so a bound):
    their arrivals, their reuses within that span per access of the trace, and those less
    the slots they hold at the price (the net gain)."""
    arrivals = hits = 0
    held = 0.0
    for (cls, name, _), reuse in groups.items():
        best = reuse.best(capacity)
        if cls == 1 and name == "combined" and reuse.density(best, capacity) >= price:
            arrivals += reuse.arrivals
            hits += reuse.reused[best]
            held += reuse.held[best]
    return arrivals, hits / accesses, (hits - price * held / capacity) / accesses


def in_band(low: float, high: float) -> Callable[[float], bool]:
    """Whether a seen share is in [low, high)."""
    return lambda share: low <= share < high


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", help="a Mooncake trace (default: the shipped one)")
    parser.add_argument("--fraction", type=float, default=0.01, help="capacity / distinct blocks")
    args = parser.parse_args(argv)
    requests = sorted(read_mooncake(args.trace), key=lambda r: r.timestamp_ms)
    keys, flags = flatten(requests)
    capacity = max(1, int(len(set(keys)) * args.fraction))
    prices: list[float] = []
    with marginal_prices(prices):
        base = simulate("lct", capacity, keys, flags)
    late = [price * capacity for price in prices[len(prices) // 4 :]]  # after warm-up
    price = statistics.median(late) if late else 0.0
    quartiles = statistics.quantiles(late, n=4) if len(late) > 1 else [price] * 3
    print(f"{len(requests):,} requests, {len(keys):,} accesses, capacity {capacity:,}")
    print(
        f"lct: hit ratio {base.hit_ratio:.4f}; the price per slot (x capacity) of its solves "
        f"after the first quarter: median {price:.3f}, quartiles {quartiles[0]:.3f} / "
        f"{quartiles[2]:.3f}"
    )
    groups = trace_reuse(requests, capacity)
    print("\nOn the trace (class by lct's shortest horizon):\n")
    print("\n".join(table(groups, capacity, skip=("combined",))))
    arrivals, gross, net = reachable(groups, capacity, price, len(keys))
    print(
        f"\nclass 1's combined groups above the price: {arrivals:,} arrivals, at most "
        f"+{gross:.4f} hit ratio, +{net:.4f} net of their slots at the price"
    )
    run = replay(requests, capacity)
    print(f"\nIn a request-driven replay of lct (hit ratio {run.hit_ratio:.4f}):\n")
    print("\n".join(table(run.groups, capacity)))
    print("\nRefusing class 2 in requests whose seen share is in a band:\n")
    print("| band | hit ratio |\n|---|---|")
    for low, high in ((0.1, 0.7), (0.0, 0.7), (0.0, 0.9)):
        ratio = replay(requests, capacity, in_band(low, high)).hit_ratio
        print(f"| {low:g}-{high:g} | {ratio:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
