"""A switch tried first (`auto`'s trial; `kvtier.policies.auto`'s module doc): a copy of the
winner's shadow made from the tier's own blocks runs as one more shadow, and the switch is
made only if that copy, what the switch would serve with, does well against the serving
policy. `SwitchTrial` keeps its score and says when it is decided.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.policies.base import CachePolicy


@dataclass
class SwitchTrial:
    """A running trial of candidate `index`: its `copy`, the decision it `began` at, and,
    for a trial an alarm started (`kvtier.policies.lead_alarm`), the alarm's `bar`."""

    index: int
    copy: CachePolicy
    began: int
    bar: float | None = None
    hits: int = 0
    """The copy's hits since the last decision."""
    lead: int = 0
    """The copy's hits since it began minus the serving policy's."""

    def score(
        self, serving_hits: int, epochs: int, length: int, gain: float, cost: float, drop: float
    ) -> bool | None:
        """Add the epoch's hits (the copy's, `hits`, against the serving policy's) and say
        whether the trial is decided, `epochs` decisions in (of `length`): True, take over;
        False, drop it; None, go on. A trial of the faded or steady rule takes over once the
        copy leads by `gain` (the margin over the accesses since), or at the end if it trails
        by less than `cost` (a switch's); an alarm's, stricter, early only past its bar and
        at the end only with `gain`. Either is dropped once the copy trails by `drop`, or at
        the end."""
        self.lead += self.hits - serving_hits
        self.hits = 0
        ended = epochs >= length
        if self.bar is None:
            taken = self.lead > gain or (ended and self.lead > -cost)
        else:
            taken = self.lead > max(gain, self.bar) or (ended and self.lead > gain)
        if taken:
            return True
        if self.lead < -drop or ended:
            return False
        return None
