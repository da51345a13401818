"""`kvtier simulate --hints`: what reuse hints are worth, with hints derived from the trace's
future and made as noisy as an application's would be.

An application's hints (`kvtier.hints`) are two predictions about each block it serves:
"will this block be read again soon?" (`"likely"`) and "will it never be read again?"
(`"never"`). On a trace both truths are known, so each access `i` of a key is first
classed by the key's next access `j`:

- **soon**: `j - i <= horizon` accesses (the horizon is `horizon` x the cache's capacity
  in blocks: a block the cache must keep that long to hit it);
- **never**: the key is not accessed again;
- **later**: it is, after the horizon.

Each prediction then errs as a binary classifier with the given `recall` and `fpr`, the
same for both:

- **recall**: the fraction of the accesses a prediction is true of that get it:
  P(`"likely"` | soon) = P(`"never"` | never) = recall;
- **fpr** (false-positive rate): the fraction of the accesses a prediction is false of that
  get it anyway: P(`"likely"` | not soon) = P(`"never"` | not never) = fpr.

So a soon access gets `"likely"` with probability recall, `"never"` with probability fpr,
no hint otherwise; a never access `"never"` with recall, `"likely"` with fpr; a later
access either hint with fpr each. Hence recall + fpr <= 1 and fpr <= 0.5. One uniform draw
per access from `random.Random(seed)` decides, so the hints are deterministic, and one
access's draw is the same at every capacity. recall = fpr makes hints carry no information
about the future (each hint as likely whatever the truth). A `"likely"` hint has a TTL of
the horizon (the simulation withdraws it that many accesses later, as a tier does at its
TTL); the hint of access `i` is given once `i` is served (`simulate_hinted`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.errors import InvalidValueError
from kvtier.hints import Reuse
from kvtier.policies.simulate import simulate_hinted
from kvtier_tools.workloads.simulation.sweep import SimTrace, SweepReport

NEVER_AGAIN = -1
"""`next_uses`' value for an access whose key is not accessed again."""


@dataclass(frozen=True, slots=True)
class HintNoise:
    """How good the simulated hints are (see the module doc for what each value means)."""

    recall: float
    fpr: float
    horizon: float = 1.0
    """The horizon of "soon", in multiples of the cache's capacity (in accesses)."""
    seed: int = 0

    def horizon_accesses(self, capacity: int) -> int:
        """The horizon, in accesses, of a cache of `capacity` blocks (at least 1)."""
        return max(1, math.floor(self.horizon * capacity))

    def to_dict(self) -> dict[str, Any]:
        return {
            "recall": self.recall,
            "fpr": self.fpr,
            "horizon": self.horizon,
            "seed": self.seed,
        }


_FIELDS = ("recall", "fpr", "horizon", "seed")


def parse_hint_noise(text: str, option: str = "--hints") -> HintNoise:
    """`recall=R,fpr=F[,horizon=H][,seed=S]` as a `HintNoise`; recall and fpr are
    required. A bad item raises InvalidValueError naming it (e.g. `recall=1.5`)."""
    values: dict[str, str] = {}
    for item in text.split(","):
        token = item.strip()
        name, sep, value = token.partition("=")
        name = name.strip().lower()
        if not sep or name not in _FIELDS or not value.strip():
            raise InvalidValueError(
                f"{option}: {token!r} is not one of recall=R, fpr=F, horizon=H, seed=S "
                f"(e.g. {option} recall=0.9,fpr=0.1)"
            )
        if name in values:
            raise InvalidValueError(f"{option}: {name} given twice ({text!r})")
        values[name] = value.strip()
    missing = [name for name in ("recall", "fpr") if name not in values]
    if missing:
        raise InvalidValueError(f"{option}: {' and '.join(missing)} missing from {text!r}")
    recall = _fraction(option, "recall", values["recall"])
    fpr = _fraction(option, "fpr", values["fpr"])
    if recall + fpr > 1:
        raise InvalidValueError(
            f"{option}: recall={values['recall']} and fpr={values['fpr']} add up to more than "
            "1 (a soon access gets 'likely' with probability recall and 'never' with fpr)"
        )
    if fpr > 0.5:
        raise InvalidValueError(
            f"{option}: fpr={values['fpr']} is above 0.5 (an access after the horizon gets "
            "each of 'likely' and 'never' with probability fpr)"
        )
    horizon = _horizon(option, values.get("horizon", "1"))
    seed_text = values.get("seed", "0")
    if not seed_text.isdigit():
        raise InvalidValueError(f"{option}: seed={seed_text} is not a non-negative integer")
    return HintNoise(recall, fpr, horizon, int(seed_text))


