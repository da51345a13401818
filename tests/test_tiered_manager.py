"""TieredManager: scenario tests and a state machine over a symbolic byte model.

The model gives every tier an array of slots whose "bytes" are the key last written there. Jobs
copy slot contents step by step, in any interleaving with other operations. After every step,
every readable block of every tier must hold its own key: that is "never wrong bytes" for the
chain's decisions, independent of any real storage.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager import (
    JobKind,
    TieredManager,
    TransferJob,
    make_tier_manager,
)
from kvtier.specs import BlockIDsLoadStoreSpec


def k(i: int) -> OffloadKey:
    return key_from_int(i)


def ks(*ids: int) -> list[OffloadKey]:
    return [k(i) for i in ids]


class Model:
    """Symbolic slots for each tier of a TieredManager, and a job runner over them."""

    def __init__(self, manager: TieredManager) -> None:
        self.manager = manager
        self.slots: list[list[OffloadKey | None]] = [
            [None] * tier.backend.num_blocks for tier in manager.tiers
        ]

    def run(
        self,
        job: TransferJob,
        fail: set[tuple[int, OffloadKey]] | None = None,
        corrupt: set[tuple[int, OffloadKey]] | None = None,
    ) -> None:
        failed = set(fail or ())
        for step in job.steps:
            for key, s, d in zip(step.keys, step.src_ids, step.dst_ids, strict=True):
                if (step.src, key) in failed:
                    failed.add((step.dst, key))
                    continue
                assert self.slots[step.src][int(s)] == key, f"{job}: source slot lost {key!r}"
                if (step.dst, key) not in failed:
                    self.slots[step.dst][int(d)] = key
        self.manager.complete_job(job, failed, corrupt or ())

    def put(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        out = self.manager.prepare_store(keys)
        if out is None:
            return []
        if out.demotion is not None:
            self.run(out.demotion)
        assert isinstance(out.store_spec, BlockIDsLoadStoreSpec)
        for key, slot in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
            self.slots[0][int(slot)] = key
        self.manager.complete_store(out.keys_to_store)
        return out.keys_to_store

    def drain(self) -> None:
        for job in self.manager.take_jobs():
            self.run(job)

    def verify(self) -> None:
        for index, tier in enumerate(self.manager.tiers):
            for key, block in tier.policy.items():
                if block.ref_cnt >= 0:
                    held = self.slots[index][block.block_id]
                    assert held == key, f"tier {tier.name}: slot {block.block_id} holds {held!r}"
            tier.check()


def chain(*sizes: int, policy: str = "lru", write_policy: str = "write-back") -> TieredManager:
    media = ["gpu", "cpu", "disk"][-len(sizes) :] if len(sizes) <= 3 else ["cpu"] * len(sizes)
    tiers = [
        make_tier_manager(size, 64, medium, policy, name=f"t{i}")
        for i, (size, medium) in enumerate(zip(sizes, media, strict=True))
    ]
    return TieredManager(tiers, write_policy=write_policy)  # type: ignore[arg-type]


def test_new_blocks_go_to_the_top_and_victims_are_demoted() -> None:
    model = Model(chain(2, 4))
    model.put(ks(1, 2))
    out = model.manager.prepare_store(ks(3))
    assert out is not None and out.keys_to_store == ks(3) and out.evicted_keys == ks(1)
    assert out.demotion is not None and out.demotion.kind is JobKind.DEMOTE
    step = out.demotion.steps[0]
    assert (step.src, step.dst, step.keys) == (0, 1, (k(1),))
    assert model.manager.lookup(k(1)) is None  # on its way down
    model.run(out.demotion)
    assert model.manager.locate(k(1)) == (1, True)
    model.verify()


def test_bottom_tier_drops_its_victims() -> None:
    model = Model(chain(1, 1))
    for i in range(3):
        model.put(ks(i))
    assert model.manager.locate(k(0)) is None
    assert model.manager.counters.dropped_at_bottom == 1
    removed = [e for e in model.manager.take_events() if e.removed and e.tier == "t1"]
    assert [e.keys for e in removed] == [(k(0),)]


def test_hit_below_is_promoted_and_lookup_asks_again_meanwhile() -> None:
    model = Model(chain(2, 4, 8))
    for i in range(8):
        model.put(ks(i))
    where = model.manager.locate(k(0))
    assert where == (2, True)
    assert model.manager.lookup(k(0)) is None
    jobs = model.manager.take_jobs()
    assert [job.kind for job in jobs] == [JobKind.PROMOTE]
    assert model.manager.lookup(k(0)) is None  # still in flight: single job
    assert model.manager.take_jobs() == []
    model.run(jobs[0])
    assert model.manager.lookup(k(0)) is True
    assert model.manager.locate(k(0)) == (0, True)
    model.verify()


def test_promotion_of_a_prefix_is_one_job_per_source_tier() -> None:
    model = Model(chain(4, 8))
    for i in range(8):
        model.put(ks(i))
    answers = model.manager.lookup_many(ks(0, 1, 2, 3))
    assert answers == [None] * 4
    jobs = model.manager.take_jobs()
    assert len(jobs) == 1 and jobs[0].promoted == tuple(ks(0, 1, 2, 3))
    model.run(jobs[0])
    assert model.manager.lookup_many(ks(0, 1, 2, 3)) == [True] * 4
    model.verify()


def test_a_promotion_hold_pins_what_arrives_for_its_reader() -> None:
    model = Model(chain(2, 4))
    for i in range(4):
        model.put(ks(i))
    assert model.manager.lookup_many(ks(0, 1)) == [None, None]
    (job,) = model.manager.take_jobs()
    hold = model.manager.hold_promotion(ks(0, 1, 7))
    assert hold is not None and hold.keys == tuple(ks(0, 1)) and hold.granted is None
    model.run(job)
    assert hold.granted == ks(0, 1)
    assert model.manager.top.stats().pinned == 2  # held for the reader, not evictable
    model.manager.release_hold(hold)
    assert model.manager.top.stats().pinned == 0
    assert model.manager.hold_promotion(ks(0)) is None  # nothing in flight any more
    model.verify()


def test_a_joined_promotion_is_counted_once_per_reader_in_the_tier_it_reads() -> None:
    """A reader whose look-up started the promotion has it counted there (and in its
    ledger); a reader that joins it is counted by `count_joined_hits`, a hit of the tier
    the promotion reads from: hits + misses = lookups for both."""
    model = Model(chain(2, 4))
    manager = model.manager
    for i in range(4):
        model.put(ks(i))
    before = (manager.counters.lookups, list(manager.counters.hits))
    ledger: set[bytes] = set()
    assert manager.lookup_many(ks(0, 1), counted=ledger) == [None, None]
    assert ledger == set(ks(0, 1))
    (job,) = manager.take_jobs()
    assert manager.lookup_many(ks(0, 1), counted=set()) == [None, None]  # "ask again"
    assert manager.counters.lookups == before[0] + 2  # the second asked, counted nothing
    hold = manager.hold_promotion(ks(0, 1))
    assert hold is not None and hold.source == 1
    model.run(job)
    manager.count_joined_hits(hold, ks(0, 1))
    assert manager.counters.lookups == before[0] + 4
    assert manager.counters.hits == [before[1][0], before[1][1] + 4]
    assert manager.counters.lookups == manager.counters.misses + sum(manager.counters.hits)
    manager.release_hold(hold)
    model.verify()


def test_a_released_hold_before_completion_pins_nothing() -> None:
    model = Model(chain(2, 4))
    for i in range(4):
        model.put(ks(i))
    model.manager.lookup_many(ks(0))
    (job,) = model.manager.take_jobs()
    hold = model.manager.hold_promotion(ks(0))
    assert hold is not None
    model.manager.release_hold(hold)
    model.run(job)
    assert hold.granted is None and model.manager.top.stats().pinned == 0


def test_lookup_many_stops_at_the_first_miss() -> None:
    model = Model(chain(4, 4))
    model.put(ks(1, 2))
    assert model.manager.lookup_many(ks(1, 9, 2)) == [True, False]


def test_promotion_without_space_is_a_miss() -> None:
    model = Model(chain(1, 4))
    model.put(ks(1))
    model.put(ks(2))  # 1 demoted
    model.manager.prepare_load(ks(2))  # the only top slot is pinned
    assert model.manager.lookup(k(1)) is False
    assert model.manager.counters.promotions_refused == 1
    assert model.manager.take_jobs() == []
    model.manager.complete_load(ks(2))
    model.verify()


def test_failed_copy_leaves_no_trace_and_releases_pins() -> None:
    model = Model(chain(2, 4))
    model.put(ks(1, 2))
    model.put(ks(3, 4))  # 1 and 2 demoted
    assert model.manager.lookup(k(1)) is None
    (job,) = model.manager.take_jobs()
    model.run(job, fail={(0, k(1))})
    assert model.manager.locate(k(1)) == (1, True)  # still below, unpinned
    assert model.manager.tiers[1].stats().pinned == 0
    assert model.manager.counters.copy_failures == 1
    model.verify()


def test_corrupt_source_is_dropped() -> None:
    model = Model(chain(1, 4))
    model.put(ks(1))
    model.put(ks(2))
    model.manager.lookup(k(1))
    (job,) = model.manager.take_jobs()
    model.run(job, fail={(1, k(1))}, corrupt={(1, k(1))})
    assert model.manager.locate(k(1)) is None
    assert model.manager.counters.corrupt_dropped == 1
    model.verify()


def test_completing_a_job_twice_is_an_error() -> None:
    model = Model(chain(1, 4))
    model.put(ks(1))
    out = model.manager.prepare_store(ks(2))
    assert out is not None and out.demotion is not None
    model.run(out.demotion)
    with pytest.raises(BlockStateError, match="not open"):
        model.manager.complete_job(out.demotion)


def test_write_through_cascades_and_makes_eviction_free() -> None:
    model = Model(chain(2, 4, 8, write_policy="write-through"))
    model.put(ks(1, 2))
    (job,) = model.manager.take_jobs()
    assert job.kind is JobKind.CASCADE
    assert [(s.src, s.dst) for s in job.steps] == [(0, 1), (1, 2)]
    model.run(job)
    assert model.manager.tiers[2].lookup(k(1)) is True
    out = model.manager.prepare_store(ks(3, 4))
    assert out is not None and out.evicted_keys == ks(1, 2) and out.demotion is None
    model.verify()


def test_a_block_below_is_not_stored_again() -> None:
    model = Model(chain(1, 4))
    model.put(ks(1))
    model.put(ks(2))
    out = model.manager.prepare_store(ks(1, 3))
    assert out is not None and out.keys_to_store == ks(3)


def test_bad_construction() -> None:
    with pytest.raises(InvalidValueError, match="at least one tier"):
        TieredManager([])
    with pytest.raises(InvalidValueError, match="write_policy"):
        chain(1, write_policy="sometimes")
    a = make_tier_manager(2, 64, "cpu", name="x")
    b = make_tier_manager(2, 128, "disk", name="y")
    with pytest.raises(InvalidValueError, match="block size"):
        TieredManager([a, b])


# -- the state machine -----------------------------------------------------------------------

KEYS = [k(i) for i in range(24)]


class ChainMachine(RuleBasedStateMachine):
    """Random puts, prefix lookups, reads and out-of-order job completion on a small chain."""

    sizes: tuple[int, ...] = (2, 3, 5)
    policy = "lru"
    write_policy = "write-back"

    def __init__(self) -> None:
        super().__init__()
        self.model = Model(chain(*self.sizes, policy=self.policy, write_policy=self.write_policy))
        self.jobs: list[TransferJob] = []

    @rule(ids=st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=4))
    def put(self, ids: list[int]) -> None:
        self.model.put([KEYS[i] for i in ids])
        self.jobs.extend(self.model.manager.take_jobs())

    @rule(ids=st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=5))
    def lookup(self, ids: list[int]) -> None:
        answers = self.model.manager.lookup_many([KEYS[i] for i in ids])
        assert len(answers) <= len(ids)
        self.jobs.extend(self.model.manager.take_jobs())

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data(), fail=st.booleans())
    def complete_a_job(self, data: st.DataObject, fail: bool) -> None:
        job = self.jobs.pop(data.draw(st.integers(0, len(self.jobs) - 1)))
        failures: set[tuple[int, OffloadKey]] = set()
        if fail and job.steps:
            step = job.steps[0]
            failures.add((step.dst, step.keys[0]))
        self.model.run(job, failures)
        self.jobs.extend(self.model.manager.take_jobs())

    @rule(ids=st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=3, unique=True))
    def read_top(self, ids: list[int]) -> None:
        keys = [KEYS[i] for i in ids if self.model.manager.top.lookup(KEYS[i]) is True]
        if not keys:
            return
        spec = self.model.manager.prepare_load(keys)
        assert isinstance(spec, BlockIDsLoadStoreSpec)
        for key, slot in zip(keys, spec.block_ids, strict=True):
            assert self.model.slots[0][int(slot)] == key
        self.model.manager.touch(keys)
        self.model.manager.complete_load(keys)

    @invariant()
    def bytes_match_bookkeeping(self) -> None:
        self.model.verify()

    @invariant()
    def open_jobs_are_the_ones_held(self) -> None:
        assert {j.id for j in self.model.manager.open_jobs()} == {j.id for j in self.jobs}

    def teardown(self) -> None:
        while self.jobs:
            self.model.run(self.jobs.pop())
            self.jobs.extend(self.model.manager.take_jobs())
        for tier in self.model.manager.tiers:
            stats = tier.stats()
            assert stats.pinned == 0 and stats.pending == 0, stats
        self.model.verify()


_settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class _ArcMachine(ChainMachine):
    policy = "arc"


class _ThroughMachine(ChainMachine):
    write_policy = "write-through"
    sizes = (2, 4, 6)


TestChainLRU = ChainMachine.TestCase
TestChainLRU.pytestmark = [pytest.mark.slow]
TestChainLRU.settings = _settings
TestChainARC = _ArcMachine.TestCase
TestChainARC.pytestmark = [pytest.mark.slow]
TestChainARC.settings = _settings
TestChainWriteThrough = _ThroughMachine.TestCase
TestChainWriteThrough.pytestmark = [pytest.mark.slow]
TestChainWriteThrough.settings = _settings
