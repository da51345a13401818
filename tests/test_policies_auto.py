"""`auto`: the conformance suite, switches that keep every resident block and take over warm,
determinism, no flapping, and a workload that changes regime, where `auto` must follow the
candidate that wins."""

from __future__ import annotations

import functools
import itertools
import math
import os
import random
import subprocess
import sys

import pytest

from kvtier.blocks import BlockStatus
from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.policies import (
    POLICIES,
    ARCCachePolicy,
    AutoCachePolicy,
    CachePolicy,
    LRUCachePolicy,
    S3FIFOCachePolicy,
    partial_block_flags,
    simulate,
)
from kvtier.policies.auto import CANDIDATES
from kvtier.policies.lct import LCTCachePolicy
from kvtier.policies.lead_alarm import LeadAlarm
from kvtier.policies.sampling import sample_point
from kvtier.testing import PolicyTests
from kvtier.testing.policy import k, ready_block
from kvtier_tools.bench.policy_traces import regimes
from kvtier_tools.workloads.traces import MOONCAKE_BLOCK_TOKENS, read_mooncake


class TestAuto(PolicyTests):
    policy_class = AutoCachePolicy


def _resident(policy: CachePolicy) -> dict[OffloadKey, BlockStatus]:
    return dict(policy.items())


def test_registered_with_the_other_policies() -> None:
    assert POLICIES["auto"] is AutoCachePolicy


@pytest.mark.parametrize(
    "options",
    [
        {"candidates": ()},
        {"candidates": ("lct", "lct")},
        {"candidates": ("lct", "mru")},
        {"candidates": ("auto",)},
        {"decay": 1.0},
        {"epoch": 0.0},
        {"margin": -0.1},
        {"switch_cost": -1.0},
        {"min_gap": -1},
        {"probation": -1},
        {"trial": -1},
    ],
)
def test_rejects_bad_options(options: dict[str, object]) -> None:
    with pytest.raises(InvalidValueError, match="auto"):
        AutoCachePolicy(64, **options)  # type: ignore[arg-type]


def test_every_candidate_runs_at_full_capacity_on_every_access() -> None:
    policy = AutoCachePolicy(100)
    _drive(policy, list(range(150)))
    for name in policy.candidates:
        shadow = policy.shadow(name)
        assert shadow.cache_capacity == 100
        assert len(shadow) == 100 if name != "lct" else len(shadow) <= 100  # lct may refuse
    assert policy.accesses == 150 and policy.shadow("lct") is policy.policy


@pytest.mark.parametrize("target", ["arc", "lru", "s3fifo", "lct"])
def test_a_switch_keeps_every_resident_block_and_the_rules_of_evict(target: str) -> None:
    policy = AutoCachePolicy(
        12,
        candidates=("lct", "arc", "s3fifo", "lru")
        if target != "lct"
        else ("arc", "lct", "s3fifo", "lru"),
    )
    for i in range(12):
        policy.on_store_miss([k(i)])
        policy.insert(k(i), ready_block(i, ref_cnt=1 if i < 3 else (-1 if i < 5 else 0)))
    policy.touch([k(7), k(8)])
    before = _resident(policy)
    order = policy.lru_order()
    policy.serve_with(target)
    assert policy.serving == target and policy.policy.name == target
    assert _resident(policy) == before and _resident(policy.policy) == before
    assert policy.lru_order() == order
    # pinned (0-2), pending (3-4) and protected keys are never victims, before or after
    protected = {k(5), k(6)}
    evicted = policy.evict(5, protected)
    assert evicted is not None and len(evicted) == 5
    for key, block in evicted:
        assert key not in protected and block.ref_cnt == 0
        assert policy.get(key) is None and key not in policy.policy
    assert policy.evict(1, protected) is None  # 7 left: 3 pinned, 2 pending, 2 protected
    assert len(policy) == len(policy.policy) == 7


def _warmed(candidates: tuple[str, ...]) -> AutoCachePolicy:
    """An auto of 20 blocks after a mix of reuse and one-off keys (no switch yet)."""
    policy = AutoCachePolicy(20, candidates=candidates)
    rng = random.Random(4)
    _drive(policy, [rng.randrange(12) if rng.random() < 0.6 else 100 + i for i in range(400)])
    assert policy.switches == []
    return policy


def test_an_arc_takes_over_with_its_shadows_lists() -> None:
    policy = _warmed(("lru", "arc"))
    shadow = policy.shadow("arc")
    assert isinstance(shadow, ARCCachePolicy)
    resident = set(policy.lru_order())
    lists = {
        name: [key for key in keys if key in resident] for name, keys in shadow.lists().items()
    }
    policy.serve_with("arc")
    live = policy.policy
    assert isinstance(live, ARCCachePolicy) and live is not shadow
    assert live.lists()["t2"] == lists["t2"] and lists["t2"]
    # the shadow's T1 in its order, after what only the tier held (first in line)
    assert live.lists()["t1"][-len(lists["t1"]) :] == lists["t1"]
    assert _resident(live) == _resident(policy)


