"""A write group's system calls as a list of ops, run in one batch.

The write lane makes each step of a group (its bytes, its header entries and syncs, the
check that its files are still the store's) as one batch of ops: a `WriteOp` (`pwritev`
resumed to the last byte), a `SyncOp` (`fdatasync`), a `StatOp` (`fstat` of a descriptor, or
`stat` of a path not following a symlink). `run_batch` runs them in order, each to its end;
an op that fails gets its OSError as `error` and the ops after it still run, so the caller
attributes every failure to the blocks it concerns.

Why batches: every system call releases the GIL, and a thread that wants it back while
another thread runs Python waits up to the interpreter's switch interval (5 ms) for it. The
lane made some fifteen calls a group, so beside a busy event loop (a serving engine, a
replay) a group of 236 blocks of 16 KiB took 47 ms where it takes 8 ms beside an idle one.
With the compiled core (`_io_core.pyx`) a batch is one call that makes all its system calls
without the GIL: the lane takes the GIL back once per batch. Without it (not built, or a
`FileIO` whose `pwritev` or `fsync` a test overrides, so that it sees every call), the same
ops run one Python call at a time (`run_in_python`), with the same outcomes.

A `plain` op is one on a small metadata file the store writes with plain system calls (the
header file, the in-flight log), never through the store's `FileIO`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvtier.tiers.disk.io import IOV_MAX, PLAIN_IO, FileIO, IOBuffer, pwritev_all

FileStat = tuple[int, int, int]
"""A stat op's outcome: (st_dev, st_ino, st_nlink)."""


@dataclass(eq=False, slots=True)
class WriteOp:
    """Write `buffers`, back to back, at `offset` of `fd` (`nbytes` in all)."""

    KIND: ClassVar[int] = 0
    fd: int
    buffers: list[IOBuffer]
    offset: int
    nbytes: int
    plain: bool = False
    error: OSError | None = None


@dataclass(eq=False, slots=True)
class SyncOp:
    """Make what was written to `fd` durable (`fdatasync`)."""

    KIND: ClassVar[int] = 1
    fd: int
    plain: bool = False
    error: OSError | None = None


@dataclass(eq=False, slots=True)
class StatOp:
    """The identity and link count of the file open as `fd` (`path` None), or of the file
    at `path` (not following a symlink); in `stat` once run."""

    KIND: ClassVar[int] = 2
    fd: int = -1
    path: str | None = None
    stat: FileStat | None = None
    error: OSError | None = None


Op = WriteOp | SyncOp | StatOp

try:  # the compiled batch, present only when kvtier.compiled selected it
    import kvtier.tiers.disk._io_core as _io_core
except ImportError:
    _io_core = None  # type: ignore[assignment]


def compiled_batches() -> bool:
    """Whether batches run in C without the GIL (the compiled core is selected)."""
    return _io_core is not None


def _plain_calls(io: FileIO) -> bool:
    """Whether `io` makes the real system calls (it overrides neither `pwritev` nor
    `fsync`), so a batch may make them itself."""
    kind = type(io)
    return kind.pwritev is FileIO.pwritev and kind.fsync is FileIO.fsync


def run_batch(io: FileIO, ops: Sequence[Op]) -> None:
    """Run `ops` in order, each to its end, setting each one's outcome: in one call without
    the GIL when the compiled core is selected and `io` makes the real system calls, else one
    Python call at a time (`run_in_python`)."""
    if not ops:
        return
    if _io_core is not None and _plain_calls(io):
        _io_core.run_batch(list(ops), IOV_MAX)
    else:
        run_in_python(io, ops)


def run_in_python(io: FileIO, ops: Sequence[Op]) -> None:
    """`run_batch` one Python call at a time: writes and syncs of an op that is not `plain`
    through `io`, the others with plain system calls."""
    for op in ops:
        try:
            if isinstance(op, WriteOp):
                calls = PLAIN_IO if op.plain else io
                pwritev_all(op.fd, op.buffers, op.offset, io=calls, nbytes=op.nbytes)
            elif isinstance(op, SyncOp):
                (PLAIN_IO if op.plain else io).fsync(op.fd)
            else:
                info = (
                    os.fstat(op.fd) if op.path is None else os.stat(op.path, follow_symlinks=False)
                )
                op.stat = (info.st_dev, info.st_ino, info.st_nlink)
        except OSError as error:
            op.error = error
        else:
            op.error = None
