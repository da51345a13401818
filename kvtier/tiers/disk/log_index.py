"""The in-memory index of a log-structured disk store: slot -> record, as packed arrays.

One row per slot (30 bytes plus the key's bytes): the region and offset of the slot's newest
record, its stored length, codec, sequence number and bound checksum, and the key. A dict
key -> slot serves `forget` and `in`. Regions have their epoch, their durable fill (where the
next scan after a restart starts) and their live bytes. Only the write lane changes the index,
and only with records already durable; readers take a row under the lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.log_format import TOMBSTONE, Record, record_bytes

NO_REGION = -1

_KEY_WIDTH_STEP = 8


@dataclass(frozen=True, slots=True)
class Row:
    """One slot's newest record, copied out of the index (`region` is never NO_REGION)."""

    key: OffloadKey
    region: int
    offset: int
    length: int
    codec: int
    seq: int
    checksum: int

    @property
    def payload_offset(self) -> int:
        """Offset of the stored bytes from the region's start."""
        return self.offset + record_bytes(len(self.key), 0)


@dataclass(frozen=True, slots=True)
class Placed:
    """A record written and synced: what `LogIndex.apply` puts in the index. A moved record
    (`moved_from`: its region before a reclaim) applies only while the slot still holds it."""

    record: Record
    region: int
    moved_from: int = NO_REGION


