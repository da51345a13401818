"""`kvtier replay --sessions`: the session hints of `kvtier.sessions` given to a real replay.

A trace whose requests name their session (`kvtier workloads agentic` writes one: the
`"session"` and `"session_end"` keys of `kvtier_tools.workloads.traces`) is replayed as an
agent framework would drive a Hierarchy:

- every `put` of a request carries its session (`Hierarchy.put(..., session=)`), and so does
  one more `put` of the request's hits (all already held, so nothing is stored or moved): a
  session re-reads its whole prefix, and its sub-agent's read of the parent's prefix is what
  keeps those blocks alive when the parent ends (`kvtier.sessions`);
- a request marked `"session_end"` ends its session once its puts are done
  (`Hierarchy.end_session`): the blocks only that session read become `"never"`;
- with `--expect-within S` (an **oracle**: it reads the future of the trace), every put of a
  request whose session goes on carries `expect_within_s`: the trace's gap to that
  session's next request plus S seconds. It rides on the puts, as a framework that knows
  its tool's run time says it with the request (and as `simulate --hints` gives it): an
  expectation given only once the request is served leaves the request's own blocks ranked
  idle while they are stored, below every expected session's, so its later parts evict
  its earlier ones (measured: 0.21 at 1 % instead of 0.32, docs/BENCHMARKS.md).

The Hierarchy reads the session hints' deadlines on the trace's clock (`session_clock`:
the timestamp of the request being served, `SessionPlan.clock`), as the simulator does: a
replay serves the trace's hour in minutes at a pace that varies with its load, and on the
wall clock 18 % of the sessions' next requests came after their expectation had lapsed.

`--hint-noise recall=R,fpr=F` (with `--expect-within`) makes the oracle's two predictions
("the session ends", "its next request comes within T") as noisy as `simulate --hints`
makes them, for the curve of a chain's hit ratio against hint accuracy.

The replay keeps its counters: how many puts named a session, how many sessions ended and
how many expectations it gave, reported under `"sessions"` in `report.json`.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtier.errors import InvalidValueError, UnknownSessionError
from kvtier.sessions import MAX_EXPECT_S
from kvtier_tools.workloads.simulation.hints import HintNoise
from kvtier_tools.workloads.simulation.sessions import FALSE_EXPECT_S
from kvtier_tools.workloads.traces import read_mooncake

if TYPE_CHECKING:
    from kvtier.hierarchy import Hierarchy

__all__ = ["SessionPlan", "load_session_plan", "next_gaps", "noisy_predictions"]


def next_gaps(sessions: list[str], times_s: list[float]) -> list[float | None]:
    """For each request, the seconds to its session's next request in the trace (None: it
    has none)."""
    gaps: list[float | None] = [None] * len(sessions)
    last_seen: dict[str, float] = {}
    for index in range(len(sessions) - 1, -1, -1):
        name = sessions[index]
        later = last_seen.get(name)
        if later is not None:
            gaps[index] = max(0.0, later - times_s[index])
        last_seen[name] = times_s[index]
    return gaps


@dataclass(slots=True)
class SessionPlan:
    """Each request's session, whether it ends its session, and (with the oracle) the
    expectation to give after it; counts what the replay gave the Hierarchy."""

    sessions: tuple[str, ...]
    ends: tuple[bool, ...]
    expect_s: tuple[float | None, ...] | None = None
    """Per request, the trace seconds to expect its session's next request in (the oracle)."""
    times_s: tuple[float, ...] = ()
    """Each request's time in the trace (seconds): the sessions' clock."""
    now_s: float = 0.0
    """The trace time of the request being served (`clock`)."""
    noise: HintNoise | None = None
    """How noisy the oracle's predictions are (None: exact, or no oracle)."""
    ended: int = 0
    expected: int = 0
    end_refused: int = 0
    """`session_end` requests whose session the Hierarchy did not know (none of its puts
    ran, or it had ended already): UnknownSessionError, counted rather than raised."""

    def session_of(self, index: int) -> str:
        """The session of request `index` (0-based)."""
        return self.sessions[index]

    def clock(self) -> float:
        """The sessions' clock: the trace time of the request being served (what the
        replay's Hierarchy takes as `session_clock`)."""
        return self.now_s

    def expect_within(self, index: int) -> float | None:
        """Request `index` is being served (the clock moves to its time): the oracle's
        `expect_within_s` for its puts, in trace seconds (None: no oracle, or its session
        has no next request)."""
        if self.times_s:
            self.now_s = self.times_s[index]
        within = None if self.expect_s is None else self.expect_s[index]
        if within is None or self.ends[index]:
            return None
        self.expected += 1
        return within

    def after(self, hierarchy: Hierarchy, index: int) -> None:
        """What the framework says once request `index` is served: its session ended."""
        if self.ends[index]:
            try:
                hierarchy.end_session(self.sessions[index])
                self.ended += 1
            except UnknownSessionError:
                self.end_refused += 1

    def to_dict(self) -> dict[str, Any]:
        """The `"sessions"` part of `report.json`."""
        return {
            "sessions": len(set(self.sessions)),
            "session_ends_said": sum(self.ends),
            "hint_noise": None
            if self.noise is None
            else {"recall": self.noise.recall, "fpr": self.noise.fpr, "seed": self.noise.seed},
            "ended": self.ended,
            "end_refused": self.end_refused,
            "expect_oracle": self.expect_s is not None,
            "expected": self.expected,
        }


