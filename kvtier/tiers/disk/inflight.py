"""The in-flight log of a disk store: the slots that the write group in progress rewrites.

A write group drops the records of the slots it rewrites from memory at once, but from the
index only in its one commit, after the bytes are written and synced. A process killed in
between leaves index records that point at rewritten (new or torn) bytes. So before a group
writes any slot, it records the group's slots here: one small `pwrite` at offset 0, not
fsynced, because a killed process needs the log only to have reached the page cache before the
slab writes did, which a completed `pwrite` has. Opening the store then checks the records of
those slots against their bytes and drops the ones that no longer match, so what `restore()`
lists after a crash reads back intact.

After a power cut the log may be older than the slab writes it should cover. A record left
pointing at rewritten bytes is then caught by the checksum that every read verifies (a miss,
never data) and reported by `DiskStore.check`. A log that cannot be written (a full disk)
weakens only that cleanup after a crash in the same way.

Format: magic, slot count, the slots (little-endian u64 each), xxh3-64 of all that. A torn or
foreign log reads as empty: a group writes its log before its first slab byte, so a log torn
by a crash belongs to a group that wrote no slot yet.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xxhash

from kvtier.tiers.disk.io import pwritev_all
from kvtier.tiers.disk.ops import WriteOp

_MAGIC = b"kvtinfl1"
_HEADER = struct.Struct("<8sQ")
_TRAILER = struct.Struct("<Q")
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)


class InflightLog:
    """The log file at `path` (created with exactly `mode` if missing)."""

    def __init__(self, path: Path, mode: int) -> None:
        self.path = path
        flags = os.O_RDWR | _O_CLOEXEC | _O_NOFOLLOW
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:  # an existing log keeps its mode: kvtier chmods only its own
            fd = os.open(path, flags)
        else:
            try:
                os.fchmod(fd, mode)
            except BaseException:
                os.close(fd)
                raise
        self._fd = fd

    def read(self) -> list[int]:
        """The slots last recorded; [] when the log is empty, torn or not a log."""
        size = os.fstat(self._fd).st_size
        return _slots_in(os.pread(self._fd, size, 0) if size else b"")

    @staticmethod
    def peek(path: Path) -> list[int]:
        """The slots recorded in the log at `path`, read without creating or changing it
        (a store opened to inspect); [] when it is missing, empty, torn or not a log."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _O_CLOEXEC | _O_NOFOLLOW)
        except OSError:
            return []
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return []
            return _slots_in(os.pread(fd, info.st_size, 0) if info.st_size else b"")
        finally:
            os.close(fd)

    def record(self, slots: Sequence[int]) -> None:
        """Replace the log with `slots` (a short write resumed); raises OSError if it cannot be
        written whole."""
        op = self.record_op(slots)
        pwritev_all(op.fd, op.buffers, op.offset, nbytes=op.nbytes)

    def record_op(self, slots: Sequence[int]) -> WriteOp:
        """The write that replaces the log with `slots`, to run first in a batch (ops.py)."""
        body = _HEADER.pack(_MAGIC, len(slots)) + np.asarray(slots, dtype="<u8").tobytes()
        data = body + _TRAILER.pack(xxhash.xxh3_64_intdigest(body))
        return WriteOp(self._fd, [data], 0, len(data), plain=True)

    def clear(self) -> None:
        """Empty the log (once the records it covers have been checked)."""
        os.ftruncate(self._fd, 0)

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


def _slots_in(data: bytes) -> list[int]:
    """The slots a log's bytes record; [] when empty, torn or not a log."""
    if len(data) < _HEADER.size:
        return []
    magic, count = _HEADER.unpack_from(data)
    end = _HEADER.size + 8 * count
    if magic != _MAGIC or len(data) < end + _TRAILER.size:
        return []
    (checksum,) = _TRAILER.unpack_from(data, end)
    if xxhash.xxh3_64_intdigest(data[:end]) != checksum:
        return []
    return [int(slot) for slot in np.frombuffer(data, "<u8", count, _HEADER.size)]
