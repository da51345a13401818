"""Whether two greedy completions of one prompt agree, told the right way (issue 35, item 1).

A prefill over cached KV blocks and a prefill that computes the whole prompt add the same
numbers in another order, so their logits can differ in the last bits. Where the model's two
best tokens are tied (with random bf16 weights this happens: the margin is often exactly 0.0),
such a difference picks the other token and the completions part ways from there. That is not
wrong KV. So:

- the reference for a cached prefix is the same engine serving the prompt from its *own*
  prefix cache (same kernels, same order of sums), not a cold run;
- a first difference where the two tokens are each other's runner-up in *both* runs, within
  `TIE_MARGIN` of each other, is a **tie**: reported with its margin, never a failure (what
  follows a tie is not compared: the contexts differ from there);
- any other difference is a **mismatch**: the position and both tokens' logprobs in both runs.

Each completion is a sequence of steps `(token, {token: logprob})`: the token chosen and the
top-k logprobs vLLM returned for that step (k >= 2, so that the runner-up is known). Logprobs
stand for logits here: at one step they differ from the logits by one constant, so margins are
the same.

`compare_greedy` is used by `kvtier_tools.bench.engine_ttft` and by the engine lane
(tests/engine/); tests/test_greedy_match.py covers it without an engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

Step = tuple[int, Mapping[int, float]]
"""One greedy step: the token chosen and the top-k logprobs of that step."""

TIE_MARGIN = 0.1
"""Largest logprob gap (nats) between the two best tokens still called a tie: a few steps of a
bf16 logit (0.03 to 0.06 apart between 4 and 16), which is how far a change in the order of
the sums can move one."""


@dataclass(frozen=True)
class Verdict:
    """How a candidate completion compares with the reference.

    `kind` is "identical" (every token equal; `max_logprob_delta` says how close the logprobs
    were), "tie" (they part at `position` on a top-2 tie of `margin` nats) or "mismatch" (they
    part at `position` without a tie, or a logprob moved past the tolerance asked for).
    `reference_logprobs` / `candidate_logprobs` hold, at `position`, each run's logprobs of
    the reference's token and of the candidate's token (None where outside its top-k).
    """

    kind: Literal["identical", "tie", "mismatch"]
    steps: int
    max_logprob_delta: float = 0.0
    position: int | None = None
    reference_token: int | None = None
    candidate_token: int | None = None
    margin: float | None = None
    reference_logprobs: tuple[float | None, float | None] = (None, None)
    candidate_logprobs: tuple[float | None, float | None] = (None, None)
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True unless the difference is a real one (a mismatch)."""
        return self.kind != "mismatch"

    def describe(self) -> str:
        """One line for a report or a failing test."""
        if self.kind == "identical":
            return f"identical ({self.steps} tokens; logprobs within {self.max_logprob_delta:.3g})"
        pair = f"reference token {self.reference_token}, candidate token {self.candidate_token}"
        where = f"at position {self.position} of {self.steps}"
        if self.kind == "tie":
            return (
                f"parted on a top-2 tie {where}: {pair}, logprob margin {self.margin:.3g} "
                f"(reference {_pair(self.reference_logprobs)}, candidate "
                f"{_pair(self.candidate_logprobs)}); the tokens before it are identical"
            )
        return (
            f"MISMATCH {where}: {self.reason}; {pair}; logprobs of (reference token, candidate "
            f"token): reference run {_pair(self.reference_logprobs)}, candidate run "
            f"{_pair(self.candidate_logprobs)}"
        )


def _pair(values: tuple[float | None, float | None]) -> str:
    return "(" + ", ".join("-" if value is None else f"{value:.4f}" for value in values) + ")"


