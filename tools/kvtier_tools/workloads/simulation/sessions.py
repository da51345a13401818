"""`kvtier simulate --hints` on a trace with sessions: what session hints are worth.

A trace whose requests name their session (`kvtier workloads agentic` writes one) lets the
simulation give the policy what an agent framework would (`kvtier.sessions`): every
request's blocks ranked by session (a fact, always given), and two predictions made as
noisy as `HintNoise` says, from the trace's truth:

- **the session ends** after this request (it has no later one): said with probability
  `recall`; said falsely of a session that goes on with probability `fpr` (its blocks turn
  `"never"`, and its next request starts it again);
- **its next request comes within T** (T = 1.5 x the true gap + 1 s, an application's
  bound on its tool's run time): said with probability `recall` of a session that goes on;
  said falsely of one that ends with probability `fpr` (T = `FALSE_EXPECT_S`).

While a request is served, the blocks it has still to read are protected (a tier pins
what a request loads), unless nothing else can go; those it read already are ranked as
their session is after the request.

One uniform draw per request from `random.Random(seed)` decides, as for block hints. The
expectation is given with the request (a put's `expect_within_s`); the end once it is
served. Time is the trace's timestamps; an expectation lapses at its deadline.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from typing import cast

from kvtier.blocks import BlockStatus
from kvtier.errors import InvalidValueError, KvtierError
from kvtier.keys import OffloadKey
from kvtier.policies import SimulationResult
from kvtier.policies.base import CachePolicy
from kvtier.policies.registry import get_policy_class
from kvtier.sessions import SessionChanges, SessionTable
from kvtier_tools.workloads.simulation.hints import HintedRow, HintNoise
from kvtier_tools.workloads.simulation.sweep import SweepReport

FALSE_EXPECT_S = 60.0
"""The T of a false "expect within T" (a session that in truth ends)."""


def session_truth(sessions: Sequence[str], times_s: Sequence[float]) -> list[float | None]:
    """For each request, the gap in seconds to its session's next request (None: none)."""
    gaps: list[float | None] = [None] * len(sessions)
    following: dict[str, float] = {}
    for index in range(len(sessions) - 1, -1, -1):
        name = sessions[index]
        later = following.get(name)
        gaps[index] = None if later is None else later - times_s[index]
        following[name] = times_s[index]
    return gaps


def simulate_sessions(
    name: str | Callable[[int], CachePolicy],
    capacity: int,
    requests: Sequence[Sequence[Hashable]],
    sessions: Sequence[str],
    times_s: Sequence[float],
    noise: HintNoise | None,
    partial: Sequence[bool] | None = None,
) -> SimulationResult:
    """Serve `requests` (each a prefix of block keys, of session `sessions[i]` at
    `times_s[i]`) through a fresh policy of `capacity` blocks with session hints (see the
    module doc; `noise` None: ranks only, no end or expectation). `partial`: a flag per
    access (flattened), as `simulate` takes it."""
    if not len(requests) == len(sessions) == len(times_s):
        raise InvalidValueError("simulate_sessions: one session and one time per request")
    policy_class = get_policy_class(name) if isinstance(name, str) else name
    policy = policy_class(capacity)
    run = _Run(policy, capacity)
    gaps = session_truth(sessions, times_s)
    rng = random.Random(noise.seed if noise is not None else 0)
    recall = noise.recall if noise is not None else 0.0
    fpr = noise.fpr if noise is not None else 0.0
    table = SessionTable()
    position = 0
    for request, session, now, gap in zip(requests, sessions, times_s, gaps, strict=True):
        u = rng.random()
        run.give(table.expire(now))
        keys = [cast(OffloadKey, key) for key in request]
        changes = table.read(session, keys, now)
        ends = False
        if gap is None:
            ends = u < recall
            if not ends and u < recall + fpr:
                changes.merge(table.expect(session, FALSE_EXPECT_S, now))
        elif u < recall:
            changes.merge(table.expect(session, 1.5 * gap + 1.0, now))
        else:
            ends = u < recall + fpr
        run.give(changes)
        flags = partial[position : position + len(keys)] if partial is not None else None
        position += len(keys)
        run.serve(keys, flags, changes)
        if ends:
            run.give(table.end(session, now))
    return SimulationResult(
        policy.name, capacity, run.accesses, run.hits, run.evictions, run.refused
    )


class _Run:
    """One replay's policy, counts and "likely" deadlines."""

    def __init__(self, policy: CachePolicy, capacity: int) -> None:
        self.policy = policy
        self.capacity = capacity
        self.accesses = self.hits = self.evictions = self.refused = 0

    def give(self, changes: SessionChanges) -> None:
        """Give the resident keys their ranks and hints (absent ones are ignored)."""
        policy = self.policy
        for key, rank in changes.ranks.items():
            policy.rank(key, rank)
        for key in changes.never:
            policy.hint(key, "never")

    def serve(
        self,
        keys: list[OffloadKey],
        flags: Sequence[bool] | None,
        changes: SessionChanges,
    ) -> None:
        """Each access as `simulate` serves it, the keys still to read protected; a stored
        key gets its rank."""
        policy = self.policy
        protected = set(keys)
        for index, key in enumerate(keys):
            protected.discard(key)
            self.accesses += 1
            one = (key,)
            if policy.get(key) is not None:
                self.hits += 1
                policy.touch(one)
                continue
            if flags is not None and flags[index]:
                self.refused += 1
                continue
            policy.on_store_miss(one)
            if not policy.admits_all and not policy.admit(one)[0]:
                self.refused += 1
                continue
            if len(policy) >= self.capacity:
                victims = policy.evict(1, protected) or policy.evict(1)
                if victims is None:
                    raise KvtierError(f"{policy.name}: a full cache could not evict one")
                self.evictions += 1
            block = BlockStatus(0)
            block.ref_cnt = 0
            policy.insert(key, block)
            rank = changes.ranks.get(key)
            if rank is not None:
                policy.rank(key, rank)


def run_session_hinted(
    report: SweepReport,
    noise: HintNoise,
    partial: Sequence[bool] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[HintedRow]:
    """Each policy of a sweep at each of its capacities again, with session hints of
    `noise`'s accuracy (the trace must have sessions); next to the sweep's own hit ratio."""
    trace = report.trace
    if trace.sessions is None or trace.times_s is None:
        raise InvalidValueError("session hints need a trace whose requests name their session")
    rows: list[HintedRow] = []
    for capacity in report.capacities:
        for policy in report.policies:
            result = simulate_sessions(
                policy,
                capacity.blocks,
                trace.requests,
                trace.sessions,
                trace.times_s,
                noise,
                partial=partial,
            )
            without = report.row(policy, capacity.blocks).result.hit_ratio
            rows.append(
                HintedRow(capacity.label, capacity.blocks, policy, without, result.hit_ratio)
            )
            if progress is not None:
                progress(1)
    return rows
