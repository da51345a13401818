"""A hypothesis state machine that drives a TierManager against a plain model.

The model is a dict of key -> ref count (-1 pending, 0 ready, n pinned n times) and the list
of events the manager owes. After every step the machine checks: capacity never exceeded, no
pinned or pending block ever evicted, ref counts exact, lookups agree, events match state, and
`TierManager.check()` passes.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.errors import BlockStateError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager import TierManager, make_tier_manager

KEY_POOL = [key_from_int(i) for i in range(12)]
key_lists = st.lists(st.sampled_from(KEY_POOL), min_size=1, max_size=5)


class TierManagerMachine(RuleBasedStateMachine):
    """Subclass with `policy` and `capacity` set (see `make_tier_manager_machine`)."""

    policy = "lru"
    capacity = 5

    def __init__(self) -> None:
        super().__init__()
        self.manager: TierManager = make_tier_manager(self.capacity, 64, "cpu", self.policy)
        self.refs: dict[OffloadKey, int] = {}
        self.expected_events: list[tuple[bool, tuple[OffloadKey, ...]]] = []

    # -- helpers ----------------------------------------------------------------------------

    def _snapshot(self) -> dict[OffloadKey, int]:
        return {key: block.ref_cnt for key, block in self.manager.policy.items()}

    def _keys_with(self, predicate: Callable[[int], bool]) -> list[OffloadKey]:
        return [key for key, ref in self.refs.items() if predicate(ref)]

    # -- rules ------------------------------------------------------------------------------

    @rule(keys=key_lists)
    def prepare_store(self, keys: list[OffloadKey]) -> None:
        unique = list(dict.fromkeys(keys))
        new = [key for key in unique if key not in self.refs]
        evictable_elsewhere = [
            key for key, ref in self.refs.items() if ref == 0 and key not in unique
        ]
        needed = len(new) - (self.capacity - len(self.refs))
        before = self._snapshot()
        out = self.manager.prepare_store(keys)
        if out is None:
            assert self._snapshot() == before, "a failed prepare_store changed the tier"
            assert needed > len(evictable_elsewhere), "prepare_store refused with room to make"
            return
        assert out.keys_to_store == new
        assert len(out.evicted_keys) == max(needed, 0) if new else out.evicted_keys == []
        for victim in out.evicted_keys:
            assert victim in evictable_elsewhere, f"evicted {victim!r}: pinned, pending or ours"
            del self.refs[victim]
        if out.evicted_keys:
            self.expected_events.append((True, tuple(out.evicted_keys)))
        for key in new:
            self.refs[key] = -1

    @precondition(lambda self: any(ref == -1 for ref in self.refs.values()))
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        pending = self._keys_with(lambda ref: ref == -1)
        chosen = data.draw(st.lists(st.sampled_from(pending), min_size=1, unique=True))
        ready = self._keys_with(lambda ref: ref >= 0)
        extra = data.draw(st.lists(st.sampled_from(ready), max_size=2)) if ready else []
        self.manager.complete_store(chosen + extra, success=success)
        for key in chosen:
            if success:
                self.refs[key] = 0
            else:
                del self.refs[key]
        if success:
            self.expected_events.append((False, tuple(chosen)))

    @precondition(lambda self: any(ref >= 0 for ref in self.refs.values()))
    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        ready = self._keys_with(lambda ref: ref >= 0)
        chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3))
        self.manager.prepare_load(chosen)
        self.manager.touch(chosen)
        for key in chosen:
            self.refs[key] += 1

    @precondition(lambda self: any(ref > 0 for ref in self.refs.values()))
    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        pinned = self._keys_with(lambda ref: ref > 0)
        chosen = data.draw(st.lists(st.sampled_from(pinned), min_size=1, unique=True))
        self.manager.complete_load(chosen)
        for key in chosen:
            self.refs[key] -= 1

    @rule(keys=key_lists)
    def touch(self, keys: list[OffloadKey]) -> None:
        self.manager.touch(keys)

    @rule(keys=key_lists)
    def bad_load_changes_nothing(self, keys: list[OffloadKey]) -> None:
        if all(self.refs.get(key, -1) >= 0 for key in keys):
            return  # a valid load: not this rule's business
        before = self._snapshot()
        try:
            self.manager.prepare_load(keys)
        except BlockStateError:
            pass
        else:
            raise AssertionError("prepare_load of an absent or pending key did not raise")
        assert self._snapshot() == before

    @rule(keys=key_lists)
    def bad_unpin_changes_nothing(self, keys: list[OffloadKey]) -> None:
        counts: dict[OffloadKey, int] = {}
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        if all(self.refs.get(key, 0) >= count for key, count in counts.items()):
            return  # a valid unpin
        before = self._snapshot()
        try:
            self.manager.complete_load(keys)
        except BlockStateError:
            pass
        else:
            raise AssertionError("complete_load of an unpinned key did not raise")
        assert self._snapshot() == before

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def state_matches_the_model(self) -> None:
        assert len(self.manager) <= self.capacity
        assert self._snapshot() == self.refs
        for key in KEY_POOL:
            ref = self.refs.get(key)
            expected = False if ref is None else (None if ref == -1 else True)
            assert self.manager.lookup(key) is expected
        self.manager.check()
        stats = self.manager.stats()
        assert stats.pending == sum(1 for ref in self.refs.values() if ref == -1)
        assert stats.pinned == sum(1 for ref in self.refs.values() if ref > 0)
        assert stats.free == self.capacity - len(self.refs)

    @invariant()
    def events_match_state(self) -> None:
        events = self.manager.take_events()
        assert [(event.removed, event.keys) for event in events] == self.expected_events
        self.expected_events = []


def make_tier_manager_machine(policy: str, capacity: int = 5) -> type[TierManagerMachine]:
    """A TierManagerMachine subclass for `policy`, ready for `.TestCase`."""
    return type(
        f"TierManagerMachine_{policy}",
        (TierManagerMachine,),
        {"policy": policy, "capacity": capacity},
    )
