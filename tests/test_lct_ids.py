"""lct on ids (`LCTCachePolicy.use_ids`): `auto`'s serving lct finds each remembered key by
its id in the `KeyIds` table its shadows share, instead of a dict of its own. It must take
every decision lct on keys takes: driven as a tier drives it (touches, announcements with a
resident key announced again now and then, admissions, evictions with protected keys,
pinned blocks, moves, removals), through conversions to ids and back, its answers and state
are its twin's on keys, and the table counts exactly the keys it remembers. Runs on
whichever core is selected (`tests/test_compiled_core.py` compares the compiled core with
its Python text on keys)."""

from __future__ import annotations

import random
import re

import pytest
from policy_helpers import drive_as_a_tier

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.policies import AutoCachePolicy, LCTCachePolicy
from kvtier.policies._key_ids import KeyIds


def lct_state(policy: LCTCachePolicy) -> tuple[object, ...]:
    """Everything lct decides by: its queues, ghosts and their histories, its solver's
    output, its blocks."""
    blocks = sorted((key, block.block_id, block.ref_cnt) for key, block in policy.items())
    return (
        [(key, block.block_id) for key, block in policy.items()],  # in the order they came
        policy.queues(),
        policy.ghosts(),
        policy.limits,
        policy.shares,
        policy.horizon,
        policy._clock,
        blocks,
        len(policy),
    )


def check_counts(table: KeyIds, policy: LCTCachePolicy) -> None:
    """The table holds exactly the keys lct remembers (resident or ghost), each counted
    once (after recycling what was released)."""
    table.intern([])
    remembered = {key for queue in policy.queues() for key in queue}
    remembered |= {key for key, _ in policy.ghosts()}
    assert len(table) == len(remembered)
    for key in remembered:
        assert table.count(table.id_of(key)) == 1, key


class Twin:
    """One lct driven as a tier drives it, on keys or (`table` set and `on_ids`) on ids."""

    def __init__(self, capacity: int, table: KeyIds | None) -> None:
        self.policy = LCTCachePolicy(capacity)
        self.table = table
        self.capacity = capacity
        self.slot = 0

    def block(self, pinned: bool) -> BlockStatus:
        self.slot += 1
        block = BlockStatus(self.slot)
        block.ref_cnt = 1 if pinned else 0
        return block

    def request(self, numbers: list[int], again: int | None, rng: random.Random) -> list[object]:
        """One request of keys `numbers` (fresh key objects, as a trace's are); `again`: a
        resident key's number announced again with the misses. Returns what it decided."""
        policy = self.policy
        keys = [key_from_int(n) for n in numbers]
        on_ids = self.table is not None and policy.on_ids
        ids = self.table.intern(keys) if on_ids and self.table is not None else []
        hit_at = [i for i, key in enumerate(keys) if policy.get(key) is not None]
        hits = [keys[i] for i in hit_at]
        if on_ids:
            policy.touch_ids([ids[i] for i in hit_at], hits)
        else:
            policy.touch(hits)
        miss_at = [i for i in range(len(keys)) if i not in hit_at]
        announced = [keys[i] for i in miss_at]
        announced_ids = [ids[i] for i in miss_at] if on_ids else []
        if again is not None and policy.get(key_from_int(again)) is not None:
            announced.append(key_from_int(again))
            if on_ids and self.table is not None:
                announced_ids.append(self.table.intern_one(announced[-1]))
        if on_ids:
            policy.on_store_miss_ids(announced_ids, announced)
        else:
            policy.on_store_miss(announced)
        answers = policy.admit(announced)
        stored = [k for k, ok in zip(announced, answers, strict=True) if ok and not policy.get(k)]
        decided: list[object] = [len(hits), answers]
        need = len(policy) + len(stored) - self.capacity
        if need > 0:
            evicted = policy.evict(need, set(keys))
            decided.append(None if evicted is None else [key for key, _ in evicted])
            if evicted is None:
                return decided
        for key in stored:
            policy.insert(key, self.block(rng.random() < 0.05))
        return decided


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(4))
def test_lct_on_ids_decides_as_lct_on_keys(seed: int) -> None:
    """Requests of 1 to 6 keys over a universe 6 x the capacity, long enough that the
    solver runs and forgets ghosts; one lct stays on keys, its twin goes on ids, back on
    keys and on ids again: every answer, eviction and state is the same, and the table
    counts what the twin remembers."""
    rng = random.Random(seed)
    capacity = rng.choice([4, 8, 24])
    table = KeyIds()
    on_keys, on_ids = Twin(capacity, None), Twin(capacity, table)
    for number in range(2_500):
        numbers = list(dict.fromkeys(rng.randrange(6 * capacity) for _ in range(rng.randint(1, 6))))
        again = rng.randrange(6 * capacity) if number % 5 == 2 else None
        draws = rng.random()
        if number % 7 == 3:  # a tier's move: announced, not an access
            keys = [key_from_int(n) for n in numbers]
            on_keys.policy.on_store_move(keys)
            on_ids.policy.on_store_move([key_from_int(n) for n in numbers])
        elif number % 17 == 0 and len(on_keys.policy):
            key = sorted(key for key, _ in on_keys.policy.items())[int(draws * len(on_keys.policy))]
            on_keys.policy.remove(key)
            on_ids.policy.remove(OffloadKey(bytes(bytearray(key))))  # an equal key object
        else:
            decided = on_keys.request(numbers, again, random.Random(number))
            assert on_ids.request(numbers, again, random.Random(number)) == decided, number
        if number in (200, 1_800):
            on_ids.policy.use_ids(table)
            assert on_ids.policy.on_ids
        if number == 1_500:
            on_ids.policy.use_keys()
            assert not on_ids.policy.on_ids
            check_counts(table, LCTCachePolicy(capacity))  # every id released
        if number % 50 == 0:
            assert lct_state(on_ids.policy) == lct_state(on_keys.policy), number
            if on_ids.policy.on_ids:
                check_counts(table, on_ids.policy)
    assert lct_state(on_ids.policy) == lct_state(on_keys.policy)
    on_ids.policy.clear()
    check_counts(table, on_ids.policy)


