"""The counters of one open disk store, kept by its parts (recovery, the write lane, the reader,
the catalog) and read as one snapshot through `DiskStore.stats`."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from kvtier.tiers.storage import ReadFailure


@dataclass(slots=True)
class DiskStoreStats:
    """Counters of one open store (a snapshot when read through `DiskStore.stats`)."""

    blocks_written: int = 0
    """Blocks stored and indexed."""
    raw_bytes_written: int = 0
    """Bytes of those blocks before compression."""
    bytes_written: int = 0
    """Bytes written to slab files for them (after compression; padding not counted)."""
    write_failures: int = 0
    """Blocks whose write failed (reported as an OSError)."""
    blocks_read: int = 0
    """Blocks read back intact."""
    bytes_read: int = 0
    """Bytes read from slab files (whole slots)."""
    read_failures: Counter[ReadFailure] = field(default_factory=Counter)
    """Failed block reads, by reason."""
    dropped_at_open: int = 0
    """Index records dropped when the store was opened: slots beyond `num_blocks`, beyond the
    end of a (truncated) slab file, or a slot claimed by a newer record."""
    write_groups: int = 0
    """Groups run by the write lane (each merges one or more `write` / `forget` calls)."""
    write_batches: int = 0
    """`write` calls run in those groups (calls cancelled while queued are not counted)."""
    forget_batches: int = 0
    """`forget` calls run in those groups."""
    fsyncs: int = 0
    """Slab file fdatasyncs made by the groups (at most one per file and group)."""
    index_commits: int = 0
    """Index (LMDB) write transactions committed by the groups (at most one per group, plus
    one more after a failed commit)."""
    index_rebuilds: int = 0
    """Times a damaged index was found while the store was open and replaced by one written
    from memory (a rebuild from the headers at open is `DiskStore.rebuilt_index`)."""

    def copy(self) -> DiskStoreStats:
        """An independent copy."""
        return replace(self, read_failures=Counter(self.read_failures))


class StoreCounters:
    """The `DiskStoreStats` of one store behind a lock: every part adds to them from its own
    thread, and a snapshot is consistent."""

    def __init__(self) -> None:
        self._stats = DiskStoreStats()
        self._lock = threading.Lock()

    def snapshot(self) -> DiskStoreStats:
        """An independent copy of the counters now."""
        with self._lock:
            return self._stats.copy()

    def set_dropped_at_open(self, count: int) -> None:
        """Record how many index records opening the store dropped."""
        with self._lock:
            self._stats.dropped_at_open = count

    def count_group(
        self,
        *,
        writes: int,
        forgets: int,
        fsyncs: int,
        commits: int,
        stored: int,
        failed: int,
        raw_bytes: int,
        stored_bytes: int,
    ) -> None:
        """Add one write group: its calls, syncs, commits and the blocks it stored or failed."""
        with self._lock:
            stats = self._stats
            stats.write_groups += 1
            stats.write_batches += writes
            stats.forget_batches += forgets
            stats.fsyncs += fsyncs
            stats.index_commits += commits
            stats.blocks_written += stored
            stats.raw_bytes_written += raw_bytes
            stats.bytes_written += stored_bytes
            stats.write_failures += failed

    def count_write_failures(self, count: int) -> None:
        """Add `count` blocks whose write was refused before any group ran them."""
        with self._lock:
            self._stats.write_failures += count

    def count_reads(self, results: Iterable[ReadFailure | None], bytes_read: int) -> None:
        """Add the results of a read (None: a block read intact) and the bytes it read."""
        with self._lock:
            stats = self._stats
            stats.bytes_read += bytes_read
            for result in results:
                if result is None:
                    stats.blocks_read += 1
                else:
                    stats.read_failures[result] += 1

    def count_index_rebuild(self) -> None:
        """Add one index replaced from memory while the store was open."""
        with self._lock:
            self._stats.index_rebuilds += 1
