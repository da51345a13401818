"""The disk stores' read threads (kvtier/tiers/disk/read_threads.py): a call's result or
exception reaches its awaiting coroutine, a cancelled call is skipped, `fan_out` runs every
part exactly once on several threads (or alone, or after a shutdown) and never deadlocks,
and a shutdown finishes what was queued and refuses what comes after."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable

import pytest

from kvtier.tiers.disk.read_threads import ReadThreads

pytestmark = pytest.mark.timeout(60)


async def test_a_call_returns_its_result_or_raises_its_exception() -> None:
    threads = ReadThreads(2, "test-read")
    loop = asyncio.get_running_loop()
    try:
        assert await threads.submit(loop, lambda: threading.current_thread().name) != (
            threading.current_thread().name
        )

        def fail() -> None:
            raise OSError("boom")

        with pytest.raises(OSError, match="boom"):
            await threads.submit(loop, fail)
        results = await asyncio.gather(
            *(threads.submit(loop, functools.partial(pow, n, 2)) for n in range(50))
        )
        assert results == [n * n for n in range(50)]
    finally:
        threads.shutdown()


async def test_a_call_cancelled_before_a_thread_takes_it_is_skipped() -> None:
    threads = ReadThreads(1, "test-read")
    loop = asyncio.get_running_loop()
    release = threading.Event()
    ran: list[str] = []
    try:
        blocker = threads.submit(loop, release.wait)  # holds the one thread
        skipped = threads.submit(loop, lambda: ran.append("skipped"))
        skipped.cancel()
        release.set()
        assert await blocker is True
        await threads.submit(loop, lambda: ran.append("after"))
        assert ran == ["after"]
    finally:
        threads.shutdown()


def _parts(count: int, seen: list[int], lock: threading.Lock) -> list[Callable[[], None]]:
    def part(number: int) -> None:
        with lock:
            seen.append(number)

    return [functools.partial(part, n) for n in range(count)]


@pytest.mark.parametrize("size", [1, 2, 8])
def test_fan_out_runs_every_part_once(size: int) -> None:
    threads = ReadThreads(size, "test-read")
    seen: list[int] = []
    try:
        threads.fan_out(_parts(100, seen, threading.Lock()))
        assert sorted(seen) == list(range(100))
        threads.fan_out([])
    finally:
        threads.shutdown()


def test_fan_out_uses_several_threads_at_once() -> None:
    """Four parts that each wait for all four to have started finish only if four threads
    run them at once."""
    threads = ReadThreads(4, "test-read")
    started = threading.Barrier(4, timeout=30)
    names: set[str] = set()
    lock = threading.Lock()

    def part() -> None:
        with lock:
            names.add(threading.current_thread().name)
        started.wait()

    try:
        threads.fan_out([part] * 4)
        assert len(names) == 4
    finally:
        threads.shutdown()


def test_fan_out_raises_the_first_error_after_every_part_ran() -> None:
    threads = ReadThreads(3, "test-read")
    seen: list[int] = []
    lock = threading.Lock()
    parts = _parts(20, seen, lock)

    def fail() -> None:
        raise OSError("part failed")

    try:
        with pytest.raises(OSError, match="part failed"):
            threads.fan_out([*parts[:10], fail, *parts[10:]])
        assert sorted(seen) == list(range(20))
    finally:
        threads.shutdown()


async def test_calls_that_fan_out_from_every_thread_at_once_all_finish() -> None:
    """Every thread of the pool runs a call that fans out to the same pool: no deadlock
    (each call runs what no helper took), every part once."""
    threads = ReadThreads(2, "test-read")
    loop = asyncio.get_running_loop()
    seen: list[int] = []
    lock = threading.Lock()
    try:
        calls = [
            threads.submit(loop, lambda: threads.fan_out(_parts(50, seen, lock))) for _ in range(6)
        ]
        await asyncio.gather(*calls)
        assert len(seen) == 6 * 50
    finally:
        threads.shutdown()


async def test_shutdown_finishes_queued_calls_then_refuses_new_ones() -> None:
    threads = ReadThreads(1, "test-read")
    loop = asyncio.get_running_loop()
    release = threading.Event()
    first = threads.submit(loop, release.wait)
    queued = threads.submit(loop, lambda: "queued")
    release.set()
    await asyncio.to_thread(threads.shutdown)
    assert await first is True
    assert await queued == "queued"
    with pytest.raises(RuntimeError):
        threads.submit(loop, lambda: None)
    seen: list[int] = []
    threads.fan_out(_parts(5, seen, threading.Lock()))  # no threads left: all on this one
    assert sorted(seen) == list(range(5))
    threads.shutdown()  # idempotent


@pytest.mark.parametrize("size", [None, 1, 4])
def test_read_in_parts_puts_each_outcome_at_its_place_in_the_batch(size: int | None) -> None:
    """The per-block layout's large read: its parts (in slot order, not the batch's) read
    by the threads at once or one after the other, each outcome back at its position."""
    import numpy as np

    from kvtier.keys import OffloadKey, key_from_int
    from kvtier.tiers.disk.reader import read_in_parts
    from kvtier.tiers.storage import HostBuffer, ReadFailure

    keys = [key_from_int(i) for i in range(12)]
    slots = [11 - i for i in range(12)]
    buffers: list[HostBuffer] = [np.zeros(8, dtype=np.uint8) for _ in keys]
    parts = [[11, 10, 9, 8], [7, 6, 5, 4], [3, 2, 1, 0]]

    def read(
        part_keys: list[OffloadKey], part_slots: list[int], part_buffers: list[HostBuffer]
    ) -> list[ReadFailure | None]:
        for slot, buffer in zip(part_slots, part_buffers, strict=True):
            buffer[:] = slot
        return [ReadFailure.CHECKSUM if s % 5 == 0 else None for s in part_slots]

    threads = None if size is None else ReadThreads(size, "test-read")
    try:
        results = read_in_parts(threads, read, keys, slots, buffers, parts)
    finally:
        if threads is not None:
            threads.shutdown()
    assert results == [ReadFailure.CHECKSUM if s % 5 == 0 else None for s in slots]
    assert [int(buffer[0]) for buffer in buffers] == slots
