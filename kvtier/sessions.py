"""Session hints: what an agent framework knows about its sessions, turned into the reuse
hints and ranks a policy takes (`kvtier.hints`, `CachePolicy.rank`).

An agentic session is a prefix that grows turn by turn; every request of it re-reads the
whole prefix, and between two requests a tool runs for seconds to minutes. Three things the
application knows and no block policy can learn:

- **which session a block belongs to** (`Hierarchy.put(..., session=)`): a session's blocks
  are reused together, when it sends its next request. Blocks are evicted by session, the
  least recently active session's first (its tail first: a prefix's head serves more);
- **that a session ended** (`Hierarchy.end_session`): its blocks become `"never"` (evicted
  first, not demoted), except those another live session read too (a sub-agent's parent);
- **that its next request comes within T seconds** (`Hierarchy.expect_session`, or
  `expect_within_s=` on a put): until T its blocks go only after every idle session's,
  and among expected sessions the one expected latest goes first (Belady's rule, by
  session). Past T, unless a request came, the session is idle again.

`SessionTable` keeps the sessions: which keys each read, when each was last active, its
expectation. It reads no clock (the caller passes `now`, seconds on its own clock) and moves
no block: each call returns the `SessionChanges` the caller gives the chain's tiers. A
block's rank is the best of its live sessions': `(0, activity, -position)` for an idle
session (lower activity: longer idle), `(1, -deadline, -position)` for an expected one, so
idle sessions' blocks go before expected ones, and a session's tail before its head.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import isfinite

from kvtier.errors import InvalidValueError, UnknownSessionError
from kvtier.keys import OffloadKey

MAX_EXPECT_S = 7 * 24 * 3600.0
"""The longest `within_s` an expectation may give (a week): a larger one is a mistake."""

MAX_SESSION_ID_CHARS = 256

Rank = tuple[int, float, int]


def check_session_id(session: object, what: str) -> str:
    """`session` itself if it is a non-empty string of at most 256 characters; raises
    InvalidValueError naming it otherwise."""
    if not isinstance(session, str) or not session or len(session) > MAX_SESSION_ID_CHARS:
        shown = repr(session) if not isinstance(session, str) else f"{session[:40]!r}"
        raise InvalidValueError(
            f"{what}: session must be a non-empty string of at most "
            f"{MAX_SESSION_ID_CHARS} characters, got {shown}"
        )
    return session


def check_within_s(within_s: object, what: str) -> float:
    """`within_s` as a float; raises InvalidValueError unless it is a positive finite number
    of seconds of at most `MAX_EXPECT_S`."""
    if (
        isinstance(within_s, bool)
        or not isinstance(within_s, int | float)
        or not isfinite(within_s)
        or not 0 < within_s <= MAX_EXPECT_S
    ):
        raise InvalidValueError(
            f"{what}: within_s must be a number of seconds above 0 and at most "
            f"{MAX_EXPECT_S:.0f} (a week), got {within_s!r}"
        )
    return float(within_s)


@dataclass
class SessionChanges:
    """What a session event asks of the tiers: new ranks (None: unranked) and keys now
    `"never"`."""

    ranks: dict[OffloadKey, Rank | None] = field(default_factory=dict)
    never: list[OffloadKey] = field(default_factory=list)

    def merge(self, other: SessionChanges) -> SessionChanges:
        """These changes, then `other`'s (a later rank of a key wins)."""
        self.ranks.update(other.ranks)
        self.never += other.never
        return self

    def __bool__(self) -> bool:
        return bool(self.ranks or self.never)


@dataclass(slots=True)
class _Session:
    keys: dict[OffloadKey, int] = field(default_factory=dict)
    """Each key it read and its position in the session (0: the head)."""
    activity: int = 0
    deadline: float | None = None


