"""`auto`: serve with whichever candidate policy (lct, ARC, S3-FIFO, LRU) a full-size
simulation of the same accesses says is winning, and switch only when the lead is clear.

No single policy suits every workload: lct wins by a wide margin on conversation traces,
S3-FIFO and ARC on block-I/O mixes, plain LRU on a loop that fits (issues 22 and 34). `auto`
runs every candidate at the full capacity, over every access: the one serving is the live
policy, holding the tier's blocks; each other one is a *shadow*, the same policy holding
keys only (every key shares one ready `BlockStatus`: metadata, no bytes), driven as
`simulate` drives a policy. A shadow is not a sample: its hits are the hits that candidate
would have had, so the choice depends on the workload only, never on which keys a hash
happened to pick (issue 34: a 1 % SHARDS sample made the result depend on its seed, 0.133 to
0.178 on one trace).

Every `EPOCH` x capacity accesses (at least `MIN_EPOCH`) each candidate's hits of the epoch
join an exponentially fading score (`DECAY` per epoch). `auto` switches to the best one
when, after `WARMUP` epochs, and `DWELL` epochs and `MIN_GAP` accesses after its last
switch (at most one switch per `MIN_GAP` accesses, whatever the noise):
  - its lead over the serving candidate is above `MARGIN` (a hit ratio) over the faded
    accesses, plus the cost of a switch (`SWITCH_COST` x capacity hits: what a takeover
    loses, ARC's ghosts and target; a rebuild of the order is O(capacity) once);
  - and above `Z` standard deviations of the lead's own noise, estimated from the epochs
    (batch means: the lead is a faded sum of per-epoch differences, whose variance is their
    faded spread);
or when its lead is *steady*: its hits since the later of the warm-up's end and the last
switch (not faded) exceed the serving one's by `MARGIN` over those accesses plus the cost of
a switch, its faded lead is positive, and either the faded lead is above `Z` standard
deviations as above or the steady lead is above `Z` standard deviations of its own noise
(the same batch means over the epochs since, not faded): a small lead held for long pays
for the switch though no window of one capacity shows it (the Zipf mix at 25 %), and a lead
in bursts clears its own noise over enough epochs, never the faded one (lct in a loop
longer than the cache, `regimes` at 1 %; docs/BENCHMARKS.md has both).
A steady lead whose last epoch was a *burst* (more hits than the serving one's by over
`BURST_LEAD` of the epoch's accesses) switches with no noise test and no trial, on a
probation that undoes it only past that lead: one burst can carry all of a late winner's
evidence (P3 at 10 %: 15,663 hits in an epoch of 19,064 accesses), its noise as large.
On a stationary workload the lead of a winner grows as the epochs do and noise as their
square root; what can still move is a learner's standing (lct trails for its first
capacities, then leads), hence `MIN_GAP`.

A switch to S3-FIFO, ARC or LRU (whose takeover leaves the shadow as it was) is *tried*
first, for up to `TRIAL` decisions: a copy of the shadow made from the tier's own blocks
runs as one more shadow, and the switch is made only if it does well against the serving
policy (`SwitchTrial`: its lead is the switch's real gain, the blocks the tier lacks
included; cloudPhysics at 10 %); else none starts for `DWELL` decisions. lct takes over at
once (its takeover is its shadow). A late lead in bursts (P3 at 5 %) raises an *alarm*
(`kvtier.policies.lead_alarm`), which only starts a trial, stricter until the rules above
back it: taken early only past the alarm's bar, at the end with a gain.

A decided switch is on probation for `PROBATION` decisions: the shadows price the
candidates, not a takeover (the new policy starts from the blocks the old one kept, and the
blocks its shadow held that the tier lacks are misses), so the switch's real cost is
measured: the candidate that stopped serving goes on as a shadow from those same blocks, the
exact run without the switch, and if the new one falls behind it by `REVERT_COST` x capacity
hits (plus `MARGIN` over the accesses since), the switch is undone (`reverts`), and counts
as a switch for `DWELL` and `MIN_GAP`. lct stays first: S3-FIFO first meets cloudPhysics at
10 and 25 % but loses cells lct first meets (docs/BENCHMARKS.md, "... third round").

A takeover's loss is measured: after a switch to S3-FIFO, ARC or LRU its shadow (left as it
was) goes on for `probation` decisions, and its hits minus the live one's are
`takeover_cost`, which a lead must then clear instead of `switch_cost` if larger (P3 at 5 %:
S3-FIFO's lost 7,050 hits, 9 x `switch_cost`; auto no longer switches back for less).

A switch takes over warm (`kvtier.policies.takeover`, whose doc says what each candidate
keeps): the winner's shadow becomes the live policy with the tier's blocks; the policy
that stops serving goes on as a shadow with what it held.

`auto` keeps its own index of the resident blocks in recency order (for `get`, `len` and
`items`, so a getter stays valid across switches, and for the blocks a shadow let go);
every other decision (admission, eviction order) is the serving policy's.

Cost per access: every candidate's (the live one's and three shadows'), plus a dict
pop and insert per hit. A request's keys are interned once (`kvtier.policies.shadow_calls`:
one look-up per key) and the ids go to LRU's, ARC's and S3-FIFO's shadows, each
keeping its nodes in int arrays by id with no dict of its own, in one call per request
with no Python call per key when compiled, and to lct serving (the same table: no dict of
its own to probe); lct's shadow takes the keys, its calls one by one. Compiled, on the
shipped trace, auto costs 1.5 to 1.7 x ARC at 1 and 10 % (3.5 / 3.5 x before the shared
look-up; 8.3 / 5.5 x before the batch calls; issue 34's target is 2 x, and lct alone costs
1.1 to 1.5 x ARC; docs/BENCHMARKS.md, "Policy cost, fifth round" to "fifteenth round", has
each part). Memory:
per candidate, its own per-key state at full capacity (lct remembers `MEMORY` capacities
of keys), measured in docs/BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies.arc import ARCCachePolicy
from kvtier.policies.auto_view import AutoView
from kvtier.policies.base import CachePolicy, check_evict_count
from kvtier.policies.hinted import HintBook
from kvtier.policies.lct import LCTCachePolicy
from kvtier.policies.lead_alarm import LeadAlarm
from kvtier.policies.lru import LRUCachePolicy
from kvtier.policies.s3fifo import S3FIFOCachePolicy
from kvtier.policies.shadow_calls import ShadowCalls
from kvtier.policies.switch_trial import SwitchTrial
from kvtier.policies.takeover import copyable, shadow_on_keys, store_moved, take_over

CANDIDATE_CLASSES: dict[str, type[CachePolicy]] = {
    LCTCachePolicy.name: LCTCachePolicy,
    ARCCachePolicy.name: ARCCachePolicy,
    S3FIFOCachePolicy.name: S3FIFOCachePolicy,
    LRUCachePolicy.name: LRUCachePolicy,
}
"""The policies `auto` may serve with, by name."""
CANDIDATES: tuple[str, ...] = ("lct", "arc", "s3fifo", "lru")
"""The candidates, in order of preference on a tie; the first serves until another leads."""
EPOCH = 0.25
"""Accesses between decisions, as a multiple of the capacity. A quarter, with `DECAY` 0.8
(scores faded over about one capacity): with whole capacities faded over ten, a regime's
winner came too late (issue 34: `regimes` at 10 %, 0.016 below LRU)."""
MIN_EPOCH = 1_000
"""The shortest epoch, in accesses: a small cache's epochs would be all noise."""
DECAY = 0.8
"""Weight a candidate's score keeps at each decision (older hits fade; see `EPOCH`)."""
MARGIN = 0.002
"""The lead, in hit ratio over the faded accesses, a candidate needs to take over (over a
faded window of about one capacity; `MIN_GAP` bounds the switches, not this)."""
SWITCH_COST = 0.02
"""What a switch costs, in hits, as a multiple of the capacity: added to the lead needed
(or the last takeover's measured loss, if more)."""
Z = 3.0
"""The lead must also exceed this many standard deviations of its noise."""
WARMUP = 16
"""Decisions before the first switch (four capacities of accesses): every candidate's first
capacity is cold misses, and a learner's first ones are spent learning."""
DWELL = 16
"""Decisions after a switch before the next one may be made (four capacities)."""
PROBATION = 16
"""Decisions after a switch during which it is undone if the candidate it replaced, going
on as a shadow, gets more hits than the new one (`AutoCachePolicy._probation_failed`)."""
REVERT_COST = 0.05
"""How far behind the candidate it replaced a new one must fall during its probation to be
undone, as a multiple of the capacity in hits (plus `MARGIN` over the accesses since)."""
TRIAL = 8
"""Decisions a trial may run (two capacities; `SwitchTrial`): 0 switches at once."""
BURST_LEAD = 0.5
"""An epoch in which a candidate gets more hits than the serving one by this share of its
accesses is a *burst*: with a steady lead, it switches with no noise test and no trial
(module doc). Not noise: in the 40 cells of docs/BENCHMARKS.md (eighth round) the largest
share elsewhere is 0.34, P3 at 10 % has 0.82."""
MIN_GAP = 100_000
"""Accesses after a switch before the next one may be made: at most one switch per this
many accesses, whatever the noise (issue 34's bound on flapping): a learner (lct) trails
for its first capacities, then leads."""