def requeued_by_the_dict(policy: LCTCachePolicy, horizon: int) -> list[list[OffloadKey]]:
    """The queues a requeue must give, found as lct did before it ran without its resident
    dict (issue 34 item 3): the resident dict's keys, oldest access first, ties in the
    dict's order (the order the keys became resident), each queued by its class under
    candidate `horizon`."""
    order = list(policy._core.resident)
    assert len(order) == len(policy)
    times = {key: (policy._seen(key) or (0, 0, 0, 0))[1] for key in order}
    queues: list[list[OffloadKey]] = [[], [], [], []]
    for key in sorted(order, key=times.__getitem__):
        queues[policy.count(key, horizon) - 1].append(key)
    return queues


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(3))
def test_lct_on_ids_keeps_no_resident_dict_and_its_order(seed: int) -> None:
    """On ids lct keeps no resident dict: its blocks, their order (the order they became
    resident), `get`, `len` and `in` come from its nodes, and a requeue orders the blocks
    of equal access times as the dict did. Keys stored unannounced (access time the
    clock's, so tied), moves, removals and forced requeues; the twin on keys is checked
    against its dict, the one on ids against the twin."""
    rng = random.Random(seed)
    capacity = rng.choice([6, 12])
    table = KeyIds()
    on_keys, on_ids = Twin(capacity, None), Twin(capacity, table)
    on_ids.policy.use_ids(table)
    fresh = 10_000
    for number in range(1_200):
        numbers = list(dict.fromkeys(rng.randrange(5 * capacity) for _ in range(rng.randint(1, 5))))
        if number % 9 == 4 and len(on_keys.policy) + 2 <= capacity:  # stored unannounced
            for twin in (on_keys, on_ids):
                for n in (fresh, fresh + 1):
                    twin.policy.insert(key_from_int(n), BlockStatus(n))
            fresh += 2
        elif number % 13 == 6 and len(on_keys.policy):
            key = list(on_keys.policy._core.resident)[number % len(on_keys.policy)]
            on_keys.policy.remove(key)
            on_ids.policy.remove(OffloadKey(bytes(bytearray(key))))  # an equal key object
        else:
            decided = on_keys.request(numbers, None, random.Random(number))
            assert on_ids.request(numbers, None, random.Random(number)) == decided, number
        if number % 40 == 20:  # a requeue, as a horizon's move makes
            horizon = 1 - on_keys.policy.horizon
            expected = requeued_by_the_dict(on_keys.policy, horizon)
            for twin in (on_keys, on_ids):
                twin.policy._move_horizon(horizon)
            assert on_keys.policy.queues() == expected, number
        core = on_ids.policy._core
        assert core.on_ids and not core.resident
        assert lct_state(on_ids.policy) == lct_state(on_keys.policy), number
        assert list(on_keys.policy.items()) == list(on_keys.policy._core.resident.items())
        for n in numbers:
            key = key_from_int(n)
            block = on_keys.policy.get(key)
            assert on_ids.policy.get(key) is not None if block else on_ids.policy.get(key) is None
            assert (key in core) == (block is not None)
    on_ids.policy.use_keys()  # the dict refilled, in its order
    assert list(on_ids.policy._core.resident) == list(on_keys.policy._core.resident)


@pytest.mark.parametrize("on_ids", [False, True])
def test_a_requeue_orders_equal_access_times_as_the_blocks_became_resident(on_ids: bool) -> None:
    """Two blocks of the same last access, in different queues (one stored unannounced,
    after the other), land in one queue when the horizon moves: the one that became
    resident first goes first, as the resident dict's order put it, on keys and on ids
    (where there is no such dict)."""
    policy = LCTCachePolicy(2)  # horizons of 32 and 128 accesses, a solve every 64
    if on_ids:
        policy.use_ids(KeyIds())
    first, second = key_from_int(1), key_from_int(2)
    policy._move_horizon(1)  # count over 128 accesses
    policy.on_store_miss([first])
    for number in range(40):
        policy.on_store_miss([key_from_int(100 + number)])
    policy.on_store_miss([first])  # 41 accesses later: class 2 over 128, class 1 over 32
    policy.insert(first, BlockStatus(1))
    policy.insert(second, BlockStatus(2))  # unannounced: the same access time, class 1
    assert policy.queues() == [[second], [first], [], []]
    policy._move_horizon(0)
    assert policy.queues() == [[first, second], [], [], []]
    assert [key for key, _ in policy.items()] == [first, second]


