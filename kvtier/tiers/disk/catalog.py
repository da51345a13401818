"""What a disk store holds: each key's index record and each slot's key, in memory, over the
durable LMDB index (index.py).

The maps in memory are the truth of the running process: reads look records up there (never
in LMDB), and a write group changes them around its one index commit (lane.py). LMDB is the
truth for the next process. A commit that finds the index damaged replaces it with a fresh one
written from memory (`IndexHome.replace`), so a damaged file is never written further.

Two locks: `writing` orders the writers of the index (a write group from its first step to its
commit, `check`, test backdoors); the maps themselves are guarded by a lock of their own, held
only for lookups and updates, so a read never waits for a commit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from pathlib import Path

import lmdb

from kvtier.errors import StorageClosedError
from kvtier.keys import OffloadKey
from kvtier.tiers.disk.index import DAMAGE_ERRORS, BlockIndex, IndexHome
from kvtier.tiers.disk.index_check import write_clean_stamp
from kvtier.tiers.disk.layout import IndexRecord
from kvtier.tiers.disk.safety import FileId
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.storage import RestoredBlock

Records = list[tuple[OffloadKey, IndexRecord]]


class Catalog:
    """The records of the store in `where`, over `index`; `home` (None when the store is
    opened only to be inspected) replaces the index when a commit finds it damaged."""

    def __init__(
        self, index: BlockIndex, home: IndexHome | None, counters: StoreCounters, where: Path
    ) -> None:
        self._index: BlockIndex | None = index
        self._home = home
        self._counters = counters
        self._where = where
        self.index_file: FileId | None = home.file_id() if home is not None else None
        """The identity of the index's data file, to tell when it was removed or replaced."""
        self.writing = threading.Lock()
        """Held by whoever writes the index, from deciding what to write to its commit."""
        self._lock = threading.Lock()
        self._records: dict[OffloadKey, IndexRecord] = {}
        self._slot_keys: dict[int, OffloadKey] = {}
        self._restored: Records = []
        self.next_seq = 1
        """The sequence number of the next block written (the caller holds `writing`)."""

    @property
    def index(self) -> BlockIndex:
        """The LMDB index; StorageClosedError once it is closed."""
        index = self._index
        if index is None:
            raise StorageClosedError(f"the disk tier at {self._where} is closed")
        return index

    def load(
        self, records: dict[OffloadKey, IndexRecord], *, next_seq: int, restorable: bool
    ) -> None:
        """Start from `records` (one per slot at most), as opening the store found them;
        with `restorable`, `restored` lists them."""
        with self._lock:
            self._records = dict(records)
            self._slot_keys = {record.slot: key for key, record in records.items()}
            if restorable:
                self._restored = sorted(records.items(), key=lambda item: item[1].seq)
            self.next_seq = next_seq

    # -- lookups ------------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._records

    def keys(self) -> list[OffloadKey]:
        """The keys indexed now."""
        with self._lock:
            return list(self._records)

    def get(self, key: OffloadKey) -> IndexRecord | None:
        """The record of `key`, or None."""
        with self._lock:
            return self._records.get(key)

    def lookup(self, keys: Iterable[OffloadKey]) -> list[IndexRecord | None]:
        """The record (or None) of each key, from one snapshot."""
        with self._lock:
            records = self._records
            return [records.get(key) for key in keys]

    def claimed_slots(self) -> set[int]:
        """The slots that records point at now."""
        with self._lock:
            return set(self._slot_keys)

    def restored(self) -> list[RestoredBlock]:
        """The blocks indexed when the store was opened, oldest first, less those forgotten
        or overwritten since."""
        with self._lock:
            return [
                RestoredBlock(key, record.slot)
                for key, record in self._restored
                if self._records.get(key) == record
            ]

    # -- changes (the caller holds `writing`) -------------------------------------------------

    def take_seqs(self, count: int) -> range:
        """`count` fresh sequence numbers, in order."""
        first = self.next_seq
        self.next_seq = first + count
        return range(first, first + count)

    def drop_for_group(
        self, slots: Iterable[int], forgotten: Iterable[OffloadKey]
    ) -> dict[OffloadKey, IndexRecord]:
        """Drop from memory the records of the blocks in `slots` (about to be rewritten) and of
        the `forgotten` keys; the records dropped, by key, in order."""
        with self._lock:
            slot_keys, records = self._slot_keys, self._records
            dropped = [slot_keys[slot] for slot in slots if slot in slot_keys]
            dropped += [key for key in forgotten if key in records]
            before = {key: records[key] for key in dict.fromkeys(dropped)}
            self._drop_locked(before)
        return before

    def drop(self, keys: Iterable[OffloadKey]) -> None:
        """Drop the records of `keys` from memory."""
        with self._lock:
            self._drop_locked(keys)

    def _drop_locked(self, keys: Iterable[OffloadKey]) -> None:
        records, slot_keys = self._records, self._slot_keys
        for key in keys:
            record = records.pop(key, None)
            if record is not None and slot_keys.get(record.slot) == key:
                del slot_keys[record.slot]

    def remember(self, new: Records) -> None:
        """Add committed records to memory: a key's record replaces its old one (and frees
        its old slot), a slot's record its old owner."""
        with self._lock:
            records, slot_keys = self._records, self._slot_keys
            for key, record in new:
                old = records.get(key)
                if old is not None and slot_keys.get(old.slot) == key:
                    del slot_keys[old.slot]
                squatter = slot_keys.get(record.slot)
                if squatter is not None and squatter != key:
                    # Not reached through the lane (a group drops its slots' records first);
                    # a backdoor write may get here. The newer record wins, as on reopening.
                    records.pop(squatter, None)
                records[key] = record
                slot_keys[record.slot] = key

    def clear(self) -> None:
        """Forget every record in memory (the store disabled itself: it holds no block)."""
        with self._lock:
            self._records.clear()
            self._slot_keys.clear()
            self._restored = []

    def commit(
        self,
        index: BlockIndex,
        deleted: list[OffloadKey],
        new: Records,
        packed: list[tuple[OffloadKey, bytes]],
    ) -> None:
        """One transaction on `index` (taken by the caller when it started): the `deleted`
        records out, the `new` ones (`packed`: the same, packed) in. An index found damaged is
        replaced by one written from memory plus `new`; raises lmdb.Error / OSError when the
        commit (or that replacement) fails."""
        try:
            index.update(deleted, packed)
        except DAMAGE_ERRORS as damage:
            self._replace(index, new, f"a commit found the index damaged: {damage}")

    def _replace(self, damaged: BlockIndex, pending: Records, why: str) -> None:
        home = self._home
        if home is None:  # pragma: no cover - a store opened to inspect never commits
            raise StorageClosedError(f"the disk tier at {self._where} is open only to be checked")
        self._index = None  # until the fresh one is written: no further commit can succeed
        with self._lock:
            records = [(key, record.pack()) for key, record in self._records.items()]
        records += [(key, record.pack()) for key, record in pending]
        self._index = home.replace(damaged, records, why)
        self.index_file = home.file_id()
        self._counters.count_index_rebuild()

    def delete_quietly(self, index: BlockIndex, keys: list[OffloadKey]) -> bool:
        """Try once to remove the records of `keys` from `index`; whether that committed."""
        try:
            index.update(keys, ())
        except lmdb.Error:
            return False
        return True

    def unindex_slots(self, slots: Iterable[int]) -> None:
        """Durably drop every record that points at one of `slots` (for test backdoors that
        are about to overwrite them behind the store's back)."""
        index = self.index
        with self.writing:
            with self._lock:
                victims = [self._slot_keys[slot] for slot in slots if slot in self._slot_keys]
            if victims:
                index.delete(victims)
                self.drop(victims)

    def close(self, *, clean: bool) -> None:
        """Close the index; when `clean` (every group has ended and it is sound), stamp it so
        the next open trusts it without a probe while it matches the stamp."""
        index, self._index = self._index, None
        if index is None:
            return
        index.close()
        if clean:
            with contextlib.suppress(OSError):
                write_clean_stamp(index.path)
