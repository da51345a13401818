"""The disk tier's I/O loops (kvtier/tiers/disk/io.py): a short `pwritev` / `preadv` is resumed
where it stopped, a call that cannot progress is an error, and staging memory is aligned."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from kvtier.tiers.disk.io import (
    ALIGNMENT,
    FileIO,
    IOBuffer,
    advance,
    byte_views,
    is_aligned,
    preadv_all,
    preadv_fill,
    pwritev_all,
    round_up,
    staging_buffer,
)


class ChoppyIO(FileIO):
    """Moves at most `limit` bytes per call (as a signal-interrupted or busy kernel may),
    records the size of every call, and can fail its calls from the `fail_from`-th on, or
    move nothing from the `stall_from`-th on."""

    def __init__(
        self, limit: int, *, fail_from: int | None = None, stall_from: int | None = None
    ) -> None:
        self.limit = limit
        self.fail_from = fail_from
        self.stall_from = stall_from
        self.calls: list[int] = []

    def _cut(self, buffers: Sequence[IOBuffer]) -> list[memoryview]:
        call = len(self.calls)
        self.calls.append(sum(memoryview(buffer).nbytes for buffer in buffers))
        if self.fail_from is not None and call >= self.fail_from:
            raise OSError(errno.EIO, "injected")
        if self.stall_from is not None and call >= self.stall_from:
            return []
        cut, left = [], self.limit
        for view in byte_views(buffers):
            if left <= 0:
                break
            cut.append(view[:left])
            left -= view.nbytes
        return cut

    def pwritev(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        cut = self._cut(buffers)
        return super().pwritev(fd, cut, offset) if cut else 0

    def preadv(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        cut = self._cut(buffers)
        return super().preadv(fd, cut, offset) if cut else 0


@pytest.fixture
def fd(tmp_path: Path) -> Iterator[int]:
    descriptor = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def pieces(sizes: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8) for size in sizes]


def test_advance_drops_whole_views_and_cuts_the_next() -> None:
    views = byte_views([b"abc", b"defg", b"h"])
    assert [bytes(view) for view in advance(views, 0)] == [b"abc", b"defg", b"h"]
    assert [bytes(view) for view in advance(views, 3)] == [b"defg", b"h"]
    assert [bytes(view) for view in advance(views, 5)] == [b"fg", b"h"]
    assert advance(views, 8) == []


@pytest.mark.parametrize("limit", [1, 7, 100, 1 << 20])
def test_a_short_write_is_resumed_until_every_byte_is_written(fd: int, limit: int) -> None:
    buffers = pieces([10, 0, 333, 4096, 5])
    io = ChoppyIO(limit)
    assert pwritev_all(fd, [buffer.data for buffer in buffers], 100, io=io) == 4444
    assert os.pread(fd, 4444, 100) == b"".join(buffer.tobytes() for buffer in buffers)
    assert len(io.calls) == -(-4444 // limit)
    assert io.calls[0] == 4444  # the first call asks for everything


def test_a_write_that_completes_in_one_call_builds_no_views(fd: int) -> None:
    io = ChoppyIO(1 << 20)
    assert pwritev_all(fd, [b"x" * 10, b"y" * 6], 0, io=io, nbytes=16) == 16
    assert io.calls == [16]


def test_a_write_that_stops_progressing_is_an_eio(fd: int) -> None:
    io = ChoppyIO(100, stall_from=2)
    with pytest.raises(OSError) as raised:
        pwritev_all(fd, [bytes(1000)], 0, io=io)
    assert raised.value.errno == errno.EIO
    assert os.fstat(fd).st_size == 200  # what the two calls that progressed wrote


def test_a_failed_write_call_raises_its_error(fd: int) -> None:
    with pytest.raises(OSError, match="injected"):
        pwritev_all(fd, [bytes(1000)], 0, io=ChoppyIO(100, fail_from=3))


@pytest.mark.parametrize("limit", [1, 9, 4096, 1 << 20])
def test_a_short_read_is_resumed_until_the_buffers_are_full(fd: int, limit: int) -> None:
    data = pieces([5000], seed=1)[0].tobytes()
    os.pwrite(fd, data, 0)
    buffers = [np.zeros(size, dtype=np.uint8) for size in (1, 2000, 0, 2999)]
    io = ChoppyIO(limit)
    assert preadv_fill(fd, [buffer.data for buffer in buffers], 0, io=io) == 5000
    assert b"".join(buffer.tobytes() for buffer in buffers) == data
    assert len(io.calls) == -(-5000 // limit)


def test_a_read_stops_at_the_end_of_the_file(fd: int) -> None:
    os.pwrite(fd, b"abcdefgh", 0)
    buffer = np.zeros(20, dtype=np.uint8)
    assert preadv_fill(fd, [buffer.data], 2, io=ChoppyIO(3)) == 6
    assert buffer[:6].tobytes() == b"cdefgh" and not buffer[6:].any()
    with pytest.raises(OSError) as raised:
        preadv_all(fd, [buffer.data], 2, io=ChoppyIO(3))
    assert raised.value.errno == errno.EIO


def test_a_first_failed_read_raises_and_a_later_one_ends_the_read_short(fd: int) -> None:
    os.pwrite(fd, bytes(range(100)), 0)
    buffer = np.zeros(100, dtype=np.uint8)
    with pytest.raises(OSError, match="injected"):
        preadv_fill(fd, [buffer.data], 0, io=ChoppyIO(10, fail_from=0))
    assert preadv_fill(fd, [buffer.data], 0, io=ChoppyIO(10, fail_from=3)) == 30
    assert buffer[:30].tobytes() == bytes(range(30))


def test_preadv_all_fills_exactly_what_was_written(fd: int) -> None:
    buffers = pieces([3, 4093, 8192], seed=2)
    pwritev_all(fd, [buffer.data for buffer in buffers], 4096, io=ChoppyIO(1000))
    back = [np.zeros(buffer.size, dtype=np.uint8) for buffer in buffers]
    preadv_all(fd, [buffer.data for buffer in back], 4096, io=ChoppyIO(999))
    assert all(np.array_equal(a, b) for a, b in zip(buffers, back, strict=True))


def test_the_default_io_is_the_real_system_calls(fd: int) -> None:
    assert pwritev_all(fd, [b"hello ", b"world"], 0) == 11
    buffer = np.zeros(11, dtype=np.uint8)
    preadv_all(fd, [buffer.data], 0)
    assert buffer.tobytes() == b"hello world"


def test_staging_memory_is_page_aligned_and_reused_by_its_thread() -> None:
    first = staging_buffer(5000)
    assert first.nbytes == 5000 and is_aligned(first)
    second = staging_buffer(100)
    assert second.ctypes.data == first.ctypes.data  # the thread's buffer, reused
    big = staging_buffer((64 << 20) + 1)
    assert big.nbytes == (64 << 20) + 1 and is_aligned(big)
    assert not is_aligned(np.zeros(ALIGNMENT + 1, dtype=np.uint8)[1:])
    assert round_up(1, ALIGNMENT) == ALIGNMENT and round_up(ALIGNMENT, ALIGNMENT) == ALIGNMENT