class AutoCachePolicy(AutoView, CachePolicy):
    """Serves with the candidate whose full-size shadow is clearly winning (module doc)."""

    name: ClassVar[str] = "auto"
    admits_all: ClassVar[bool] = False

    def __init__(
        self,
        cache_capacity: int,
        *,
        candidates: Sequence[str] = CANDIDATES,
        epoch: float = EPOCH,
        min_epoch: int = MIN_EPOCH,
        decay: float = DECAY,
        margin: float = MARGIN,
        switch_cost: float = SWITCH_COST,
        z: float = Z,
        warmup: int = WARMUP,
        dwell: int = DWELL,
        min_gap: int = MIN_GAP,
        probation: int = PROBATION,
        revert_cost: float = REVERT_COST,
        trial: int = TRIAL,
    ) -> None:
        """Every parameter defaults to the module's constant of that name (the one set chosen
        for every capacity); they are parameters for tuning and tests (the alarm's: `alarms`)."""
        super().__init__(cache_capacity)
        candidates = tuple(candidates)
        if not candidates or len(set(candidates)) != len(candidates):
            raise InvalidValueError(f"auto: candidates must be distinct, got {candidates!r}")
        unknown = [name for name in candidates if name not in CANDIDATE_CLASSES]
        if unknown:
            raise InvalidValueError(
                f"auto: unknown candidates {unknown!r}; valid: {', '.join(CANDIDATE_CLASSES)}"
            )
        if not (
            epoch > 0.0
            and 0.0 < decay < 1.0
            and margin >= 0.0
            and switch_cost >= 0.0
            and z >= 0.0
            and warmup >= 0
            and dwell >= 0
            and min_gap >= 0
            and probation >= 0
            and revert_cost >= 0.0
            and trial >= 0
        ):
            raise InvalidValueError(
                f"auto: needs epoch > 0, 0 < decay < 1, margin, switch_cost, z, warmup, dwell, "
                f"min_gap, probation, revert_cost and trial >= 0; got {epoch!r}, {decay!r}, "
                f"{margin!r}, {switch_cost!r}, {z!r}, {warmup!r}, {dwell!r}, {min_gap!r}, "
                f"{probation!r}, {revert_cost!r}, {trial!r}"
            )
        self.candidates = candidates
        self.epoch = max(int(min_epoch), round(epoch * cache_capacity), 1)
        """Accesses between decisions."""
        self.decay = decay
        self.margin = margin
        self.switch_cost = switch_cost * cache_capacity
        """What a switch costs, in hits."""
        self.z = z
        self.warmup = warmup
        self.dwell = dwell
        self.min_gap = min_gap
        self.probation = probation
        self.revert_cost = revert_cost * cache_capacity
        """How far behind, in hits, the new candidate must fall to be undone."""
        self.trial = trial
        self.burst_lead = BURST_LEAD * self.epoch
        """An epoch's lead past this many hits is a burst (module doc)."""
        self._block = BlockStatus(0)
        """The one ready block every shadow's key shares: a shadow stores no data."""
        self._block.ref_cnt = 0
        self._resident: dict[OffloadKey, BlockStatus] = {}
        """Every resident block, least recently used first: a plain dict, where a hit moves
        its key to the end by `pop` and insert (cheaper than `OrderedDict.move_to_end`, the
        same order)."""
        self._hints = HintBook()
        """Reuse hints on resident blocks: auto's own, so they survive a switch; the serving
        policy's eviction is asked for the rest (`HintBook.evict_hinted`)."""
        # `get` is that dict's own bound method, as LRU's is; the dict is never replaced, so
        # a getter stays valid across switches. A subclass that overrides `get` keeps its own.
        if type(self).get is AutoCachePolicy.get:
            self.get = self._resident.get  # type: ignore[method-assign,assignment]
        self._start_afresh()

    def _start_afresh(self) -> None:
        """The state of a new policy: the first candidate serving, cold shadows, no scores."""
        capacity = self.cache_capacity
        self._policies: list[CachePolicy] = [
            CANDIDATE_CLASSES[name](capacity) for name in self.candidates
        ]
        """Per candidate, its instance: the live policy for the serving one, else a shadow."""
        self.serving_index = 0
        """The index in `candidates` of the policy serving now."""
        self._serving = self._policies[0]
        self._others = [i for i in range(len(self.candidates)) if i != 0]
        self._shadows = ShadowCalls()
        """The calls to the shadows (LRU's, ARC's, S3-FIFO's on one table of key ids)."""
        self._shadows.route(self._policies, 0, self._others)
        self._hits = [0] * len(self.candidates)
        """Hits per candidate since the last decision."""
        self.total_hits = [0] * len(self.candidates)
        """Hits per candidate since the start."""
        self.scores = [0.0] * len(self.candidates)
        """Per candidate, its hits, faded by `decay` at each decision."""
        self._squares = [0.0] * len(self.candidates)
        """Per candidate, the faded sum of (its hits - the serving one's)**2 per epoch."""
        self._epochs = 0.0
        self._weights2 = 0.0
        self.weight = 0.0
        """The accesses the scores are over, faded as they are."""
        self.decisions = 0
        self._last_switch = 0
        self.switches: list[tuple[int, str]] = []
        """Each switch: (accesses so far, the candidate that took over); a revert is one."""
        self.reverts: list[int] = []
        """The accesses at which a switch was undone (its probation failed)."""
        self._steady_from: tuple[int, list[int]] | None = None
        """Where a steady lead is counted from (the end of the warm-up, then each switch):
        (accesses, `total_hits` then); None during the warm-up."""
        self._steady_squares = [0] * len(self.candidates)
        """Per candidate, the sum of (its hits - the serving one's)**2 per epoch since
        `_steady_from` (not faded: the steady lead's own noise)."""
        self._steady_epochs = 0
        """Decisions since `_steady_from`."""
        self.alarms = LeadAlarm(len(self.candidates))  # Page's CUSUMs, since `_steady_from`
        self._on_probation: tuple[int, int, float] | None = None
        """After a decided switch, for `probation` decisions: (the old candidate, the decision,
        the lag that undoes it)."""
        self._burst = 0.0  # the steady lead `_leads` last found with a burst (0: none)
        self._last_hits = [0] * len(self.candidates)  # the last epoch's hits per candidate
        self._behind = 0
        """During a probation: the old candidate's hits since the switch minus the new one's."""
        self._trial: SwitchTrial | None = None  # the trial running, if one is
        self._last_trial = -self.dwell - 1  # the last trial's end if it made no switch
        self._ideal: tuple[int, CachePolicy] | None = None
        """After a takeover that left its shadow as it was: (the decision, that shadow)."""
        self._takeover_loss = 0
        """Meanwhile: that shadow's hits since the switch minus the live policy's."""
        self.takeover_cost = 0.0  # what the last measured takeover lost, in hits (module doc)
        self.trials: list[tuple[int, str, bool]] = []
        """Each trial that ended: (accesses so far, the candidate tried, whether it took over)."""
        self.accesses = 0
        self._until_decision = self.epoch

    # -- the shadows and the choice ---------------------------------------------------------

    def _observe(self, keys: Sequence[OffloadKey], live_hits: int, ids: list[int] | None) -> None:
        """Accesses of `keys` (one request's, head first, of which the live policy hit
        `live_hits`; `ids`: theirs, if interned): every shadow takes them tail first."""
        if not keys:
            return
        hits = self._hits
        hits[self.serving_index] += live_hits
        block = self._block
        self._shadows.access(keys, block, hits, ids)
        if self._trial is not None:
            self._trial.hits += self._trial.copy.access(keys, block)
        if self._ideal is not None:
            self._takeover_loss += self._ideal[1].access(keys, block) - live_hits
        self.accesses += len(keys)
        self._until_decision -= len(keys)
        if self._until_decision <= 0:
            self._until_decision += self.epoch
            self._decide()

    def _decide(self) -> None:
        """Fade the scores, add the epoch's hits, and switch if the leader's lead is clear
        (see the module doc)."""
        decay, hits, serving = self.decay, self._hits, self.serving_index
        for index, count in enumerate(hits):
            self.total_hits[index] += count
            self.scores[index] = self.scores[index] * decay + count
            difference = count - hits[serving]
            self._squares[index] = self._squares[index] * decay + difference * difference
            self._steady_squares[index] += difference * difference
        self._steady_epochs += 1
        if self._steady_from is not None:  # not the warm-up's last epoch
            self.alarms.add(hits, serving, self.margin * self.epoch)
        self._hits, self._last_hits = [0] * len(hits), hits
        self.weight = self.weight * decay + self.epoch
        self._epochs = self._epochs * decay + 1.0
        self._weights2 = self._weights2 * decay * decay + 1.0
        self.decisions += 1
        if self.decisions == self.warmup:
            self._start_steady()
        if self._ideal is not None and self.decisions - self._ideal[0] >= self.probation:
            self._ideal = None
            self.takeover_cost = max(0.0, float(self._takeover_loss))
        if self._on_probation is not None and self._probation_failed(hits, *self._on_probation):
            return
        if self._trial is not None:
            self._score_trial(self._trial, hits[serving])
            return
        if (
            self.decisions <= self.warmup
            or self.decisions - self._last_trial <= self.dwell
            or (self.switches and self.decisions - self._last_switch <= self.dwell)
            or (self.switches and self.accesses - self.switches[-1][0] < self.min_gap)
        ):
            return
        best = max(range(len(self.scores)), key=lambda i: (self.scores[i], i == serving, -i))
        floor, bar = self._cost() + self.margin * self.epoch, None
        if best == serving or not self._leads(best):  # an alarm only starts a trial
            best = self.alarms.alarm(serving, floor)
            bar = self.alarms.bar_of(best, floor)
        if best != serving and self.trial and copyable(self._policies[best]):
            self._start_trial(best, bar)
        elif best != serving and bar is None:
            self._decided_switch(best)

    def _start_trial(self, index: int, bar: float | None) -> None:
        """Try candidate `index` (`SwitchTrial`; `bar`: the alarm's, if one started it); a
        burst (`_steady_lead`) switches at once instead."""
        if self._burst and bar is None:
            self._decided_switch(index)
            return
        copy = take_over(self._policies[index], [(key, self._block) for key in self._resident])
        self._trial = SwitchTrial(index, copy, self.decisions, bar)

    def _decided_switch(self, index: int) -> None:
        """Switch to candidate `index` as a decision does: on probation (see `_decide`)."""
        serving, burst, self._burst = self.serving_index, self._burst, 0.0
        self._switch(index)
        if self.probation:
            self._on_probation = (serving, self.decisions, max(self.revert_cost, burst))
            self._behind = 0

    def _score_trial(self, trial: SwitchTrial, serving_hits: int) -> None:
        """Score the trial's epoch (`SwitchTrial.score`); if decided: a switch, or `dwell`."""
        if trial.bar is not None and self._leads(trial.index):
            self._start_trial(trial.index, None)  # afresh, as the rules would start it
            return
        epochs = self.decisions - trial.began
        costs = (self.margin * epochs * self.epoch, self.switch_cost, self.revert_cost)
        decided = trial.score(serving_hits, epochs, self.trial, *costs)
        if decided is None:
            return
        self._trial = None
        self.trials.append((self.accesses, self.candidates[trial.index], decided))
        if decided:
            self._decided_switch(trial.index)
        else:
            self._last_trial = self.decisions
            self.alarms.spend()

    def _probation_failed(self, hits: list[int], old: int, decided: int, lag: float) -> bool:
        """Whether the switch on probation (made at decision `decided`) was undone, given
        the epoch's `hits` per candidate: the candidate it replaced, `old`, which went on as
        a shadow from the same blocks (what the tier would have had without the switch), has
        more hits since than the new one by `lag` (`revert_cost`, or a burst's lead) plus the
        margin over the accesses since. The shadows cannot price a takeover (the blocks the
        tier lacks); this measures it. Ends the probation after `probation` decisions."""
        self._behind += hits[old] - hits[self.serving_index]
        epochs = self.decisions - decided
        if self._behind > self.margin * epochs * self.epoch + lag:
            self._on_probation = None
            self._switch(old)
            self.reverts.append(self.accesses)
            return True
        if epochs >= self.probation:
            self._on_probation = None
        return False

    def _cost(self) -> float:
        """What a lead must clear: `switch_cost`, or the last takeover's loss if more."""
        return max(self.switch_cost, self.takeover_cost)

    def _leads(self, best: int) -> bool:
        """Whether candidate `best` leads the serving one by more than the margin plus the
        switch's cost, and by more than `z` standard deviations of the lead's noise."""
        self._burst = 0.0
        lead = self.scores[best] - self.scores[self.serving_index]
        if lead <= 0.0:
            return False
        mean = lead / self._epochs
        variance = max(0.0, self._squares[best] / self._epochs - mean * mean)
        clear = lead * lead > self.z * self.z * variance * self._weights2
        if clear and lead > self.margin * self.weight + self._cost():
            return True
        return self._steady_lead(best, clear)

    def _steady_lead(self, best: int, faded_clear: bool) -> bool:
        """Whether `best`'s hits since `_steady_from` exceed the serving candidate's by the
        margin over those accesses plus the switch's cost, and either its faded lead is
        clear of its noise (`faded_clear`) or this lead is clear of its own: more than `z`
        standard deviations of a sum of that many epochs' differences (the module doc), or
        the last epoch was a burst of `best`'s (`burst_lead`; noted in `_burst`)."""
        if self._steady_from is None:
            return False
        accesses, hits = self._steady_from
        serving = self.serving_index
        lead = (self.total_hits[best] - hits[best]) - (self.total_hits[serving] - hits[serving])
        if lead <= self.margin * (self.accesses - accesses) + self._cost():
            return False
        if faded_clear:
            return True
        epochs = max(1, self._steady_epochs)
        mean = lead / epochs
        variance = max(0.0, self._steady_squares[best] / epochs - mean * mean)
        if lead * lead > self.z * self.z * variance * epochs:
            return True
        last = self._last_hits
        if last[best] - last[serving] > self.burst_lead:
            self._burst = float(lead)
            return True
        return False

    def serve_with(self, name: str) -> None:
        """Serve with candidate `name` from now on (what a decision does; public for tests
        and for an operator who knows better): its shadow takes over warm (`take_over`);
        nothing the tier holds is dropped. Serving with the candidate that serves already
        changes nothing. A switch made here is not on probation (it ends one under way):
        the caller chose it."""
        if name not in self.candidates:
            raise InvalidValueError(f"auto: {name!r} is not a candidate of {self.candidates!r}")
        index = self.candidates.index(name)
        if index == self.serving_index:
            return
        self._on_probation = None
        self._switch(index)

    def _switch(self, index: int) -> None:
        """Candidate `index` takes over (see `serve_with`); a trial under way ends."""
        self._trial = None
        name = self.candidates[index]
        shadow = self._policies[index]
        live = take_over(shadow, list(self._resident.items()))
        self._ideal = None
        if live is not shadow:  # the shadow goes on, on keys, to measure the takeover
            shadow_on_keys(shadow)
            self._ideal = (self.decisions, shadow)
        self._takeover_loss = 0
        self._policies[index] = live
        self._serving = live
        self.serving_index = index
        self._others = [i for i in range(len(self.candidates)) if i != index]
        self._shadows.route(self._policies, index, self._others)  # the old live one: a shadow
        # the lead was measured against the old serving candidate: start the noise afresh
        self._squares = [0.0] * len(self.candidates)
        self._last_switch = self.decisions
        self.switches.append((self.accesses, name))
        self._start_steady()

    def _start_steady(self) -> None:
        """Count a steady lead from now on (the end of the warm-up, each switch)."""
        self._steady_from = (self.accesses, list(self.total_hits))
        self._steady_squares = [0] * len(self.candidates)
        self._steady_epochs = 0
        self.alarms.reset()

    # -- CachePolicy ------------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._resident.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._resident.get

    def admit(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """The serving policy's answer (lct refuses the classes that never pay)."""
        if self._serving.admits_all:
            return [True] * len(keys)
        return self._serving.admit(keys)

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        ids = self._shadows.live_miss(self._serving, keys)
        self._observe(keys, 0, ids)  # after: a switch it makes adopts what the tier holds now

    def on_store_move(self, keys: Sequence[OffloadKey]) -> None:
        """Not an access: each shadow stores the keys (if absent and admitted) as the tier
        does, and nothing is scored."""
        block = self._block
        self._shadows.store(keys, block)
        if self._trial is not None:
            store_moved(self._trial.copy, keys, block)
        if self._ideal is not None:
            store_moved(self._ideal[1], keys, block)
        self._serving.on_store_move(keys)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._resident:
            raise BlockStateError(f"auto: key {key!r} is already resident")
        self._serving.insert(key, block)
        self._resident[key] = block

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        self._check_insert_batch(keys, blocks, self._resident)
        self._serving.insert_many(keys, blocks)
        resident = self._resident
        for key, block in zip(keys, blocks, strict=True):
            resident[key] = block

    def remove(self, key: OffloadKey) -> None:
        if self._resident.pop(key, None) is None:
            raise BlockStateError(f"auto: key {key!r} is not resident")
        self._serving.remove(key)
        if self._hints.reuse:
            self._hints.discard(key)

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        self._hints.mark(key, reuse, key in self._resident)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        if self._hints.reuse:
            self._hints.touched(keys)
        resident = self._resident
        pop = resident.pop
        hits: list[OffloadKey] = []
        for key in reversed(keys):  # tail first: the request's head is the most recent
            if (block := pop(key, None)) is not None:  # one look-up: moved to the end
                resident[key] = block
                hits.append(key)
        hits.reverse()
        self._observe(hits, len(hits), self._shadows.live_touch(self._serving, hits))

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """The serving policy's victims."""
        check_evict_count(n)
        if self._hints.active and n:
            return self._hints.evict_hinted(
                n, protected, self.evict, self._resident.get, self.remove, self.items
            )
        victims = self._serving.evict(n, protected)
        if victims:
            resident = self._resident
            for key, _ in victims:
                del resident[key]
        return victims

    def clear(self) -> None:
        """Forget every block and all learned state: a fresh policy of the same settings."""
        self._resident.clear()
        self._hints.clear()
        self._start_afresh()

    def __len__(self) -> int:
        return len(self._resident)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(list(self._resident.items()))
