"""The records a disk store found at open, held compactly: arrays by slot instead of objects.

A store of 10^6 blocks restored as one `IndexRecord` and two dict entries per block costs
hundreds of bytes per block and seconds to build. Opening instead reads the index's packed
records in one pass (`scan`), settles them with array operations (the same rules as the
per-record settling in recovery.py: slots that exist, slab files long enough, one record per
slot, the newest) and keeps what it keeps here: per slot its sequence number (0: the slot
holds no restored record), stored length, codec and bound checksum, 25 bytes per slot. A key's
restored record is found through the LMDB index itself (key -> packed record), and is
restored only while this table still has the same sequence number in that slot: a record
dropped, rewritten or forgotten since (`kill`) is never found again.

The keys by slot (what an eviction or a write group needs to name a restored block) are not
read at open: `load_keys` fills them in the background, one pass over the index, and sets
`loaded`. Until then `key_of` answers None.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.index import BlockIndex
from kvtier.tiers.disk.layout import IndexRecord, StoreLayout

RECORD_DTYPE = np.dtype(
    [("slot", "<u8"), ("length", "<u8"), ("codec", "u1"), ("checksum", "<u8"), ("seq", "<u8")]
)
"""`IndexRecord.FORMAT` as a packed numpy record: the index's values read as one array."""

if RECORD_DTYPE.itemsize != IndexRecord.FORMAT.size:  # pragma: no cover - checked at import
    raise RuntimeError("RECORD_DTYPE does not match IndexRecord.FORMAT")

_KEY_CHUNK = 4096
"""Index records per step of `load_keys` (its pause points for a close)."""


@dataclass(slots=True)
class Scan:
    """The index's records as arrays, in key order (`records`), and their verdicts."""

    records: np.ndarray
    kept: np.ndarray
    """Positions of the records kept (one per slot, the newest that can be served)."""
    dropped: np.ndarray
    """Positions of the records dropped, with `reasons` (same order)."""
    reasons: list[str]


def settle(
    records: np.ndarray,
    layout: StoreLayout,
    sizes: list[int],
    slab_fds: list[int],
    bad: np.ndarray | None = None,
) -> Scan:
    """Judge `records` as recovery.py's per-record settling does: a record is dropped when its
    slot is beyond the store, its slab file is missing or ends before the block, it is `bad`
    (a mask: its bytes failed verification), or a newer kept record claims its slot."""
    slots = records["slot"]
    count = len(records)
    in_range = slots < layout.num_blocks
    safe = np.where(in_range, slots, 0).astype(np.int64)
    files = safe // layout.slots_per_file
    ends = (safe % layout.slots_per_file) * layout.block_size + np.maximum(records["length"], 1)
    present = np.array([fd >= 0 for fd in slab_fds] or [True] * layout.num_files, dtype=bool)
    file_sizes = np.array(sizes, dtype=np.int64)
    has_file = present[files]
    long_enough = file_sizes[files] >= ends.astype(np.int64)
    sound = in_range & has_file & long_enough
    if bad is not None:
        sound &= ~bad
    candidates = np.flatnonzero(sound)
    if np.bincount(safe[candidates], minlength=1).max(initial=0) <= 1:
        kept = candidates  # no slot claimed twice (the usual index): nothing to order
    else:
        kept = _newest_per_slot(records, candidates)
    losers = np.ones(count, dtype=bool)
    losers[kept] = False
    dropped = np.flatnonzero(losers)
    reasons = []
    for position in dropped:
        if not in_range[position]:
            reasons.append(f"slot beyond the store's {layout.num_blocks} slots")
        elif not has_file[position]:
            reasons.append("its slab file is missing")
        elif not long_enough[position]:
            reasons.append("its slab file ends before the block")
        elif bad is not None and bad[position]:
            reasons.append("rewritten by a write group that did not finish")
        else:
            reasons.append("slot also claimed by a newer record")
    return Scan(records, kept, dropped, reasons)


