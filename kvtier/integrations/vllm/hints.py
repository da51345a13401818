"""A request's reuse hint (`kvtier.hints`), as vLLM hands it over in the request's
`kv_transfer_params`:

    {"kvtier_reuse": "never"}                                # a one-off document
    {"kvtier_reuse": "likely", "kvtier_reuse_ttl_s": 30}     # a follow-up is expected

(an OpenAI-compatible request passes them as `"kv_transfer_params": {...}` in its body).
kvtier hints the blocks of that request it stores. A bad value (an unknown reuse, a TTL
that is not a positive number, a TTL without a reuse) is ignored for that request, logged
once and counted (`RequestHints.ignored`): a client's typo never fails a request, let alone
the engine. A request without the keys stores as it always did.

Session hints (`kvtier.sessions`) come the same way, for an agent framework's requests:

    {"kvtier_session": "task-42"}                            # blocks ranked by session
    {"kvtier_session": "task-42", "kvtier_expect_within_s": 20}   # a tool runs; back by 20 s
    {"kvtier_session": "task-42", "kvtier_session_end": true}     # the last request

The secondary tier puts the request's blocks with `session=` (and `expect_within_s=`),
and ends the session once the last request's blocks are stored. A bad value (a session id
that is not a string, a negative, huge or non-finite expectation, an end that is not a
bool, either without a session) is ignored the same way.

A request's hint is parsed once and kept in its `ReqContext`, so it is logged and counted
once, by the first kvtier part that reads it: under `KvtierOffloadingSpec` the secondary
tier (in `on_new_request`), before the CPU tier's policy sees the request's chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.errors import InvalidValueError, UnknownSessionError
from kvtier.hints import ReuseHint, check_reuse, check_ttl
from kvtier.sessions import check_session_id, check_within_s

log = logging.getLogger("kvtier.integrations.vllm")

REUSE_KEY = "kvtier_reuse"
"""`kv_transfer_params` key: `"likely"`, `"unlikely"` or `"never"`."""
TTL_KEY = "kvtier_reuse_ttl_s"
"""`kv_transfer_params` key: how long the hint holds, in seconds (optional)."""


SESSION_KEY = "kvtier_session"
"""`kv_transfer_params` key: the request's agentic session (a non-empty string)."""
SESSION_END_KEY = "kvtier_session_end"
"""`kv_transfer_params` key: true on a session's last request."""
EXPECT_KEY = "kvtier_expect_within_s"
"""`kv_transfer_params` key: the session's next request comes within this many seconds."""


@dataclass(frozen=True, slots=True)
class SessionParams:
    """A request's session hints, as its `kv_transfer_params` give them."""

    session: str
    end: bool = False
    expect_within_s: float | None = None


def session_from_params(params: object) -> SessionParams | None:
    """The session hints `params` give, None if none; raises InvalidValueError naming the
    key and the bad value."""
    keys = (SESSION_KEY, SESSION_END_KEY, EXPECT_KEY)
    if not isinstance(params, Mapping) or not any(key in params for key in keys):
        return None
    if SESSION_KEY not in params:
        given = next(key for key in keys if key in params)
        raise InvalidValueError(f"{given} given without {SESSION_KEY}")
    try:
        session = check_session_id(params[SESSION_KEY], SESSION_KEY)
    except InvalidValueError as error:
        raise InvalidValueError(
            str(error).replace(f"{SESSION_KEY}: session", SESSION_KEY)
        ) from None
    end = params.get(SESSION_END_KEY, False)
    if not isinstance(end, bool):
        raise InvalidValueError(f"{SESSION_END_KEY} must be true or false, got {end!r}")
    within = params.get(EXPECT_KEY)
    if within is not None:
        within = check_within_s(within, EXPECT_KEY)
    return SessionParams(session, end, within)


def end_session_quietly(hierarchy: Any, session: str) -> None:
    """End `session` in `hierarchy`; a session it does not know (none of its blocks were
    stored under it, or it ended already) is logged, never raised: a request never fails
    for its hint."""
    try:
        hierarchy.end_session(session)
    except UnknownSessionError as error:
        log.info("kvtier: %s", error)


def hint_from_params(params: object) -> ReuseHint | None:
    """The hint `params` (a request's `kv_transfer_params`) gives, None if it gives none;
    raises InvalidValueError naming the key and the bad value."""
    if not isinstance(params, Mapping) or (REUSE_KEY not in params and TTL_KEY not in params):
        return None
    if REUSE_KEY not in params:
        raise InvalidValueError(f"{TTL_KEY} given without {REUSE_KEY}")
    try:
        reuse = check_reuse(params[REUSE_KEY])
    except InvalidValueError as error:
        raise InvalidValueError(f"{REUSE_KEY}: {error}") from None
    try:
        ttl_s = check_ttl(params.get(TTL_KEY))
    except InvalidValueError as error:
        raise InvalidValueError(f"{TTL_KEY}: {error}") from None
    return ReuseHint(reuse, ttl_s)


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A request's hint and session hints, parsed once (kept in its `ReqContext`'s
    state)."""

    hint: ReuseHint | None
    session: SessionParams | None = None


class RequestHints:
    """Reads the hint of each request once, counting what it found: `given` requests with
    a valid hint, `ignored` ones with a bad one (each logged once)."""

    def __init__(self) -> None:
        self.given = 0
        self.ignored = 0

    def of(self, req_context: Any) -> ReuseHint | None:
        """The hint of the request of `req_context` (a vLLM `ReqContext`), None if none or
        bad. Never raises: a request is never failed for its hint."""
        if req_context is None:
            return None
        try:
            parsed: _Parsed | None = req_context.get_state(_Parsed)
        except AttributeError:  # not a ReqContext (an older vLLM's): no hint
            return None
        if parsed is None:
            parsed = self._parse(req_context)
            req_context.set_state(parsed)
        return parsed.hint

    def session_of(self, req_context: Any) -> SessionParams | None:
        """The session hints of the request of `req_context`, None if none or bad (parsed
        with its reuse hint, once). Never raises."""
        if req_context is None:
            return None
        self.of(req_context)
        try:
            parsed: _Parsed | None = req_context.get_state(_Parsed)
        except AttributeError:
            return None
        return None if parsed is None else parsed.session

    def _parse(self, req_context: Any) -> _Parsed:
        params = getattr(req_context, "kv_transfer_params", None)
        hint = self._read(req_context, "reuse hint", hint_from_params, params)
        session = self._read(req_context, "session hint", session_from_params, params)
        return _Parsed(hint, session)

    def _read(self, req_context: Any, what: str, parse: Any, params: object) -> Any:
        try:
            value = parse(params)
        except InvalidValueError as error:
            self.ignored += 1
            log.warning(
                "request %s: kv_transfer_params %s ignored: %s",
                getattr(req_context, "req_id", "?"),
                what,
                error,
            )
            return None
        if value is not None:
            self.given += 1
        return value


__all__ = [
    "EXPECT_KEY",
    "REUSE_KEY",
    "SESSION_END_KEY",
    "SESSION_KEY",
    "TTL_KEY",
    "RequestHints",
    "SessionParams",
    "end_session_quietly",
    "hint_from_params",
    "session_from_params",
]
