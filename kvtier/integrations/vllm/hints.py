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
and ends the session once the last request's blocks are stored (the keys and their
parsing: `kvtier.integrations.session_params`, shared with SGLang). A bad value (a session id
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

from kvtier.errors import InvalidValueError
from kvtier.hints import ReuseHint, check_reuse, check_ttl
from kvtier.integrations.session_params import (
    EXPECT_KEY,
    SESSION_END_KEY,
    SESSION_KEY,
    SessionParams,
    end_session_quietly,
    session_from_params,
)

log = logging.getLogger("kvtier.integrations.vllm")

REUSE_KEY = "kvtier_reuse"
"""`kv_transfer_params` key: `"likely"`, `"unlikely"` or `"never"`."""
TTL_KEY = "kvtier_reuse_ttl_s"
"""`kv_transfer_params` key: how long the hint holds, in seconds (optional)."""


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
