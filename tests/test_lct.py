"""`lct`, learned class thresholds (issue 12, item 1, first part): the PolicyTests
conformance suite, the admission hook through a tier, and its hit ratio on the shipped trace
against LRU and ARC driven the same way (request by request: hits touched tail first, misses
stored as one batch)."""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Sequence

import pytest

from kvtier.blocks import BlockStatus
from kvtier.compiled import core_is_compiled, extension_suffix
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager import SlotPoolBackend
from kvtier.manager.tier import TierManager
from kvtier.policies import (
    ARCCachePolicy,
    CachePolicy,
    LCTCachePolicy,
    LRUCachePolicy,
    _lct_core,
    simulate,
)
from kvtier.policies._lct_core import NEVER
from kvtier.policies.lct import EvictionOrder
from kvtier.specs import Medium
from kvtier.testing import PolicyTests
from kvtier_tools.workloads.traces import read_mooncake

UNIQUE_BLOCKS = 182_790


class TestLCT(PolicyTests):
    policy_class = LCTCachePolicy


def serve(policy: CachePolicy, capacity: int, requests: Sequence[Sequence[int]]) -> float:
    """Hit ratio of `policy` over the requests, driven as a tier drives it."""
    hits = total = 0
    for request in requests:
        keys = [key_from_int(block) for block in request]
        total += len(keys)
        present = [policy.get(key) is not None for key in keys]
        hits += sum(present)
        resident = [key for key, here in zip(keys, present, strict=True) if here]
        if resident:
            policy.touch(resident)
        misses = [key for key, here in zip(keys, present, strict=True) if not here]
        if not misses:
            continue
        policy.on_store_miss(misses)
        admitted = policy.admit(misses)
        store = [key for key, ok in zip(misses, admitted, strict=True) if ok][:capacity]
        need = len(policy) + len(store) - capacity
        if need > 0:
            assert policy.evict(need, set(store)) is not None
        blocks = [BlockStatus(i) for i in range(len(store))]
        for block in blocks:
            block.ref_cnt = 0
        policy.insert_many(store, blocks)
    return hits / total


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lct_beats_arc_and_lru_on_the_shipped_trace() -> None:
    requests = [list(r.hash_ids) for r in read_mooncake()]
    capacity = UNIQUE_BLOCKS // 100  # 1 %
    lct = serve(LCTCachePolicy(capacity), capacity, requests)
    arc = serve(ARCCachePolicy(capacity), capacity, requests)
    lru = serve(LRUCachePolicy(capacity), capacity, requests)
    assert lct > 1.4 * arc > lru  # 0.107 against 0.065 and 0.053 (0.101 when first written)


def test_a_class_that_never_pays_is_not_admitted() -> None:
    """A scan of blocks seen once, long enough for the solver to learn that single-use
    blocks are never reused, ends up refused; a block reused often stays admitted."""
    policy = LCTCachePolicy(64)
    hot = key_from_int(10**9)
    serve_keys = []
    for i in range(20_000):
        serve_keys.append([i])
        if i % 10 == 0:
            serve_keys.append([10**9])
    serve(policy, 64, serve_keys)
    assert policy.admit([key_from_int(10**8)]) == [False]  # a new block: class 1
    assert policy.get(hot) is not None
    assert policy.limits[0] == 0.0 and policy.limits[-1] > 0


def test_a_tier_stores_only_what_its_policy_admits() -> None:
    policy = LCTCachePolicy(4)
    policy.limits = [0.0, 1e9, 1e9, 1e9]  # as if learned: single-use blocks never pay
    policy.period = 10**9  # and kept
    tier = TierManager(SlotPoolBackend(4, 16, Medium.CPU), policy)
    out = tier.prepare_store([key_from_int(1), key_from_int(2)])
    assert out is not None and out.keys_to_store == [] and len(out.refused_keys) == 2
    assert tier.lookup(key_from_int(1)) is False
    tier.check()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_partial_blocks_are_never_stored_when_the_caller_says_which() -> None:
    """`simulate` with the Mooncake trace's input lengths: a prompt's last, partial block is
    a miss that stores nothing, for every policy, which leaves room for blocks that pay."""
    from kvtier.policies import partial_block_flags, simulate

    raw = list(read_mooncake())
    requests = [list(r.hash_ids) for r in raw]
    flags = partial_block_flags(requests, [r.input_length for r in raw], 512)
    accesses = [block for request in requests for block in request]
    assert 0 < sum(flags) < len(requests)
    capacity = UNIQUE_BLOCKS // 20  # 5 %
    for name in ("lru", "lct"):
        plain = simulate(name, capacity, accesses)
        skipping = simulate(name, capacity, accesses, partial=flags)
        assert skipping.refused >= sum(flags) - skipping.hits
        assert skipping.hit_ratio > plain.hit_ratio
    lct = simulate("lct", capacity, accesses, partial=flags)
    lru = simulate("lru", capacity, accesses, partial=flags)
    assert lct.hit_ratio > lru.hit_ratio
    small = UNIQUE_BLOCKS // 100  # 1 %: where learning which classes pay matters most
    lct = simulate("lct", small, accesses, partial=flags)
    arc = simulate("arc", small, accesses, partial=flags)
    assert lct.hit_ratio > 1.5 * arc.hit_ratio  # 0.107 against 0.067 (0.110 before issue 22)


