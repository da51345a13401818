"""`PutGate`: loads first, end to end. Puts enter the chain a bounded number at a time.

Every put step (reserving slots, demoting victims, copying in, settling, the background
jobs it plans) is work on the one event loop that gets share. With many callers putting as
fast as they can, each step of a get would queue behind a step of every put in flight, and
a get waiting for room at the top would see every freed slot taken by a put first. So:

- at most `limit` puts (parts of a put) are inside the chain at once; the others wait here,
  first come first served, in a future that costs the loop nothing (backpressure: the put
  is slower, nothing is dropped);
- while a get waits for room at the top tier (`loads_waiting`), no new put is let in, so
  the slots the chain frees go to that get;
- a get never waits on the gate.

A put that waited past its `store_timeout_s` deadline goes in anyway (over the limit,
counted by the caller as a store timeout): a put is never refused by the gate.

A serving engine's own stores (`store.prepare_engine_store`, what `embed/offloading_spec.py`
calls) do not pass the gate, on purpose. The engine awaits that call inside its step: a
place here could be held by any number of the embedder's puts (each for its whole reserve,
victims, copy and settling) and refused for as long as gets wait for room, so the engine's
step would wait on traffic that is not its own. And its own traffic needs no gate: its
scheduler issues its stores one step at a time (at most one in flight per engine), and its
loads (`TieredManager.lookup`: "ask again", the promotion started at once) never wait for
room at the top, so there is no engine get for the gate to put first. An engine store still
waits for the chain's room like a put (`wait_for_reserve`, within `store_timeout_s`, and its
victims' snapshot); it neither takes a place nor is counted in `put_admission_waits`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from kvtier.errors import InvalidValueError

DEFAULT_PUTS_IN_FLIGHT = 4
"""Puts (parts of puts) inside a chain at once, by default."""


class PutGate:
    """Admission of puts into one chain (see the module's docstring)."""

    def __init__(self, limit: int = DEFAULT_PUTS_IN_FLIGHT) -> None:
        if limit < 1:
            raise InvalidValueError(f"a put gate needs a limit >= 1, got {limit}")
        self.limit = limit
        self.in_flight = 0
        """Puts admitted and not yet left."""
        self.peak_in_flight = 0
        self.loads_waiting = 0
        """Gets waiting now for room at the top tier."""
        self.waits = 0
        """Puts that could not enter at once and waited."""
        self._waiters: deque[asyncio.Future[None]] = deque()

    def _open_now(self) -> bool:
        return self.in_flight < self.limit and self.loads_waiting == 0

    def open_now(self) -> bool:
        """Whether a put would enter at once (no wait)."""
        return self._open_now() and not self._waiters

    async def enter(self, deadline: float | None) -> bool:
        """Wait for a place (until `deadline`, a `time.perf_counter()` value; None: as long
        as it takes), then take it; False if the deadline passed first (the put is let in
        anyway). Cancelled while waiting, it takes no place."""
        if self.open_now():
            self._take()
            return True
        self.waits += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            remaining = None if deadline is None else max(0.0, deadline - time.perf_counter())
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
            async with asyncio.timeout(remaining):
                await asyncio.shield(future)
        except TimeoutError:
            if future.done():  # granted as the deadline passed: the place is ours
                return True
            future.cancel()
            self._take()
            return False
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.leave()  # granted as we were cancelled: pass it on
            else:
                future.cancel()
            raise
        return True

    def _take(self) -> None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def leave(self) -> None:
        """A put admitted by `enter` is done with the chain: let the next one in."""
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._open_now():
            future = self._waiters.popleft()
            if future.done():
                continue
            self._take()
            future.set_result(None)

    @contextmanager
    def load_waiting(self) -> Iterator[None]:
        """Around a get's wait for room at the top: no put is let in meanwhile."""
        self.loads_waiting += 1
        try:
            yield
        finally:
            self.loads_waiting -= 1
            self._wake()


__all__ = ["DEFAULT_PUTS_IN_FLIGHT", "PutGate"]
