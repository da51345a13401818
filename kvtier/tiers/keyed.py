"""`KeyedStorage`: the storage of a tier that owns its own index, and `ProbeCache`.

A remote or shared store (Redis, a shared filesystem, an engine's own tier) is addressed by
key, not by slot: it decides what it keeps, and many writers share it. Its storage
implements the ordinary `BlockStorage` calls, ignoring the `slots` arguments (they are
handles of kvtier's bookkeeping, `KeyedTierManager`), plus `probe`, a lookup that never
blocks: it answers from a short-lived local cache, or starts an asynchronous, batched query
and answers None ("ask again"); when the answer arrives, the storage calls its listener
(the hierarchy wakes the readers waiting on it).

`ProbeCache` is that machinery, ready to use: give it the store's batched `contains`.
A failed or slow query is a miss (counted), never an error in the caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.tiers.storage import BlockStorage, TierAccess

log = logging.getLogger("kvtier.tiers.keyed")

Listener = Callable[[], None]


class KeyedStorage(BlockStorage):
    """A `BlockStorage` addressed by key that answers lookups itself (see module doc)."""

    access: ClassVar[TierAccess] = TierAccess.CLIENT
    _listener: Listener | None = None

    @abstractmethod
    def probe(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        """Without blocking: True the store holds the key, False it does not, None not
        known yet (a query was started; ask again, the listener is called on its answer)."""

    def set_listener(self, listener: Listener | None) -> None:
        """Called (on the event loop) whenever a query answers."""
        self._listener = listener

    def _answered(self) -> None:
        listener = self._listener
        if listener is not None:
            listener()


@dataclass(slots=True)
class ProbeStats:
    """What the lookups of a keyed tier did."""

    cached: int = 0
    """Answers from the local cache."""
    queried: int = 0
    """Keys sent to the store."""
    queries: int = 0
    """Round trips (batches)."""
    failures: int = 0
    """Queries that failed or timed out (their keys answered as absent for a while)."""


class ProbeCache:
    """Batched asynchronous lookups with a local cache of answers.

    `query(keys) -> list[bool]` asks the store about a batch. Answers are kept for
    `ttl_s` (present) or `negative_ttl_s` (absent; short, since another node may store the
    block any moment), at most `max_entries` of them. At most `max_in_flight` queries run
    at once; keys asked while a query is full wait for the next one.
    """

    def __init__(
        self,
        query: Callable[[list[OffloadKey]], Awaitable[list[bool]]],
        *,
        ttl_s: float = 5.0,
        negative_ttl_s: float = 0.5,
        timeout_s: float = 1.0,
        max_entries: int = 100_000,
        max_batch: int = 512,
        max_in_flight: int = 4,
        on_answer: Listener | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (
            ("ttl_s", ttl_s),
            ("negative_ttl_s", negative_ttl_s),
            ("timeout_s", timeout_s),
        ):
            if not value > 0:
                raise InvalidValueError(f"{name} must be > 0, got {value!r}")
        for name, count in (
            ("max_entries", max_entries),
            ("max_batch", max_batch),
            ("max_in_flight", max_in_flight),
        ):
            if count < 1:
                raise InvalidValueError(f"{name} must be >= 1, got {count!r}")
        self._query = query
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self.timeout_s = timeout_s
        self.max_entries = max_entries
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.on_answer = on_answer
        self._clock = clock
        self._answers: OrderedDict[OffloadKey, tuple[bool, float]] = OrderedDict()
        self._asked: set[OffloadKey] = set()  # in a query now
        self._waiting: dict[OffloadKey, None] = {}  # to ask, in order
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = ProbeStats()
        self._closed = False

    def probe(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        """Cached answers, or None for keys being (or now to be) asked about."""
        now = self._clock()
        answers: list[bool | None] = []
        for key in keys:
            cached = self._answers.get(key)
            if cached is not None and cached[1] > now:
                self.stats.cached += 1
                answers.append(cached[0])
                continue
            if key not in self._asked:
                self._waiting[key] = None
            answers.append(None)
        self._launch()
        return answers

    def note(self, key: OffloadKey, present: bool) -> None:
        """Remember what a write (present) or a failed read (absent) showed."""
        ttl = self.ttl_s if present else self.negative_ttl_s
        self._remember(key, present, self._clock() + ttl)

    def forget(self, key: OffloadKey) -> None:
        self._answers.pop(key, None)

    async def aclose(self) -> None:
        """Cancel the queries in flight and wait for them."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _launch(self) -> None:
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a synchronous caller): keys stay waiting for the next probe
        while self._waiting and len(self._tasks) < self.max_in_flight:
            batch = []
            for key in list(self._waiting)[: self.max_batch]:
                del self._waiting[key]
                batch.append(key)
            self._asked.update(batch)
            task = loop.create_task(self._ask(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _ask(self, batch: list[OffloadKey]) -> None:
        self.stats.queries += 1
        self.stats.queried += len(batch)
        try:
            async with asyncio.timeout(self.timeout_s):
                answers = await self._query(batch)
            if len(answers) != len(batch):
                raise InvalidValueError(f"{len(answers)} answers for {len(batch)} keys")
        except asyncio.CancelledError:
            self._asked.difference_update(batch)
            raise
        except Exception as error:  # any failure of the store: a miss for a short while
            self.stats.failures += 1
            log.warning("lookup of %d keys failed: %r", len(batch), error)
            answers = [False] * len(batch)
        now = self._clock()
        for key, present in zip(batch, answers, strict=True):
            ttl = self.ttl_s if present else self.negative_ttl_s
            self._remember(key, bool(present), now + ttl)
        self._asked.difference_update(batch)
        if self.on_answer is not None:
            self.on_answer()
        self._launch()

    def _remember(self, key: OffloadKey, present: bool, expires: float) -> None:
        self._answers[key] = (present, expires)
        self._answers.move_to_end(key)
        while len(self._answers) > self.max_entries:
            self._answers.popitem(last=False)