class LogIndex:
    """The slots' records and the regions' accounting of one open log store."""

    ARRAYS = ("region", "offset", "length", "codec", "key_len", "seq", "checksum")

    def __init__(self, num_blocks: int, num_regions: int) -> None:
        self.num_blocks = num_blocks
        self.num_regions = num_regions
        self.lock = threading.Lock()
        self.region = np.full(num_blocks, NO_REGION, dtype=np.int32)
        self.offset = np.zeros(num_blocks, dtype=np.uint32)
        self.length = np.zeros(num_blocks, dtype=np.uint32)
        self.codec = np.zeros(num_blocks, dtype=np.uint8)
        self.key_len = np.zeros(num_blocks, dtype=np.uint8)
        self.seq = np.zeros(num_blocks, dtype=np.uint64)
        self.checksum = np.zeros(num_blocks, dtype=np.uint64)
        self.keys = np.zeros((num_blocks, _KEY_WIDTH_STEP * 2), dtype=np.uint8)
        self.epoch = np.zeros(num_regions, dtype=np.uint64)
        self.fill = np.zeros(num_regions, dtype=np.int64)
        """Bytes of each region durably written (a page boundary): a restart scans past it."""
        self.live = np.zeros(num_regions, dtype=np.int64)
        self.slot_of: dict[OffloadKey, int] = {}
        self.blocks = 0

    # -- reads ---------------------------------------------------------------------------------

    def row(self, slot: int) -> Row | None:
        """The block in `slot` (a copy), or None when it holds none."""
        with self.lock:
            region = int(self.region[slot])
            if region == NO_REGION or self.codec[slot] == TOMBSTONE:
                return None
            return Row(
                self._key(slot),
                region,
                int(self.offset[slot]),
                int(self.length[slot]),
                int(self.codec[slot]),
                int(self.seq[slot]),
                int(self.checksum[slot]),
            )

    def holds(self, slot: int, region: int, seq: int) -> bool:
        """Whether `slot` still holds the record of `seq` in `region` (a read's re-check)."""
        with self.lock:
            return int(self.region[slot]) == region and int(self.seq[slot]) == seq

    def _key(self, slot: int) -> OffloadKey:
        return OffloadKey(self.keys[slot, : int(self.key_len[slot])].tobytes())

    def live_slots(self, region: int) -> list[int]:
        """The slots whose newest record (block or forget) lives in `region`."""
        with self.lock:
            return np.flatnonzero(self.region == region).tolist()

    def restored(self) -> list[tuple[OffloadKey, int]]:
        """(key, slot) of every block, oldest (lowest sequence) first."""
        with self.lock:
            held = np.flatnonzero((self.region != NO_REGION) & (self.codec != TOMBSTONE))
            order = held[np.argsort(self.seq[held], kind="stable")]
            return [(self._key(int(slot)), int(slot)) for slot in order]

    # -- changes (the write lane only) -----------------------------------------------------

    def apply(self, placed: list[Placed]) -> None:
        """Put durable records in the index, in the order written: each replaces its slot's
        record (a moved one only while the slot still holds it where it was)."""
        with self.lock:
            for item in placed:
                record = item.record
                slot = record.slot
                if item.moved_from != NO_REGION and not (
                    self.region[slot] == item.moved_from and int(self.seq[slot]) == record.seq
                ):
                    continue
                self._set(slot, record, item.region)

    def _set(self, slot: int, record: Record, region: int) -> None:
        old_region = int(self.region[slot])
        old_key = self._key(slot)
        if old_region != NO_REGION:
            self.live[old_region] -= record_bytes(int(self.key_len[slot]), int(self.length[slot]))
            if self.codec[slot] != TOMBSTONE:
                self.blocks -= 1
                if self.slot_of.get(old_key) == slot:
                    del self.slot_of[old_key]
        key = record.key
        if len(key) > self.keys.shape[1]:
            width = -(-len(key) // _KEY_WIDTH_STEP) * _KEY_WIDTH_STEP
            wider = np.zeros((self.num_blocks, width), dtype=np.uint8)
            wider[:, : self.keys.shape[1]] = self.keys
            self.keys = wider
        self.keys[slot, : len(key)] = np.frombuffer(key, dtype=np.uint8)
        self.key_len[slot] = len(key)
        self.region[slot] = region
        self.offset[slot] = record.offset
        self.length[slot] = record.length
        self.codec[slot] = record.codec
        self.seq[slot] = record.seq
        self.checksum[slot] = record.checksum
        self.live[region] += record.size
        if record.codec != TOMBSTONE:
            self.blocks += 1
            other = self.slot_of.get(key)
            if other is not None and other != slot:
                self._clear(other)  # a key lives in one slot: its newest
            self.slot_of[key] = slot

    def _clear(self, slot: int) -> None:
        region = int(self.region[slot])
        if region == NO_REGION:
            return
        self.live[region] -= record_bytes(int(self.key_len[slot]), int(self.length[slot]))
        if self.codec[slot] != TOMBSTONE:
            self.blocks -= 1
        self.region[slot] = NO_REGION

    def drop(self, slots: list[int]) -> None:
        """Forget the blocks in `slots` in memory (records found bad by a check)."""
        with self.lock:
            for slot in slots:
                key = self._key(slot)
                if self.slot_of.get(key) == slot:
                    del self.slot_of[key]
                self._clear(slot)

    # -- checkpoint and restart ------------------------------------------------------------

    def snapshot(self) -> dict[str, np.ndarray[Any, Any]]:
        """Copies of every array, consistent with each other (the checkpoint's content)."""
        with self.lock:
            arrays = {name: getattr(self, name).copy() for name in self.ARRAYS}
            arrays["keys"] = self.keys.copy()
            arrays["epoch"] = self.epoch.copy()
            arrays["fill"] = self.fill.copy()
            return arrays

    def load(self, arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        """Take a checkpoint's arrays (checked by the caller for shape and type)."""
        for name in self.ARRAYS:
            getattr(self, name)[:] = arrays[name]
        self.keys = arrays["keys"].copy()
        self.epoch[:] = arrays["epoch"]
        self.fill[:] = arrays["fill"]

    def settle(self, epochs: np.ndarray[Any, Any], sizes_ok: np.ndarray[Any, Any]) -> int:
        """After loading a checkpoint: drop the records in regions whose epoch on disk is not
        the checkpoint's (reused since) or that the file no longer holds (`sizes_ok` False),
        keeping their sequence numbers as floors; the records dropped."""
        stale = (self.epoch != epochs) | ~sizes_ok
        held = self.region != NO_REGION
        gone = held & stale[np.where(held, self.region, 0)]
        self.region[gone] = NO_REGION
        self.epoch[:] = epochs
        self.fill[stale] = 0
        return int(np.count_nonzero(gone & (self.codec != TOMBSTONE)))

    def replay(self, records: list[tuple[int, Record]]) -> None:
        """Apply records found by scanning regions (region, record): the newest per slot wins
        (a tie is the same record, moved), never one older than what the slot held."""
        for region, record in sorted(records, key=lambda item: item[1].seq):
            slot = record.slot
            if slot >= self.num_blocks or record.seq < int(self.seq[slot]):
                continue
            self._set_raw(slot, record, region)

    def _set_raw(self, slot: int, record: Record, region: int) -> None:
        key = record.key
        if len(key) > self.keys.shape[1]:
            width = -(-len(key) // _KEY_WIDTH_STEP) * _KEY_WIDTH_STEP
            wider = np.zeros((self.num_blocks, width), dtype=np.uint8)
            wider[:, : self.keys.shape[1]] = self.keys
            self.keys = wider
        self.keys[slot] = 0
        self.keys[slot, : len(key)] = np.frombuffer(key, dtype=np.uint8)
        self.key_len[slot] = len(key)
        self.region[slot] = region
        self.offset[slot] = record.offset
        self.length[slot] = record.length
        self.codec[slot] = record.codec
        self.seq[slot] = record.seq
        self.checksum[slot] = record.checksum

    def rebuild(self) -> int:
        """After a restart: the live bytes per region, the block count and the key map, a key
        held in several slots kept only in its newest; the blocks dropped as duplicates."""
        held = np.flatnonzero(self.region != NO_REGION)
        sizes = 48 + ((self.key_len[held].astype(np.int64) + 7) & ~7)
        sizes += (self.length[held].astype(np.int64) + 7) & ~7
        self.live[:] = np.bincount(self.region[held], weights=sizes, minlength=self.num_regions)
        blocks = held[self.codec[held] != TOMBSTONE]
        blocks = blocks[np.argsort(self.seq[blocks], kind="stable")]
        slot_of: dict[OffloadKey, int] = {}
        dropped = []
        keys, lengths = self.keys, self.key_len
        for slot in blocks.tolist():
            key = OffloadKey(keys[slot, : lengths[slot]].tobytes())
            older = slot_of.get(key)
            if older is not None:
                dropped.append(older)
            slot_of[key] = slot
        self.slot_of = slot_of
        for slot in dropped:
            self._clear(slot)
        self.blocks = len(slot_of)
        return len(dropped)