def test_a_block_moved_down_is_not_another_access() -> None:
    """Write-through told the lower tier of the access (the cascade); the block leaving the
    tier above later must not raise its class as a second access would."""
    moved, accessed = LCTCachePolicy(8), LCTCachePolicy(8)
    key = key_from_int(1)
    for policy in (moved, accessed):
        policy.on_store_miss([key])
    moved.on_store_move([key])
    accessed.on_store_miss([key])
    assert moved.count(key) == 1 and accessed.count(key) == 2
    never_heard = key_from_int(2)
    moved.on_store_move([never_heard])  # it stands for the one access this tier missed
    assert moved.count(never_heard) == 1


def test_inserts_find_the_announced_keys_in_any_order() -> None:
    """`insert` finds an announced key's node without a look-up when the keys come in the
    announced order; out of order, or announced again while resident, it must still find
    the key's own history and refuse a resident key."""
    keys = [key_from_int(i) for i in range(6)]
    in_order, shuffled = LCTCachePolicy(16), LCTCachePolicy(16)
    for policy, order in ((in_order, [0, 1, 2, 3, 4, 5]), (shuffled, [5, 0, 3, 1, 4, 2])):
        policy.on_store_miss(keys)
        policy.on_store_miss(keys)  # a second access: each key's history has two
        for i in order:
            policy.insert(keys[i], BlockStatus(i))
        with pytest.raises(BlockStateError):
            policy.insert(keys[order[0]], BlockStatus(9))
        policy.on_store_miss(keys[:2])  # announced again while resident
        with pytest.raises(BlockStateError):
            policy.insert(keys[0], BlockStatus(9))
    assert [in_order._seen(k) for k in keys] == [shuffled._seen(k) for k in keys]
    assert all(in_order.count(k) == 2 for k in keys)
    assert sorted(map(len, in_order.queues())) == sorted(map(len, shuffled.queues()))
    assert {k for k, _ in shuffled.items()} == set(keys)


