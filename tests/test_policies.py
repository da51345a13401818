"""Every policy runs the PolicyTests conformance suite; policy-specific order tests follow."""

from __future__ import annotations

import pytest

from kvtier.errors import InvalidValueError, UnknownPolicyError
from kvtier.policies import (
    POLICIES,
    ARCCachePolicy,
    LRUCachePolicy,
    S3FIFOCachePolicy,
    get_policy_class,
    simulate,
)
from kvtier.testing import PolicyTests
from kvtier.testing.policy import k, ready_block


class TestLRU(PolicyTests):
    policy_class = LRUCachePolicy

    def test_evicts_least_recently_used_first(self) -> None:
        policy = LRUCachePolicy(4)
        self.fill(policy, range(4))
        policy.touch([k(0)])
        evicted = policy.evict(2)
        assert evicted is not None and [key for key, _ in evicted] == [k(1), k(2)]
        assert policy.lru_order() == [k(3), k(0)]

    def test_touch_leaves_a_prefix_head_most_recent(self) -> None:
        policy = LRUCachePolicy(3)
        self.fill(policy, range(3))
        policy.touch([k(0), k(1), k(2)])  # one request's prefix, head first
        assert policy.lru_order() == [k(2), k(1), k(0)]


class TestARC(PolicyTests):
    policy_class = ARCCachePolicy

    def test_second_access_moves_a_block_to_t2(self) -> None:
        policy = ARCCachePolicy(4)
        self.fill(policy, range(3))
        policy.touch([k(1)])
        assert policy.lists()["t1"] == [k(0), k(2)]
        assert policy.lists()["t2"] == [k(1)]

    def test_touching_a_pending_block_keeps_it_in_t1(self) -> None:
        policy = ARCCachePolicy(4)
        policy.insert(k(1), ready_block(1, ref_cnt=-1))
        policy.touch([k(1)])
        assert policy.lists()["t1"] == [k(1)] and policy.lists()["t2"] == []

    def test_a_full_t1_drops_its_lru_without_a_ghost(self) -> None:
        # Paper case IV.A with |T1| = c: the LRU page of T1 is deleted, not remembered.
        policy = ARCCachePolicy(2)
        self.fill(policy, range(2))
        policy.on_store_miss([k(2)])
        evicted = policy.evict(1)
        assert evicted is not None and evicted[0][0] == k(0)
        policy.insert(k(2), ready_block(2))
        assert policy.lists() == {"t1": [k(1), k(2)], "t2": [], "b1": [], "b2": []}

    def test_evicted_blocks_become_ghosts_and_a_ghost_hit_adapts_p(self) -> None:
        policy = ARCCachePolicy(2)
        self.fill(policy, range(2))
        policy.touch([k(1)])  # T1 = [0], T2 = [1]
        policy.on_store_miss([k(2)])
        evicted = policy.evict(1)  # REPLACE: |T1| = 1 > p = 0, so T1's LRU goes to B1
        assert evicted is not None and evicted[0][0] == k(0)
        policy.insert(k(2), ready_block(2))
        assert policy.lists() == {"t1": [k(2)], "t2": [k(1)], "b1": [k(0)], "b2": []}
        assert policy.target_t1_size == 0
        policy.on_store_miss([k(0)])  # B1 ghost hit: p += max(1, |B2|/|B1|) = 1
        evicted = policy.evict(1)  # REPLACE: |T1| = 1 is not > p = 1, so T2's LRU goes
        assert evicted is not None and evicted[0][0] == k(1)
        assert policy.target_t1_size == 1
        policy.insert(k(0), ready_block(0))
        assert policy.lists() == {"t1": [k(2)], "t2": [k(0)], "b1": [], "b2": [k(1)]}

    def test_remove_does_not_leave_a_ghost(self) -> None:
        policy = ARCCachePolicy(2)
        self.fill(policy, range(2))
        policy.remove(k(0))
        assert policy.lists()["b1"] == [] and policy.lists()["b2"] == []

    def test_ghost_lists_stay_bounded(self) -> None:
        policy = ARCCachePolicy(8)
        simulate_keys = [i % 50 for i in range(1000)] + [i % 7 for i in range(200)]
        result = simulate("arc", 8, simulate_keys)
        assert result.accesses == 1200
        for i in range(300):
            policy.on_store_miss([k(i)])
            if len(policy) >= 8:
                assert policy.evict(1) is not None
            policy.insert(k(i), ready_block(i))
            lists = policy.lists()
            assert len(lists["t1"]) + len(lists["b1"]) <= 8
            assert sum(len(v) for v in lists.values()) <= 16


