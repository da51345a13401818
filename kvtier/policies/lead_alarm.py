"""Page's CUSUM on each candidate's per-epoch lead over the serving one: `auto`'s alarm for
a lead that starts late (`kvtier.policies.auto`'s module doc).

`auto`'s faded lead weighs a new lead against its own recent bursts, its steady lead
against every epoch since the warm-up or the last switch; a lead that rises well past the
noise of the epochs before it, but in bursts, passes neither for many capacities (P3 at
5 %: S3-FIFO's lead from ~320,000 accesses first passes the z test at 505,196, and a
switch after ~400,000 costs the cell; docs/BENCHMARKS.md, "auto's decision rule, fifth
round"). The CUSUM is the sequential test for such a change of the mean: per candidate, the
sum of its per-epoch leads less a slack, never below 0, *alarms* past a bar; slack and bar
are in standard deviations of the per-epoch lead since the last `reset`, so the test is the
same at every capacity and on every trace's scale of noise.
"""

from __future__ import annotations

from collections.abc import Sequence

SLACK = 0.5
"""The slack per epoch, in standard deviations of the per-epoch lead: Page's test for a
shift of the mean lead by twice this (the textbook choice; with `BAR` 5 a false alarm about
once in 400-500 epochs of a level, normal lead, and an alarm only starts a trial)."""
BAR = 5.0
"""The alarm bar, in standard deviations of the per-epoch lead (and at least the floor the
caller gives: `auto`'s switch cost plus its margin over an epoch); 0 turns the test off."""


class LeadAlarm:
    """Per candidate, the CUSUM of its per-epoch lead and that lead's mean and spread since
    the last `reset` (the serving candidate's own entries stay 0)."""

    def __init__(self, count: int, slack: float = SLACK, bar: float = BAR) -> None:
        self.slack = slack
        self.bar = bar
        self._count = count
        self.reset()

    def reset(self) -> None:
        """Start afresh (the warm-up's end, each switch: the leads are over a new serving
        candidate)."""
        self.sums = [0.0] * self._count
        """Per candidate, its CUSUM."""
        self._leads = [0] * self._count
        self._squares = [0] * self._count
        self._epochs = 0

    def spend(self) -> None:
        """Zero the CUSUMs, keeping the spread (a dropped trial: the alarm's evidence is
        spent, the noise it was measured against is not)."""
        self.sums = [0.0] * self._count

    def deviation(self, index: int) -> float:
        """The standard deviation of candidate `index`'s per-epoch lead since `reset`."""
        epochs = max(1, self._epochs)
        mean = self._leads[index] / epochs
        return float(max(0.0, self._squares[index] / epochs - mean * mean) ** 0.5)

    def add(self, hits: Sequence[int], serving: int, least_slack: float) -> None:
        """One epoch's `hits` per candidate: each other candidate's lead over `serving` joins
        its spread and its CUSUM, less `slack` deviations (at least `least_slack` hits)."""
        self._epochs += 1
        for index, count in enumerate(hits):
            if index == serving:
                continue
            lead = count - hits[serving]
            self._leads[index] += lead
            self._squares[index] += lead * lead
            slack = max(least_slack, self.slack * self.deviation(index))
            self.sums[index] = max(0.0, self.sums[index] + lead - slack)

    def bar_of(self, index: int, floor: float) -> float:
        """Candidate `index`'s alarm bar: `bar` deviations, at least `floor` hits."""
        return max(floor, self.bar * self.deviation(index))

    def alarm(self, serving: int, floor: float) -> int:
        """The candidate whose CUSUM is highest above its bar (`bar_of`), else `serving`."""
        chosen, above = serving, 0.0
        if not self.bar:
            return chosen
        for index, total in enumerate(self.sums):
            if index == serving or total <= 0.0:
                continue
            excess = total - self.bar_of(index, floor)
            if excess > above:
                chosen, above = index, excess
        return chosen