def _zipf_keys(count: int, universe: int, skew: float, seed: int) -> list[int]:
    """`count` keys drawn from `universe` with Zipf(`skew`) popularity."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** skew for rank in range(universe)]
    return rng.choices(range(universe), weights=weights, k=count)


def _scans_over_a_hot_set(count: int, seed: int) -> list[int]:
    """A hot set of 200 keys, read at random, interleaved with one-off scans of fresh keys."""
    rng = random.Random(seed)
    keys: list[int] = []
    fresh = 10_000
    while len(keys) < count:
        if rng.random() < 0.3:
            keys.extend(range(fresh, fresh + 50))  # a scan nobody reads again
            fresh += 50
        else:
            keys.extend(rng.randrange(200) for _ in range(20))
    return keys[:count]


def test_a_cleared_lct_decides_as_a_fresh_one() -> None:
    """`clear` hands the core's nodes out again from the first (their arrays kept, grown in
    place: docs/BENCHMARKS.md, "Policy cost, eighth round"): over thousands of keys (nodes
    past several growths), a policy cleared after another sequence serves, remembers and
    learns what a fresh one does."""
    first, second = (
        [list(dict.fromkeys(keys[i : i + 3])) for i in range(0, len(keys), 3)]
        for keys in (_zipf_keys(6000, 3000, 0.8, seed=1), _zipf_keys(6000, 4000, 0.9, seed=2))
    )
    cleared, fresh = LCTCachePolicy(100), LCTCachePolicy(100)
    serve(cleared, 100, first)
    cleared.clear()
    assert serve(cleared, 100, second) == serve(fresh, 100, second)
    assert cleared.queues() == fresh.queues()
    assert cleared.ghosts() == fresh.ghosts()
    assert (cleared.limits, cleared.shares, cleared.horizon) == (
        fresh.limits,
        fresh.shares,
        fresh.horizon,
    )


@pytest.mark.parametrize(
    "sequence",
    [
        pytest.param(_zipf_keys(60_000, 20_000, 0.9, seed=1), id="zipf-0.9"),
        pytest.param(_zipf_keys(60_000, 20_000, 0.6, seed=2), id="zipf-0.6"),
        pytest.param(_scans_over_a_hot_set(60_000, seed=3), id="scans-over-a-hot-set"),
    ],
)
@pytest.mark.slow
def test_never_below_lru_on_a_plain_key_sequence(sequence: list[int]) -> None:
    """No request structure (each request one key): lct must not lose to LRU at any
    capacity, from a few blocks to most of the key space."""
    unique = len(set(sequence))
    for capacity in sorted({max(2, unique * f // 100) for f in (1, 2, 5, 10, 25, 50)}):
        lct = simulate("lct", capacity, sequence).hits
        lru = simulate("lru", capacity, sequence).hits
        # Where every class is kept without limit lct evicts by last use, as LRU does, and
        # may differ by a tie-break: 1 hit in 10,000 accesses is the tolerance.
        assert lct >= lru - len(sequence) // 10_000, (capacity, lct, lru)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_never_below_lru_on_the_shipped_trace_at_any_capacity() -> None:
    """The shipped trace's first 4,000 requests, prompts as requests, capacities from 0.5 %
    to 50 % of their distinct blocks. Where every class is unlimited lct evicts as LRU does,
    up to tie-breaks among one request's blocks (at 50 % 4 of 105,904 blocks since its
    candidate horizons are 16 and 64 capacities, issue 34 item 2): 1 in 10,000 is the
    tolerance, as in `tests/test_lct_solver.py`."""
    requests = [list(r.hash_ids) for r in itertools.islice(read_mooncake(), 4000)]
    unique = len({block for request in requests for block in request})
    for fraction in (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5):
        capacity = max(1, int(unique * fraction))
        lct = serve(LCTCachePolicy(capacity), capacity, requests)
        lru = serve(LRUCachePolicy(capacity), capacity, requests)
        assert lct >= lru - 1e-4, (fraction, lct, lru)


def _ready_blocks(count: int) -> list[BlockStatus]:
    blocks = [BlockStatus(i) for i in range(count)]
    for block in blocks:
        block.ref_cnt = 0
    return blocks


def _advance(policy: LCTCachePolicy, accesses: int, start: int) -> None:
    """`accesses` misses of fresh keys (never stored): the clock moves on."""
    for i in range(start, start + accesses):
        policy.on_store_miss([key_from_int(i)])


@pytest.mark.parametrize(("order", "evicted"), [("ratio", "once"), ("over", "twice")])
def test_eviction_takes_the_block_furthest_past_its_limit(order: str, evicted: str) -> None:
    """A block seen once, 150 accesses old under a limit of 100, against one seen twice,
    12,001 old under a limit of 10,000: as a ratio the first is further past (1.5 > 1.2),
    as a difference the second (2,001 > 50); both past their limits, ranked within and
    across classes alike (`by_class=False`)."""
    policy = LCTCachePolicy(4, order="ratio" if order == "ratio" else "over", by_class=False)
    policy.period = 10**9  # the limits below are kept
    twice, once = key_from_int(1), key_from_int(2)
    policy.on_store_miss([twice])
    policy.on_store_miss([twice])
    policy.insert(twice, _ready_blocks(1)[0])
    _advance(policy, 11_850, start=1000)
    policy.on_store_miss([once])
    policy.insert(once, _ready_blocks(1)[0])
    _advance(policy, 150, start=100_000)
    policy.limits = [100.0, 10_000.0, 10_000.0, 10_000.0]
    victims = policy.evict(1)
    assert victims is not None
    assert victims[0][0] == {"once": once, "twice": twice}[evicted]


def _once_and_twice(policy: LCTCachePolicy, once_age: int) -> tuple[OffloadKey, OffloadKey]:
    """A block seen twice, 12,000 + `once_age` accesses old, and a block seen once,
    `once_age` old, both resident (the solver never runs)."""
    policy.period = 10**9
    twice, once = key_from_int(1), key_from_int(2)
    policy.on_store_miss([twice])
    policy.on_store_miss([twice])
    policy.insert(twice, _ready_blocks(1)[0])
    _advance(policy, 12_000 - 1, start=1000)
    policy.on_store_miss([once])
    policy.insert(once, _ready_blocks(1)[0])
    _advance(policy, once_age, start=100_000)
    return once, twice


@pytest.mark.parametrize("order", ["ratio", "over"])
def test_past_their_limits_the_lowest_class_goes_first(order: EvictionOrder) -> None:
    """With `by_class` (the default), a block seen once 101 accesses old under a limit of 100
    goes before one seen twice 12,101 old under a limit of 1,000, though the second is
    further past as a ratio (12.1 > 1.01) and as a difference (11,101 > 1)."""
    policy = LCTCachePolicy(4, order=order)
    assert policy.by_class
    once, twice = _once_and_twice(policy, 101)
    policy.limits = [100.0, 1_000.0, 1_000.0, 1_000.0]
    victims = policy.evict(1)
    assert victims is not None and victims[0][0] == once
    assert policy.get(twice) is not None


def test_a_block_within_its_limit_goes_after_every_block_past_its_own() -> None:
    """A block seen once within its limit (50 of 100) stays while one seen twice is past its
    limit (12,050 of 10,000), whatever the classes."""
    policy = LCTCachePolicy(4)
    once, twice = _once_and_twice(policy, 50)
    policy.limits = [100.0, 10_000.0, 10_000.0, 10_000.0]
    victims = policy.evict(1)
    assert victims is not None and victims[0][0] == twice
    assert policy.get(once) is not None


def test_by_class_must_be_a_bool() -> None:
    with pytest.raises(InvalidValueError, match="by_class"):
        LCTCachePolicy(4, by_class=1)  # type: ignore[arg-type]


def test_an_unknown_eviction_order_is_refused() -> None:
    with pytest.raises(InvalidValueError):
        LCTCachePolicy(4, order="lru")  # type: ignore[arg-type]


@functools.cache
def _shipped_accesses() -> tuple[list[int], list[bool]]:
    """The shipped trace's block accesses and their partial-block flags."""
    from kvtier.policies import partial_block_flags

    raw = list(read_mooncake())
    requests = [list(r.hash_ids) for r in raw]
    flags = partial_block_flags(requests, [r.input_length for r in raw], 512)
    return [block for request in requests for block in request], flags


