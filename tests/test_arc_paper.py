"""Batched ARC takes exactly the paper's decisions (issue 12, item 3): `ARCCachePolicy`
driven as a tier drives it (a batch of misses announced, evicted for and inserted at once;
touches of hits; blocks pinned by readers; failed stores) against `arc_paper.PaperARC`, the
paper's Fig. 4 served one request at a time with the tier's two departures written out, on
random programs: the same victims, lists and target p after every step."""

from __future__ import annotations

import random

import pytest
from arc_paper import PaperARC

from kvtier.blocks import BlockStatus
from kvtier.keys import key_from_int
from kvtier.policies import ARCCachePolicy


def run_program(seed: int, capacity: int, universe: int, steps: int) -> str | None:
    """None when every step agreed, else what differed first."""
    rng = random.Random(seed)
    policy = ARCCachePolicy(capacity)
    paper = PaperARC(capacity)
    keys = [key_from_int(i) for i in range(universe)]
    pinned: set[bytes] = set()
    for step in range(steps):
        action = rng.random()
        if action < 0.08 and len(policy):  # a reader pins a block, or lets one go
            toggle_pin(policy, rng, pinned)
            problem = differences(policy, paper)
        elif action < 0.12 and len(policy):  # a store failed: the block is forgotten
            forget_one(policy, paper, rng, pinned)
            problem = differences(policy, paper)
        elif action < 0.75:  # a request's misses, stored as one batch
            problem = store_misses(policy, paper, rng, keys, pinned, capacity)
        else:  # hits of a request, applied tail first (so its head ends up most recent)
            problem = touch_hits(policy, paper, rng)
        if problem is not None:
            return f"step {step}: {problem}"
    return None


def toggle_pin(policy: ARCCachePolicy, rng: random.Random, pinned: set[bytes]) -> None:
    """A reader pins a resident block, or lets a pinned one go."""
    key = rng.choice([k for k, _ in policy.items()])
    block = policy.get(key)
    assert block is not None
    if key in pinned:
        block.ref_cnt = 0
        pinned.discard(key)
    else:
        block.ref_cnt = 1
        pinned.add(key)


def forget_one(
    policy: ARCCachePolicy, paper: PaperARC, rng: random.Random, pinned: set[bytes]
) -> None:
    """A store failed: both forget the block."""
    key = rng.choice([k for k, _ in policy.items()])
    policy.remove(key)
    paper.remove(key)
    pinned.discard(key)


def store_misses(
    policy: ARCCachePolicy,
    paper: PaperARC,
    rng: random.Random,
    keys: list[bytes],
    pinned: set[bytes],
    capacity: int,
) -> str | None:
    """A request's misses stored as one batch, as a tier stores them: what differed from the
    paper, or None (also when nothing was stored: no misses, or every candidate pinned)."""
    size = rng.randint(1, min(6, capacity))  # a tier stores at most its capacity
    batch = [k for k in dict.fromkeys(rng.choices(keys, k=size)) if policy.get(k) is None]
    if not batch:
        return None
    policy.on_store_miss(batch)
    n = len(policy) + len(batch) - capacity
    victims = []
    if n > 0:
        evicted = policy.evict(n, set(batch))
        if evicted is None:  # every candidate pinned: the tier refuses the store
            return None
        victims = [k for k, _ in evicted]
    if set(victims) & pinned:
        return "a pinned block was evicted"
    blocks = [BlockStatus(i) for i in range(len(batch))]
    for block in blocks:
        block.ref_cnt = 0
    policy.insert_many(batch, blocks)
    expected = [v for k in batch for v in paper.request(k, set(batch) | pinned)]
    if victims != expected:
        return f"victims {victims} != paper's {expected}"
    return differences(policy, paper)


def touch_hits(policy: ARCCachePolicy, paper: PaperARC, rng: random.Random) -> str | None:
    """A request's hits, applied tail first (so its head ends up most recent): what differed
    from the paper, or None (also when nothing is resident)."""
    resident = [k for k, _ in policy.items()]
    if not resident:
        return None
    hits = rng.sample(resident, rng.randint(1, min(4, len(resident))))
    policy.touch(hits)
    for k in reversed(hits):
        assert paper.request(k) == []
    return differences(policy, paper)


def differences(policy: ARCCachePolicy, paper: PaperARC) -> str | None:
    """How the policy's lists or target p differ from the paper's, or None."""
    if policy.lists() != paper.lists():
        return f"lists {policy.lists()} != paper's {paper.lists()}"
    if policy.target_t1_size != paper.p:
        return f"p {policy.target_t1_size} != paper's {paper.p}"
    return None


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 8])
@pytest.mark.slow
def test_batched_arc_is_the_papers_arc_on_random_programs(capacity: int) -> None:
    failures = []
    for seed in range(1500):
        problem = run_program(seed, capacity, universe=3 * capacity + 4, steps=80)
        if problem is not None:
            failures.append((seed, problem))
    assert not failures, f"{len(failures)} of 1500 programs differ; first: {failures[0]}"


def replay_both(requests: list[list[bytes]], capacity: int) -> None:
    """A tier over ARCCachePolicy driven as the bookkeeping benchmark drives it, and the
    paper's ARC served the same requests one at a time: the same evictions at every request,
    the same lists and p at the end."""
    from kvtier.manager import SlotPoolBackend
    from kvtier.manager.tier import TierManager
    from kvtier.specs import Medium

    policy = ARCCachePolicy(capacity)
    tier = TierManager(SlotPoolBackend(capacity, 16, Medium.CPU), policy)
    paper = PaperARC(capacity)
    for number, request in enumerate(requests):
        hits = 0
        while hits < len(request) and tier.lookup(request[hits]) is True:
            hits += 1
        if hits:
            prefix = list(request[:hits])
            tier.prepare_load(prefix)
            tier.touch(prefix)
            tier.complete_load(prefix)
            for key in reversed(prefix):
                assert paper.request(key) == []
        misses = list(request[hits:])
        if misses:
            out = tier.prepare_store(misses)
            assert out is not None
            tier.complete_store(out.keys_to_store)
            expected = [v for k in misses for v in paper.request(k, set(misses))]
            assert list(out.evicted_keys) == expected, number
    assert policy.lists() == paper.lists()
    assert policy.target_t1_size == paper.p


@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.5])
def test_a_tier_replaying_the_trace_decides_as_the_paper(fraction: float) -> None:
    from kvtier_tools.bench.bookkeeping import capacity_for, keys_for, load_requests

    requests = [list(r) for r in keys_for(load_requests(1500))]
    unique = len({key for request in requests for key in request})
    capacity = capacity_for(fraction, unique)
    requests = [r[:capacity] for r in requests]  # a tier stores at most its capacity at once
    replay_both(requests, capacity)