@pytest.mark.parametrize("on_ids", [False, True])
def test_a_requeue_orders_by_access_time_then_by_when_resident(on_ids: bool) -> None:
    """After each move of the horizon every class queue runs by the blocks' last access,
    equal times by the order they became resident (`items`'): `requeue`'s one sort on a
    packed key (compiled) or its two sorts, over many blocks, with ties (batches stored
    unannounced share an access time) and stamps out of the queues' order."""
    rng = random.Random(11)
    policy = LCTCachePolicy(200)
    if on_ids:
        policy.use_ids(KeyIds())
    number = 0
    for _ in range(150):
        if len(policy) > 150:
            policy.evict(len(policy) - 150, set())
        resident = [key for key, _ in policy.items()]
        policy.touch(rng.sample(resident, min(len(resident), rng.randrange(4))))
        keys = [key_from_int(number + i) for i in range(rng.randrange(1, 6))]
        number += len(keys)
        if rng.random() < 0.5:
            policy.on_store_miss(keys)
        policy.insert_many(keys, [BlockStatus(i) for i in range(len(keys))])
    order = {key: rank for rank, (key, _) in enumerate(policy.items())}

    def time(key: OffloadKey) -> int:
        seen = policy._seen(key)
        assert seen is not None
        return seen[1]

    for horizon in (1, 0, 1, 0):
        policy._move_horizon(horizon)
        queues = policy.queues()
        assert sum(map(len, queues)) == len(policy) > 100
        for queue in queues:
            assert queue == sorted(queue, key=lambda key: (time(key), order[key]))
        times = [time(key) for queue in queues for key in queue]
        assert len(set(times)) < len(times) - 50  # many ties to break
    assert [key for key, _ in policy.items()] == list(order)


def test_insert_many_on_ids_checks_the_batch_in_the_core() -> None:
    """On ids the batch is checked by one call of the core: a resident key rejects the
    whole batch (named), a ghost (remembered, not resident) or a new key does not, nor
    does the check change anything; the lengths and repeats are still checked."""
    policy = LCTCachePolicy(8)
    policy.use_ids(KeyIds())
    keys = [key_from_int(n) for n in range(6)]
    policy.on_store_miss(keys[:3])
    policy.insert_many(keys[:2], [BlockStatus(0), BlockStatus(1)])  # keys[2]: a ghost
    assert len(policy) == 2 and keys[2] not in policy
    before = lct_state(policy)
    with pytest.raises(BlockStateError, match=re.escape(repr(keys[1]))):
        policy.insert_many([keys[3], keys[4], keys[1]], [BlockStatus(n) for n in range(3)])
    with pytest.raises(BlockStateError, match="twice"):
        policy.insert_many([keys[3], keys[3]], [BlockStatus(0), BlockStatus(1)])
    with pytest.raises(InvalidValueError):
        policy.insert_many([keys[3]], [])
    assert lct_state(policy) == before
    assert policy._core.first_resident([keys[5], keys[2], keys[0], keys[1]]) == 2
    assert policy._core.first_resident([keys[5], keys[2]]) == -1
    policy.insert_many([keys[2], keys[3]], [BlockStatus(2), BlockStatus(3)])
    assert [key for key, _ in policy.items()] == keys[:4]


def test_lct_on_keys_refuses_ids() -> None:
    policy = LCTCachePolicy(4)
    with pytest.raises(BlockStateError, match="use_ids"):
        policy.touch_ids([0], [key_from_int(0)])
    with pytest.raises(BlockStateError, match="use_ids"):
        policy.on_store_miss_ids([0], [key_from_int(0)])


def test_auto_serves_with_lct_on_its_table_and_keeps_lct_shadow_on_keys() -> None:
    """auto's serving lct runs on its table (the table then counts lct's keys too); a
    switch away puts lct on keys, a switch back on ids, its state kept."""
    policy = AutoCachePolicy(16)
    rng = random.Random(5)
    table = policy._shadows.table
    lct = policy.shadow("lct")
    assert isinstance(lct, LCTCachePolicy) and lct.on_ids

    def drive(count: int) -> None:
        drive_as_a_tier(policy, 16, count, lambda: key_from_int(rng.randrange(600)), rng)

    drive(500)
    assert table.count(table.id_of(lct.queues()[0][0] if lct.queues()[0] else lct.ghosts()[0][0]))
    policy.serve_with("arc")
    assert not lct.on_ids and policy.shadow("lct") is lct
    before = lct_state(lct)
    drive(300)
    assert lct_state(lct) != before  # a shadow on keys, driven
    policy.serve_with("lct")
    assert policy.shadow("lct") is lct and lct.on_ids
    drive(300)
