"""The blocks a log store held when it opened (`LogStore.restore_cold`), as a view over its
index (log_index.py), apart from it."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.log_format import TOMBSTONE
from kvtier.tiers.disk.log_index import LogIndex
from kvtier.tiers.disk.log_rows import NO_REGION


class LogRestored:
    """The blocks a log store held when it opened (`LogStore.restore_cold`), as a view over
    its index: a slot counts while it holds the record it held then (same sequence number:
    a record moved by reclaiming is the same record). Its look-ups take no disk access."""

    __slots__ = ("_index", "_seq")

    def __init__(self, index: LogIndex) -> None:
        self._index = index
        with index.lock:
            held = (index.region != NO_REGION) & (index.codec != TOMBSTONE)
            self._seq = np.where(held, index.seq, np.uint64(0))

    def _still(self, slot: int) -> bool:
        index = self._index
        return bool(
            self._seq[slot] != 0
            and index.seq[slot] == self._seq[slot]
            and index.region[slot] != NO_REGION
            and index.codec[slot] != TOMBSTONE
        )

    def slots(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The slots of the restored blocks still held, oldest first."""
        index = self._index
        with index.lock:
            slots = np.flatnonzero(self._seq != 0)
            still = (index.seq[slots] == self._seq[slots]) & (index.region[slots] != NO_REGION)
            slots = slots[still & (index.codec[slots] != TOMBSTONE)]
            ordered: np.ndarray[Any, np.dtype[np.int64]] = slots[
                np.argsort(self._seq[slots], kind="stable")
            ].astype(np.int64)
            return ordered

    def slot_of(self, key: OffloadKey) -> int | None:
        """The slot of restored block `key` while the store holds it there, or None."""
        index = self._index
        with index.lock:
            slot = index._find(key)
            return slot if slot is not None and self._still(slot) else None

    def key_of(self, slot: int) -> OffloadKey | None:
        """The key of the restored block in `slot` while it holds it, or None."""
        index = self._index
        with index.lock:
            return index._key(slot) if self._still(slot) else None