LCT_ON_THE_SHIPPED_TRACE = {0.01: 0.1083, 0.05: 0.2259, 0.10: 0.2960}
"""lct's hit ratios on the whole shipped trace, partial blocks skipped, with the parameters
chosen on its first half (kvtier_tools.bench.lct_tuning). Before the learned horizon and the sound
solver (issue 22, item 1): 0.1100, 0.2156, 0.2942; before a class admitted in part took
a fixed share of its keys (issue 34): 0.1065, 0.2241, 0.2960; before limits stood when every
option fits (issue 34 item 2): 0.1069, 0.2255, 0.2960; with candidate horizons of 1 and 4
capacities too (until issue 34 item 2): 0.1072, 0.2255, 0.2960; before the blocks past
their limits went lowest class first (`BY_CLASS`, issue 34 item 2, third round): 0.1087,
0.2263, 0.2959."""
ISSUE_TARGETS = {0.01: 0.110, 0.05: 0.220, 0.10: 0.295}


def _lct_on_the_shipped_trace(fraction: float) -> float:
    accesses, flags = _shipped_accesses()
    capacity = math.floor(fraction * UNIQUE_BLOCKS)
    return simulate("lct", capacity, accesses, partial=flags).hit_ratio


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fraction", sorted(LCT_ON_THE_SHIPPED_TRACE))
@pytest.mark.slow
def test_lct_figures_on_the_shipped_trace_hold(fraction: float) -> None:
    """The figures docs/BENCHMARKS.md reports, to 0.0001 (a change of lct that moves them
    must say so there)."""
    found = _lct_on_the_shipped_trace(fraction)
    assert abs(found - LCT_ON_THE_SHIPPED_TRACE[fraction]) < 1e-4, found