def _fraction(option: str, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise InvalidValueError(f"{option}: {name}={text} must be a number from 0 to 1")
    return value


def _horizon(option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InvalidValueError(
            f"{option}: horizon={text} must be a positive multiple of the capacity"
        )
    return value


def next_uses(accesses: Sequence[Hashable]) -> list[int]:
    """For each access, the index of the next access to its key (`NEVER_AGAIN`: none)."""
    following: list[int] = [NEVER_AGAIN] * len(accesses)
    seen: dict[Hashable, int] = {}
    for index in range(len(accesses) - 1, -1, -1):
        key = accesses[index]
        following[index] = seen.get(key, NEVER_AGAIN)
        seen[key] = index
    return following


def draws(count: int, seed: int) -> list[float]:
    """The uniform draw of each access (the same at every capacity)."""
    rng = random.Random(seed)
    return [rng.random() for _ in range(count)]


def noisy_hints(
    following: Sequence[int], uniform: Sequence[float], noise: HintNoise, horizon: int
) -> list[Reuse | None]:
    """The hint of each access (see the module doc), from its next use and its draw."""
    recall, fpr = noise.recall, noise.fpr
    hints: list[Reuse | None] = []
    append = hints.append
    for index, (nxt, u) in enumerate(zip(following, uniform, strict=True)):
        if nxt == NEVER_AGAIN:
            append("never" if u < recall else "likely" if u < recall + fpr else None)
        elif nxt - index <= horizon:
            append("likely" if u < recall else "never" if u < recall + fpr else None)
        else:
            append("likely" if u < fpr else "never" if u < 2 * fpr else None)
    return hints


@dataclass(frozen=True, slots=True)
class HintedRow:
    """One policy at one capacity, with and without the hints."""

    capacity_label: str
    blocks: int
    policy: str
    without: float
    hinted: float

    @property
    def gain(self) -> float:
        return self.hinted - self.without

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity_label,
            "blocks": self.blocks,
            "policy": self.policy,
            "hit_ratio": self.without,
            "hinted_hit_ratio": self.hinted,
            "gain": self.gain,
        }


def run_hinted(
    report: SweepReport,
    noise: HintNoise,
    partial: Sequence[bool] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[HintedRow]:
    """Each policy of a sweep at each of its capacities again, with noisy hints; next to
    the sweep's own (unhinted) hit ratio. `progress` is called with 1 after each run."""
    trace: SimTrace = report.trace
    following = next_uses(trace.accesses)
    uniform = draws(len(trace.accesses), noise.seed)
    rows: list[HintedRow] = []
    for capacity in report.capacities:
        horizon = noise.horizon_accesses(capacity.blocks)
        hints = noisy_hints(following, uniform, noise, horizon)
        for policy in report.policies:
            result = simulate_hinted(
                policy, capacity.blocks, trace.accesses, hints, horizon, partial=partial
            )
            without = report.row(policy, capacity.blocks).result.hit_ratio
            rows.append(
                HintedRow(capacity.label, capacity.blocks, policy, without, result.hit_ratio)
            )
            if progress is not None:
                progress(1)
    return rows


__all__ = [
    "HintNoise",
    "HintedRow",
    "next_uses",
    "noisy_hints",
    "parse_hint_noise",
    "run_hinted",
]
