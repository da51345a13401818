"""Shadows on ids (`kvtier.policies._key_ids`, `use_ids`): LRU's, ARC's and S3-FIFO's
shadow on the ids of one `KeyIds` table takes the same decisions as the same policy on keys
(hits, lists, queues, order), through a conversion from keys (pinned and pending blocks
included, what a former live policy holds) and back; and the table holds exactly the keys
some shadow remembers, each counted once per shadow. Runs on whichever core is selected
(`tests/test_compiled_core.py` and `tests/test_compiled_s3fifo.py` compare the compiled
cores with their Python text on keys)."""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence

import pytest
from policy_helpers import drive_as_a_tier

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.policies import (
    ARCCachePolicy,
    AutoCachePolicy,
    CachePolicy,
    LCTCachePolicy,
    LRUCachePolicy,
    S3FIFOCachePolicy,
)
from kvtier.policies._key_ids import KeyIds, grown_ids
from kvtier.policies.takeover import store_in_shadow

ON_IDS: dict[str, type[ARCCachePolicy] | type[LRUCachePolicy] | type[S3FIFOCachePolicy]] = {
    "lru": LRUCachePolicy,
    "arc": ARCCachePolicy,
    "s3fifo": S3FIFOCachePolicy,
}


def shared_block() -> BlockStatus:
    block = BlockStatus(0)
    block.ref_cnt = 0
    return block


def state(policy: CachePolicy) -> tuple[object, ...]:
    """What a policy shows: its blocks, its order (lists, queues, counters), its length."""
    blocks = sorted((key, block.block_id, block.ref_cnt) for key, block in policy.items())
    shown: list[object] = []
    if isinstance(policy, ARCCachePolicy):
        shown = [policy.lists(), policy.target_t1_size]
    elif isinstance(policy, S3FIFOCachePolicy):
        queues = policy.queues()
        shown = [queues, [policy.frequency(key) for key in queues["small"] + queues["main"]]]
    elif isinstance(policy, LRUCachePolicy):
        shown = [policy.lru_order()]
    gets = [policy.get(key) is block for key, block in policy.items()]
    return (blocks, shown, len(policy), all(gets))


def remembered(policy: CachePolicy) -> set[OffloadKey]:
    """Every key a policy remembers: resident or ghost."""
    if isinstance(policy, LCTCachePolicy):
        return {key for queue in policy.queues() for key in queue} | {
            key for key, _ in policy.ghosts()
        }
    if isinstance(policy, ARCCachePolicy):
        return {key for keys in policy.lists().values() for key in keys}
    if isinstance(policy, S3FIFOCachePolicy):
        return {key for keys in policy.queues().values() for key in keys}
    assert isinstance(policy, LRUCachePolicy)
    return set(policy.lru_order())


def store_one_by_one(policy: CachePolicy, keys: Sequence[OffloadKey], block: BlockStatus) -> None:
    """What `auto`'s `on_store_move` does to a shadow on keys."""
    for key in reversed(keys):
        if policy.get(key) is None:
            policy.on_store_move((key,))
            store_in_shadow(policy, key, block)


def check_counts(table: KeyIds, shadows: Sequence[CachePolicy]) -> None:
    """The table holds exactly the keys the shadows remember, each id counted once per
    shadow that remembers it (after recycling what was released)."""
    table.intern([])
    every: dict[OffloadKey, int] = {}
    for shadow in shadows:
        for key in remembered(shadow):
            every[key] = every.get(key, 0) + 1
    assert len(table) == len(every)
    for key, count in every.items():
        assert table.count(table.id_of(key)) == count, key


def pin_some(policy: CachePolicy, rng: random.Random, number: int) -> None:
    """Swap a resident key's block for a pinned or pending one (on keys)."""
    if not len(policy):
        return
    key = rng.choice(sorted(key for key, _ in policy.items()))
    pinned = BlockStatus(number)
    pinned.ref_cnt = rng.choice([0, 1, -1])
    policy.remove(key)
    policy.insert(key, pinned)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(3))
