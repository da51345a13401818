"""The in-memory index of a log-structured disk store: slot -> record, as packed arrays.

One row per slot (30 bytes plus the key's bytes): the region and offset of the slot's newest
record, its stored length, codec, sequence number and bound checksum, and the key. A key is
found (`find`: `forget`, `in`, the bookkeeping's look-ups of restored blocks) without an
object per key: the 64-bit hashes of the keys held at open, sorted (12 bytes a slot, built
with array operations), and a dict of the keys written since; every candidate is confirmed
against the slot's own key, so a stale entry finds nothing. Regions have their epoch, their
durable fill (where the next scan after a restart starts) and their live bytes. Only the
write lane changes the index, and only with records already durable (it may `plan` a
group's look-ups while the group is written, which changes nothing); readers take a row
under the lock.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from itertools import repeat
from typing import Any

import numpy as np

from kvtier.arrays import sorted_unique
from kvtier.keys import OffloadKey
from kvtier.tiers.disk.log_commit import _compiled_apply, apply_new
from kvtier.tiers.disk.log_format import RECORD_HEADER_BYTES, TOMBSTONE, Record, record_bytes
from kvtier.tiers.disk.log_keys import key_hash, key_rows, pick, row_hashes, written_again
from kvtier.tiers.disk.log_rows import NO_REGION, NewRecords, Placed, Plan, Row

_compiled_plan: Callable[..., tuple[Any, ...]] | None
try:  # the compiled look-ups, present only when kvtier.compiled selected them
    from kvtier.tiers.disk._plan_core import plan_new as _compiled_plan
except ImportError:
    _compiled_plan = None

__all__ = ["NO_REGION", "LogIndex", "Placed", "Plan", "Row", "sorted_hashes"]

_KEY_WIDTH_STEP = 8


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
        self.written: dict[OffloadKey, int] = {}
        """Slots of the keys written since the open (the hashes cover the others)."""
        self._hashes = np.zeros(0, dtype=np.uint64)
        self._hashed_slots = np.zeros(0, dtype=np.int32)
        self.blocks = 0
        self.version = 0
        """Counts the changes to the slots' records and key look-ups (a `Plan` made before
        the last one is planned again)."""
        self.compiled_plan = _compiled_plan
        """`_plan_new`'s compiled pass (`_plan_core.pyx`), None: its numpy path."""
        self.compiled_commit = _compiled_apply
        """`_apply_new`'s compiled loop (`_plan_core.pyx`), None: its numpy path."""

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

    def held_slots(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The slots holding a block, oldest (lowest sequence) first."""
        with self.lock:
            held = np.flatnonzero((self.region != NO_REGION) & (self.codec != TOMBSTONE))
            return held[np.argsort(self.seq[held], kind="stable")]

    def key_at(self, slot: int) -> OffloadKey | None:
        """The key of the block in `slot`, or None."""
        with self.lock:
            if self.region[slot] == NO_REGION or self.codec[slot] == TOMBSTONE:
                return None
            return self._key(slot)

    def checkpoint_bytes(self) -> int:
        """About the bytes a checkpoint of this index writes."""
        return self.num_blocks * (30 + 12 + int(self.keys.shape[1]))

    def memory_bytes(self) -> int:
        """Bytes the index holds: its arrays, the key hashes, and the dict of keys written
        since the open with its keys."""
        arrays = sum(int(getattr(self, name).nbytes) for name in (*self.ARRAYS, "keys"))
        arrays += int(self._hashes.nbytes + self._hashed_slots.nbytes)
        written = sys.getsizeof(self.written) + sum(sys.getsizeof(key) + 28 for key in self.written)
        return arrays + written

    # -- changes (the write lane only) -----------------------------------------------------

    def apply(self, placed: Placed) -> None:
        """Put durable records in the index, in the order written: each replaces its slot's
        record (a moved one only while the slot still holds it where it was), and a block's
        key leaves any other slot that held it (one written earlier in the batch too). With
        array operations over the batch: the Python per record is C-level iteration (its
        key's length, its dict look-up and entry), no Python code of its own."""
        with self.lock:
            self._commit(self._plan(placed))

    def plan(self, placed: Placed) -> Plan:
        """`apply`'s look-ups for `placed` (its checksums may still be unset), made now and
        changing no record (a key longer than any before widens the key rows, which no
        reader sees): the lane plans a group while its writes and fdatasync run, and
        `commit`s the plan only once they succeeded (a failed group's plan is dropped, so
        no reader ever finds a record that is not durable)."""
        with self.lock:
            return self._plan(placed)

    def commit(self, plan: Plan) -> None:
        """`apply` of the records `plan` was made for (their checksums set since): only the
        stores, unless the index changed since the plan (then planned again first)."""
        with self.lock:
            self._commit(plan)

    def _plan(self, placed: Placed) -> Plan:
        moved = placed.moved_from != NO_REGION
        new = np.flatnonzero(~moved)
        records = self._plan_new(placed, new) if new.size else None
        return Plan(placed, self.version, np.flatnonzero(moved), new, records)

    def _commit(self, plan: Plan) -> None:
        new = plan.new_records
        if plan.version != self.version or (new is not None and new.width != self.keys.shape[1]):
            plan = self._plan(plan.placed)  # the index changed since (rare): planned again
        if plan.moved.size:
            self._apply_moved(plan.placed, plan.moved)
        if plan.new_records is not None:
            self._apply_new(plan.placed, plan.new_records)
        self.version += 1

    def _apply_moved(self, placed: Placed, which: np.ndarray[Any, Any]) -> None:
        slots = placed.slot[which]
        still = (self.region[slots] == placed.moved_from[which]) & (
            self.seq[slots] == placed.seq[which]
        )
        which, slots = which[still], slots[still]
        if not which.size:
            return
        sizes = self._sizes(slots)
        np.subtract.at(self.live, self.region[slots], sizes)
        self.region[slots] = placed.region[which]
        self.offset[slots] = placed.offset[which]
        np.add.at(self.live, placed.region[which], sizes)

    def _plan_new(self, placed: Placed, which: np.ndarray[Any, Any]) -> NewRecords:
        """The look-ups of `apply` for records that were not moved (`which`: their
        positions), in the order written: each key's row and the slot holding it now, the
        newest record per slot chosen. Rows wider than the index's are widened first (rare).
        In one compiled pass when the core is built (`_plan_core.pyx`), else with array
        operations (`_plan_new_arrays`): the same plan."""
        keys = placed.keys if which.size == len(placed.keys) else pick(placed.keys, which)
        self._widen(max(map(len, keys)))
        compiled = self.compiled_plan
        if compiled is not None and self._plannable(placed, which):
            return NewRecords(
                self.keys.shape[1],
                *compiled(
                    placed.keys, which, placed.slot, placed.codec, self.keys, self.key_len,
                    self.region, self.codec, self.written, self._hashes, self._hashed_slots,
                    TOMBSTONE, RECORD_HEADER_BYTES,
                ),
            )  # fmt: skip
        return self._plan_new_arrays(placed, which, keys)

    def _plannable(self, placed: Placed, which: np.ndarray[Any, Any]) -> bool:
        """Whether the compiled pass takes these arrays (their types as built here; a
        checkpoint's, loaded, are checked for them too)."""
        arrays: tuple[np.ndarray[Any, Any], ...] = (which, placed.slot, placed.codec, self.keys)
        arrays += (self.key_len, self.region, self.codec, self._hashes, self._hashed_slots)
        return (
            which.dtype == np.int64
            and placed.slot.dtype == np.int64
            and placed.codec.dtype == np.int64
            and self.region.dtype == np.int32
            and self.key_len.dtype == np.uint8
            and self.codec.dtype == np.uint8
            and self._hashes.dtype == np.uint64
            and self._hashed_slots.dtype == np.int32
            and all(array.flags.c_contiguous for array in arrays)
        )

    def _plan_new_arrays(
        self, placed: Placed, which: np.ndarray[Any, Any], keys: list[OffloadKey]
    ) -> NewRecords:
        """`_plan_new` with array operations (rows already wide enough; `keys`: those of
        `which`): the batch's key rows built once, the slots that held its keys found with
        array operations (`_find_rows`), the newest record per slot chosen."""
        lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
        rows = key_rows(keys, lengths, self.keys.shape[1])
        is_block = placed.codec[which] != TOMBSTONE
        # a key lives in one slot, its newest: the slots holding these keys now lose them
        blocks = np.flatnonzero(is_block)
        block_keys = pick(keys, blocks)
        others = self._find_rows(rows[blocks], lengths[blocks], block_keys)
        # a slot written twice in the batch: its last record wins
        slots = placed.slot[which]
        _, last_rev = np.unique(slots[::-1], return_index=True)
        last = np.sort(which.size - 1 - last_rev)  # positions in `which`
        target = slots[last]
        clear = sorted_unique(np.concatenate([others[others >= 0], target]))
        # a key written again later in the batch (into another slot) leaves this one
        if len(set(block_keys)) < len(block_keys):  # rare: a key twice in the batch
            keep = ~written_again(rows, lengths, blocks, last)
            last, target = last[keep], target[keep]
        held = is_block[last]
        key_sizes = RECORD_HEADER_BYTES + ((lengths[last] + 7) & ~7)
        written = dict(zip(pick(keys, last[held]), target[held].tolist(), strict=True))
        return NewRecords(
            self.keys.shape[1], which[last], target, clear, rows[last], lengths[last],
            key_sizes, int(np.count_nonzero(held)), written,
        )  # fmt: skip

    def _apply_new(self, placed: Placed, new: NewRecords) -> None:
        """The stores of `apply` for records that were not moved, as `_plan_new` chose them
        (log_commit.py: compiled, or with array operations)."""
        apply_new(self, placed, new)

    def _sizes(self, slots: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.int64]]:
        """`record_bytes` of the records in `slots`, as an array."""
        sizes = RECORD_HEADER_BYTES + ((self.key_len[slots].astype(np.int64) + 7) & ~7)
        result: np.ndarray[Any, np.dtype[np.int64]] = sizes + (
            (self.length[slots].astype(np.int64) + 7) & ~7
        )
        return result

    def _find_rows(
        self,
        rows: np.ndarray[Any, Any],
        lengths: np.ndarray[Any, Any],
        keys: list[OffloadKey],
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """`_find` of each of `keys` (their rows at the index's width and lengths given), as
        an array (-1: not held): the dict of keys written since the open first, each slot
        it names confirmed against its row, then the hashes for the others (`_hashed`)."""
        found = np.fromiter(map(self.written.get, keys, repeat(-1)), np.int64, len(keys))
        named = np.flatnonzero(found >= 0)
        if named.size:
            slots = found[named]
            found[named] = np.where(self._rows_held(slots, rows[named], lengths[named]), slots, -1)
        missing = np.flatnonzero(found < 0)
        if missing.size and self._hashes.size:
            found[missing] = self._hashed(rows[missing], lengths[missing], pick(keys, missing))
        return found

    def _rows_held(
        self,
        slots: np.ndarray[Any, Any],
        rows: np.ndarray[Any, Any],
        lengths: np.ndarray[Any, Any],
    ) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Whether each of `slots` holds a block whose key is the row and length given
        (`_holds_key` with array operations; rows at the index's width)."""
        held: np.ndarray[Any, np.dtype[np.bool_]] = (
            (self.region[slots] != NO_REGION)
            & (self.codec[slots] != TOMBSTONE)
            & (self.key_len[slots] == lengths)
            & (self.keys[slots] == rows).all(axis=1)
        )
        return held

    def _widen(self, key_len: int) -> None:
        """Make the key rows at least `key_len` bytes wide (rare: a longer key than ever)."""
        if key_len > self.keys.shape[1]:
            width = -(-key_len // _KEY_WIDTH_STEP) * _KEY_WIDTH_STEP
            wider = np.zeros((self.num_blocks, width), dtype=np.uint8)
            wider[:, : self.keys.shape[1]] = self.keys
            self.keys = wider
            self.version += 1
            self._hash_held()  # the hashes depend on the width

    # -- finding a key -----------------------------------------------------------------

    def find(self, key: OffloadKey) -> int | None:
        """The slot holding block `key`, or None."""
        with self.lock:
            return self._find(key)

    def _find(self, key: bytes) -> int | None:
        slot = self.written.get(OffloadKey(key))
        if slot is not None and self._holds_key(slot, key):
            return slot
        if len(key) > self.keys.shape[1] or not self._hashes.size:
            return None
        wanted = np.uint64(key_hash(key, self.keys.shape[1]))
        first = int(np.searchsorted(self._hashes, wanted, side="left"))
        while first < self._hashes.size and self._hashes[first] == wanted:
            slot = int(self._hashed_slots[first])
            if self._holds_key(slot, key):
                return slot
            first += 1
        return None

    def _find_many(self, keys: list[OffloadKey]) -> list[int | None]:
        """`_find` of many keys at once over the hashes alone (an open's replay: nothing is
        written since the open yet), with array operations (`_hashed`)."""
        if not keys or not self._hashes.size:
            return [None] * len(keys)
        width = self.keys.shape[1]
        lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
        if int(lengths.max()) > width:
            return [self._find(key) for key in keys]
        found = self._hashed(key_rows(keys, lengths, width), lengths, keys)
        return [None if slot < 0 else slot for slot in found.tolist()]

    def _hashed(
        self,
        rows: np.ndarray[Any, Any],
        lengths: np.ndarray[Any, Any],
        keys: list[OffloadKey],
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The slot of each key (-1: none) found through the sorted hashes of the keys held
        at the last checkpoint or open (not empty), each confirmed against its slot's row;
        a hash met twice (a collision) takes the one-key path (`_find`)."""
        wanted = row_hashes(rows, lengths)
        at = np.minimum(np.searchsorted(self._hashes, wanted), self._hashes.size - 1)
        hit = self._hashes[at] == wanted
        slots = self._hashed_slots[at].astype(np.int64)
        same = hit & self._rows_held(slots, rows, lengths)
        twice = hit & ~same & (at + 1 < self._hashes.size)
        twice &= self._hashes[np.minimum(at + 1, self._hashes.size - 1)] == wanted
        found = np.where(same, slots, -1)
        for i in np.flatnonzero(twice).tolist():
            slot = self._find(keys[i])
            found[i] = -1 if slot is None else slot
        return found

    def _holds_key(self, slot: int, key: bytes) -> bool:
        return (
            self.region[slot] != NO_REGION
            and self.codec[slot] != TOMBSTONE
            and int(self.key_len[slot]) == len(key)
            and self.keys[slot, : len(key)].tobytes() == key
        )

    def _hash_held(self) -> None:
        """Hash the keys of every block held now, sorted (what `_find` searches)."""
        self._hashes, self._hashed_slots = sorted_hashes(
            self.keys, self.key_len, self.region, self.codec
        )

    def _clear(self, slot: int) -> None:
        self.version += 1
        region = int(self.region[slot])
        if region == NO_REGION:
            return
        self.live[region] -= record_bytes(int(self.key_len[slot]), int(self.length[slot]))
        if self.codec[slot] != TOMBSTONE:
            self.blocks -= 1
        self.region[slot] = NO_REGION

    def drop(self, slots: list[int]) -> None:
        """Forget the blocks in `slots` in memory (records found bad by a check, or left in
        a region reclaimed without them)."""
        with self.lock:
            for slot in slots:
                self._clear(slot)

    # -- checkpoint and restart ------------------------------------------------------------

    def snapshot(self) -> tuple[dict[str, np.ndarray[Any, Any]], dict[OffloadKey, int]]:
        """Copies of every array, consistent with each other (the checkpoint's content), and
        of the dict of keys written since the open (what `adopt` may then forget)."""
        with self.lock:
            arrays = {name: getattr(self, name).copy() for name in self.ARRAYS}
            arrays["keys"] = self.keys.copy()
            arrays["epoch"] = self.epoch.copy()
            arrays["fill"] = self.fill.copy()
            return arrays, dict(self.written)

    def adopt(
        self,
        hashes: np.ndarray[Any, Any],
        slots: np.ndarray[Any, Any],
        width: int,
        written: dict[OffloadKey, int],
    ) -> None:
        """Search the sorted hashes of a snapshot's keys from now on (`width`: its key rows'
        width), and forget the keys the snapshot's dict had that have not moved since: the
        hashes find them. Keeps the dict to the keys written since the last checkpoint, so
        the index stays near its size after an open. In chunks: never holds the lock long.
        No tuple a key (two lists, zipped): a checkpoint's 4096 tuples set off the collector,
        whose full pass took ~20 ms (docs/BENCHMARKS.md, "The write row's CPU per block")."""
        with self.lock:
            if self.keys.shape[1] != width:
                return  # the rows were widened since: those hashes are of another width
            self._hashes, self._hashed_slots = hashes, slots
            self.version += 1
        keys, held = list(written), list(written.values())
        for first in range(0, len(keys), 4096):
            chunk = slice(first, first + 4096)
            with self.lock:
                for key, slot in zip(keys[chunk], held[chunk], strict=True):
                    if self.written.get(key) == slot:
                        del self.written[key]

    def load(self, arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        """Take a checkpoint's arrays (checked by the caller for shape and type, and its own:
        they become the index's, not copied), its key hashes among them (the keys held when
        it was written)."""
        for name in self.ARRAYS:
            setattr(self, name, arrays[name])
        self.keys = arrays["keys"]
        self.epoch[:] = arrays["epoch"]
        self.fill[:] = arrays["fill"]
        self._hashes = arrays["hashes"]
        self._hashed_slots = arrays["hashed_slots"]

    def settle(
        self, epochs: np.ndarray[Any, Any], present: np.ndarray[Any, Any], region_bytes: int
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """After loading a checkpoint: drop the records in regions whose epoch on disk is not
        the checkpoint's (reused since), and those whose bytes end past what the regions file
        still holds of their region (`present`: bytes of each region in the file, fewer than
        `region_bytes` where it was cut short), keeping their sequence numbers as floors; the
        slots of the blocks dropped (a scan may find them again: moved by a reclaim, or
        written over). A region reused since is scanned again from its start."""
        stale = self.epoch != epochs
        held = self.region != NO_REGION
        at = np.where(held, self.region, 0)
        gone = held & stale[at]
        cut = np.flatnonzero(held & (present < region_bytes)[at])  # rare: a file cut short
        end = self.offset[cut].astype(np.int64) + self.length[cut].astype(np.int64)
        gone[cut[end > present[at[cut]]]] = True
        self.region[gone] = NO_REGION
        self.epoch[:] = epochs
        self.fill[stale] = 0
        dropped: np.ndarray[Any, np.dtype[np.int64]] = np.flatnonzero(
            gone & (self.codec != TOMBSTONE)
        )
        return dropped

    def replay(self, records: list[tuple[int, Record]]) -> None:
        """Apply records found by scanning regions (region, record): the newest per slot wins
        (a tie is the same record, moved: the one scanned last), never one older than what
        the slot held. The newest per slot is chosen with array operations (one sort); only
        the key bookkeeping (a key lives in one slot) walks the chosen records."""
        if not records:
            return
        count = len(records)
        slot_of = np.fromiter((record.slot for _, record in records), np.int64, count)
        seq_of = np.fromiter((record.seq for _, record in records), np.uint64, count)
        ok = slot_of < self.num_blocks
        ok[ok] = seq_of[ok] >= self.seq[slot_of[ok]]
        candidates = np.flatnonzero(ok)
        # by slot, then sequence, then scan order: each slot's last is its newest
        order = candidates[np.lexsort((candidates, seq_of[candidates], slot_of[candidates]))]
        last = np.ones(order.size, dtype=bool)
        last[:-1] = slot_of[order[1:]] != slot_of[order[:-1]]
        chosen = order[last]
        chosen = chosen[np.argsort(seq_of[chosen], kind="stable")]
        ordered = [records[i] for i in chosen.tolist()]
        newest = set(slot_of[chosen].tolist())
        kept: dict[int, tuple[int, Record]] = {}
        key_slot: dict[OffloadKey, int] = {}
        found = self._find_many([record.key for _, record in ordered])
        for (region, record), checkpointed in zip(ordered, found, strict=True):
            if record.codec != TOMBSTONE:
                other = key_slot.get(record.key)
                if other is None:
                    other = checkpointed  # the checkpoint's slot of the key
                    if other is not None and other in newest:
                        other = None  # that slot was written over since
                if (
                    other is not None
                    and other != record.slot
                    and kept.pop(other, None) is None  # else a scanned record: not kept
                ):
                    self.region[other] = NO_REGION  # the checkpoint's older slot: dropped
                key_slot[record.key] = record.slot
            kept[record.slot] = (region, record)
        if not kept:
            return
        items = list(kept.values())
        slots = np.array([record.slot for _, record in items], dtype=np.int64)
        self.region[slots] = [region for region, _ in items]
        self.offset[slots] = [record.offset for _, record in items]
        self.length[slots] = [record.length for _, record in items]
        self.codec[slots] = [record.codec for _, record in items]
        self.seq[slots] = [record.seq for _, record in items]
        self.checksum[slots] = [record.checksum for _, record in items]
        self._widen(max(len(record.key) for _, record in items))
        width = self.keys.shape[1]
        rows = b"".join(record.key.ljust(width, b"\0") for _, record in items)
        self.keys[slots] = np.frombuffer(rows, dtype=np.uint8).reshape(len(items), width)
        self.key_len[slots] = [len(record.key) for _, record in items]
        self.written.update(key_slot)

    def rebuild(self, hashed: bool) -> int:
        """After a restart: the live bytes per region, the block count, and unless the
        checkpoint brought them (`hashed`: the keys found since are in `written`) the key
        hashes, a key held in several slots kept only in its newest; the blocks dropped as
        duplicates. Array operations only (no object per block)."""
        held = np.flatnonzero(self.region != NO_REGION)
        sizes = RECORD_HEADER_BYTES + ((self.key_len[held].astype(np.int64) + 7) & ~7)
        sizes += (self.length[held].astype(np.int64) + 7) & ~7
        self.live[:] = np.bincount(self.region[held], weights=sizes, minlength=self.num_regions)
        if hashed:
            self.blocks = int(
                np.count_nonzero(self.region[held] >= 0)
                - np.count_nonzero(self.codec[held] == TOMBSTONE)
            )
            return 0
        self.written.clear()
        self._hash_held()
        same = np.flatnonzero(self._hashes[1:] == self._hashes[:-1])
        dropped = 0
        seen: dict[bytes, int] = {}
        for at in sorted_unique(np.concatenate([same, same + 1])).tolist():
            slot = int(self._hashed_slots[at])
            key = self._key(slot)
            older = seen.get(key)
            if older is None:
                seen[key] = slot
                continue
            keep, drop = (slot, older) if self.seq[slot] > self.seq[older] else (older, slot)
            seen[key] = keep
            self._clear(drop)
            dropped += 1
        self.blocks = int(np.count_nonzero((self.region != NO_REGION) & (self.codec != TOMBSTONE)))
        return dropped


def sorted_hashes(
    keys: np.ndarray[Any, Any],
    key_len: np.ndarray[Any, Any],
    region: np.ndarray[Any, Any],
    codec: np.ndarray[Any, Any],
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(the hashes of the keys of the slots holding a block, sorted; those slots in the same
    order): what a look-up searches, and what a checkpoint stores so an open need not."""
    held = np.flatnonzero((region != NO_REGION) & (codec != TOMBSTONE))
    hashes = row_hashes(keys[held], key_len[held])
    order = np.argsort(hashes)  # any order among equal hashes: each is confirmed
    return hashes[order], held[order].astype(np.int32)