def test_an_lru_takes_over_in_its_shadows_order() -> None:
    policy = _warmed(("s3fifo", "lru"))
    shadow = policy.shadow("lru")
    assert isinstance(shadow, LRUCachePolicy)
    resident = set(policy.lru_order())
    order = [key for key in shadow.lru_order() if key in resident]
    policy.serve_with("lru")
    live = policy.policy
    assert isinstance(live, LRUCachePolicy)
    assert live.lru_order()[-len(order) :] == order
    assert set(live.lru_order()) == resident


def test_an_s3fifo_takes_over_with_its_queues_counters_and_ghosts() -> None:
    policy = _warmed(("lru", "s3fifo"))
    shadow = policy.shadow("s3fifo")
    assert isinstance(shadow, S3FIFOCachePolicy)
    resident = set(policy.lru_order())
    queues = {
        name: [key for key in keys if key in resident] for name, keys in shadow.queues().items()
    }
    ghosts = [key for key in shadow.queues()["ghost"] if key not in resident]
    # what the shadow held and the tier does not: ghosts, the newest, so they come back to M
    lacking = [
        key for name in ("main", "small") for key in shadow.queues()[name] if key not in resident
    ]
    assert lacking
    policy.serve_with("s3fifo")
    live = policy.policy
    assert isinstance(live, S3FIFOCachePolicy)
    assert live.queues()["main"] == queues["main"] and queues["main"]
    assert live.queues()["small"][-len(queues["small"]) :] == queues["small"]
    assert live.queues()["ghost"] == (ghosts + lacking)[-live.ghost_capacity :]
    assert all(live.frequency(key) == shadow.frequency(key) for key in queues["main"])
    key = lacking[-1]
    live.insert(key, ready_block(999))
    assert key in live.queues()["main"]


def test_an_lct_takes_over_with_what_its_shadow_learned() -> None:
    policy = _warmed(("lru", "lct"))
    shadow = policy.shadow("lct")
    assert isinstance(shadow, LCTCachePolicy)
    counts = {key: shadow.count(key) for key in policy.lru_order()}
    learned = (shadow.limits, shadow.horizon, shadow.expected)
    policy.serve_with("lct")
    assert policy.policy is shadow  # the shadow itself, with the tier's blocks
    assert (shadow.limits, shadow.horizon, shadow.expected) == learned
    assert {key: shadow.count(key) for key in counts} == counts
    assert _resident(shadow) == _resident(policy)


def test_a_policy_that_stops_serving_goes_on_as_a_shadow() -> None:
    policy = _warmed(("lct", "lru"))
    lct = policy.policy
    assert isinstance(lct, LCTCachePolicy)
    policy.serve_with("lru")
    assert policy.shadow("lct") is lct
    _drive(policy, [500, 501, 500])
    assert lct.count(k(500)) == 2  # it heard the accesses
    assert len(lct) <= 20


def _scans_then_a_loop(seed: int = 3) -> list[int]:
    """7,000 accesses of a hot set of 500 keys read at random among one-off scans (S3-FIFO
    keeps the hot set, LRU loses it to the scans), then a loop of 800 keys (LRU keeps it
    whole; an S3-FIFO that took over LRU's blocks puts the loop's new keys in its small
    queue, 10 % of the cache, and loses them before their next pass)."""
    rng = random.Random(seed)
    keys: list[int] = []
    fresh = 1_000_000
    while len(keys) < 7_000:
        if rng.random() < 0.5:
            keys.extend(range(fresh, fresh + 300))
            fresh += 300
        else:
            keys.extend(rng.randrange(500) for _ in range(100))
    return keys + list(itertools.islice(itertools.cycle(range(50_000, 50_800)), 20_000))


@pytest.mark.parametrize("probation", [16, 0])
def test_a_switch_that_does_worse_than_staying_is_undone(probation: int) -> None:
    """S3-FIFO's shadow leads during the scans and auto switches; the loop comes within the
    switch's probation, and the LRU that stopped serving, going on as a shadow from the same
    blocks, is ahead of the new S3-FIFO: the switch is undone, and auto has more hits than
    without a probation (which stays on S3-FIFO for `MIN_GAP` accesses)."""
    found = {}
    for policy_probation in (probation, 0):
        policy = AutoCachePolicy(
            1_000,
            candidates=("lru", "s3fifo"),
            min_epoch=250,
            probation=policy_probation,
            trial=0,  # the switch made at once, as without trials: its probation is tested
        )
        hits = sum(_access(policy, k(raw)) for raw in _scans_then_a_loop())
        found[policy_probation] = (hits, policy)
    hits, policy = found[probation]
    assert policy.switches[0][1] == "s3fifo" and policy.switches[0][0] < 7_000
    if probation:
        assert policy.reverts and policy.switches[1] == (policy.reverts[0], "lru")
        assert policy.reverts[0] <= policy.switches[0][0] + probation * policy.epoch
        assert policy.serving == "lru" and hits > found[0][0]
    else:
        assert policy.reverts == [] and policy.serving == "s3fifo"