def _newest_per_slot(records: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """The positions among `candidates` of the newest record of each slot, in order."""
    # Newest first; between equal sequence numbers (only a damaged index has them) the
    # first in key order, as the per-record settling's stable sort does.
    newest_first = candidates[np.lexsort((-candidates, records["seq"][candidates]))[::-1]]
    _, first = np.unique(records["slot"][newest_first], return_index=True)
    kept: np.ndarray = np.sort(newest_first[first])
    return kept


class ColdRecords:
    """The restored records of a store of `num_blocks` slots, by slot (module docstring).
    The catalog guards `kill`, `record_of` and `count` with its lock; `load_keys` runs in a
    thread of its own and only fills the key arrays."""

    def __init__(self, num_blocks: int, records: np.ndarray, kept: np.ndarray) -> None:
        chosen = records if len(kept) == len(records) else records[kept]
        slots = chosen["slot"].astype(np.int64)
        self.seqs = np.zeros(num_blocks, dtype=np.uint64)
        self.seqs[slots] = chosen["seq"]
        self.lengths = np.zeros(num_blocks, dtype=np.uint64)
        self.lengths[slots] = chosen["length"]
        self.codecs = np.zeros(num_blocks, dtype=np.uint8)
        self.codecs[slots] = chosen["codec"]
        self.checksums = np.zeros(num_blocks, dtype=np.uint64)
        self.checksums[slots] = chosen["checksum"]
        self.order = slots[np.argsort(chosen["seq"], kind="stable")]
        """The restored slots, oldest (lowest sequence number) first."""
        self.count = len(slots)
        """Restored records still held."""
        self._keys = np.zeros((num_blocks, 0), dtype=np.uint8)
        self._key_lens = np.zeros(0, dtype=np.uint8)
        self.loaded = threading.Event()
        """Set once `load_keys` has finished (or failed: `key_of` then stays None)."""
        self.stop = threading.Event()
        """Set to make a running `load_keys` return early (the store is closing)."""

    def holds(self, record: IndexRecord) -> bool:
        """Whether `record` (read from the index) is a restored record still held."""
        slot = record.slot
        return 0 <= slot < len(self.seqs) and record.seq != 0 and self.seqs[slot] == record.seq

    def record_of(self, slot: int) -> IndexRecord | None:
        """The restored record in `slot` still held, or None."""
        seq = int(self.seqs[slot])
        if not seq:
            return None
        return IndexRecord(
            slot, int(self.lengths[slot]), int(self.codecs[slot]), int(self.checksums[slot]), seq
        )

    def kill(self, slot: int) -> bool:
        """Stop holding the restored record in `slot` (dropped, rewritten or forgotten);
        whether there was one."""
        if not 0 <= slot < len(self.seqs) or not self.seqs[slot]:
            return False
        self.seqs[slot] = 0
        self.count -= 1
        return True

    def clear(self) -> None:
        """Hold nothing any more."""
        self.seqs[:] = 0
        self.count = 0

    def live_slots(self) -> np.ndarray:
        """The slots whose restored record is still held, oldest first."""
        live: np.ndarray = self.order[self.seqs[self.order] != 0]
        return live

    def key_of(self, slot: int) -> OffloadKey | None:
        """The key of the restored record still held in `slot`; None when there is none or
        the keys are not loaded yet."""
        if not self.loaded.is_set() or not 0 <= slot < len(self.seqs) or not self.seqs[slot]:
            return None
        keys, lens = self._keys, self._key_lens
        if not len(lens) or not lens[slot]:
            return None
        return OffloadKey(keys[slot, : lens[slot]].tobytes())

    def load_keys(self, index: BlockIndex) -> None:
        """Read the index once and note the key of every restored record still held (the
        background part of opening); sets `loaded` when done, also on failure or `stop`."""
        try:
            num = len(self.seqs)
            self._key_lens = np.zeros(num, dtype=np.uint8)
            for keys, values in index.chunks(_KEY_CHUNK):
                if self.stop.is_set():
                    return
                self._note_keys(keys, np.frombuffer(b"".join(values), dtype=RECORD_DTYPE))
        finally:
            self.loaded.set()

    def _note_keys(self, keys: list[bytes], records: np.ndarray) -> None:
        slots = records["slot"]
        inside = slots < len(self.seqs)
        safe = np.where(inside, slots, 0).astype(np.int64)
        mine = inside & (self.seqs[safe] == records["seq"]) & (records["seq"] != 0)
        if not mine.any():
            return
        width = max(len(key) for key in keys)
        if width > self._keys.shape[1]:
            wider = np.zeros((len(self.seqs), width), dtype=np.uint8)
            wider[:, : self._keys.shape[1]] = self._keys
            self._keys = wider
        width = self._keys.shape[1]
        padded = np.frombuffer(b"".join(key.ljust(width, b"\0") for key in keys), np.uint8)
        rows = padded.reshape(len(keys), width)
        lens = np.fromiter((len(key) for key in keys), dtype=np.uint8, count=len(keys))
        self._keys[safe[mine]] = rows[mine]
        self._key_lens[safe[mine]] = lens[mine]
