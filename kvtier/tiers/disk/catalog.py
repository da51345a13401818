"""What a disk store holds: each key's index record and each slot's key, in memory, over the
durable LMDB index (index.py).

The maps in memory are the truth of the running process: reads look records up there (never
in LMDB), and a write group changes them around its one index commit (lane.py). LMDB is the
truth for the next process. A commit that finds the index damaged replaces it with a fresh one
written from memory (`IndexHome.replace`), so a damaged file is never written further.

The records found at open are held compactly (cold.py) when the open could settle them as
arrays: a restored key's record is then read from LMDB on demand and served while the compact
table still holds it; the keys by slot are loaded in a background thread (`start_loading`).
Records written since the open are in the maps.

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
import numpy as np

from kvtier.errors import StorageClosedError
from kvtier.keys import OffloadKey
from kvtier.tiers.disk.cold import ColdRecords
from kvtier.tiers.disk.index import DAMAGE_ERRORS, BlockIndex, IndexHome
from kvtier.tiers.disk.index_check import write_clean_stamp
from kvtier.tiers.disk.layout import IndexRecord
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.storage import RestoredBlock
from kvtier.tiers.trusted import FileId

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
        self._cold: ColdRecords | None = None
        self._loader: threading.Thread | None = None
        self._loader_lock = threading.Lock()
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

    def load_cold(self, cold: ColdRecords, *, next_seq: int) -> None:
        """Start from the compact restored records `cold` (cold.py); `start_loading` then
        loads their keys in the background."""
        with self._lock:
            self._cold = cold
            self.next_seq = next_seq

    @property
    def cold(self) -> ColdRecords | None:
        """The compact restored records, or None when the open loaded them as objects."""
        return self._cold

    def start_loading(self) -> bool:
        """Load the keys of the compact restored records in a thread of their own (once);
        whether that load runs or ran (not when there is nothing to load or it is closed)."""
        with self._loader_lock:
            cold, index = self._cold, self._index
            if self._loader is None:
                if cold is None or index is None:
                    return False
                if not cold.count:
                    cold.loaded.set()
                    return True
                self._loader = threading.Thread(
                    target=cold.load_keys, args=(index,), name="kvtier-disk-load", daemon=True
                )
                self._loader.start()
            return True

    def restored_slots(self) -> np.ndarray:
        """The slots of the compact restored records still held, oldest first (int64)."""
        with self._lock:
            cold = self._cold
            return np.zeros(0, np.int64) if cold is None else cold.live_slots()

    def restored_slot(self, key: OffloadKey) -> int | None:
        """The slot of `key`'s compact restored record while it is held, or None."""
        with self._lock:
            record = self._cold_find(key)
            return None if record is None else record.slot

    def restored_key(self, slot: int) -> OffloadKey | None:
        """The key of the compact restored record held in `slot`; None when there is none
        or the keys are still loading."""
        cold = self._cold
        return None if cold is None else cold.key_of(slot)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Wait until the keys of the compact restored records are loaded; whether they are."""
        cold = self._cold
        if cold is None or not self.start_loading():
            return True
        return cold.loaded.wait(timeout)

    def _wait_loaded(self) -> None:
        cold = self._cold
        if cold is not None and cold.count and self.start_loading():
            cold.loaded.wait()

    def _cold_find(self, key: OffloadKey) -> IndexRecord | None:
        """The restored record of `key` still held (the caller holds `_lock`), or None."""
        cold, index = self._cold, self._index
        if cold is None or not cold.count or index is None:
            return None
        try:
            raw = index.get(key)
        except lmdb.Error:
            return None
        if raw is None:
            return None
        try:
            record = IndexRecord.unpack(raw)
        except ValueError:
            return None
        return record if cold.holds(record) else None

    # -- lookups ------------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            cold = self._cold
            return len(self._records) + (cold.count if cold is not None else 0)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes):
            return False
        return self.get(OffloadKey(key)) is not None

    def keys(self) -> list[OffloadKey]:
        """The keys indexed now."""
        self._wait_loaded()
        with self._lock:
            found = list(self._records)
            cold = self._cold
            if cold is not None:
                keys = (cold.key_of(int(slot)) for slot in cold.live_slots())
                found += [key for key in keys if key is not None]
            return found

    def get(self, key: OffloadKey) -> IndexRecord | None:
        """The record of `key`, or None."""
        with self._lock:
            record = self._records.get(key)
            return record if record is not None else self._cold_find(key)

    def lookup(self, keys: Iterable[OffloadKey]) -> list[IndexRecord | None]:
        """The record (or None) of each key, from one snapshot."""
        keys = keys if isinstance(keys, list) else list(keys)
        with self._lock:
            records = self._records
            found = [records.get(key) for key in keys]
            cold = self._cold
            if cold is None or not cold.count or None not in found:
                return found
            return [
                self._cold_find(key) if record is None else record
                for key, record in zip(keys, found, strict=True)
            ]

    def claimed_slots(self) -> set[int]:
        """The slots that records point at now."""
        with self._lock:
            claimed = set(self._slot_keys)
            if self._cold is not None:
                claimed.update(self._cold.live_slots().tolist())
            return claimed

    def restored(self) -> list[RestoredBlock]:
        """The blocks indexed when the store was opened, oldest first, less those forgotten
        or overwritten since (for compact restored records, once their keys are loaded)."""
        self._wait_loaded()
        with self._lock:
            cold = self._cold
            if cold is not None:
                blocks = []
                for slot in cold.live_slots().tolist():
                    key = cold.key_of(slot)
                    if key is not None:
                        blocks.append(RestoredBlock(key, slot))
                return blocks
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
        the `forgotten` keys; the records dropped, by key, in order. A restored record is
        named by its key once the keys are loaded (this waits for that)."""
        slots = list(slots)
        cold = self._cold
        if cold is not None and cold.count and any(cold.seqs[slot] for slot in slots):
            self._wait_loaded()
        with self._lock:
            slot_keys, records = self._slot_keys, self._records
            dropped = [slot_keys[slot] for slot in slots if slot in slot_keys]
            dropped += [key for key in forgotten if key in records]
            before = {key: records[key] for key in dict.fromkeys(dropped)}
            self._drop_locked(before)
            if cold is not None and cold.count:
                before.update(self._drop_cold(cold, slots, forgotten))
        return before

    def _drop_cold(
        self, cold: ColdRecords, slots: Iterable[int], keys: Iterable[OffloadKey]
    ) -> dict[OffloadKey, IndexRecord]:
        """Stop holding the restored records in `slots` and of `keys` (the caller holds
        `_lock`); those of them whose key is known, by key."""
        dropped: dict[OffloadKey, IndexRecord] = {}
        for key in keys:
            record = self._cold_find(key)
            if record is not None:
                cold.kill(record.slot)
                dropped[key] = record
        for slot in slots:
            held = cold.record_of(slot)
            if held is None:
                continue
            name = cold.key_of(slot)
            cold.kill(slot)
            if name is not None:
                dropped[name] = held
        return dropped

    def drop(self, keys: Iterable[OffloadKey]) -> None:
        """Drop the records of `keys` from memory."""
        keys = list(keys)
        with self._lock:
            self._drop_locked(keys)
            if self._cold is not None:
                self._drop_cold(self._cold, (), keys)

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
                if self._cold is not None:
                    self._cold.kill(record.slot)

    def clear(self) -> None:
        """Forget every record in memory (the store disabled itself: it holds no block)."""
        with self._lock:
            self._records.clear()
            self._slot_keys.clear()
            self._restored = []
            if self._cold is not None:
                self._cold.clear()

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
        commit (or that replacement) fails. A restored record of a key written again is no
        longer held (its slot is about to be freed)."""
        if self._cold is not None and self._cold.count:
            with self._lock:
                self._drop_cold(self._cold, (), [key for key, _ in new])
        try:
            index.update(deleted, packed)
        except DAMAGE_ERRORS as damage:
            self._replace(index, new, f"a commit found the index damaged: {damage}")

    def _replace(self, damaged: BlockIndex, pending: Records, why: str) -> None:
        home = self._home
        if home is None:  # pragma: no cover - a store opened to inspect never commits
            raise StorageClosedError(f"the disk tier at {self._where} is open only to be checked")
        self._wait_loaded()
        self._index = None  # until the fresh one is written: no further commit can succeed
        with self._lock:
            records = [(key, record.pack()) for key, record in self._records.items()]
            cold = self._cold
            if cold is not None:
                for slot in cold.live_slots().tolist():
                    key, record = cold.key_of(slot), cold.record_of(slot)
                    if key is not None and record is not None:
                        records.append((key, record.pack()))
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
        slots = list(slots)
        self._wait_loaded()
        with self.writing:
            with self._lock:
                victims = [self._slot_keys[slot] for slot in slots if slot in self._slot_keys]
                if self._cold is not None:
                    victims += list(self._drop_cold(self._cold, slots, ()))
            if victims:
                index.delete(victims)
                self.drop(victims)

    def close(self, *, clean: bool) -> None:
        """Close the index; when `clean` (every group has ended and it is sound), stamp it so
        the next open trusts it without a probe while it matches the stamp, and leave its
        records in one file beside it (the next open reads them in one call)."""
        with self._loader_lock:
            loader = self._loader
            if loader is not None and self._cold is not None:
                self._cold.stop.set()
                loader.join()
            index, self._index = self._index, None
        if index is None:
            return
        records = None
        if clean:
            with contextlib.suppress(lmdb.Error):
                records = index.packed_values()
        index.close()
        if clean:
            with contextlib.suppress(OSError):
                write_clean_stamp(index.path, records)


class RestoredBlocks:
    """The blocks a disk store restored at open, compactly (`DiskStore.restore_cold`): what a
    tier's bookkeeping holds them by instead of an object per block."""

    __slots__ = ("_catalog",)

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def slots(self) -> np.ndarray:
        """The slots of the restored blocks still held, oldest first."""
        return self._catalog.restored_slots()

    def slot_of(self, key: OffloadKey) -> int | None:
        """The slot of restored block `key` while the store holds it, or None."""
        return self._catalog.restored_slot(key)

    def key_of(self, slot: int) -> OffloadKey | None:
        """The key of the restored block in `slot`, or None (none, or still loading)."""
        return self._catalog.restored_key(slot)
