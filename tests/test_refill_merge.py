"""The background refills of one store, folded into one copy per pair of tiers
(`ChainPlanner._fold`, `TieredManager(merge_demotions_up_to=...)`): the chain decides exactly
what it decides without folding (the same blocks in the same tiers after every put), every
block's bytes stay right (the symbolic byte model of `test_tiered_manager`), and only the
copies are grouped: fewer copies into the tier below, the same blocks copied."""

from __future__ import annotations

from collections import Counter

import pytest
from test_tiered_manager import Model, k

from kvtier.errors import InvalidValueError
from kvtier.manager import TieredManager, TransferJob, make_tier_manager

WATERMARKS = [(0.25, 0.5), (0.85, 0.95), None]


def three_tiers(merge: int, four: bool = False) -> TieredManager:
    """gpu 8, cpu 16, disk 64 blocks; the gpu tier keeps a larger reserve than the cpu
    tier, so its refill evicts from the cpu tier as the cpu tier's own refill does.
    `four`: a disk of 24 blocks keeping a reserve too, over a second one of 64 (so a folded
    refill has deeper steps, which must run before the copy they make room for)."""
    sizes = ((8, "gpu"), (16, "cpu"), (24, "disk"), (64, "disk")) if four else None
    sizes = sizes or ((8, "gpu"), (16, "cpu"), (64, "disk"))
    tiers = [
        make_tier_manager(size, 64, medium, "lru", name=f"{medium}{i}")
        for i, (size, medium) in enumerate(sizes)
    ]
    marks = [*WATERMARKS[:2], (0.85, 0.95), None] if four else WATERMARKS
    return TieredManager(tiers, watermarks=marks, merge_demotions_up_to=merge)


class Recorder(Model):
    """The byte model, recording every job it runs."""

    def __init__(self, manager: TieredManager) -> None:
        super().__init__(manager)
        self.jobs: list[TransferJob] = []

    def run(self, job: TransferJob, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.jobs.append(job)
        super().run(job, *args, **kwargs)

    def contents(self) -> list[set[bytes]]:
        return [{key for key, _ in tier.policy.items()} for tier in self.manager.tiers]

    def copies(self) -> Counter[tuple[int, int]]:
        return Counter((step.src, step.dst) for job in self.jobs for step in job.steps)

    def blocks(self) -> Counter[tuple[int, int, bytes]]:
        steps = [step for job in self.jobs for step in job.steps]
        return Counter((step.src, step.dst, key) for step in steps for key in step.keys)


def replay(merge: int, puts: int = 60, four: bool = False) -> Recorder:
    """Puts of 3 new blocks each (and now and then one read again), each followed by
    running every job it planned, as `kvtier replay` drains after each put."""
    model = Recorder(three_tiers(merge, four))
    for i in range(puts):
        keys = [k(3 * i + j) for j in range(3)]
        if i % 7 == 3:
            keys[0] = k(3 * (i - 3))  # a block stored before: held somewhere, not stored again
        model.put(keys)
        model.drain()
        model.verify()
    return model


@pytest.mark.timeout(60)
def test_folded_refills_decide_the_same_and_copy_the_same_blocks_in_fewer_copies() -> None:
    plain = Recorder(three_tiers(0))
    folded = Recorder(three_tiers(1 << 20))
    for i in range(60):
        keys = [k(3 * i + j) for j in range(3)]
        for model in (plain, folded):
            model.put(keys)
            model.drain()
            model.verify()  # every readable block holds its own bytes
        assert folded.contents() == plain.contents()  # the same blocks in the same tiers
    assert folded.blocks() == plain.blocks()  # each block copied the same way, once
    assert folded.copies()[1, 2] < plain.copies()[1, 2]  # cpu -> disk: fewer copies
    assert folded.copies()[0, 1] == plain.copies()[0, 1]
    # A refill folded into the upper tier's: its copy down from the cpu tier is one step.
    assert any(
        [(s.src, s.dst) for s in job.steps] == [(1, 2), (0, 1)] and job.background
        for job in folded.jobs
    )
    for job in folded.jobs:
        pairs = [(step.src, step.dst) for step in job.steps]
        assert len(pairs) == len(set(pairs))  # never two copies between the same two tiers
    for model in (plain, folded):
        for tier in model.manager.tiers:
            assert tier.stats().pending == 0 and tier.stats().pinned == 0
            assert tier.num_draining == 0


@pytest.mark.timeout(60)
def test_refills_are_not_folded_past_the_limit() -> None:
    """A limit below the two copies' blocks keeps them apart (a merged copy must fit the
    chain's staging arena)."""
    plain, small, folded = replay(0), replay(2), replay(1 << 20)
    assert small.copies() == plain.copies()
    assert small.contents() == plain.contents()
    assert folded.copies()[1, 2] < plain.copies()[1, 2]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("four", [False, True])
def test_reads_again_and_folds_keep_every_byte_right(four: bool) -> None:
    """Puts that read back stored blocks too: the byte model's checks after every put; with
    four tiers, folded refills whose deeper steps are moved ahead of the copy."""
    plain, folded = replay(0, 120, four), replay(1 << 20, 120, four)
    assert folded.contents() == plain.contents()
    assert folded.blocks() == plain.blocks()
    assert folded.copies()[1, 2] < plain.copies()[1, 2]
    if four:  # some folded job carries a deeper step ahead of its cpu -> disk copy
        assert any(
            [(s.src, s.dst) for s in job.steps][:2] == [(2, 3), (1, 2)] and len(job.steps) > 2
            for job in folded.jobs
        )


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_merge_limit_must_be_an_int_of_zero_or_more(bad: object) -> None:
    tiers = [make_tier_manager(4, 64, "cpu", name="cpu"), make_tier_manager(8, 64, "disk")]
    with pytest.raises(InvalidValueError, match="merge_demotions_up_to"):
        TieredManager(tiers, merge_demotions_up_to=bad)  # type: ignore[arg-type]
