"""Failing closed: whether a disk store still serves, and the reads it has in flight.

A store's files can be taken from under it while it is open (the directory `rm -rf`ed, a file
unlinked, the lock file removed or replaced). Writes through the descriptors it holds would
still succeed, into files nobody will ever read; so before each write group commits its index
records the lane runs `StoreFiles.ground_check` (in the group's last batch of system calls,
after its syncs), and on a problem commits nothing and disables the store through its `Guard`:
from then on no read starts, every write fails, and the reads in flight finish before the
files close.

The same count of reads in flight lets a write group wait, briefly, for the reads on the
device before it starts (reads first: a write in flight slows a read down).
"""

from __future__ import annotations

import threading


class Guard:
    """The disabled state of one store and its reads in flight (thread-safe)."""

    def __init__(self) -> None:
        self._reason: str | None = None
        self._reads = 0
        self._changed = threading.Condition()

    @property
    def reason(self) -> str | None:
        """Why the store disabled itself, or None while it serves."""
        return self._reason

    def enter_read(self) -> bool:
        """Count a read as in flight; False (not counted) once the store is disabled."""
        with self._changed:
            if self._reason is not None:
                return False
            self._reads += 1
            return True

    def leave_read(self) -> None:
        """A read counted by `enter_read` has ended."""
        with self._changed:
            self._reads -= 1
            if self._reads == 0:
                self._changed.notify_all()

    def wait_for_reads(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until no read is in flight."""
        with self._changed:
            self._changed.wait_for(lambda: self._reads == 0, timeout_s)

    def disable(self, why: str) -> bool:
        """Disable the store for good because `why`, once the reads in flight have ended;
        False when it was disabled already (the first reason stays)."""
        with self._changed:
            if self._reason is not None:
                return False
            self._reason = why
            self._changed.wait_for(lambda: self._reads == 0)
        return True