def _decide_with_leads(policy: AutoCachePolicy, leads: list[int]) -> list[float]:
    """Drive `policy`'s decisions with made-up epochs: per epoch the serving candidate has
    100 hits and S3-FIFO 100 + the epoch's lead (the others 90). Returns S3-FIFO's faded lead
    over lct before each decision's switch, as the faded rule sees it."""
    faded = []
    for lead in leads:
        policy._hits = [100 + lead if name == "s3fifo" else 90 for name in policy.candidates]
        policy._hits[policy.serving_index] = 100
        policy.accesses += policy.epoch
        policy._decide()
        lct, s3fifo = policy.candidates.index("lct"), policy.candidates.index("s3fifo")
        faded.append(policy.scores[s3fifo] - policy.scores[lct])
    return faded


def test_a_small_steady_lead_takes_over_a_noise_of_the_same_size_does_not() -> None:
    """A lead of 10 hits an epoch, held: its faded score tops out near 50 hits, below the
    faded rule's margin plus switch cost (90), but its hits since the warm-up pass the same
    bar after ~10 epochs, and auto switches. A lead of +-13 hits that averages nothing never
    does; nor does the steady lead count the warm-up, or pass before the warm-up ends."""
    policy = AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000, trial=0)
    assert policy.epoch == 1_000
    bar = policy.margin * policy.epoch / (1 - policy.decay) + policy.switch_cost
    faded = _decide_with_leads(policy, [10 + (3 if i % 2 else -3) for i in range(60)])
    assert policy.switches and policy.switches[0][1] == "s3fifo"
    switched_at = policy.switches[0][0] // policy.epoch  # the decision it was made at
    assert policy.warmup + 5 < switched_at < 40
    assert max(faded[:switched_at]) < bar  # the faded rule alone would not have switched

    noisy = AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000, trial=0)
    _decide_with_leads(noisy, [13 if i % 2 else -13 for i in range(200)])
    assert noisy.switches == []

    early = AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000, trial=0)
    _decide_with_leads(early, [15] * early.warmup + [0] * 40)  # 240 hits, all in the warm-up
    assert early.switches == []


def test_a_bursty_steady_lead_takes_over_when_clear_of_its_own_noise() -> None:
    """S3-FIFO leads by 300 hits one epoch in eight, nothing between: the faded lead never
    clears its noise (one burst in its window), but the lead summed since the warm-up
    clears that sum's own noise after enough bursts, and auto switches (issue 34: lct's
    hits in a loop come in bursts; `regimes` at 1 % stayed on ARC through it, 0.2441).
    Without that test it never switches."""
    pattern = ([0] * 7 + [300]) * 30
    policy = AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000, trial=0)
    _decide_with_leads(policy, pattern)
    assert policy.switches and policy.switches[0][1] == "s3fifo"

    faded_only = AutoCachePolicy(
        4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000, trial=0
    )
    faded_only._steady_lead = lambda best, faded_clear: False  # type: ignore[method-assign]
    _decide_with_leads(faded_only, pattern)
    assert faded_only.switches == []


def _decide_with_trial(policy: AutoCachePolicy, leads: list[int], trial_leads: list[int]) -> None:
    """`_decide_with_leads`, and while a trial runs, its copy's hits each epoch: the serving
    candidate's 100 plus the next of `trial_leads`."""
    pending = iter(trial_leads)
    for lead in leads:
        if policy._trial is not None:
            policy._trial.hits = 100 + next(pending)
        _decide_with_leads(policy, [lead])


