"""`ManagerTests`: the contract of an OffloadingManager for one tier, as a pytest mixin."""

from __future__ import annotations

import pytest

from kvtier.errors import BlockStateError, ManagerClosedError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager import OffloadingManager, TierManager
from kvtier.specs import BlockIDsLoadStoreSpec


def k(i: int) -> OffloadKey:
    return key_from_int(i)


def keys(*ids: int) -> list[OffloadKey]:
    return [k(i) for i in ids]


class ManagerTests:
    """Subclass and implement `make_manager(num_blocks)`; override `check` to verify the
    manager's internal bookkeeping after each test step (default: `manager.check()` if any).

    Slots are read through `slots_of`, a backdoor on the returned spec, so the suite checks
    where blocks were placed independently of `prepare_load`.
    """

    block_size = 4096

    def make_manager(self, num_blocks: int) -> OffloadingManager:
        raise NotImplementedError

    def check(self, manager: OffloadingManager) -> None:
        check = getattr(manager, "check", None)
        if callable(check):
            check()

    @staticmethod
    def slots_of(spec: object) -> list[int]:
        assert isinstance(spec, BlockIDsLoadStoreSpec)
        return [int(i) for i in spec.block_ids]

    def stored(self, manager: OffloadingManager, ids: list[int]) -> None:
        out = manager.prepare_store(keys(*ids))
        assert out is not None
        manager.complete_store(keys(*ids))

    # -- lookup and the store lifecycle -----------------------------------------------------

    def test_lookup_follows_the_store_lifecycle(self) -> None:
        manager = self.make_manager(4)
        assert manager.lookup(k(1)) is False
        out = manager.prepare_store(keys(1))
        assert out is not None and out.keys_to_store == keys(1) and out.evicted_keys == []
        assert manager.lookup(k(1)) is None  # being written: ask again
        manager.complete_store(keys(1))
        assert manager.lookup(k(1)) is True
        self.check(manager)

    def test_prepare_store_skips_present_keys_and_duplicates(self) -> None:
        manager = self.make_manager(8)
        self.stored(manager, [1, 2])
        out = manager.prepare_store(keys(2, 3, 3, 1, 4))
        assert out is not None
        assert out.keys_to_store == keys(3, 4)
        slots = self.slots_of(out.store_spec)
        assert len(slots) == 2 and len(set(slots)) == 2
        self.check(manager)

    def test_store_slots_are_distinct_and_within_the_pool(self) -> None:
        manager = self.make_manager(6)
        out = manager.prepare_store(keys(*range(6)))
        assert out is not None
        assert sorted(self.slots_of(out.store_spec)) == list(range(6))

    def test_failed_store_leaves_no_trace(self) -> None:
        manager = self.make_manager(2)
        self.stored(manager, [1])
        manager.take_events()
        out = manager.prepare_store(keys(2))
        assert out is not None
        manager.complete_store(keys(1, 2), success=False)  # 1 is ready: untouched
        assert manager.lookup(k(2)) is False
        assert manager.lookup(k(1)) is True
        assert manager.take_events() == []
        out = manager.prepare_store(keys(3))
        assert out is not None and out.evicted_keys == []  # the slot of 2 was freed
        self.check(manager)

    def test_complete_store_of_a_key_never_prepared_raises(self) -> None:
        manager = self.make_manager(2)
        with pytest.raises(BlockStateError):
            manager.complete_store(keys(5))

    def test_store_more_than_capacity_returns_none(self) -> None:
        manager = self.make_manager(3)
        assert manager.prepare_store(keys(*range(4))) is None
        assert all(manager.lookup(key) is False for key in keys(*range(4)))
        self.check(manager)

    # -- eviction ---------------------------------------------------------------------------

    def test_full_tier_evicts_and_reports_it(self) -> None:
        manager = self.make_manager(3)
        self.stored(manager, [1, 2, 3])
        manager.take_events()
        out = manager.prepare_store(keys(4))
        assert out is not None and len(out.evicted_keys) == 1
        victim = out.evicted_keys[0]
        assert victim in keys(1, 2, 3)
        assert manager.lookup(victim) is False
        events = manager.take_events()
        assert len(events) == 1 and events[0].removed and events[0].keys == (victim,)
        self.check(manager)

    def test_never_evicts_a_key_of_the_same_call(self) -> None:
        manager = self.make_manager(3)
        self.stored(manager, [1, 2, 3])
        out = manager.prepare_store(keys(1, 2, 4))
        assert out is not None and out.evicted_keys == keys(3)
        assert manager.lookup(k(1)) is True and manager.lookup(k(2)) is True

    def test_never_evicts_pinned_or_pending_blocks(self) -> None:
        manager = self.make_manager(3)
        self.stored(manager, [1, 2])
        manager.prepare_load(keys(1))
        assert manager.prepare_store(keys(3)) is not None  # pending, fills the last slot
        out = manager.prepare_store(keys(4))
        assert out is not None and out.evicted_keys == keys(2)
        assert manager.prepare_store(keys(5)) is None  # 1 pinned, 3 and 4 pending
        for key, expected in zip(keys(1, 3, 4, 5), (True, None, None, False), strict=True):
            assert manager.lookup(key) is expected
        manager.complete_load(keys(1))
        out = manager.prepare_store(keys(5))
        assert out is not None and out.evicted_keys == keys(1)
        self.check(manager)

    def test_none_changes_nothing(self) -> None:
        manager = self.make_manager(2)
        self.stored(manager, [1, 2])
        manager.prepare_load(keys(1, 2))
        manager.take_events()
        assert manager.prepare_store(keys(3, 4)) is None
        assert manager.take_events() == []
        assert [manager.lookup(key) for key in keys(1, 2, 3, 4)] == [True, True, False, False]
        self.check(manager)

    # -- loads ------------------------------------------------------------------------------

    def test_load_pins_and_points_at_the_stored_slots(self) -> None:
        manager = self.make_manager(4)
        out = manager.prepare_store(keys(1, 2))
        assert out is not None
        manager.complete_store(keys(1, 2))
        spec = manager.prepare_load(keys(2, 1))
        stored_slots = self.slots_of(out.store_spec)
        assert self.slots_of(spec) == [stored_slots[1], stored_slots[0]]
        manager.complete_load(keys(2, 1))
        self.check(manager)

    def test_load_of_absent_or_pending_key_raises_and_pins_nothing(self) -> None:
        manager = self.make_manager(2)
        self.stored(manager, [1])
        manager.prepare_store(keys(2))
        with pytest.raises(BlockStateError, match="not present"):
            manager.prepare_load(keys(1, 9))
        with pytest.raises(BlockStateError, match="being written"):
            manager.prepare_load(keys(1, 2))
        manager.complete_store(keys(2))
        # 1 was not left pinned by the failed calls: it can be evicted
        out = manager.prepare_store(keys(3))
        assert out is not None and out.evicted_keys == keys(1)
        self.check(manager)

    def test_unpin_of_unpinned_block_raises_and_changes_nothing(self) -> None:
        manager = self.make_manager(2)
        self.stored(manager, [1, 2])
        manager.prepare_load(keys(1))
        with pytest.raises(BlockStateError, match="not pinned"):
            manager.complete_load(keys(1, 2))
        with pytest.raises(BlockStateError):
            manager.complete_load(keys(1, 1))
        with pytest.raises(BlockStateError, match="not present"):
            manager.complete_load(keys(7))
        manager.complete_load(keys(1))  # still pinned once, as before
        with pytest.raises(BlockStateError):
            manager.complete_load(keys(1))
        self.check(manager)

    def test_two_readers_pin_twice(self) -> None:
        manager = self.make_manager(1)
        self.stored(manager, [1])
        manager.prepare_load(keys(1))
        manager.prepare_load(keys(1))
        manager.complete_load(keys(1))
        assert manager.prepare_store(keys(2)) is None
        manager.complete_load(keys(1))
        assert manager.prepare_store(keys(2)) is not None
        self.check(manager)

    # -- events and shutdown ----------------------------------------------------------------

    def test_events_report_stores_and_evictions_once(self) -> None:
        manager = self.make_manager(2)
        self.stored(manager, [1, 2])
        out = manager.prepare_store(keys(3))
        assert out is not None
        manager.complete_store(keys(3))
        events = manager.take_events()
        assert [(e.removed, e.keys) for e in events] == [
            (False, tuple(keys(1, 2))),
            (True, tuple(out.evicted_keys)),
            (False, tuple(keys(3))),
        ]
        assert all(e.block_size == self.block_size for e in events)
        assert manager.take_events() == []

    def test_shutdown_closes_the_manager(self) -> None:
        manager = self.make_manager(2)
        manager.shutdown()
        with pytest.raises(ManagerClosedError):
            manager.lookup(k(1))
        with pytest.raises(ManagerClosedError):
            manager.prepare_store(keys(1))


class TierManagerTests(ManagerTests):
    """ManagerTests plus TierManager's own promises (stats)."""

    def make_manager(self, num_blocks: int) -> OffloadingManager:
        raise NotImplementedError

    def test_stats_count_every_state(self) -> None:
        manager = self.make_manager(5)
        assert isinstance(manager, TierManager)
        self.stored(manager, [1, 2, 3])
        manager.prepare_load(keys(1))
        manager.prepare_store(keys(4))
        stats = manager.stats()
        assert (stats.num_blocks, stats.free, stats.pending, stats.evictable, stats.pinned) == (
            5,
            1,
            1,
            2,
            1,
        )
        assert stats.used == 4
