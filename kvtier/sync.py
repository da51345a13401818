"""`SyncHierarchy`: a `Hierarchy` on an event-loop thread of its own, for code that is not
async (a scheduler loop, a plain script).

Every call is handed to the loop thread and waited for, so the hierarchy is only ever touched
from that one thread; calls from several threads are serialized there. The loop keeps running
the hierarchy's background transfers (promotions, cascades) between calls.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

import torch

from kvtier.config import HierarchyConfig
from kvtier.errors import ManagerClosedError
from kvtier.hierarchy import Hierarchy, HierarchyStats, TierInfo
from kvtier.hints import Reuse, ReuseHint
from kvtier.keys import OffloadKey
from kvtier.manager import OffloadingEvent

T = TypeVar("T")


class SyncHierarchy:
    """A hierarchy opened on its own loop thread; close it (or use `with`) to stop the thread."""

    def __init__(
        self,
        config: HierarchyConfig | Mapping[str, Any] | str | os.PathLike[str],
        **options: Any,
    ) -> None:
        self._hierarchy = Hierarchy.from_config(config, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kvtier-loop", daemon=True
        )
        self._thread.start()
        self._stop: asyncio.Event | None = None
        self._opened: Future[None] = Future()
        # The hierarchy is opened and closed by one task that lives as long as it does.
        self._life = asyncio.run_coroutine_threadsafe(self._live(), self._loop)
        try:
            self._opened.result()
        except BaseException:
            self._shutdown_loop()
            raise

    async def _live(self) -> None:
        self._stop = asyncio.Event()
        try:
            await self._hierarchy.open()
        except BaseException as error:
            self._opened.set_exception(error)
            return
        self._opened.set_result(None)
        try:
            await self._stop.wait()
        finally:
            await self._hierarchy.close()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._hierarchy.closed or not self._thread.is_alive():
            coroutine.close()
            raise ManagerClosedError("the hierarchy is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def submit(self, work: Callable[[Hierarchy], Coroutine[Any, Any, T]]) -> Future[T]:
        """Start `work(hierarchy)` on the loop thread and return at once: the future holds
        its result or its exception. For callers that must not wait (a scheduler thread);
        on a closed hierarchy the future holds a ManagerClosedError."""
        if self._hierarchy.closed or not self._thread.is_alive():
            failed: Future[T] = Future()
            failed.set_exception(ManagerClosedError("the hierarchy is closed"))
            return failed
        return asyncio.run_coroutine_threadsafe(work(self._hierarchy), self._loop)

    def call(self, function: Callable[[Hierarchy], T]) -> T:
        """`function(hierarchy)` run on the loop thread, waited for (to inspect the hierarchy
        from another thread: its manager, storages, stats)."""
        return self._sync(function, self._hierarchy)

    def call_soon(self, function: Callable[[Hierarchy], object]) -> bool:
        """Run `function(hierarchy)` on the loop thread soon, without waiting; False (and
        nothing run) when the hierarchy is closed."""
        if self._hierarchy.closed or not self._thread.is_alive():
            return False
        try:
            self._loop.call_soon_threadsafe(function, self._hierarchy)
        except RuntimeError:  # the loop closed meanwhile
            return False
        return True

    def _sync(self, function: Callable[..., T], *args: Any) -> T:
        async def call() -> T:
            return function(*args)

        return self._call(call())

    def put(
        self,
        keys: Sequence[OffloadKey],
        blocks: torch.Tensor,
        *,
        hint: ReuseHint | Reuse | None = None,
        session: str | None = None,
        expect_within_s: float | None = None,
    ) -> int:
        """`Hierarchy.put`, waited for."""
        return self._call(
            self._hierarchy.put(
                keys, blocks, hint=hint, session=session, expect_within_s=expect_within_s
            )
        )

    def end_session(self, session: str) -> None:
        """`Hierarchy.end_session`."""
        self._sync(self._hierarchy.end_session, session)

    def expect_session(self, session: str, within_s: float) -> None:
        """`Hierarchy.expect_session`."""
        self._sync(self._hierarchy.expect_session, session, within_s)

    def hint(self, keys: Sequence[OffloadKey], reuse: Reuse, ttl_s: float | None = None) -> None:
        """`Hierarchy.hint`."""
        self._sync(self._hierarchy.hint, keys, reuse, ttl_s)

    def lookup(self, keys: Sequence[OffloadKey]) -> int:
        """`Hierarchy.lookup`."""
        return self._sync(self._hierarchy.lookup, keys)

    def get(self, keys: Sequence[OffloadKey], *, timeout_s: float | None = None) -> torch.Tensor:
        """`Hierarchy.get`, waited for."""
        return self._call(self._hierarchy.get(keys, timeout_s=timeout_s))

    def where(self, key: OffloadKey) -> str | None:
        """`Hierarchy.where`."""
        return self._sync(self._hierarchy.where, key)

    def stats(self) -> HierarchyStats:
        """`Hierarchy.stats`."""
        return self._sync(self._hierarchy.stats)

    def take_events(self) -> list[OffloadingEvent]:
        """`Hierarchy.take_events`."""
        return self._sync(self._hierarchy.take_events)

    def flush(self, timeout_s: float | None = None) -> int:
        """`Hierarchy.flush`, waited for: copy what only volatile tiers hold down to the
        bottom tier; the blocks copied."""
        return self._call(self._hierarchy.flush(timeout_s))

    def drain(self) -> None:
        """Wait until no background transfer is in flight."""
        self._call(self._hierarchy.drain())

    @property
    def tiers(self) -> list[TierInfo]:
        """`Hierarchy.tiers`: the open tiers, top first."""
        return self._sync(lambda: self._hierarchy.tiers)

    @property
    def closed(self) -> bool:
        return self._hierarchy.closed

    def close(self) -> None:
        """Wait for transfers in flight, close the tiers and stop the loop thread."""
        if self._thread.is_alive():
            stop = self._stop
            if stop is not None:
                self._loop.call_soon_threadsafe(stop.set)
            self._life.result()
        self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()

    def __enter__(self) -> SyncHierarchy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