def test_a_switch_is_tried_from_the_tiers_blocks_first() -> None:
    """S3-FIFO's shadow leads clearly: auto starts a trial (a copy of S3-FIFO made from the
    tier's blocks) and switches only if that copy beats the serving policy; a copy that
    trails (the shadow's lead was in blocks the tier lacks) by more than a switch's cost is
    dropped after `trial` decisions, or once it trails by `revert_cost`, and nothing is
    switched; one that trails by less takes over at the end. Without trials (`trial=0`)
    the same leads switch at once."""

    def make(trial: int) -> AutoCachePolicy:
        return AutoCachePolicy(
            4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000, trial=trial
        )

    leads = [0] * 16 + [60] * 12
    dropped = make(8)
    _decide_with_trial(dropped, leads, [-20] * 40)  # -160 after 8 decisions: past the cost
    assert dropped.switches == [] and dropped.trials
    assert dropped.trials[0][1:] == ("s3fifo", False)

    behind = make(8)
    _decide_with_trial(behind, leads, [-150] * 40)  # past revert_cost (200) in two epochs
    assert behind.switches == [] and behind.trials[0][1:] == ("s3fifo", False)
    assert behind.trials[0][0] < dropped.trials[0][0]

    kept_up = make(8)  # -40 after 8 decisions: within a switch's cost (80), taken at the end
    _decide_with_trial(kept_up, leads, [-5] * 40)
    assert kept_up.trials[0] == (dropped.trials[0][0], "s3fifo", True)
    assert kept_up.serving == "s3fifo"

    taken = make(8)
    _decide_with_trial(taken, leads, [10] * 40)
    assert taken.trials[0][1:] == ("s3fifo", True)
    assert taken.switches == [(taken.trials[0][0], "s3fifo")] and taken.serving == "s3fifo"

    at_once = make(0)
    _decide_with_trial(at_once, leads, [])
    assert at_once.switches and at_once.switches[0][0] < taken.switches[0][0]
    assert taken.switches[0][0] < dropped.trials[0][0]
    assert at_once.trials == []


def test_a_takeover_is_measured_against_the_shadow_it_came_from() -> None:
    """After a switch to S3-FIFO its shadow goes on, as if the switch were free, for
    `probation` decisions: what the takeover lost is that shadow's hits minus the live
    policy's over them, here the hot set the tier (LRU's, lost to the scans) lacked, far
    more than `switch_cost`; an S3-FIFO that never stopped serving gets exactly those."""
    keys = _scans_then_a_loop()[:7_000]
    rng = random.Random(9)
    later = [rng.randrange(500) if rng.random() < 0.7 else 2_000_000 + i for i in range(4_000)]
    policy = AutoCachePolicy(
        1_000, candidates=("lru", "s3fifo"), min_epoch=250, warmup=10**6, trial=0
    )
    alone = S3FIFOCachePolicy(1_000)
    block = ready_block()
    block.ref_cnt = 0
    for raw in keys:
        _access(policy, k(raw))
        alone.access([k(raw)], block)
    policy.serve_with("s3fifo")
    assert policy.takeover_cost == 0.0
    live = shadow = 0
    for raw in later:  # 16 decisions of 250 accesses: the measure ends with the last one
        live += _access(policy, k(raw))
        shadow += alone.access([k(raw)], block)
    assert policy.decisions * policy.epoch == len(keys) + len(later)
    assert policy.takeover_cost == shadow - live
    assert policy.takeover_cost > 5 * policy.switch_cost


def test_the_measure_hears_moves_and_a_switch_to_lct_measures_nothing() -> None:
    """While a takeover is measured, a block moved into the tier (not an access) is stored
    in the shadow that goes on too, as in every shadow; lct's takeover is its shadow itself,
    so nothing goes on to measure it against and `takeover_cost` stays as it was."""
    policy = _warmed(("lct", "s3fifo"))
    policy.serve_with("s3fifo")
    assert policy._ideal is not None
    ideal = policy._ideal[1]
    assert ideal.get(k(900)) is None
    policy.on_store_move([k(900)])
    assert ideal.get(k(900)) is not None
    policy.takeover_cost = 123.0
    policy.serve_with("lct")
    assert policy._ideal is None and policy.takeover_cost == 123.0


def test_a_lead_must_clear_the_measured_takeover_cost() -> None:
    """A steady lead of 10 hits an epoch clears the margin plus `switch_cost` after ~10
    epochs; once a takeover was measured to cost 1,000 hits, the same lead does not switch
    within 60 epochs (it would have to pay for a takeover as costly as the last)."""
    switched = []
    for cost in (0.0, 1_000.0):
        policy = AutoCachePolicy(
            4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000, trial=0
        )
        policy.takeover_cost = cost
        _decide_with_leads(policy, [10 + (3 if i % 2 else -3) for i in range(60)])
        switched.append(policy.switches)
    assert switched[0] and switched[0][0][1] == "s3fifo"
    assert switched[1] == []


def _epoch_of(policy: AutoCachePolicy, hits: dict[str, int]) -> None:
    """One made-up epoch: each candidate's hits from `hits` (90 if absent), then a decision."""
    policy._hits = [hits.get(name, 90) for name in policy.candidates]
    policy.accesses += policy.epoch
    policy._decide()


def _noise_then_a_burst(policy: AutoCachePolicy, last: int) -> None:
    """Drive `policy` through the warm-up, 40 epochs of S3-FIFO's lead at -1,200 / +1,200
    (level: nothing since the warm-up after each pair), then one epoch of `last`."""
    noise = [1_200 if i % 2 else -1_200 for i in range(40)]
    _decide_with_leads(policy, [0] * policy.warmup + noise + [last])


