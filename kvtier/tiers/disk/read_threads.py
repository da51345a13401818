"""`ReadThreads`: the read threads of a disk store, with one hop each way per call.

A store's read runs in a thread so that the event loop never waits on the disk. With a
`ThreadPoolExecutor` a call costs a `concurrent.futures.Future`, its lock and condition, and
the asyncio future wrapped around it (`run_in_executor`: a callback that copies one future's
state into the other); on a busy 2-core VM that round trip was half of a small promotion's
time (docs/BENCHMARKS.md, "Where a promotion's time goes"). Here a call is one item on a
`SimpleQueue` that an idle thread takes, and its result goes straight into the caller's
asyncio future with one `call_soon_threadsafe`.

A large batch is still one call (one hop in, one hop out): the thread running it hands the
batch's independent parts (`fan_out`) to the other threads of the same pool and works on
them itself, so the disk sees several reads in flight while the event loop sees one call.
The calling thread never waits for a part that no thread has taken (it takes what is left
itself), so a pool whose threads are all busy, or one thread alone, cannot deadlock; a helper
goes back to the queue between two parts when a call is waiting there, so a small read is not
held up behind a large one by more than a part.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["ReadThreads", "run_parts"]

_T = TypeVar("_T")

_Item = Callable[[], None]
"""One thing a thread runs: a call settling its future, or a helper taking parts."""


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Set `future` on its loop (a caller that gave up on it has cancelled it: nothing)."""
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Parts:
    """The parts of one `fan_out`: taken one at a time by whichever thread asks next; `done`
    is set once every part taken has finished and none is left."""

    def __init__(self, parts: Sequence[Callable[[], None]]) -> None:
        self.parts = parts
        self.lock = threading.Lock()
        self.next = 0
        self.running = 0
        self.error: BaseException | None = None
        self.done = threading.Event()

    def work(self, stop: Callable[[], bool] | None = None) -> None:
        """Run parts until none is left (what each helper and the calling thread do); a
        helper also returns between two parts once `stop()` says a call is waiting for its
        thread (the calling thread runs what is left)."""
        ran = False
        while True:
            if ran and stop is not None and stop():
                return
            ran = True
            with self.lock:
                if self.next >= len(self.parts):
                    if self.running == 0:
                        self.done.set()
                    return
                part = self.parts[self.next]
                self.next += 1
                self.running += 1
            error: BaseException | None = None
            try:
                part()
            except BaseException as failure:  # handed to the calling thread, which raises it
                error = failure
            with self.lock:
                self.error = self.error or error
                self.running -= 1
                if self.running == 0 and self.next >= len(self.parts):
                    self.done.set()


class ReadThreads:
    """At most `threads` threads (started as calls need them, daemon threads: a read left
    running at exit is only a read) taking calls from one queue."""

    def __init__(self, threads: int, name: str) -> None:
        self.size = threads
        """The most threads: calls in flight at once, and the parts of one `fan_out`."""
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._shut = False

    def submit(self, loop: asyncio.AbstractEventLoop, call: Callable[[], _T]) -> asyncio.Future[_T]:
        """Run `call` in a read thread; its result (or exception) in the returned future of
        `loop`. A future cancelled before a thread takes the call skips it. RuntimeError
        after `shutdown`."""
        future: asyncio.Future[_T] = loop.create_future()

        def item() -> None:
            if future.cancelled():
                return
            result: _T | None = None
            error: BaseException | None = None
            try:
                result = call()
            except BaseException as failure:  # the caller's to handle, on its loop
                error = failure
            # RuntimeError: the loop was closed meanwhile, nobody waits any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)

        self._put(item)
        return future

    def fan_out(self, parts: Sequence[Callable[[], None]]) -> None:
        """Run `parts` (independent; from a thread, never the event loop) on up to `size`
        threads at once, this one included; return once all have run. The first exception a
        part raised is raised here after the others finished."""
        work = _Parts(parts)
        helpers = min(self.size, len(parts)) - 1
        waiting = self._queue.qsize
        helper = functools.partial(work.work, lambda: waiting() > 0)
        for _ in range(helpers):
            try:
                self._put(helper)
            except RuntimeError:  # shut down: this thread runs what is left
                break
        work.work()
        work.done.wait()
        if work.error is not None:
            raise work.error

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new calls; the threads end once the calls already queued have run
        (`wait`: this returns after they did). Idempotent."""
        with self._lock:
            if self._shut:
                threads: list[threading.Thread] = []
            else:
                self._shut = True
                threads = list(self._threads)
                for _ in threads:
                    self._queue.put(None)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _put(self, item: _Item) -> None:
        with self._lock:
            if self._shut:
                raise RuntimeError("the read threads are shut down")
            self._queue.put(item)
            if self._idle == 0 and len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._serve,
                    name=f"{self._name}_{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()  # it takes this item (or another: each puts one)
            elif self._idle > 0:
                self._idle -= 1  # an idle thread will take it

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            item()
            with self._lock:
                self._idle += 1


def run_parts(threads: ReadThreads | None, parts: Sequence[Callable[[], None]]) -> None:
    """Run `parts` (from a read thread): by `threads` at once (`ReadThreads.fan_out`) when
    there are several parts and threads to share them, else one after the other here."""
    if threads is not None and threads.size > 1 and len(parts) > 1:
        threads.fan_out(parts)
    else:
        for part in parts:
            part()
