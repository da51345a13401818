"""`auto`: the conformance suite, switches that keep every resident block, determinism, and
a workload that changes regime, where `auto` must follow the candidate that wins."""

from __future__ import annotations

import functools
import itertools
import math
import random

import pytest

from kvtier.blocks import BlockStatus
from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.policies import (
    POLICIES,
    AutoCachePolicy,
    CachePolicy,
    partial_block_flags,
    simulate,
)
from kvtier.policies.auto import CANDIDATES, sample_point
from kvtier.policies.lct import LCTCachePolicy
from kvtier.testing import PolicyTests
from kvtier.testing.policy import k, ready_block
from kvtier_tools.workloads.traces import MOONCAKE_BLOCK_TOKENS, read_mooncake


class TestAuto(PolicyTests):
    policy_class = AutoCachePolicy


def _resident(policy: CachePolicy) -> dict[OffloadKey, BlockStatus]:
    return dict(policy.items())


def test_registered_with_the_other_policies() -> None:
    assert POLICIES["auto"] is AutoCachePolicy


@pytest.mark.parametrize(
    "options",
    [
        {"candidates": ()},
        {"candidates": ("lct", "lct")},
        {"candidates": ("lct", "mru")},
        {"candidates": ("auto",)},
        {"sample_rate": 0.0},
        {"decay": 1.0},
        {"epoch": 0.0},
        {"margin": -0.1},
    ],
)
def test_rejects_bad_options(options: dict[str, object]) -> None:
    with pytest.raises(InvalidValueError, match="auto"):
        AutoCachePolicy(64, **options)  # type: ignore[arg-type]


def test_shadows_are_a_sample_of_the_capacity() -> None:
    small = AutoCachePolicy(100)
    assert small.rate == 1.0 and small.shadow_capacity == 100  # below SHADOW_BLOCKS / rate
    large = AutoCachePolicy(100_000)
    assert large.shadow_capacity == 1_000 and large.rate == pytest.approx(0.01)
    middle = AutoCachePolicy(2_000)
    assert middle.shadow_capacity == 128 and middle.rate == pytest.approx(128 / 2_000)
    assert {len(large.shadow(name)) for name in large.candidates} == {0}


@pytest.mark.parametrize("target", ["arc", "lru", "lct"])
def test_a_switch_keeps_every_resident_block_and_the_rules_of_evict(target: str) -> None:
    policy = AutoCachePolicy(
        12, candidates=("lct", "arc", "lru") if target != "lct" else ("arc", "lct", "lru")
    )
    for i in range(12):
        policy.on_store_miss([k(i)])
        policy.insert(k(i), ready_block(i, ref_cnt=1 if i < 3 else (-1 if i < 5 else 0)))
    policy.touch([k(7), k(8)])
    before = _resident(policy)
    order = policy.lru_order()
    policy.serve_with(target)
    assert policy.serving == target and policy.policy.name == target
    assert _resident(policy) == before and _resident(policy.policy) == before
    assert policy.lru_order() == order
    # pinned (0-2), pending (3-4) and protected keys are never victims, before or after
    protected = {k(5), k(6)}
    evicted = policy.evict(5, protected)
    assert evicted is not None and len(evicted) == 5
    for key, block in evicted:
        assert key not in protected and block.ref_cnt == 0
        assert policy.get(key) is None and key not in policy.policy
    assert policy.evict(1, protected) is None  # 7 left: 3 pinned, 2 pending, 2 protected
    assert len(policy) == len(policy.policy) == 7


def test_an_arc_that_takes_over_keeps_the_frequent_blocks_frequent() -> None:
    policy = AutoCachePolicy(8, candidates=("lct", "arc", "lru"))
    for i in range(8):
        policy.on_store_miss([k(i)])
        policy.insert(k(i), ready_block(i))
    policy.touch([k(2), k(5)])  # accessed twice: lct counts them so
    policy.serve_with("arc")
    from kvtier.policies import ARCCachePolicy

    arc = policy.policy
    assert isinstance(arc, ARCCachePolicy)
    assert set(arc.lists()["t2"]) == {k(2), k(5)}
    assert len(arc.lists()["t1"]) == 6


def test_serve_with_an_unknown_candidate_raises() -> None:
    policy = AutoCachePolicy(8, candidates=("lct", "arc"))
    with pytest.raises(InvalidValueError):
        policy.serve_with("lru")
    policy.serve_with("lct")  # the one serving: nothing changes
    assert policy.switches == []