def test_a_burst_with_a_steady_lead_switches_at_once_where_its_noise_hides_it() -> None:
    """S3-FIFO's lead swings by +-1,200 hits an epoch for 40 epochs, then one epoch gives it
    600 of the epoch's 1,000 accesses (P3 at 10 %: 15,663 of 19,064 after eight epochs of
    -3,203 to +8): no noise test can pass on one epoch, and a trial's copy would trail for
    capacities (the takeover's early loss). An epoch's lead past half its accesses, with a
    steady lead past the margin and the cost, switches at once, no trial; 450 does not,
    nor does a burst that leaves no steady lead (after a -1,200 epoch)."""

    def make() -> AutoCachePolicy:
        return AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000)

    policy = make()
    assert policy.burst_lead == pytest.approx(0.5 * policy.epoch)
    _noise_then_a_burst(policy, 600)
    assert policy.switches == [(policy.accesses, "s3fifo")]
    assert policy.trials == [] and policy._trial is None

    below = make()
    _noise_then_a_burst(below, 450)  # a steady lead of 450, not a burst
    assert below.switches == [] and below._trial is None

    behind = make()
    _decide_with_leads(behind, [0] * behind.warmup + [-1_200, 1_200] * 20 + [-1_200, 600])
    assert behind.switches == [] and behind._trial is None


@pytest.mark.parametrize("share", [0.5, 1.5])
def test_a_bursts_switch_is_undone_only_past_its_lead(share: float) -> None:
    """After a switch on a burst, the probation undoes it only if the candidate it replaced
    gets ahead of the new one by more than the steady lead that made it (the evidence), not
    by `revert_cost` as after any other switch: the takeover's early loss is what a late
    winner pays first (P3 at 10 %: undone at 610,048 accesses with `revert_cost`)."""
    policy = AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000)
    _noise_then_a_burst(policy, 600)
    assert policy.serving == "s3fifo" and policy._on_probation is not None
    lag = policy._on_probation[2]
    assert share * lag > 1.4 * policy.revert_cost  # 0.5 x the lead would undo any other
    per_epoch = round(share * lag / 8)  # lct ahead of the new S3-FIFO for 8 epochs
    for _ in range(8):
        _epoch_of(policy, {"s3fifo": 100, "lct": 100 + per_epoch})
    if share < 1:
        assert policy.reverts == [] and policy.serving == "s3fifo"
    else:
        assert len(policy.reverts) == 1 and policy.serving == "lct"


def _late_bursty_lead() -> list[int]:
    """S3-FIFO's per-epoch lead: none in the warm-up, then 40 epochs of +-100 (no lead),
    then a lead that comes in bursts, +600 / -200 / +500 / -100 (200 an epoch on average)."""
    return [0] * 16 + [100 if i % 2 else -100 for i in range(40)] + [600, -200, 500, -100] * 10


def test_a_late_lead_beyond_the_old_noise_raises_an_alarm_and_a_trial() -> None:
    """A lead that starts late and in bursts: its faded lead is not clear of the bursts'
    noise and its steady lead counts the 40 level epochs, so the faded and steady rules
    try S3-FIFO late; Page's CUSUM (slack half a deviation of the per-epoch lead since the
    warm-up, bar five) sees it rise past the level epochs' noise within a few epochs, and
    starts a trial there (P3 at 5 %: tried at 333,620 accesses, not 505,196)."""

    def first_trial(cusum_bar: float) -> int:
        policy = AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000)
        policy.alarms.bar = cusum_bar
        policy.burst_lead = float("inf")  # a burst of 600 in 1,000 would switch first
        started = None
        for index, lead in enumerate(_late_bursty_lead()):
            _decide_with_leads(policy, [lead])
            if policy._trial is not None and started is None:
                started = index
        assert started is not None
        return started

    with_alarm, without = first_trial(5.0), first_trial(0.0)
    assert 56 <= with_alarm < 56 + 8 < without


def test_a_level_noise_raises_no_alarm() -> None:
    """Noise of +-150 hits an epoch around no lead, for 300 epochs: the CUSUM's slack (half
    a deviation) absorbs it; no trial, no switch."""
    policy = AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000)
    _decide_with_leads(policy, [0] * 16 + [150 if i % 3 else -300 for i in range(300)])
    assert policy.trials == [] and policy.switches == []
    assert policy.alarms.alarm(policy.serving_index, 0.0) == policy.serving_index


