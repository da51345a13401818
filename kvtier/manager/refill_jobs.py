"""How the jobs of a background refill are grouped (`ChainPlanner._plan_reserves`).

- `RefillPass`: a pass over the tiers' reserves planned in parts (`ChainPlanner.plan_refills`
  with a limit): where it goes on, the job of the tier it is at, the jobs of those above.
- `merge_part`: a part of one tier's refill added to that refill's job, its copies merged
  into the job's, so the tier below is handed one call per refill however it was planned.
- `fold_refill`: a lower tier's refill folded into an upper tier's refill of the same pass.

Grouping changes no decision, only how the copies are handed to the tiers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtier.blocks import BlockStatus
from kvtier.manager.jobs import CopyStep, TransferJob


@dataclass(slots=True)
class RefillPass:
    """A pass of `ChainPlanner._plan_reserves` planned in parts: the tier it goes on at,
    that tier's refill job so far (None: not started) and the slots it drains, and the jobs
    of the tiers above it, queued together once the pass is over."""

    index: int = 0
    job: TransferJob | None = None
    drained: list[BlockStatus] = field(default_factory=list)
    planned: list[TransferJob] = field(default_factory=list)


def _joined(first: CopyStep, second: CopyStep) -> CopyStep:
    """One copy of both steps' blocks (between the same two tiers), `first`'s first."""
    return CopyStep(
        first.keys + second.keys,
        first.src,
        np.concatenate([first.src_ids, second.src_ids]),
        first.dst,
        np.concatenate([first.dst_ids, second.dst_ids]),
    )


def merge_part(job: TransferJob, part: TransferJob) -> None:
    """Add a part of a refill (`part`: its copies and pending keys) to the refill `job`: a
    copy between two tiers that `job` has already grows by the part's blocks (one call to
    the tier below, as if the refill had been planned at once), one it lacks is added.
    Deeper copies go first, as `_demote` orders them: each reads slots of a tier that a
    shallower copy writes, and a part's victims there are never slots another part gave
    out (those are pending, not evictable)."""
    steps = {(step.src, step.dst): step for step in job.steps}
    for step in part.steps:
        pair = (step.src, step.dst)
        had = steps.get(pair)
        steps[pair] = step if had is None else _joined(had, step)
    job.steps[:] = sorted(steps.values(), key=lambda step: -step.src)
    job.pending.extend(part.pending)


def fold_refill(into: TransferJob, job: TransferJob, index: int, limit: int) -> bool:
    """Fold the refill `job` of tier `index` into `into`, an earlier refill of the same
    pass that copies from tier `index` to the tier below too (the victims the upper tier's
    refill evicted from it), when both copies together hold at most `limit` blocks (the
    chain's `merge_demotions_up_to`): one copy, so a slow tier below is handed one call,
    not two that each pay its fixed costs (docs/BENCHMARKS.md, "The replay's pair on a
    fast device"). Its deeper steps go first (they read slots the copy overwrites); the
    decisions are unchanged, only their copies grouped. Whether it was folded."""
    own = job.steps[-1]
    if (own.src, own.dst) != (index, index + 1):  # the tier below took none of them
        return False
    at = next(
        (i for i, step in enumerate(into.steps) if (step.src, step.dst) == (index, index + 1)),
        None,
    )
    if at is None or len(into.steps[at]) + len(own) > limit:
        return False
    into.steps[at] = _joined(into.steps[at], own)
    into.steps[:at] = [*job.steps[:-1], *into.steps[:at]]
    into.pending.extend(job.pending)
    into.drain.extend(job.drain)
    return True


__all__ = ["RefillPass", "fold_refill", "merge_part"]