def test_shadows_on_ids_decide_as_on_keys(seed: int) -> None:
    """Requests of 1 to 8 keys over a universe 4 x the capacity, now and then stored as a
    tier's move (`store_ids`); each shadow is driven on keys with pinned and pending blocks
    for a while, then put on ids (its state carried over) beside a twin that stays on keys,
    and later back on keys: every answer and state is the twin's, and the table counts
    every remembered key once per shadow."""
    rng = random.Random(seed)
    capacity = rng.choice([4, 16, 64])
    block = shared_block()
    table = KeyIds()
    on_ids = {name: cls(capacity) for name, cls in ON_IDS.items()}
    on_keys = {name: cls(capacity) for name, cls in ON_IDS.items()}
    for number in range(1_200):
        keys = list(
            dict.fromkeys(
                key_from_int(rng.randrange(4 * capacity)) for _ in range(rng.randint(1, 8))
            )
        )
        moving = number % 7 == 3
        ids = table.intern(keys) if 300 <= number < 1_000 else []
        for name, policy in on_ids.items():
            twin = on_keys[name]
            if 300 <= number < 1_000:
                if moving:
                    policy.store_ids(ids, block)  # type: ignore[union-attr]
                    store_one_by_one(twin, keys, block)
                else:
                    assert policy.access_ids(ids, block) == twin.access(keys, block), number
            elif moving:
                store_one_by_one(policy, keys, block)
                store_one_by_one(twin, keys, block)
            else:
                assert policy.access(keys, block) == twin.access(keys, block), number
            if number < 300 and number % 11 == 0:
                seeded = random.Random(number)
                pin_some(policy, seeded, number)
                pin_some(twin, random.Random(number), number)
        if number == 299:
            for policy in on_ids.values():
                policy.use_ids(table)
        if number == 999:
            for policy in on_ids.values():
                policy.use_keys()
            check_counts(table, [])
        if number % 50 == 0 or number in (299, 999):
            for name, policy in on_ids.items():
                assert state(policy) == state(on_keys[name]), (name, number)
            if 300 <= number < 999:
                check_counts(table, list(on_ids.values()))
    for name, policy in on_ids.items():
        assert state(policy) == state(on_keys[name]), name


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(3))
def test_a_batch_reads_its_blocks_counts_as_the_calls_one_by_one_do(seed: int) -> None:
    """`access` and `store` read the count of the call's block once (a shadow's blocks are
    all that block): with that block ready, pinned or pending from call to call, and other
    resident blocks pinned or pending, every shadow, on keys and on ids, decides as the
    policy's calls one by one (`CachePolicy.access`, `store_one_by_one`), which read every
    count when they evict."""
    rng = random.Random(seed)
    capacity = rng.choice([4, 16])
    block = shared_block()
    table = KeyIds()
    batched = {name: cls(capacity) for name, cls in ON_IDS.items()}
    pinned_twin = {name: cls(capacity) for name, cls in ON_IDS.items()}
    on_ids = {name: cls(capacity) for name, cls in ON_IDS.items()}
    on_ids_twin = {name: cls(capacity) for name, cls in ON_IDS.items()}
    for policy in on_ids.values():
        policy.use_ids(table)
    for number in range(800):
        keys = list(
            dict.fromkeys(
                key_from_int(rng.randrange(4 * capacity)) for _ in range(rng.randint(1, 6))
            )
        )
        block.ref_cnt = rng.choice([0, 0, 0, 1, -1])
        ids = table.intern(keys)
        for name in ON_IDS:
            if number % 7 == 3:  # a tier's move: the batch is the shadow's `store`
                on_ids[name].store_ids(ids, block)
                store_one_by_one(on_ids_twin[name], keys, block)
                continue
            hits = CachePolicy.access(pinned_twin[name], keys, block)
            assert batched[name].access(keys, block) == hits, (name, number)
            hits = CachePolicy.access(on_ids_twin[name], keys, block)
            assert on_ids[name].access_ids(ids, block) == hits, (name, number)
            if number % 5 == 0:
                pin_some(batched[name], random.Random(number), 10_000 + number)
                pin_some(pinned_twin[name], random.Random(number), 10_000 + number)
        if number % 50 == 0:
            for name in ON_IDS:
                assert state(batched[name]) == state(pinned_twin[name]), (name, number)
                assert state(on_ids[name]) == state(on_ids_twin[name]), (name, number)
    for name in ON_IDS:
        assert state(batched[name]) == state(pinned_twin[name]), name
        assert state(on_ids[name]) == state(on_ids_twin[name]), name


def test_the_table_recycles_ids_and_grows() -> None:
    """Keys no shadow remembers lose their ids (reused), and the table grows past its
    first room with every shadow resized: an LRU of 200 over 2,000 keys holds 200 ids."""
    table = KeyIds()
    shadow = LRUCachePolicy(200)
    shadow.use_ids(table)
    block = shared_block()
    for i in range(2_000):
        shadow.access_ids(table.intern([key_from_int(i)]), block)
    check_counts(table, [shadow])
    assert len(table) == 200 and 200 <= table.capacity < 2_000
    assert shadow.lru_order() == [key_from_int(i) for i in range(1_800, 2_000)]