def test_an_alarms_trial_starts_afresh_as_the_rules_trial_once_they_back_it() -> None:
    """A lead of 300 an epoch after 40 level epochs: the alarm starts a trial first, the
    faded rule backs it an epoch later, and the trial starts afresh as that rule's, whose
    copy trailing by 5 an epoch (within a switch's cost at its end) takes over; the alarm's
    own trial would have dropped it (P3 at 10 %: the alarm's stricter trial of ARC at
    2,268,616 switched late and was undone, 0.3055; afresh, 0.3183 as before)."""
    policy = AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000)
    started: list[tuple[int, bool]] = []
    for lead in [0] * 16 + [100 if i % 2 else -100 for i in range(40)] + [300] * 20:
        if policy._trial is not None:
            policy._trial.hits = 100 - 5
        _decide_with_leads(policy, [lead])
        trial = policy._trial
        if trial is not None and (not started or started[-1][0] != trial.began):
            started.append((trial.began, trial.bar is not None))
    assert len(started) == 2 and started[0][1] and not started[1][1]
    assert started[1][0] == started[0][0] + 1
    assert policy.trials == [((started[1][0] + policy.trial) * 1_000, "s3fifo", True)]


def test_a_dropped_trial_spends_the_alarm_not_the_noise_it_is_measured_against() -> None:
    """`spend` (a dropped trial) zeroes the CUSUMs and keeps the per-epoch lead's spread;
    `reset` (a switch) starts both afresh. A level lead of +-100 adds nothing past the slack."""
    alarm = LeadAlarm(2)
    for lead in [100, -100] * 10:
        alarm.add([0, lead], 0, 1.0)
    assert alarm.deviation(1) == pytest.approx(100.0)
    assert alarm.sums[1] < alarm.bar_of(1, 0.0) and alarm.alarm(0, 0.0) == 0
    alarm.sums[1] = 600.0
    assert alarm.alarm(0, 0.0) == 1
    alarm.spend()
    assert alarm.sums == [0.0, 0.0] and alarm.deviation(1) == pytest.approx(100.0)
    alarm.reset()
    assert alarm.deviation(1) == 0.0


def test_an_alarms_trial_takes_over_only_with_a_gain() -> None:
    """A trial the CUSUM started needs its copy to gain: a copy trailing by less than a
    switch's cost at the end, taken by a trial of the faded rule, is dropped; one leading
    by the margin at the end is taken; none before its alarm's bar is passed."""

    def tried(trial_lead: int) -> AutoCachePolicy:
        policy = AutoCachePolicy(4_000, candidates=("lct", "s3fifo", "lru"), min_epoch=1_000)
        policy.burst_lead = float("inf")  # a burst of 600 in 1,000 would switch first
        _decide_with_trial(policy, _late_bursty_lead(), [trial_lead] * 40)
        return policy

    assert tried(-5).trials[0][1:] == ("s3fifo", False)  # -40: within the cost (80)
    gained = tried(10)  # +80 at the end, below the alarm's bar: taken at the end only
    assert gained.trials[0][1:] == ("s3fifo", True)
    assert gained.trials[0][0] == tried(-5).trials[0][0]


def test_serve_with_an_unknown_candidate_raises() -> None:
    policy = AutoCachePolicy(8, candidates=("lct", "arc"))
    with pytest.raises(InvalidValueError):
        policy.serve_with("lru")
    policy.serve_with("lct")  # the one serving: nothing changes
    assert policy.switches == []


