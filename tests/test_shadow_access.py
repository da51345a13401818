"""`CachePolicy.access`, a shadow's batch of accesses (what `auto` drives its shadows with):
for every candidate the same hits and the same state as the accesses made one by one, as
`simulate` makes them; and `auto`'s shadows hit exactly as each policy does alone at full
capacity (a shadow is not a sample). Runs on whichever core is selected (compiled or not;
`tests/test_compiled_s3fifo.py` and `tests/test_compiled_core.py` compare the two)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from kvtier.blocks import BlockStatus
from kvtier.keys import OffloadKey, key_from_int
from kvtier.policies import CachePolicy, get_policy_class
from kvtier.policies.auto import CANDIDATES, AutoCachePolicy
from kvtier.policies.simulate import simulate


def one_by_one(policy: CachePolicy, keys: Sequence[OffloadKey], block: BlockStatus) -> int:
    """The accesses of `keys`, last first, each as `simulate` makes one: the reference."""
    hits = 0
    for key in reversed(keys):
        one = (key,)
        if policy.get(key) is not None:
            policy.touch(one)
            hits += 1
            continue
        policy.on_store_miss(one)
        if not policy.admits_all and not policy.admit(one)[0]:
            continue
        if len(policy) >= policy.cache_capacity and policy.evict(1) is None:
            continue
        policy.insert(key, block)
    return hits


def state(policy: CachePolicy) -> tuple[object, ...]:
    """What a policy shows: its blocks and, where it has one, its order."""
    blocks = sorted((key, block.block_id, block.ref_cnt) for key, block in policy.items())
    shown = [
        getattr(policy, name)()
        for name in ("lists", "lru_order", "queues")
        if callable(getattr(policy, name, None))
    ]
    return (blocks, shown, len(policy))


def shared_block() -> BlockStatus:
    block = BlockStatus(0)
    block.ref_cnt = 0
    return block


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["lru", "arc", "s3fifo", "lct"])
@pytest.mark.parametrize("seed", range(3))
def test_access_is_the_accesses_one_by_one(name: str, seed: int) -> None:
    """Requests of 1 to 8 keys over a universe 4 x the capacity; now and then a resident key
    is swapped for a pinned or pending block (what a former live policy holds), which the
    evictions of both must skip alike."""
    rng = random.Random(seed)
    capacity = rng.choice([1, 4, 16, 64])
    batch, single = (get_policy_class(name)(capacity) for _ in range(2))
    block = shared_block()
    for number in range(1_500):
        keys = list(
            dict.fromkeys(
                key_from_int(rng.randrange(4 * capacity)) for _ in range(rng.randint(1, 8))
            )
        )
        assert batch.access(keys, block) == one_by_one(single, keys, block), number
        if number % 11 == 0 and len(single):
            key = rng.choice(sorted(key for key, _ in single.items()))
            ref_cnt = rng.choice([0, 1, -1])
            for policy in (batch, single):
                pinned = BlockStatus(number)
                pinned.ref_cnt = ref_cnt
                policy.remove(key)
                policy.insert(key, pinned)
        if number % 100 == 0:
            assert state(batch) == state(single), number
    assert state(batch) == state(single)


def test_the_comparison_sees_a_different_state() -> None:
    """The reference can fail: one access more shows in the state."""
    batch, single = (get_policy_class("arc")(4) for _ in range(2))
    block = shared_block()
    batch.access([key_from_int(1), key_from_int(2)], block)
    one_by_one(single, [key_from_int(1)], block)
    assert state(batch) != state(single)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_auto_shadows_hit_as_each_policy_does_alone() -> None:
    """30,000 accesses (30 epochs of 1,000) of a Zipf-like mix at capacity 300, no switch:
    each candidate's hits in auto (the serving one's live, the others' shadows) are what
    `simulate` gives that policy alone at full capacity."""
    rng = random.Random(5)
    keys = [int(3_000 * rng.random() ** 2.5) for _ in range(30_000)]
    made: list[AutoCachePolicy] = []

    def build(capacity: int) -> AutoCachePolicy:
        made.append(AutoCachePolicy(capacity, min_epoch=1_000, warmup=10**9))
        return made[-1]

    simulate(build, 300, keys)
    auto = made[0]
    assert auto.accesses == 30_000 and not auto.switches
    alone = {name: simulate(name, 300, keys).hits for name in CANDIDATES}
    assert dict(zip(auto.candidates, auto.total_hits, strict=True)) == alone
    assert len(set(alone.values())) > 1  # the candidates differ: the test can tell them apart
