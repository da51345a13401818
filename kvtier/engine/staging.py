"""`StagingArena`: host rows that hold snapshots of blocks on their way to a slow tier.

A demotion or a write-through cascade from a memory tier to a disk (or remote) tier first
copies its blocks into arena rows (a memcpy, or a device-to-host copy), then gives the
source slots back at once and writes the arena rows to the slow tier in the background. So
a top-tier slot is held for the time of a memory copy, never for a `pwrite` + `fdatasync`.
A staged step waits for the slow tier only when the arena is full (backpressure, counted);
a step that is not staged (memory to memory, slow to slow, a batch larger than the arena)
is waited for whole.

The arena is one preallocated, page-aligned host tensor (page-locked when CUDA is present),
so the disk tier can write its rows with O_DIRECT and GPU copies into it are asynchronous.
"""

from __future__ import annotations

import asyncio
import mmap
from array import array
from collections import deque

import numpy as np
import numpy.typing as npt
import torch

from kvtier.errors import InvalidValueError
from kvtier.tiers.tensor_copy import cuda_available

DEFAULT_STAGING_BYTES = 256 << 20
"""Default size of a hierarchy's staging arena (at least 64 blocks are always allowed)."""


class StagingArena:
    """`num_blocks` host rows of `block_size` bytes, handed out in batches, first come first
    served (a large request is not overtaken forever by small ones)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise InvalidValueError(
                f"a staging arena needs num_blocks >= 1 and block_size >= 1, "
                f"got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._mapping: mmap.mmap | None = None
        if cuda_available():
            self.tensor = torch.empty((num_blocks, block_size), dtype=torch.uint8, pin_memory=True)
        else:
            self._mapping = mmap.mmap(-1, num_blocks * block_size)
            flat = torch.frombuffer(self._mapping, dtype=torch.uint8)
            self.tensor = flat.view(num_blocks, block_size)
        # Free row ids as 8-byte machine ints, not a list of Python ints (about 36 bytes a
        # row): the arena has staging_bytes // block_size rows, 512K at 512-byte blocks.
        self._free = array("q", range(num_blocks - 1, -1, -1))
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._reserved = 0  # rows promised to woken waiters that have not taken them yet
        self._readers: dict[int, int] = {}  # row -> readers copying out of it now
        self._deferred: set[int] = set()  # rows released while read: freed by the last reader
        self.waits = 0
        """Requests that found too few free rows and waited (backpressure)."""
        self.peak_used = 0

    @classmethod
    def sized(cls, staging_bytes: int, block_size: int) -> StagingArena:
        """An arena of about `staging_bytes` (at least 64 blocks)."""
        return cls(max(64, staging_bytes // block_size), block_size)

    @property
    def free(self) -> int:
        return len(self._free) - self._reserved

    def fits(self, count: int) -> bool:
        """Whether a request of `count` rows can ever be served."""
        return count <= self.num_blocks

    async def acquire(self, count: int) -> npt.NDArray[np.int64]:
        """`count` row ids, waiting (in arrival order) until that many are free."""
        if not self.fits(count):
            raise InvalidValueError(f"{count} rows asked of a {self.num_blocks}-row arena")
        if self._waiters or self.free < count:
            self.waits += 1
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (count, future)
            self._waiters.append(entry)
            try:
                await future
            except asyncio.CancelledError:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                elif future.done() and not future.cancelled():
                    self._reserved -= count  # granted as we were cancelled: pass it on
                self._wake()
                raise
            self._reserved -= count
        return self._take(count)

    def release(self, rows: npt.NDArray[np.int64]) -> None:
        """Give rows back (each exactly once); a row being read (`hold`) is freed when its
        last reader is done."""
        free: list[int] = []
        for row in (int(row) for row in rows):
            if row in self._readers:
                self._deferred.add(row)
            else:
                free.append(row)
        self._give_back(free)

    def hold(self, rows: npt.NDArray[np.int64]) -> None:
        """A reader copies out of `rows` (a get served from a snapshot on its way to a slow
        tier): they are not reused until `unhold`, even if released meanwhile."""
        for row in (int(row) for row in rows):
            self._readers[row] = self._readers.get(row, 0) + 1

    def unhold(self, rows: npt.NDArray[np.int64]) -> None:
        """The reader of `hold` is done with `rows`."""
        free: list[int] = []
        for row in (int(row) for row in rows):
            left = self._readers[row] - 1
            if left:
                self._readers[row] = left
                continue
            del self._readers[row]
            if row in self._deferred:
                self._deferred.discard(row)
                free.append(row)
        if free:
            self._give_back(free)

    def _take(self, count: int) -> npt.NDArray[np.int64]:
        rows = [self._free.pop() for _ in range(count)]
        self.peak_used = max(self.peak_used, self.num_blocks - len(self._free))
        return np.asarray(rows, dtype=np.int64)

    def _give_back(self, rows: list[int]) -> None:
        self._free.extend(rows)
        self._wake()

    def _wake(self) -> None:
        # Rows are promised to waiters in arrival order (`_reserved`) when enough are free;
        # each takes its rows when it runs, and newcomers see only the unpromised ones.
        while self._waiters:
            count, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if self.free < count:
                return
            self._waiters.popleft()
            self._reserved += count
            future.set_result(None)

    def __repr__(self) -> str:
        return f"StagingArena({self.num_blocks} x {self.block_size} B, {self.free} free)"