def test_the_sample_is_a_fixed_function_of_the_key() -> None:
    # never Python's salted hash(): these values are the same in every process
    assert sample_point(k(1)) == sample_point(k(1)) == 219_430_959
    assert sample_point(12345) == 571_572_824
    assert sample_point(12345, seed=1) != sample_point(12345)
    for points in (
        [sample_point(k(i)) for i in range(20_000)],
        [sample_point(i) for i in range(20_000)],
    ):
        assert 0.009 < sum(p < (1 << 32) // 100 for p in points) / len(points) < 0.011
    # small ints (a trace's block ids) are mixed: key 0, often the hottest block, is in a
    # 1 % sample only for about 1 seed in 100, not in every one
    assert sum(sample_point(0, seed) < (1 << 32) // 100 for seed in range(1_000)) < 30


def _regimes(seed: int = 5, phase_length: int = 40_000) -> list[int]:
    """Three phases for a cache of 2,000 blocks: a loop of 1,800 keys (recency-friendly:
    every policy keeps it), one-off scans of fresh keys with a random hot set of 1,200 keys
    (scan-heavy: LRU loses the hot set to the scans), and a Zipf mix over 8,000 keys
    (frequency-friendly)."""
    rng = random.Random(seed)
    keys = list(itertools.islice(itertools.cycle(range(100_000, 101_800)), phase_length))
    fresh = 1_000_000
    phase: list[int] = []
    while len(phase) < phase_length:
        if rng.random() < 0.5:
            length = rng.randrange(100, 600)
            phase.extend(range(fresh, fresh + length))
            fresh += length
        else:
            phase.extend(200_000 + rng.randrange(1_200) for _ in range(100))
    weights = list(itertools.accumulate(1.0 / (r + 1) ** 0.9 for r in range(8_000)))
    return (
        keys + phase[:phase_length] + rng.choices(range(8_000), cum_weights=weights, k=phase_length)
    )


def _phase_hits(policy: CachePolicy, keys: list[int], phase: int) -> list[int]:
    """Hits per phase, driving `policy` exactly as `simulate` does."""
    hits = [0] * (len(keys) // phase)
    for position, raw in enumerate(keys):
        hits[position // phase] += _access(policy, OffloadKey(raw.to_bytes(8, "big")))
    return hits


@pytest.mark.slow
def test_auto_follows_the_candidate_that_wins_each_regime() -> None:
    keys, phase, capacity = _regimes(), 40_000, 2_000
    found = {name: _phase_hits(POLICIES[name](capacity), keys, phase) for name in CANDIDATES}
    others = [name for name in CANDIDATES if name != "lru"]
    start_with_lru = ("lru", "arc", "s3fifo", "lct")
    auto = AutoCachePolicy(capacity, candidates=start_with_lru)
    auto_hits = _phase_hits(auto, keys, phase)
    again = AutoCachePolicy(capacity, candidates=start_with_lru)
    assert _phase_hits(again, keys, phase) == auto_hits and again.switches == auto.switches
    # (when, in accesses, and to which candidate) auto switched
    switched = auto.switches
    # the loop: every policy keeps it, and auto stays with LRU
    assert len(set(hits[0] for hits in found.values())) == 1 and auto_hits[0] == found["lru"][0]
    assert all(at > phase for at, _ in switched)
    # the scans: LRU loses the hot set; auto leaves it within 10 capacities
    assert found["lru"][1] < min(found[name][1] for name in others) - 0.05 * phase
    assert switched and phase < switched[0][0] <= phase + 10 * capacity
    assert switched[0][1] != "lru" and auto_hits[1] > found["lru"][1]
    # the Zipf mix: auto serves as well as the best candidate
    assert auto.serving != "lru" and len(auto.switches) <= 2  # no flapping
    assert auto_hits[2] >= max(hits[2] for hits in found.values()) - 0.005 * phase
    assert sum(auto_hits) > sum(found["lru"])


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_auto_is_not_below_lru_when_the_regime_changes() -> None:
    """The benchmark's `regimes` workload, its first round (Zipf, scans, another Zipf, a
    loop that fits), at 10 % of its distinct blocks: LRU wins the second Zipf phase and the
    loop (lct refuses the loop's new keys for one pass). With epochs of a capacity, the lead's
    noise held auto on lct throughout, 0.016 below LRU (issue 34); epochs of a quarter
    capacity, faded over about one capacity, switch to LRU within the second Zipf phase."""
    keys = regimes()[:400_000]
    capacity = len(set(keys)) // 10
    made: list[AutoCachePolicy] = []

    def build(size: int) -> AutoCachePolicy:
        made.append(AutoCachePolicy(size))
        return made[-1]

    found = simulate(build, capacity, keys)
    lru = simulate("lru", capacity, keys)
    assert found.hits >= lru.hits, (found.hit_ratio, lru.hit_ratio, made[0].switches)
    switches = made[0].switches
    assert all(b - a >= 100_000 for (a, _), (b, _) in itertools.pairwise(switches))


def _zipf(count: int = 100_000) -> list[int]:
    rng = random.Random(9)
    weights = list(itertools.accumulate(1.0 / (r + 1) ** 0.8 for r in range(30_000)))
    return rng.choices(range(30_000), cum_weights=weights, k=count)


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_stationary_workload_does_not_flap() -> None:
    """At most one switch per 100,000 accesses (issue 34) over 300,000 accesses of a
    stationary Zipf mix, the same switches on a second run, and never below LRU."""
    keys = _zipf(300_000)
    made: list[AutoCachePolicy] = []

    def build(capacity: int) -> AutoCachePolicy:
        made.append(AutoCachePolicy(capacity))
        return made[-1]

    first = simulate(build, 1_500, keys)
    second = simulate(build, 1_500, keys[:100_000])
    assert made[1].switches == [s for s in made[0].switches if s[0] <= 100_000]
    switches = made[0].switches
    assert len(switches) <= len(keys) // 100_000
    assert all(b - a >= 100_000 for (a, _), (b, _) in itertools.pairwise(switches))
    assert second.hits <= first.hits
    assert first.hit_ratio >= simulate("lru", 1_500, keys).hit_ratio


_SEEDED_RUN = """
import itertools, random, sys
from kvtier.policies import AutoCachePolicy, simulate
from kvtier.testing.policy import k
rng = random.Random(7)
keys = [k(rng.randrange(3_000) if rng.random() < 0.7 else 10_000 + i) for i in range(40_000)]
made = []
result = simulate(lambda c: made.append(AutoCachePolicy(c, min_epoch=200)) or made[-1], 300, keys)
print(result.hits, made[0].switches)
"""


@pytest.mark.timeout(300)
def test_the_result_depends_on_no_seed() -> None:
    """Every candidate is simulated in full, on every key: no sample, so no seed. Python's
    hash seed (salted hashes of bytes keys) changes nothing either."""
    found = set()
    for seed in ("0", "1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run(
            [sys.executable, "-c", _SEEDED_RUN], env=env, capture_output=True, text=True, check=True
        )
        found.add(done.stdout)
    assert len(found) == 1, found


@pytest.mark.slow
def test_a_stationary_workload_is_within_0_005_of_the_best() -> None:
    """S3-FIFO leads during lct's first capacities here, then lct (auto switches to S3-FIFO
    and, 100,000 accesses later, back to lct)."""
    keys = _zipf()
    best = max(simulate(name, 1_500, keys).hit_ratio for name in CANDIDATES)
    assert simulate("auto", 1_500, keys).hit_ratio >= best - 0.005


def test_clear_starts_afresh() -> None:
    policy = AutoCachePolicy(8, candidates=("lct", "arc"))
    for i in range(8):
        policy.on_store_miss([k(i)])
        policy.insert(k(i), ready_block(i))
    policy.serve_with("arc")
    policy.clear()
    assert policy.serving == "lct" and policy.switches == [] and len(policy) == 0
    assert all(len(policy.shadow(name)) == 0 for name in policy.candidates)


@functools.cache
def _shipped_accesses() -> tuple[list[int], list[bool]]:
    """The shipped trace's block accesses and their partial-block flags."""
    raw = list(read_mooncake())
    requests = [list(r.hash_ids) for r in raw]
    flags = partial_block_flags(requests, [r.input_length for r in raw], MOONCAKE_BLOCK_TOKENS)
    return [block for request in requests for block in request], flags


SHIPPED_DISTINCT_BLOCKS = 182_790
AUTO_ON_THE_SHIPPED_TRACE = {0.01: 0.1083, 0.05: 0.2259, 0.10: 0.2960}
"""auto's hit ratios on the whole shipped trace, partial blocks skipped: lct's, as auto serves
with lct throughout (docs/BENCHMARKS.md, "Policies across traces")."""
ISSUE_22_TARGETS = {0.01: 0.111, 0.05: 0.219, 0.10: 0.295}


def _auto_on_the_shipped_trace(fraction: float) -> tuple[float, AutoCachePolicy]:
    accesses, flags = _shipped_accesses()
    made: list[AutoCachePolicy] = []

    def build(capacity: int) -> AutoCachePolicy:
        made.append(AutoCachePolicy(capacity))
        return made[-1]

    capacity = math.floor(fraction * SHIPPED_DISTINCT_BLOCKS)
    return simulate(build, capacity, accesses, partial=flags).hit_ratio, made[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fraction", sorted(AUTO_ON_THE_SHIPPED_TRACE))
@pytest.mark.slow
def test_auto_figures_on_the_shipped_trace_hold(fraction: float) -> None:
    """The figures docs/BENCHMARKS.md reports, to 0.0001, and no switch: lct wins the shipped
    trace at every capacity."""
    found, policy = _auto_on_the_shipped_trace(fraction)
    assert policy.switches == []
    assert abs(found - AUTO_ON_THE_SHIPPED_TRACE[fraction]) < 1e-4, found


@pytest.mark.timeout(300)
@pytest.mark.xfail(
    strict=True,
    reason="issue 22's target at 1 % (0.111) is not met: auto serves with lct, 0.1083 "
    "(ARC 0.0674); those at 5 and 10 % are (0.2259, 0.2960)",
)
@pytest.mark.slow
def test_auto_meets_the_issue_targets_on_the_shipped_trace() -> None:
    for fraction, target in ISSUE_22_TARGETS.items():
        assert _auto_on_the_shipped_trace(fraction)[0] >= target, fraction


def _access(policy: CachePolicy, key: OffloadKey) -> bool:
    """One access of `key`, as `simulate` drives a policy: whether it hit."""
    if policy.get(key) is not None:
        policy.touch((key,))
        return True
    policy.on_store_miss((key,))
    if not policy.admits_all and not policy.admit((key,))[0]:
        return False
    if len(policy) >= policy.cache_capacity:
        assert policy.evict(1) is not None
    policy.insert(key, ready_block())
    return False


def _drive(policy: CachePolicy, keys: list[int]) -> None:
    """One access per key, as `simulate` drives a policy."""
    for raw in keys:
        _access(policy, k(raw))
