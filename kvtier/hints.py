"""Reuse hints: what an application knows about whether a block will be read again.

Only the application knows that a conversation is closed (its blocks will not be read again)
or that a user is typing a follow-up (its blocks will be read within seconds): no access
count or age can tell. A hint says so:

- `"never"`: the block will not be reused (a closed conversation, a one-off document). Each
  tier evicts it before any other block it may evict, and it is not demoted to the tier
  below: evicting it drops it, sparing the slower tiers a write nobody will read.
- `"unlikely"`: probably not reused. Evicted after the `"never"` blocks and before any
  unhinted one; it is demoted as usual and keeps its hint in the tier below.
- `"likely"`: reused soon (a conversation that goes on). Not evicted while the hint holds,
  unless every block the tier may evict is `"likely"`: then the policy's next victims among
  them go, so a hint never makes a store impossible. It keeps its hint when demoted.

A hint holds until its TTL (`ttl_s`, seconds, None: as long as the block stays in the
tier), until the block leaves the tier (its hint travels with it when it is demoted), and,
for `"never"` and `"unlikely"`, until the block is read again (a hit disproves it: another
request shares the prefix). A policy keeps no clock: the bookkeeping turns the TTL into a
deadline and withdraws the hint when it passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import isfinite
from typing import Literal, get_args

from kvtier.errors import InvalidValueError

Reuse = Literal["likely", "unlikely", "never"]
"""Whether a block will be read again, as the application sees it (see the module doc)."""

REUSE_VALUES: tuple[Reuse, ...] = get_args(Reuse)


def check_reuse(reuse: object) -> Reuse:
    """`reuse` itself if it is a valid `Reuse`; raises InvalidValueError naming it otherwise."""
    if not isinstance(reuse, str) or reuse not in REUSE_VALUES:
        raise InvalidValueError(
            f"reuse must be one of {', '.join(map(repr, REUSE_VALUES))}, got {reuse!r}"
        )
    return reuse


MAX_TTL_S = 7 * 24 * 3600.0
"""The longest TTL a hint may give (a week): a larger one is a mistake (milliseconds given
as seconds); a hint that should hold as long as its block stays has no TTL (None)."""


def check_ttl(ttl_s: object) -> float | None:
    """`ttl_s` as a float (None: no TTL); raises InvalidValueError unless it is None or a
    positive finite number of seconds of at most `MAX_TTL_S`."""
    if ttl_s is None:
        return None
    if (
        isinstance(ttl_s, bool)
        or not isinstance(ttl_s, int | float)
        or not isfinite(ttl_s)
        or not 0 < ttl_s <= MAX_TTL_S
    ):
        raise InvalidValueError(
            f"ttl_s must be a positive number of seconds of at most {MAX_TTL_S:.0f} "
            f"(a week) or None, got {ttl_s!r}"
        )
    return float(ttl_s)


@dataclass(frozen=True, slots=True)
class ReuseHint:
    """A hint as an application gives it: `reuse`, and for how long it holds (`ttl_s`
    seconds from when it is given; None: while the block stays in its tier)."""

    reuse: Reuse
    ttl_s: float | None = None

    def __post_init__(self) -> None:
        check_reuse(self.reuse)
        object.__setattr__(self, "ttl_s", check_ttl(self.ttl_s))

    @classmethod
    def of(cls, hint: ReuseHint | str) -> ReuseHint:
        """`hint` itself, or a hint of that `reuse` and no TTL for a bare string."""
        if isinstance(hint, ReuseHint):
            return hint
        return cls(check_reuse(hint))


@dataclass(frozen=True, slots=True)
class HeldHint:
    """A hint as a tier's bookkeeping holds it: the TTL turned into a deadline on the
    bookkeeping's clock (None: no deadline)."""

    reuse: Reuse
    expires_at: float | None = None