def _runner_up_gap(logprobs: Mapping[int, float], best: int, other: int) -> float | None:
    """The gap between `best` and `other` when they are this step's two best tokens (in
    either order), else None."""
    if best not in logprobs or other not in logprobs:
        return None
    ranked = sorted(logprobs.values(), reverse=True)
    top_two = sorted((logprobs[best], logprobs[other]), reverse=True)
    if len(ranked) < 2 or top_two != ranked[:2]:
        return None
    return abs(logprobs[best] - logprobs[other])


def compare_greedy(
    reference: Sequence[Step],
    candidate: Sequence[Step],
    *,
    tie_margin: float = TIE_MARGIN,
    logprob_tolerance: float = math.inf,
) -> Verdict:
    """Compare `candidate` with `reference` step by step (see the module's docstring).

    Where the tokens agree, the logprobs both runs report for the same token may differ by up
    to `logprob_tolerance` (by default anything: only tokens are judged; pass 0.0 where the two
    runs compute the same sums, e.g. kvtier's load against the engine's own prefix-cache hit).
    """
    if tie_margin < 0:
        raise ValueError(f"tie_margin must be >= 0, not {tie_margin}")
    steps = max(len(reference), len(candidate))
    worst = 0.0
    for position, ((ref_token, ref_lp), (cand_token, cand_lp)) in enumerate(
        zip(reference, candidate, strict=False)
    ):
        if ref_token == cand_token:
            for token in ref_lp.keys() & cand_lp.keys():
                delta = abs(ref_lp[token] - cand_lp[token])
                worst = max(worst, delta)
                if delta > logprob_tolerance:
                    return Verdict(
                        kind="mismatch",
                        steps=steps,
                        max_logprob_delta=worst,
                        position=position,
                        reference_token=ref_token,
                        candidate_token=cand_token,
                        reference_logprobs=(ref_lp.get(ref_token), ref_lp.get(cand_token)),
                        candidate_logprobs=(cand_lp.get(ref_token), cand_lp.get(cand_token)),
                        reason=(
                            f"same token, but the logprob of token {token} moved by "
                            f"{delta:.3g} (tolerance {logprob_tolerance:.3g})"
                        ),
                    )
            continue
        reference_logprobs = (ref_lp.get(ref_token), ref_lp.get(cand_token))
        candidate_logprobs = (cand_lp.get(ref_token), cand_lp.get(cand_token))
        gaps = (
            _runner_up_gap(ref_lp, ref_token, cand_token),
            _runner_up_gap(cand_lp, cand_token, ref_token),
        )
        parted = Verdict(
            kind="mismatch",
            steps=steps,
            max_logprob_delta=worst,
            position=position,
            reference_token=ref_token,
            candidate_token=cand_token,
            reference_logprobs=reference_logprobs,
            candidate_logprobs=candidate_logprobs,
        )
        if gaps[0] is None or gaps[1] is None:
            return replace(parted, reason="the two tokens are not the top two of both runs")
        margin = max(gaps[0], gaps[1])
        if margin > tie_margin:
            return replace(
                parted,
                margin=margin,
                reason=f"the top two are {margin:.3g} apart, more than a tie ({tie_margin:.3g})",
            )
        return replace(parted, kind="tie", margin=margin)
    if len(reference) != len(candidate):
        return Verdict(
            kind="mismatch",
            steps=steps,
            max_logprob_delta=worst,
            position=min(len(reference), len(candidate)),
            reason=f"{len(candidate)} tokens where the reference has {len(reference)}",
        )
    return Verdict(kind="identical", steps=steps, max_logprob_delta=worst)


def steps_of(tokens: Sequence[int], logprobs: Sequence[Mapping[str | int, float]]) -> list[Step]:
    """Steps from what the engine runs record as JSON: the tokens, and per step the top-k
    logprobs keyed by the token (as a string once through JSON)."""
    if len(tokens) != len(logprobs):
        raise ValueError(f"{len(tokens)} tokens but {len(logprobs)} steps of logprobs")
    return [
        (int(token), {int(key): float(value) for key, value in step.items()})
        for token, step in zip(tokens, logprobs, strict=True)
    ]
