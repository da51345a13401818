"""A request's session hints (`kvtier.sessions`) as a serving engine hands them over: the
same three keys in vLLM's `kv_transfer_params` and in the `extra_info` SGLang gives its
storage backend (`kvtier.integrations.vllm.hints`, `kvtier.integrations.sglang.store`):

    {"kvtier_session": "task-42"}                                 # blocks ranked by session
    {"kvtier_session": "task-42", "kvtier_expect_within_s": 20}   # a tool runs; back by 20 s
    {"kvtier_session": "task-42", "kvtier_session_end": true}     # the last request

`session_from_params` reads them, and raises InvalidValueError naming the key and the bad
value; an adapter logs that, counts it and stores the request's blocks without hints: a
client's typo never fails a request.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.errors import InvalidValueError, UnknownSessionError
from kvtier.sessions import check_session_id, check_within_s

log = logging.getLogger("kvtier.integrations")

SESSION_KEY = "kvtier_session"
"""The request's agentic session (a non-empty string)."""
SESSION_END_KEY = "kvtier_session_end"
"""True on a session's last request."""
EXPECT_KEY = "kvtier_expect_within_s"
"""The session's next request comes within this many seconds."""


@dataclass(frozen=True, slots=True)
class SessionParams:
    """A request's session hints, as its engine's request metadata gives them."""

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