@pytest.mark.timeout(120)
@pytest.mark.xfail(
    strict=True,
    reason="issue 12's target at 1 % (0.110) is not met by the set tuned on the first half "
    "(0.1083); those at 5 and 10 % are (0.2259, 0.2960)",
)
@pytest.mark.slow
def test_lct_meets_the_issue_targets_on_the_shipped_trace() -> None:
    for fraction, target in ISSUE_TARGETS.items():
        assert _lct_on_the_shipped_trace(fraction) >= target, fraction


@pytest.mark.timeout(120)
@pytest.mark.parametrize("length", [600, 1_500])
def test_a_loop_longer_than_the_cache_keeps_a_fixed_part_of_itself(length: int) -> None:
    """A loop of 1.2 and 3 capacities: LRU and ARC evict each block just before its turn
    (0 hits); the optimum keeps a fixed capacity's worth (hit ratio ~ capacity / length).
    lct learns the loop's class and admits a fixed share of its keys by their hash, only
    while nothing still expected back would be evicted for them (issue 34: it admitted every
    n-th miss, each evicting the next block needed: 0.005 at 1.2 capacities)."""
    capacity = 500
    keys = list(itertools.islice(itertools.cycle(range(length)), 60 * length))
    assert simulate("lru", capacity, keys).hits == 0
    found = simulate("lct", capacity, keys).hit_ratio
    assert found > 0.75 * capacity / length, found


def test_evict_reads_each_blocks_count_however_the_block_is_held() -> None:
    """`evict` skips a block being written or pinned and takes a ready one, reading each
    count when it evicts (compiled: straight from the block's memory, `_lct_core._ref_cnt`,
    docs/BENCHMARKS.md, "Policy cost, thirteenth round"), whether the block holds its bytes,
    lies over a buffer (`from_buffer`) or is a subclass's (read through its attribute):
    each in turn the only evictable block, the others' counts set after they were stored,
    among them counts whose low byte or half is 0."""

    class Block(BlockStatus):
        pass

    assert _lct_core.reads_ref_cnt_directly() == (
        core_is_compiled() and _lct_core.__file__.endswith(extension_suffix())
    )
    buffer = bytearray(64)
    blocks = [
        BlockStatus(0),
        BlockStatus.from_buffer(buffer, 16),
        Block(2),
        BlockStatus(3),
        BlockStatus.from_buffer(buffer, 32),
        Block(5),
    ]
    keys = [key_from_int(i) for i in range(len(blocks))]
    policy = LCTCachePolicy(len(blocks))
    policy.on_store_miss(keys)
    policy.insert_many(keys, blocks)
    busy = [-1, 1, 256, 1 << 16, 1 << 24, 7]
    for block, count in zip(blocks, busy, strict=True):
        block.ref_cnt = count
    assert policy.evict(1) is None
    for i, block in enumerate(blocks):
        block.ref_cnt = 0
        assert policy.evict(1) == [(keys[i], block)]
        block.ref_cnt = busy[i]
        policy.on_store_miss([keys[i]])
        policy.insert(keys[i], block)
        assert policy.evict(1) is None


def test_the_nodes_keep_their_histories_and_blocks_through_every_growth() -> None:
    """The core's node arrays double as keys are remembered (64 nodes at first; compiled,
    each array resized in place and only its new items zeroed, `_lct_core._extend_zeroed`):
    after nine doublings, every key still has the access times it was given, twice
    accessed or once, resident with its block or a ghost."""
    policy = LCTCachePolicy(1000)
    keys = [key_from_int(i) for i in range(20_000)]
    for i in range(0, len(keys), 10):
        policy.on_store_miss(keys[i : i + 10])
    for i in range(0, 3000, 10):  # the first 3000 keys accessed again, 1000 stored
        policy.on_store_miss(keys[i : i + 10])
        if i < 1000:
            blocks = [BlockStatus(j) for j in range(i, i + 10)]
            policy.insert_many(keys[i : i + 10], blocks)
    clock = len(keys)
    for i, key in enumerate(keys):
        seen = policy._seen(key)
        assert seen is not None
        # announced from each request's deepest key: its i-th key at clock start + 10 - i
        first = i - i % 10 + 10 - i % 10
        if i < 3000:
            again = clock + first
            assert seen[1:] == (again, first, NEVER)
        else:
            assert seen[1:] == (first, NEVER, NEVER)
    assert {key: block.block_id for key, block in policy.items()} == {
        key: i for i, key in enumerate(keys[:1000])
    }