def test_an_lru_shadow_keeps_as_many_nodes_as_blocks_whatever_the_table_holds() -> None:
    """LRU's shadow keeps a node per block held, not per id of the table: beside a shadow
    that remembers 20 times as many keys (as lct's memory makes the table hold), an LRU of
    100 keeps its 101 nodes while the table grows to thousands of ids, and decides as the
    LRU on keys does (its order, hits and the counts of its ids)."""
    table = KeyIds()
    wide = LRUCachePolicy(2_000)  # what lct remembering many capacities of keys does
    wide.use_ids(table)
    shadow = LRUCachePolicy(100)
    shadow.use_ids(table)
    on_keys = LRUCachePolicy(100)
    block = shared_block()
    rng = random.Random(5)
    hits = hits_on_keys = 0
    for _ in range(3_000):
        keys = [key_from_int(rng.randrange(2_500)) for _ in range(rng.randrange(1, 4))]
        keys = list(dict.fromkeys(keys))
        ids = table.intern(keys)
        wide.access_ids(ids, block)
        hits += shadow.access_ids(ids, block)
        hits_on_keys += on_keys.access(keys, block)
    check_counts(table, [wide, shadow])
    assert table.capacity >= 2_048
    assert shadow.lru_order() == on_keys.lru_order() and hits == hits_on_keys > 0
    core = shadow._ids
    assert core is not None and core.nodes == 101


def test_the_table_gives_out_recycled_ids_first_then_new_ones_in_order() -> None:
    """The ids handed out, in order (what the shadows' arrays are indexed by): the ids never
    given out lowest first, across a growth; once some are recycled, the last recycled
    first. A key no shadow counts is recycled at the next `intern`."""
    table = KeyIds()
    first = table.intern([key_from_int(i) for i in range(100)])
    assert first == list(range(100)) and table.capacity == 128
    lru = LRUCachePolicy(200)
    lru.use_ids(table)
    again = table.intern([key_from_int(i) for i in range(100, 103)])
    assert again == [99, 98, 97]  # the 100 uncounted ids recycled, the last one first
    lru.access_ids(again, shared_block())
    rest = table.intern([key_from_int(i) for i in range(103, 103 + 97 + 40)])
    assert rest == list(range(96, -1, -1)) + list(range(100, 140))
    assert table.capacity == 256 and [table.key_of(i) for i in (99, 0, 139)] == [
        key_from_int(100),
        key_from_int(199),
        key_from_int(239),
    ]


@pytest.mark.parametrize("value", [-1, 0])
def test_a_grown_id_array_keeps_its_items_and_fills_the_rest(value: int) -> None:
    old = array("i", [5, -1, 7])
    grown = grown_ids(old, 6, value)
    assert grown.tolist() == [5, -1, 7, value, value, value] and old.tolist() == [5, -1, 7]
    assert grown_ids(memoryview(old), 3, value).tolist() == [5, -1, 7]


def test_a_shadow_on_keys_refuses_ids() -> None:
    for cls in ON_IDS.values():
        with pytest.raises(BlockStateError, match="use_ids"):
            cls(4).access_ids([0], shared_block())


def test_auto_keeps_its_shadows_on_ids_across_switches() -> None:
    """auto's LRU, ARC and S3-FIFO shadows run on its table, and lct while it serves; a
    switch puts the one that takes over back on keys (readable, its ids released), the
    policy that stops serving on ids (lct on keys); the table then counts exactly what the
    shadows and a serving lct remember."""
    policy = AutoCachePolicy(20)
    rng = random.Random(2)
    table = policy._shadows.table

    def drive(count: int) -> None:
        def pick() -> OffloadKey:
            return key_from_int(rng.randrange(12) if rng.random() < 0.6 else rng.randrange(500))

        drive_as_a_tier(policy, 20, count, pick, rng)

    drive(400)
    shadows = [policy.shadow(name) for name in ("arc", "s3fifo", "lru")]
    assert all(shadow.on_ids for shadow in shadows)  # type: ignore[attr-defined]
    check_counts(table, [*shadows, policy.shadow("lct")])
    arc = policy.shadow("arc")
    policy.serve_with("arc")
    assert isinstance(arc, ARCCachePolicy) and not arc.on_ids  # dropped, back on keys
    assert len(arc) == 20 and arc.get(arc.lists()["t1"][0]) is not None
    lct = policy.shadow("lct")
    drive(200)
    shadows = [policy.shadow(name) for name in ("s3fifo", "lru")]
    check_counts(table, shadows)
    policy.serve_with("s3fifo")
    drive(200)
    check_counts(table, [policy.shadow("arc"), policy.shadow("lru")])
    assert policy.shadow("lct") is lct and isinstance(policy.shadow("arc"), ARCCachePolicy)