def test_the_sample_is_a_fixed_function_of_the_key() -> None:
    # never Python's salted hash(): these values are the same in every process
    assert sample_point(k(1)) == sample_point(k(1)) == 219_430_959
    assert sample_point(12345) == 571_572_824
    assert sample_point(12345, seed=1) != sample_point(12345)
    for points in (
        [sample_point(k(i)) for i in range(20_000)],
        [sample_point(i) for i in range(20_000)],
    ):
        assert 0.009 < sum(p < (1 << 32) // 100 for p in points) / len(points) < 0.011
    # small ints (a trace's block ids) are mixed: key 0, often the hottest block, is in a
    # 1 % sample only for about 1 seed in 100, not in every one
    assert sum(sample_point(0, seed) < (1 << 32) // 100 for seed in range(1_000)) < 30


def _regimes(seed: int = 5, phase_length: int = 40_000) -> list[int]:
    """Three phases for a cache of 2,000 blocks: a loop of 1,800 keys (recency-friendly:
    every policy keeps it), one-off scans of fresh keys with a random hot set of 1,200 keys
    (scan-heavy: LRU loses the hot set to the scans), and a Zipf mix over 8,000 keys
    (frequency-friendly)."""
    rng = random.Random(seed)
    keys = list(itertools.islice(itertools.cycle(range(100_000, 101_800)), phase_length))
    fresh = 1_000_000
    phase: list[int] = []
    while len(phase) < phase_length:
        if rng.random() < 0.5:
            length = rng.randrange(100, 600)
            phase.extend(range(fresh, fresh + length))
            fresh += length
        else:
            phase.extend(200_000 + rng.randrange(1_200) for _ in range(100))
    weights = list(itertools.accumulate(1.0 / (r + 1) ** 0.9 for r in range(8_000)))
    return (
        keys + phase[:phase_length] + rng.choices(range(8_000), cum_weights=weights, k=phase_length)
    )


def _phase_hits(policy: CachePolicy, keys: list[int], phase: int) -> list[int]:
    """Hits per phase, driving `policy` exactly as `simulate` does."""
    hits = [0] * (len(keys) // phase)
    for position, raw in enumerate(keys):
        hits[position // phase] += _access(policy, OffloadKey(raw.to_bytes(8, "big")))
    return hits


@pytest.mark.slow
def test_auto_follows_the_candidate_that_wins_each_regime() -> None:
    keys, phase, capacity = _regimes(), 40_000, 2_000
    found = {name: _phase_hits(POLICIES[name](capacity), keys, phase) for name in CANDIDATES}
    start_with_lru = ("lru", "arc", "lct")
    auto = AutoCachePolicy(capacity, candidates=start_with_lru)
    auto_hits = _phase_hits(auto, keys, phase)
    again = AutoCachePolicy(capacity, candidates=start_with_lru)
    assert _phase_hits(again, keys, phase) == auto_hits and again.switches == auto.switches
    # (about when, in accesses, and to which candidate) auto switched
    switched = [(sampled / auto.rate, name) for sampled, name in auto.switches]
    # the loop: every policy keeps it, and auto stays with LRU
    assert len(set(hits[0] for hits in found.values())) == 1 and auto_hits[0] == found["lru"][0]
    assert all(at > phase for at, _ in switched)
    # the scans: LRU loses the hot set; auto leaves it within 10 capacities
    assert found["lru"][1] < min(found["arc"][1], found["lct"][1]) - 0.05 * phase
    assert switched and phase < switched[0][0] <= phase + 10 * capacity
    assert switched[0][1] != "lru" and auto_hits[1] > found["lru"][1]
    # the Zipf mix: auto serves as well as the best candidate
    assert auto.serving != "lru" and len(auto.switches) <= 2  # no flapping
    assert auto_hits[2] >= max(hits[2] for hits in found.values()) - 0.005 * phase
    assert sum(auto_hits) > sum(found["lru"])


def _zipf(count: int = 100_000) -> list[int]:
    rng = random.Random(9)
    weights = list(itertools.accumulate(1.0 / (r + 1) ** 0.8 for r in range(30_000)))
    return rng.choices(range(30_000), cum_weights=weights, k=count)


@pytest.mark.slow
def test_a_stationary_workload_does_not_flap() -> None:
    keys = _zipf()
    made: list[AutoCachePolicy] = []

    def build(capacity: int) -> AutoCachePolicy:
        made.append(AutoCachePolicy(capacity))
        return made[-1]

    first = simulate(build, 1_500, keys)
    second = simulate(build, 1_500, keys)
    assert first == second and made[0].switches == made[1].switches
    assert len(made[0].switches) <= 2
    # never below LRU
    assert first.hit_ratio >= simulate("lru", 1_500, keys).hit_ratio


@pytest.mark.slow
def test_a_stationary_workload_is_within_0_005_of_the_best() -> None:
    """The shadows judge ARC ahead during lct's first capacities here (auto switches to ARC
    and back); the lct parked meanwhile keeps learning, so the switch back costs nothing
    (a fresh lct instead: 0.4323, against ARC's 0.4371 and lct's 0.4447)."""
    keys = _zipf()
    best = max(simulate(name, 1_500, keys).hit_ratio for name in ("arc", "lct"))
    assert simulate("auto", 1_500, keys).hit_ratio >= best - 0.005


def test_clear_starts_afresh() -> None:
    policy = AutoCachePolicy(8, candidates=("lct", "arc"))
    for i in range(8):
        policy.on_store_miss([k(i)])
        policy.insert(k(i), ready_block(i))
    policy.serve_with("arc")
    policy.clear()
    assert policy.serving == "lct" and policy.switches == [] and len(policy) == 0
    assert all(len(policy.shadow(name)) == 0 for name in policy.candidates)


@functools.cache
def _shipped_accesses() -> tuple[list[int], list[bool]]:
    """The shipped trace's block accesses and their partial-block flags."""
    raw = list(read_mooncake())
    requests = [list(r.hash_ids) for r in raw]
    flags = partial_block_flags(requests, [r.input_length for r in raw], MOONCAKE_BLOCK_TOKENS)
    return [block for request in requests for block in request], flags


SHIPPED_DISTINCT_BLOCKS = 182_790
AUTO_ON_THE_SHIPPED_TRACE = {0.01: 0.1065, 0.05: 0.2241, 0.10: 0.2960}
"""auto's hit ratios on the whole shipped trace, partial blocks skipped: lct's, as auto serves
with lct throughout (docs/BENCHMARKS.md, "Policies across traces")."""
ISSUE_22_TARGETS = {0.01: 0.111, 0.05: 0.219, 0.10: 0.295}


def _auto_on_the_shipped_trace(fraction: float) -> tuple[float, AutoCachePolicy]:
    accesses, flags = _shipped_accesses()
    made: list[AutoCachePolicy] = []

    def build(capacity: int) -> AutoCachePolicy:
        made.append(AutoCachePolicy(capacity))
        return made[-1]

    capacity = math.floor(fraction * SHIPPED_DISTINCT_BLOCKS)
    return simulate(build, capacity, accesses, partial=flags).hit_ratio, made[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fraction", sorted(AUTO_ON_THE_SHIPPED_TRACE))
@pytest.mark.slow
def test_auto_figures_on_the_shipped_trace_hold(fraction: float) -> None:
    """The figures docs/BENCHMARKS.md reports, to 0.0001, and no switch: lct wins the shipped
    trace at every capacity, and a sample that let its hottest block dominate once made auto
    leave it (sample_point's doc)."""
    found, policy = _auto_on_the_shipped_trace(fraction)
    assert policy.switches == []
    assert abs(found - AUTO_ON_THE_SHIPPED_TRACE[fraction]) < 1e-4, found


@pytest.mark.timeout(300)
@pytest.mark.xfail(
    strict=True,
    reason="issue 22's target at 1 % (0.111) is not met: auto serves with lct, 0.1065 "
    "(ARC 0.0674); those at 5 and 10 % are (0.2241, 0.2960)",
)
@pytest.mark.slow
def test_auto_meets_the_issue_targets_on_the_shipped_trace() -> None:
    for fraction, target in ISSUE_22_TARGETS.items():
        assert _auto_on_the_shipped_trace(fraction)[0] >= target, fraction


def _access(policy: CachePolicy, key: OffloadKey) -> bool:
    """One access of `key`, as `simulate` drives a policy: whether it hit."""
    if policy.get(key) is not None:
        policy.touch((key,))
        return True
    policy.on_store_miss((key,))
    if not policy.admits_all and not policy.admit((key,))[0]:
        return False
    if len(policy) >= policy.cache_capacity:
        assert policy.evict(1) is not None
    policy.insert(key, ready_block())
    return False


def _drive(policy: CachePolicy, keys: list[int]) -> None:
    """One access per key, as `simulate` drives a policy."""
    for raw in keys:
        _access(policy, k(raw))


def test_an_lct_that_stops_serving_keeps_learning_and_serves_again() -> None:
    policy = AutoCachePolicy(16)
    _drive(policy, list(range(40)))
    lct = policy.policy
    assert isinstance(lct, LCTCachePolicy)
    policy.serve_with("arc")
    assert len(lct) == 0  # parked: it holds no block
    _drive(policy, [100, 101, 100, 102, 100, *range(200, 240)])
    # it heard every access while parked, hits (100 twice) and misses alike
    assert lct.count(k(100)) == 3
    resident = _resident(policy)
    policy.serve_with("lct")
    assert policy.policy is lct and _resident(lct) == resident
    assert policy.lru_order() == list(resident)
    _drive(policy, list(range(300, 340)))
    assert _resident(policy) == _resident(lct) and len(policy) <= 16