def load_session_plan(
    path: Path | None,
    count: int,
    expect_slack_s: float | None = None,
    noise: HintNoise | None = None,
) -> SessionPlan:
    """The sessions of the first `count` requests of the Mooncake trace at `path`; every
    request must name one (InvalidValueError names the first that does not). With
    `expect_slack_s`, the oracle: after a request whose session goes on, expect its next
    request within the trace's gap plus `expect_slack_s` seconds (at most a week). With
    `noise` too, the oracle's two predictions made as noisy as `simulate --hints` makes
    them (`noisy_predictions`)."""
    if expect_slack_s is not None and not 0 < expect_slack_s <= MAX_EXPECT_S:
        raise InvalidValueError(
            f"--expect-within must be more than 0 and at most {MAX_EXPECT_S:g} s, "
            f"got {expect_slack_s:g}"
        )
    if noise is not None and expect_slack_s is None:
        raise InvalidValueError("--hint-noise needs --expect-within")
    sessions: list[str] = []
    ends: list[bool] = []
    times_s: list[float] = []
    for number, request in enumerate(itertools.islice(read_mooncake(path), count), 1):
        if request.session is None:
            raise InvalidValueError(
                f"--sessions: request {number} of {path or 'the shipped trace'} names no "
                "session (the trace of `kvtier workloads agentic` does)"
            )
        sessions.append(request.session)
        ends.append(request.session_end)
        times_s.append(request.timestamp_ms / 1000)
    expect: tuple[float | None, ...] | None = None
    if expect_slack_s is not None:
        gaps = next_gaps(sessions, times_s)
        if noise is not None:
            ends, expected = noisy_predictions(gaps, expect_slack_s, noise)
            expect = tuple(expected)
        else:
            expect = tuple(
                None if gap is None else min(MAX_EXPECT_S, gap + expect_slack_s) for gap in gaps
            )
    return SessionPlan(tuple(sessions), tuple(ends), expect, tuple(times_s), noise=noise)


def noisy_predictions(
    gaps: list[float | None], slack_s: float, noise: HintNoise
) -> tuple[list[bool], list[float | None]]:
    """Per request, whether the end is said and the expectation given, as noisy as
    `kvtier_tools.workloads.simulation.sessions` makes them (one uniform draw a request,
    `random.Random(noise.seed)`): a session that goes on is expected within its gap plus
    `slack_s` with probability `recall`, and falsely ended with `fpr`; one that ends is
    ended with `recall`, and falsely expected within `FALSE_EXPECT_S` with `fpr`."""
    rng = random.Random(noise.seed)
    ends: list[bool] = []
    expect: list[float | None] = []
    for gap in gaps:
        u = rng.random()
        if gap is None:
            ends.append(u < noise.recall)
            false = not ends[-1] and u < noise.recall + noise.fpr
            expect.append(FALSE_EXPECT_S if false else None)
        else:
            expected = u < noise.recall
            expect.append(min(MAX_EXPECT_S, gap + slack_s) if expected else None)
            ends.append(not expected and u < noise.recall + noise.fpr)
    return ends, expect
