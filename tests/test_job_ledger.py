"""JobLedger on its own: what it opens, queues, tracks and settles (no planner involved).

The chain's scenarios (`test_tiered_manager.py`) drive it through TieredManager; these check
the ledger's own promises with jobs built by hand over one slot-pool tier.
"""

from __future__ import annotations

import pytest

from kvtier.errors import BlockStateError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager import ChainCounters, JobKind, TierManager, TransferJob, make_tier_manager
from kvtier.manager.ledger import JobLedger


def one_tier(*ready: int) -> tuple[TierManager, JobLedger, list[OffloadKey]]:
    """A tier of 4 slots holding `ready` keys, readable, and a ledger over it."""
    tier = make_tier_manager(4, 64, "cpu", name="t0")
    keys = [key_from_int(i) for i in ready]
    out = tier.prepare_store(keys)
    assert out is not None and out.keys_to_store == keys
    tier.complete_store(keys)
    return tier, JobLedger([tier], ChainCounters(hits=[0])), keys


def test_a_job_with_nothing_to_do_is_not_opened() -> None:
    _, ledger, _ = one_tier()
    job = TransferJob(JobKind.DEMOTE)
    assert ledger.emit(job) is None
    assert not ledger.is_open(job) and ledger.take_jobs() == [] and ledger.open_jobs() == []


def test_an_unqueued_job_is_open_but_not_in_the_outbox_and_settles_once() -> None:
    tier, ledger, keys = one_tier(1)
    tier.prepare_load(keys)  # the job's source pin, which the ledger gives back
    job = TransferJob(JobKind.CASCADE, pins=[(0, tuple(keys))])
    assert ledger.emit(job, queue=False) is job
    assert ledger.take_jobs() == [] and ledger.open_jobs() == [job]
    ledger.complete_job(job)
    assert tier.stats().pinned == 0 and not ledger.is_open(job)
    with pytest.raises(BlockStateError, match="not open"):
        ledger.complete_job(job)


def test_a_promotion_is_tracked_until_settled_and_its_reader_gets_its_blocks_pinned() -> None:
    tier, ledger, keys = one_tier(1, 2)
    tier.prepare_load(keys)
    job = TransferJob(JobKind.PROMOTE, pins=[(0, tuple(keys))], promoted=tuple(keys), source=0)
    ledger.emit(job)
    assert ledger.take_jobs() == [job] and ledger.take_jobs() == []
    assert ledger.promotion_of(keys[0]) is job
    hold = ledger.hold_promotion([*keys, key_from_int(9)])
    assert hold is not None and hold.keys == tuple(keys) and hold.granted is None
    ledger.settle_tiers(job, [0])  # the top's copies are done: the reader gets them now
    assert hold.granted == keys and ledger.promotion_of(keys[0]) is None
    ledger.complete_job(job)
    assert tier.stats().pinned == 2  # the job's pins given back, the reader's held
    ledger.release_hold(hold)
    assert tier.stats().pinned == 0 and hold.granted == []
