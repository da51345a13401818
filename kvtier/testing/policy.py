"""`PolicyTests`: the contract of a CachePolicy, as a pytest mixin."""

from __future__ import annotations

import random
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.policies import CachePolicy, simulate


def ready_block(block_id: int = 0, ref_cnt: int = 0) -> BlockStatus:
    """A block in a given state (ready and unpinned by default)."""
    block = BlockStatus(block_id)
    block.ref_cnt = ref_cnt
    return block


def k(i: int) -> OffloadKey:
    return key_from_int(i)


class PolicyTests:
    """Subclass and set `policy_class`; every test then runs against that policy.

    The suite checks the contract only (what any policy must do), never which block a policy
    chooses; policy-specific order belongs in the subclass.
    """

    policy_class: ClassVar[type[CachePolicy]]

    def make(self, capacity: int) -> CachePolicy:
        return self.policy_class(capacity)

    def fill(self, policy: CachePolicy, ids: range, ref_cnt: int = 0) -> None:
        for i in ids:
            policy.on_store_miss([k(i)])
            policy.insert(k(i), ready_block(i, ref_cnt))

    def test_registered_name(self) -> None:
        from kvtier.policies import POLICIES

        assert POLICIES[self.policy_class.name] is self.policy_class

    @pytest.mark.parametrize("capacity", [0, -1, 1.5, True, "4"])
    def test_rejects_bad_capacity(self, capacity: object) -> None:
        with pytest.raises(InvalidValueError, match="cache_capacity"):
            self.policy_class(capacity)  # type: ignore[arg-type]

    def test_insert_then_get_returns_the_same_block(self) -> None:
        policy = self.make(4)
        block = ready_block(7)
        assert policy.get(k(1)) is None
        policy.insert(k(1), block)
        assert policy.get(k(1)) is block
        assert k(1) in policy and k(2) not in policy
        assert len(policy) == 1
        assert dict(policy.items()) == {k(1): block}

    def test_insert_of_a_resident_key_raises(self) -> None:
        policy = self.make(4)
        policy.insert(k(1), ready_block(1))
        with pytest.raises(BlockStateError):
            policy.insert(k(1), ready_block(2))
        assert policy.get(k(1)) is not None and policy.get(k(1)).block_id == 1  # type: ignore[union-attr]

    def test_remove_forgets_and_rejects_absent(self) -> None:
        policy = self.make(4)
        self.fill(policy, range(3))
        policy.remove(k(1))
        assert policy.get(k(1)) is None and len(policy) == 2
        with pytest.raises(BlockStateError):
            policy.remove(k(1))

    def test_reinsert_after_remove(self) -> None:
        policy = self.make(2)
        self.fill(policy, range(2))
        policy.remove(k(0))
        block = ready_block(9)
        policy.insert(k(0), block)
        assert policy.get(k(0)) is block and len(policy) == 2

    def test_reinsert_after_evict(self) -> None:
        policy = self.make(2)
        self.fill(policy, range(2))
        evicted = policy.evict(2)
        assert evicted is not None and {key for key, _ in evicted} == {k(0), k(1)}
        self.fill(policy, range(2))
        assert len(policy) == 2

    def test_evict_zero_and_negative(self) -> None:
        policy = self.make(2)
        self.fill(policy, range(2))
        assert policy.evict(0) == []
        with pytest.raises(InvalidValueError):
            policy.evict(-1)
        assert len(policy) == 2

    def test_evict_returns_exactly_n_distinct_ready_blocks(self) -> None:
        policy = self.make(8)
        self.fill(policy, range(8))
        evicted = policy.evict(3)
        assert evicted is not None and len(evicted) == 3
        keys = [key for key, _ in evicted]
        assert len(set(keys)) == 3
        for key, block in evicted:
            assert policy.get(key) is None
            assert block.ref_cnt == 0, f"block.ref_cnt: got {block.ref_cnt!r}, expected {0!r}"
        assert len(policy) == 5

    def test_evict_never_takes_pinned_pending_or_protected(self) -> None:
        policy = self.make(9)
        self.fill(policy, range(0, 3), ref_cnt=1)  # pinned by a reader
        self.fill(policy, range(3, 6), ref_cnt=-1)  # being written
        self.fill(policy, range(6, 9))  # ready
        evicted = policy.evict(2, protected={k(6)})
        assert evicted is not None
        assert {key for key, _ in evicted} == {k(7), k(8)}
        assert policy.evict(1, protected={k(6)}) is None
        assert policy.get(k(6)) is not None

    def test_evict_is_atomic_when_it_cannot_take_n(self) -> None:
        policy = self.make(6)
        self.fill(policy, range(3))
        self.fill(policy, range(3, 6), ref_cnt=2)
        before = sorted((key, block.block_id, block.ref_cnt) for key, block in policy.items())
        assert policy.evict(4) is None
        assert policy.evict(3, protected={k(0)}) is None
        after = sorted((key, block.block_id, block.ref_cnt) for key, block in policy.items())
        assert before == after, f"before: got {before!r}, expected {after!r}"
        evicted = policy.evict(3)
        assert evicted is not None and {key for key, _ in evicted} == {k(0), k(1), k(2)}

    def test_pinned_block_becomes_evictable_once_unpinned(self) -> None:
        policy = self.make(2)
        self.fill(policy, range(2), ref_cnt=1)
        assert policy.evict(1) is None
        block = policy.get(k(1))
        assert block is not None
        block.ref_cnt = 0
        evicted = policy.evict(1)
        assert evicted == [(k(1), block)]

    def test_touch_ignores_absent_keys_and_keeps_residents(self) -> None:
        policy = self.make(3)
        self.fill(policy, range(3))
        policy.touch([k(99), k(1), k(98)])
        assert len(policy) == 3 and all(policy.get(k(i)) is not None for i in range(3))

    def test_clear_forgets_everything(self) -> None:
        policy = self.make(3)
        self.fill(policy, range(2))
        self.fill(policy, range(2, 3), ref_cnt=1)
        policy.clear()
        assert len(policy) == 0 and list(policy.items()) == []
        assert all(policy.get(k(i)) is None for i in range(3))
        assert policy.evict(1) is None
        self.fill(policy, range(3))
        assert len(policy) == 3

    def test_capacity_respected_under_the_tier_protocol(self) -> None:
        rng = random.Random(7)
        accesses = [rng.randrange(40) for _ in range(2000)]
        result = simulate(self.policy_class.name, 10, accesses)
        assert result.accesses == 2000, (
            f"result.accesses: got {result.accesses!r}, expected {2000!r}"
        )
        assert 0 < result.hits < 2000
        assert result.evictions == result.misses - result.refused - 10, (
            f"evictions: got {result.evictions!r}, expected {result.misses - result.refused - 10!r}"
        )

    def test_a_cache_larger_than_the_key_space_misses_once_per_key(self) -> None:
        rng = random.Random(3)
        accesses = [rng.randrange(30) for _ in range(500)]
        result = simulate(self.policy_class.name, 64, accesses)
        assert result.misses == len(set(accesses)), (
            f"result.misses: got {result.misses!r}, expected {len(set(accesses))!r}"
        )
        assert result.evictions == 0, f"result.evictions: got {result.evictions!r}, expected {0!r}"

    # One mixin method runs once per subclass; each run builds its own policy, so sharing the
    # method across executors is safe.
    @settings(
        max_examples=150, deadline=None, suppress_health_check=[HealthCheck.differing_executors]
    )
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["insert", "remove", "touch", "evict", "pin", "unpin"]),
                st.integers(0, 11),
                st.integers(0, 3),
            ),
            max_size=80,
        )
    )
    def test_random_operations_keep_the_contract(
        self, operations: list[tuple[str, int, int]]
    ) -> None:
        capacity = 6
        policy = self.make(capacity)
        model: dict[OffloadKey, BlockStatus] = {}
        for op, i, n in operations:
            key = k(i)
            if op == "insert" and key not in model and len(model) < capacity:
                policy.on_store_miss([key])
                block = ready_block(i, ref_cnt=-1 if n == 0 else 0)
                policy.insert(key, block)
                model[key] = block
            elif op == "remove" and key in model:
                policy.remove(key)
                del model[key]
            elif op == "touch":
                policy.touch([key, k((i + 1) % 12)])
            elif op == "pin" and key in model and model[key].ref_cnt >= 0:
                model[key].ref_cnt += 1
            elif op == "unpin" and key in model and model[key].ref_cnt > 0:
                model[key].ref_cnt -= 1
            elif op == "evict":
                protected = {k(i)}
                candidates = {
                    key
                    for key, block in model.items()
                    if block.ref_cnt == 0 and key not in protected
                }
                evicted = policy.evict(n, protected)
                if n > len(candidates):
                    assert evicted is None
                else:
                    assert evicted is not None and len(evicted) == n
                    for victim, block in evicted:
                        assert victim in candidates and model[victim] is block
                        del model[victim]
                    assert len({victim for victim, _ in evicted}) == n
            assert len(policy) == len(model) <= capacity
            assert dict(policy.items()) == model

    # -- reuse hints (kvtier.hints): the same rules for every policy -------------------------

    def victims(
        self, policy: CachePolicy, n: int, protected: set[OffloadKey] | None = None
    ) -> set[OffloadKey]:
        evicted = policy.evict(n, protected or set())
        assert evicted is not None
        return {key for key, _ in evicted}

    def test_hint_never_is_the_first_victim(self) -> None:
        policy = self.make(8)
        self.fill(policy, range(8))
        policy.touch([k(i) for i in range(8)])
        policy.hint(k(6), "never")
        policy.hint(k(2), "never")
        assert self.victims(policy, 1) == {k(6)}  # hinted first, first out
        assert self.victims(policy, 1) == {k(2)}
        assert len(policy) == 6

    def test_hint_never_skips_pinned_and_protected(self) -> None:
        policy = self.make(6)
        self.fill(policy, range(6))
        policy.hint(k(4), "never")
        policy.hint(k(5), "never")
        block = policy.get(k(4))
        assert block is not None
        block.ref_cnt = 1
        assert self.victims(policy, 1, {k(5)}) not in ({k(4)}, {k(5)})
        block.ref_cnt = 0
        assert self.victims(policy, 2) == {k(4), k(5)}

    def test_hint_unlikely_goes_after_never_and_before_the_rest(self) -> None:
        policy = self.make(8)
        self.fill(policy, range(8))
        policy.hint(k(7), "unlikely")
        policy.hint(k(5), "never")
        evicted = policy.evict(2)
        assert evicted is not None and [key for key, _ in evicted] == [k(5), k(7)]

    def test_hint_likely_is_protected_while_others_are_evictable(self) -> None:
        policy = self.make(6)
        self.fill(policy, range(6))
        for i in range(3):
            policy.hint(k(i), "likely")
        assert self.victims(policy, 3) == {k(3), k(4), k(5)}
        assert all(policy.get(k(i)) is not None for i in range(3))

    def test_hint_likely_never_makes_eviction_impossible(self) -> None:
        policy = self.make(6)
        self.fill(policy, range(6))
        for i in range(5):
            policy.hint(k(i), "likely")
        victims = self.victims(policy, 3)
        assert k(5) in victims and len(victims) == 3  # the unhinted block goes first
        assert self.victims(policy, 3) == {k(i) for i in range(5)} - victims
        assert len(policy) == 0
        self.fill(policy, range(2), ref_cnt=1)
        policy.hint(k(0), "likely")
        assert policy.evict(1) is None  # still None when nothing may be evicted

    def test_hint_is_withdrawn_by_none_by_a_hit_and_by_leaving(self) -> None:
        hinted, plain = self.make(6), self.make(6)
        for policy in (hinted, plain):
            self.fill(policy, range(6))
        hinted.hint(k(3), "never")
        hinted.hint(k(3), None)  # withdrawn
        hinted.hint(k(2), "unlikely")
        hinted.hint(k(4), "never")
        hinted.remove(k(4))  # left the tier: its hint with it
        plain.remove(k(4))
        for policy in (hinted, plain):
            policy.touch([k(2)])  # a hit disproves "unlikely"
            policy.on_store_miss([k(4)])
            policy.insert(k(4), ready_block(4))
        # nothing is hinted any more: the policy decides as if it never had been
        assert self.victims(hinted, 3) == self.victims(plain, 3)

    def test_hint_on_an_absent_key_is_ignored(self) -> None:
        policy = self.make(3)
        self.fill(policy, range(3))
        policy.hint(k(99), "never")
        policy.on_store_miss([k(99)])
        policy.insert(k(99), ready_block(99))  # over capacity is fine for the policy alone
        policy.hint(k(0), "never")
        assert self.victims(policy, 1) == {k(0)}

    @pytest.mark.parametrize("reuse", ["sometimes", "", 3, "NEVER"])
    def test_hint_rejects_a_bad_reuse(self, reuse: object) -> None:
        policy = self.make(3)
        self.fill(policy, range(3))
        with pytest.raises(InvalidValueError, match="reuse must be one of"):
            policy.hint(k(0), reuse)  # type: ignore[arg-type]

    def test_clear_forgets_hints(self) -> None:
        policy = self.make(3)
        self.fill(policy, range(3))
        policy.hint(k(2), "likely")
        policy.clear()
        self.fill(policy, range(3))
        assert len(self.victims(policy, 3)) == 3

    @settings(
        max_examples=100, deadline=None, suppress_health_check=[HealthCheck.differing_executors]
    )
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["insert", "remove", "touch", "evict", "pin", "unpin", "hint"]),
                st.integers(0, 11),
                st.integers(0, 3),
            ),
            max_size=80,
        )
    )
    def test_random_operations_with_hints_keep_the_contract(
        self, operations: list[tuple[str, int, int]]
    ) -> None:
        capacity = 6
        policy = self.make(capacity)
        model: dict[OffloadKey, BlockStatus] = {}
        hinted: dict[OffloadKey, str] = {}
        reuses = (None, "never", "unlikely", "likely")
        for op, i, n in operations:
            key = k(i)
            if op == "insert" and key not in model and len(model) < capacity:
                policy.on_store_miss([key])
                block = ready_block(i, ref_cnt=-1 if n == 0 else 0)
                policy.insert(key, block)
                model[key] = block
            elif op == "remove" and key in model:
                policy.remove(key)
                del model[key]
                hinted.pop(key, None)
            elif op == "hint":
                policy.hint(key, reuses[n])  # type: ignore[arg-type]
                hinted.pop(key, None)
                if key in model and reuses[n] is not None:
                    hinted[key] = reuses[n]  # type: ignore[assignment]
            elif op == "touch":
                policy.touch([key])
                if hinted.get(key) in ("never", "unlikely"):
                    del hinted[key]
            elif op == "pin" and key in model and model[key].ref_cnt >= 0:
                model[key].ref_cnt += 1
            elif op == "unpin" and key in model and model[key].ref_cnt > 0:
                model[key].ref_cnt -= 1
            elif op == "evict":
                self._check_hinted_evict(policy, model, hinted, n, {k(i)})
            assert len(policy) == len(model) <= capacity
            assert dict(policy.items()) == model

    def _check_hinted_evict(
        self,
        policy: CachePolicy,
        model: dict[OffloadKey, BlockStatus],
        hinted: dict[OffloadKey, str],
        n: int,
        protected: set[OffloadKey],
    ) -> None:
        candidates = [
            key for key, block in model.items() if block.ref_cnt == 0 and key not in protected
        ]
        evicted = policy.evict(n, protected)
        if n > len(candidates):
            assert evicted is None
            return
        assert evicted is not None and len(evicted) == n
        keys = [key for key, _ in evicted]
        assert len(set(keys)) == n and set(keys) <= set(candidates)
        rank = {"never": 0, "unlikely": 1}
        # every evictable "never" / "unlikely" block goes before any other block
        first = sorted(
            (key for key in candidates if hinted.get(key) in rank),
            key=lambda key: rank[hinted[key]],
        )
        assert set(keys[: len(first)]) == set(first[:n]) or set(keys) >= set(first[:n])
        # a "likely" block goes only when every unhinted evictable block went
        plain = [key for key in candidates if key not in hinted]
        if any(hinted.get(key) == "likely" for key in keys):
            assert set(plain) <= set(keys)
        for key in keys:
            del model[key]
            hinted.pop(key, None)
