"""Slot addressing over the preallocated slab files of a disk store, and run planning.

Slot `s` lives in file `s // slots_per_file` at byte offset `(s % slots_per_file) *
block_size`. Splitting the slots over several files (1 GiB each by default) keeps each file a
size that every filesystem and backup tool handles, and lets a store grow or shrink by whole
files. A batch of slots is cut into runs of consecutive slots in one file, so that each run
is one `pwritev` / `preadv` system call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ALIGNMENT = 4096
"""Alignment of O_DIRECT buffers, offsets and lengths (the page size; enough on every disk)."""


def _iov_max() -> int:
    try:
        value = os.sysconf("SC_IOV_MAX")
    except (ValueError, OSError):
        return 1024
    return value if value > 0 else 1024


IOV_MAX = _iov_max()
"""The most buffers one `pwritev` / `preadv` takes."""


def round_up(value: int, multiple: int) -> int:
    """`value` rounded up to a multiple of `multiple`."""
    return -(-value // multiple) * multiple


def slab_file_name(index: int) -> str:
    """The name of the `index`-th slab file."""
    return f"slab-{index:05d}.bin"


@dataclass(frozen=True, slots=True)
class Run:
    """Blocks `members` (indices into a batch) in consecutive slots of file `file`, starting
    at byte `offset`; one system call moves them all."""

    file: int
    offset: int
    members: tuple[int, ...]


class SlabLayout:
    """Maps slots to (file, offset) for `num_blocks` slots of `block_size` bytes."""

    def __init__(self, num_blocks: int, block_size: int, slots_per_file: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.slots_per_file = slots_per_file
        self.num_files = -(-num_blocks // slots_per_file)

    def file_bytes(self, file: int) -> int:
        """How long file `file` must be to hold its slots."""
        first = file * self.slots_per_file
        return min(self.slots_per_file, self.num_blocks - first) * self.block_size

    def locate(self, slot: int) -> tuple[int, int]:
        """(file index, byte offset in that file) of `slot`."""
        file, index = divmod(slot, self.slots_per_file)
        return file, index * self.block_size

    def runs(
        self,
        members: Sequence[int],
        slots: Sequence[int],
        *,
        ends_run: Callable[[int], bool] | None = None,
    ) -> list[Run]:
        """Cut the batch positions `members` into runs of consecutive slots in one file (at
        most IOV_MAX each), in slot order. A member for which `ends_run(member)` is true is
        the last of its run (a block written short of its slot cannot be followed by the next
        slot's bytes in the same call)."""
        # Hot (once per block of every batch): locate() is inlined; consecutive slots share a
        # file unless the later one starts a file.
        order = sorted(members, key=slots.__getitem__)
        per_file = self.slots_per_file
        runs: list[Run] = []
        current: list[int] = []
        previous = -2
        for member in order:
            slot = slots[member]
            if (
                slot == previous + 1
                and slot % per_file
                and len(current) < IOV_MAX
                and not (ends_run is not None and ends_run(current[-1]))
            ):
                current.append(member)
            else:
                if current:
                    runs.append(self._run(slots[current[0]], current))
                current = [member]
            previous = slot
        if current:
            runs.append(self._run(slots[current[0]], current))
        return runs

    def _run(self, first_slot: int, members: list[int]) -> Run:
        file, index = divmod(first_slot, self.slots_per_file)
        return Run(file, index * self.block_size, tuple(members))