def test_registry_names() -> None:
    assert set(POLICIES) == {"lru", "arc", "s3fifo", "lct", "auto"}
    assert get_policy_class("arc") is ARCCachePolicy


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownPolicyError, match="valid policies: arc, auto, lct, lru, s3fifo"):
        get_policy_class("mru")
    with pytest.raises(UnknownPolicyError):
        simulate("fifo", 4, [1, 2, 3])


class TestS3FIFO(PolicyTests):
    policy_class = S3FIFOCachePolicy

    def test_new_blocks_enter_the_small_queue_and_leave_it_first(self) -> None:
        policy = S3FIFOCachePolicy(10)  # S holds 1 block's share
        self.fill(policy, range(10))
        assert policy.queues()["small"] == [k(i) for i in range(10)]
        evicted = policy.evict(1)
        assert evicted is not None and evicted[0][0] == k(0)
        assert policy.queues()["ghost"] == [k(0)]

    def test_a_block_hit_in_the_small_queue_moves_to_main(self) -> None:
        policy = S3FIFOCachePolicy(10)
        self.fill(policy, range(10))
        policy.touch([k(0)])
        evicted = policy.evict(1)
        assert evicted is not None and evicted[0][0] == k(1)  # 0 moved to M instead
        assert policy.queues()["main"] == [k(0)] and policy.frequency(k(0)) == 0

    def test_a_ghost_comes_back_to_main(self) -> None:
        policy = S3FIFOCachePolicy(10)
        self.fill(policy, range(10))
        assert policy.evict(1) is not None  # 0 becomes a ghost
        policy.on_store_miss([k(0)])
        policy.insert(k(0), ready_block(0))
        assert policy.queues()["main"] == [k(0)] and policy.queues()["ghost"] == []

    def test_main_reinserts_a_block_while_its_counter_is_above_zero(self) -> None:
        policy = S3FIFOCachePolicy(10, small=0.1)
        for i in range(3):  # three blocks in M, via the ghost queue
            policy.insert(k(i), ready_block(i))
            assert policy.evict(1) is not None
            policy.insert(k(i), ready_block(i))
        assert policy.queues()["main"] == [k(0), k(1), k(2)]
        policy.touch([k(0), k(0)])  # counter 2
        evicted = policy.evict(2)  # S is empty: M, where 0 is reinserted twice
        assert evicted is not None and [key for key, _ in evicted] == [k(1), k(2)]
        assert policy.queues()["main"] == [k(0)] and policy.frequency(k(0)) == 1

    def test_the_counter_stops_at_three(self) -> None:
        policy = S3FIFOCachePolicy(10)
        self.fill(policy, range(1))
        policy.touch([k(0)] * 5)
        assert policy.frequency(k(0)) == 3

    def test_it_beats_lru_on_one_off_scans_over_a_hot_set(self) -> None:
        keys: list[int] = []
        fresh = 10_000
        for _ in range(200):
            keys.extend(range(20))  # a hot set of 20
            keys.extend(range(fresh, fresh + 40))  # a scan, never read again
            fresh += 40
        assert simulate("s3fifo", 40, keys).hit_ratio > simulate("lru", 40, keys).hit_ratio + 0.2

    @pytest.mark.parametrize("options", [{"small": 0.0}, {"ghosts": -1.0}, {"move_threshold": 4}])
    def test_rejects_bad_options(self, options: dict[str, float]) -> None:
        with pytest.raises(InvalidValueError, match="s3fifo"):
            S3FIFOCachePolicy(10, **options)  # type: ignore[arg-type]