class SessionTable:
    """The live sessions and the keys each read (see the module doc). At most
    `max_sessions` are kept: past it the least recently active one is forgotten (its blocks
    keep their ranks until a session reads them again)."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        self._sessions: dict[str, _Session] = {}
        self._owners: dict[OffloadKey, set[str]] = {}
        self._activity = 0
        self._deadlines: list[tuple[float, str]] = []
        self.max_sessions = max_sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session: object) -> bool:
        return session in self._sessions

    def deadline_of(self, session: str) -> float | None:
        """When `session`'s expected request is due (None: it is idle). Raises
        UnknownSessionError for a session no put named (or one that ended)."""
        return self._require(session, "deadline_of").deadline

    def keys_of(self, session: str) -> list[OffloadKey]:
        """The keys `session` read, head first."""
        return list(self._require(session, "keys_of").keys)

    def read(self, session: str, keys: Sequence[OffloadKey], now: float) -> SessionChanges:
        """A request of `session` read (or stored) `keys`, head first: it becomes the most
        recently active session, its expectation ends (the request came), and `keys` join
        it. A new session id starts a session."""
        changes = self.expire(now)
        state = self._sessions.get(session)
        if state is None:
            state = self._sessions[session] = _Session()
            self._forget_oldest()
        for key in keys:
            if key not in state.keys:
                state.keys[key] = len(state.keys)
                self._owners.setdefault(key, set()).add(session)
        self._activity += 1
        state.activity = self._activity
        state.deadline = None
        self._rerank(state, changes)
        return changes

    def expect(self, session: str, within_s: float, now: float) -> SessionChanges:
        """`session`'s next request comes within `within_s` seconds: its keys are ranked
        after every idle session's, by the deadline, until it passes. Raises
        UnknownSessionError for a session no put named (or one that ended)."""
        within = check_within_s(within_s, "expect_session")
        state = self._require(session, "expect_session")
        changes = self.expire(now)
        state.deadline = now + within
        heapq.heappush(self._deadlines, (state.deadline, session))
        self._rerank(state, changes)
        return changes

    def end(self, session: str, now: float) -> SessionChanges:
        """`session` ended: its keys no other live session read become `"never"`; the others
        are ranked by their remaining sessions. Raises UnknownSessionError for a session no
        put named (or one that ended already)."""
        state = self._require(session, "end_session")
        changes = self.expire(now)
        del self._sessions[session]
        for key in state.keys:
            owners = self._owners.get(key)
            if owners is None:
                continue
            owners.discard(session)
            if owners:
                changes.ranks[key] = self._best(key, owners)
            else:
                del self._owners[key]
                changes.never.append(key)
                changes.ranks[key] = None
        return changes

    def expire(self, now: float) -> SessionChanges:
        """Sessions whose expected request did not come by `now` are idle again."""
        changes = SessionChanges()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, session = heapq.heappop(deadlines)
            state = self._sessions.get(session)
            if state is not None and state.deadline == deadline:
                state.deadline = None
                self._rerank(state, changes)
        return changes

    # -- implementation ----------------------------------------------------------------------

    def _require(self, session: str, what: str) -> _Session:
        check_session_id(session, what)
        state = self._sessions.get(session)
        if state is None:
            raise UnknownSessionError(f"{what}: no live session {session[:60]!r}")
        return state

    def _value(self, state: _Session) -> tuple[int, float]:
        if state.deadline is not None:
            return (1, -state.deadline)
        return (0, float(state.activity))

    def _best(self, key: OffloadKey, owners: set[str]) -> Rank:
        best: Rank | None = None
        for name in owners:
            state = self._sessions[name]
            rank = (*self._value(state), -state.keys[key])
            if best is None or rank > best:
                best = rank
        assert best is not None  # owners is not empty
        return best

    def _rerank(self, state: _Session, changes: SessionChanges) -> None:
        """Rank each key of `state` again: the best of its owners' values."""
        value = self._value(state)
        owners_of = self._owners
        for key, position in state.keys.items():
            owners = owners_of[key]
            if len(owners) == 1:
                changes.ranks[key] = (*value, -position)
            else:
                changes.ranks[key] = self._best(key, owners)

    def _forget_oldest(self) -> None:
        if len(self._sessions) <= self.max_sessions:
            return
        oldest = min(self._sessions, key=lambda name: self._sessions[name].activity)
        state = self._sessions.pop(oldest)
        for key in state.keys:
            owners = self._owners.get(key)
            if owners is not None:
                owners.discard(oldest)
                if not owners:
                    del self._owners[key]
