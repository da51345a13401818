"""Opening a disk store: from a directory to the files, records and layout it serves from.

An open, in order: the directories checked (safety.py) and the lock taken, the free space
checked before anything is allocated, the header file's layout record read, the index checked
before it is mapped (index_check.py; a damaged or missing one is moved aside), the layout
checked against what the store recorded at creation, the slab files opened and then the
records, loaded from the index or rebuilt from the slot headers. Before the store serves, the
records are settled: those of slots that no longer exist or whose bytes were cut off are
dropped, and so are those of the slots in the in-flight log (inflight.py) whose bytes no longer
match them (a write group was interrupted). Only then are the files sized and preallocated,
and O_DIRECT probed. A failed open closes what it opened and undoes what it created.

To inspect (`kvtier check`), nothing is created, resized, deleted or written; a missing or
damaged index is an error instead of being rebuilt, and the records a normal open would drop
are kept, for the check to report (`problems`).

The records of a sound index are read in one pass as arrays and settled with array
operations (`_settle_compact`, cold.py): nothing per block is built, so a store of 10^6 blocks
opens in a fraction of a second and keeps about 25 bytes per slot for them; their keys are
loaded in the background afterwards. A rebuilt index, an index with malformed records and an
open to inspect take the per-record path (`_load`, `_settle`: a dict of `IndexRecord`s).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.errors import DiskLayoutError, DiskTierError, KvtierError
from kvtier.keys import MAX_KEY_BYTES, OffloadKey
from kvtier.tiers.codec import BlockCodec
from kvtier.tiers.disk.catalog import Catalog
from kvtier.tiers.disk.cold import RECORD_DTYPE, ColdRecords, settle
from kvtier.tiers.disk.files import StoreFiles
from kvtier.tiers.disk.fsck import CheckProblem
from kvtier.tiers.disk.index import BlockIndex, IndexHome, index_reserve
from kvtier.tiers.disk.index_check import (
    DATA_FILE,
    PROBE_TIMEOUT_S,
    PROBED_KEYS_SUFFIX,
    ProbedKeys,
    lmdb_file_problem,
    move_aside,
    probe_index,
    take_clean_stamp,
    take_records_snapshot,
)
from kvtier.tiers.disk.inflight import InflightLog
from kvtier.tiers.disk.io import FileIO
from kvtier.tiers.disk.layout import (
    EMPTY_ENTRY,
    HEADERS_FILE,
    INDEX_DIR,
    INFLIGHT_FILE,
    BlockHeader,
    IndexRecord,
    StoreLayout,
    headers_file_bytes,
    slab_file_name,
)
from kvtier.tiers.disk.reader import BlockVerifier, Scratch
from kvtier.tiers.disk.safety import (
    OpenFootprint,
    allocated_bytes,
    check_free_space,
    check_parent_dir,
    check_store_dir,
)
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.trusted import create_or_open, make_dirs, refuse_symlink

PROBED_RECORDS = "records.probed"
"""Where the probe of an index not closed cleanly writes its records (read, then removed)."""
REBUILDING = "rebuilding"
"""A file in the index directory while it is being rebuilt from the slot headers."""

_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_HEADER_CHUNK_SLOTS = 4096
_log = logging.getLogger("kvtier.disk")
Records = dict[OffloadKey, IndexRecord]


def fsync_directory(path: Path) -> None:
    """fsync a directory (its entries); a file system that refuses is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC | _O_NOFOLLOW)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Recovery:
    """Opens the store of `layout` under `directory`; once `open` returns, `layout` is the
    store's (with its recorded slots per file), and `files`, `catalog`, `rebuilt_index` and
    `problems` describe what it serves from."""

    def __init__(
        self,
        layout: StoreLayout,
        directory: Path,
        *,
        io: FileIO,
        codec: BlockCodec,
        counters: StoreCounters,
        fsync: bool,
        inspect: bool,
        create_parents: bool,
    ) -> None:
        self.layout = layout
        self.directory = directory
        self.root = layout.store_dir(directory)
        self.files = StoreFiles(self.root, io)
        self.codec = codec
        self.counters = counters
        self.fsync = fsync
        self.inspect = inspect
        self.create_parents = create_parents
        self.catalog: Catalog | None = None
        self.rebuilt_index: str | None = None
        """Why the index was rebuilt from the slot headers (missing, damaged, ...), or None
        when it was opened as it was."""
        self.problems: list[CheckProblem] = []
        self.interrupted: list[int] = []
        """Slots of an interrupted write group (the in-flight log) that no kept record claims:
        blocks never reported stored. A normal open clears their headers; to inspect, they
        are only listed, for the check to report them as such (not as lost records)."""
        self._snapshot: tuple[bytes, int] | None = None  # the records of a clean close
        self._probed_keys: ProbedKeys | None = None  # the keys of the probe's walk
        """To inspect: what a normal open would have dropped."""
        self.sound = False
        """Whether the index is known sound (it may be stamped clean when it is closed)."""
        self._footprint: OpenFootprint | None = None

    def open(self, direct_io: bool | str) -> Catalog:
        """Open the store (module docstring); its catalog. On failure everything opened is
        closed and everything created removed; an error that is not a KvtierError becomes
        one DiskTierError line naming the store."""
        try:
            if self.inspect:
                return self._open_to_inspect()
            return self._open(direct_io)
        except BaseException as error:
            self.files.close(clean=self.sound and not self.inspect, catalog=self.catalog)
            if self._footprint is not None:
                self._footprint.rollback()
                self._footprint = None
            if isinstance(error, Exception) and not isinstance(error, KvtierError):
                raise DiskTierError(f"cannot open the disk tier at {self.root}: {error}") from error
            raise

    def _open(self, direct_io: bool | str) -> Catalog:
        created = make_dirs(self.directory, create_parents=self.create_parents)
        check_parent_dir(self.directory)
        created += make_dirs(self.root, create_parents=False)
        check_store_dir(self.root)
        self._footprint = OpenFootprint(self.root, created)
        self.files.take_lock(create=True)
        self._check_space()
        index_path = self.root / INDEX_DIR
        recorded = self._open_headers(create=True)
        damage = self._index_damage(index_path, recorded is not None)
        if damage is not None and index_path.exists():
            aside = move_aside(index_path)
            _log.warning("disk tier %s: index moved aside to %s: %s", self.root, aside, damage)
        make_dirs(index_path, create_parents=False)
        check_store_dir(index_path)
        home = IndexHome(index_path, self.layout, durable=self.fsync)
        catalog = self.catalog = Catalog(home.open(), home, self.counters, self.root)
        if damage is not None and recorded is not None:
            # The slot headers say how the store was laid out; the index is rebuilt to match.
            catalog.index.write_layout(recorded, self.layout.num_blocks)
        self.layout = home.layout = self._checked_layout(catalog.index)
        if recorded is None:
            self.files.write_file_header(self.layout)
        self.files.open_inflight()
        sizes = self.files.open_slabs(self.layout, create=True)
        if damage:
            self._settle(catalog, self._rebuild(index_path, damage, sizes), sizes)
        elif not self._settle_compact(catalog, sizes):
            self._settle(catalog, self._load(catalog.index), sizes)
        self.sound = True
        self.files.use_direct_io(direct_io, self.layout)
        if self.fsync:
            # New files and directories survive a power cut only once their directory
            # entries are on disk too.
            for directory in (self.directory, self.root, index_path):
                fsync_directory(directory)
        return catalog

    def _open_to_inspect(self) -> Catalog:
        """`_open` for `inspect`: open what exists, change nothing."""
        if not self.root.is_dir():
            raise DiskTierError(f"no disk store at {self.root}")
        self.files.take_lock(create=False)
        index_path = self.root / INDEX_DIR
        recorded = self._open_headers(create=False)
        if not (index_path / DATA_FILE).exists():
            raise DiskTierError(
                f"{self.root}: the index is missing; `kvtier check --repair` rebuilds it from "
                "the slab headers"
            )
        damage = self._index_damage(index_path, recorded is not None)
        if damage is not None:
            raise DiskTierError(
                f"{self.root}: {damage}; `kvtier check --repair` moves it aside and rebuilds "
                "it from the slab headers"
            )
        index = BlockIndex(index_path, map_size=1 << 20, durable=False)
        catalog = self.catalog = Catalog(index, None, self.counters, self.root)
        self.layout = self._checked_layout(index)
        sizes = self.files.open_slabs(self.layout, create=False)
        self._settle(catalog, self._load(index), sizes)
        claimed = catalog.claimed_slots()
        suspects = InflightLog.peek(self.root / INFLIGHT_FILE)
        self.interrupted = sorted({slot for slot in suspects if slot not in claimed})
        self.sound = True
        return catalog

    def _check_space(self) -> None:
        """DiskTierError, before anything is allocated, when the file system cannot hold what
        this open still has to allocate (slab files, header file, index reserve)."""
        layout = self.layout
        wanted = (
            layout.num_blocks * layout.block_size
            + headers_file_bytes(layout.num_blocks)
            + index_reserve(layout.num_blocks)
        )
        held = sum(allocated_bytes(path) for path in self.root.glob("slab-*.bin"))
        held += allocated_bytes(self.root / HEADERS_FILE)
        held += allocated_bytes(self.root / INDEX_DIR / DATA_FILE)
        check_free_space(self.root, wanted - held, f"the disk tier at {self.root}")

    def _open_headers(self, *, create: bool) -> dict[str, Any] | None:
        """Open the header file; the layout it records (None for a new or unreadable one).
        DiskLayoutError when it records another store's layout."""
        recorded = self.files.open_headers(create=create)
        if recorded is not None and not self.layout.matches(recorded):
            raise DiskLayoutError(
                f"{self.root}: its header file records layout {recorded}, expected fingerprint "
                f"{self.layout.fingerprint}; refusing to serve its blocks"
            )
        return recorded

    def _index_damage(self, index_path: Path, has_headers: bool) -> str | None:
        """Why the index cannot be opened as it is (it is then rebuilt from the headers), or
        None when it is sound, or absent in a new store. See `index_check.py`."""
        data = index_path / DATA_FILE
        for path in (index_path, data, index_path / "lock.mdb"):
            refuse_symlink(path)  # never read, moved or mapped through a planted link
        if not data.exists():
            return "the index is missing" if has_headers else None
        if (index_path / REBUILDING).exists():
            return "a rebuild of the index was interrupted"
        problem = lmdb_file_problem(data)
        if problem is not None:
            return f"damaged index file: {problem}"
        stamp = take_clean_stamp(index_path, keep=self.inspect)
        snapshot = take_records_snapshot(index_path, stamp or {}, keep=self.inspect)
        if stamp is not None:
            self._snapshot = snapshot
            return None
        walked = None if self.inspect else index_path / PROBED_RECORDS
        problem = probe_index(
            index_path, IndexRecord.FORMAT.size, MAX_KEY_BYTES, PROBE_TIMEOUT_S, walked
        )
        if walked is not None:
            keys = walked.with_name(walked.name + PROBED_KEYS_SUFFIX)
            if problem is None:
                self._snapshot = self._take_probed(walked)
                self._probed_keys = self._take_probed_keys(keys, self._snapshot)
            walked.unlink(missing_ok=True)
            keys.unlink(missing_ok=True)
        return None if problem is None else f"damaged index: {problem}"

    @staticmethod
    def _take_probed_keys(path: Path, snapshot: tuple[bytes, int] | None) -> ProbedKeys | None:
        """The keys the probe's walk wrote, for the records of `snapshot`, or None."""
        if snapshot is None:
            return None
        try:
            return ProbedKeys.open(path, snapshot[1])
        except (OSError, ValueError):
            return None

    @staticmethod
    def _take_probed(path: Path) -> tuple[bytes, int] | None:
        """The packed records the probe's walk wrote (it found none malformed), or None."""
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        if len(raw) % IndexRecord.FORMAT.size:
            return None
        return raw, len(raw) // IndexRecord.FORMAT.size

    def _checked_layout(self, index: BlockIndex) -> StoreLayout:
        """The store's layout: as the index records it (checked to be this store's), or, in
        a new index, the one asked for (then recorded)."""
        try:
            recorded = index.read_layout()
        except ValueError as error:
            raise DiskLayoutError(f"{self.root}: unreadable layout in the index: {error}") from None
        if recorded is None:
            if self.inspect:
                raise DiskLayoutError(f"{self.root}: the index records no layout")
            index.write_layout(self.layout.meta(), self.layout.num_blocks)
            return self.layout
        slots = self.layout.recorded_slots_per_file(recorded, f"{self.root}: the index")
        if not self.inspect:
            index.write_layout(recorded, self.layout.num_blocks)
        return self.layout.with_slots_per_file(slots)

    @staticmethod
    def _load(index: BlockIndex) -> Records:
        """The index's readable records (unreadable ones are left for `check`)."""
        records = {}
        for key, value in index.items():
            with contextlib.suppress(ValueError):
                records[key] = IndexRecord.unpack(value)
        return records

    # -- rebuilding from the slot headers -----------------------------------------------------

    def _rebuild(self, index_path: Path, damage: str, sizes: list[int]) -> Records:
        """Rebuild the fresh, empty index from the slot headers (because of `damage`). Until
        it is committed the index is marked, so a process killed meanwhile leaves an index
        the next open rebuilds again, not one that silently lacks records."""
        self.rebuilt_index = damage
        marker = index_path / REBUILDING
        os.close(create_or_open(marker))
        records = self._records_from_headers(sizes)
        marker.unlink()
        return records

    def _headers(self) -> Iterator[tuple[int, BlockHeader]]:
        """Every readable slot header, with its slot."""
        files = self.files
        slots = min(self.layout.num_blocks, files.headers_slots())
        _log.warning("disk tier %s: rebuilding the index from %d slot headers", self.root, slots)
        for first in range(0, slots, _HEADER_CHUNK_SLOTS):
            count = min(_HEADER_CHUNK_SLOTS, slots - first)
            data = files.read_entries(first, count)
            for i, header in enumerate(self.layout.unpack_entries(data, first)):
                if header is not None:
                    yield first + i, header

    def _records_from_headers(self, sizes: list[int]) -> Records:
        """The newest header of each key whose bytes verify becomes its record, written to the
        index. A full scan of the stored blocks; logged with progress."""
        candidates: dict[OffloadKey, list[tuple[int, BlockHeader]]] = {}
        for slot, header in self._headers():
            candidates.setdefault(header.key, []).append((slot, header))
        verifier = BlockVerifier(self.layout, self.files, self.codec)
        scratch = verifier.scratch()
        records: Records = {}
        report_every = max(1, len(candidates) // 10)
        for done, (key, found) in enumerate(candidates.items(), 1):
            record = self._newest_sound(verifier, key, found, sizes, scratch)
            if record is not None:
                records[key] = record
            if done % report_every == 0:
                _log.info("disk tier %s: verified %d of %d keys", self.root, done, len(candidates))
        if self.catalog is not None:
            self.catalog.index.write_all([(key, record.pack()) for key, record in records.items()])
        _log.warning(
            "disk tier %s: index rebuilt: %d blocks recovered from %d headers",
            self.root,
            len(records),
            sum(len(found) for found in candidates.values()),
        )
        return records

    def _newest_sound(
        self,
        verifier: BlockVerifier,
        key: OffloadKey,
        found: list[tuple[int, BlockHeader]],
        sizes: list[int],
        scratch: Scratch,
    ) -> IndexRecord | None:
        """The record of the newest of `key`'s headers whose block is whole and verifies."""
        for slot, header in sorted(found, key=lambda item: -item[1].seq):
            record = header.record(slot)
            file, offset = self.layout.locate(slot)
            if sizes[file] < offset + max(record.length, 1):
                continue
            if verifier.problem(key, record, scratch) is None:
                return record
        return None

    # -- settling -----------------------------------------------------------------------------

    def _settle(self, catalog: Catalog, records: Records, sizes: list[int]) -> None:
        """Keep the records that can be served (newest first, one per slot) and drop the
        others, durably, before any file shrinks; then size the files. To inspect, the
        dropped ones are kept as `problems` and nothing is changed."""
        inflight = self.files.inflight
        if inflight is not None:
            suspects = set(inflight.read())
        else:  # opened to inspect: the log is read, never created
            suspects = set(InflightLog.peek(self.root / INFLIGHT_FILE)) if self.inspect else set()
        kept = self._judge(records, sizes, suspects)
        dropped = [key for key in records if key not in kept]
        next_seq = max((record.seq for record in records.values()), default=0) + 1
        if self.inspect:
            catalog.load(kept, next_seq=1, restorable=False)
            return
        if dropped:
            catalog.index.delete(dropped)
        if suspects and inflight is not None:
            self._clear_unowned_headers(suspects, {record.slot for record in kept.values()})
            inflight.clear()
        self.counters.set_dropped_at_open(len(dropped))
        catalog.load(kept, next_seq=next_seq, restorable=True)
        self.files.fit(self.layout, sizes)

    def _settle_compact(self, catalog: Catalog, sizes: list[int]) -> bool:
        """`_settle` for the records of a sound index, read in one pass as arrays and kept
        compactly (cold.py); False, changing nothing, when a record is malformed (the
        per-record path then leaves it for `check`). Only the records in the slots of an
        interrupted write group are verified, and only the keys of records to verify or to
        drop are looked up."""
        index = catalog.index
        raw, count = self._snapshot or index.packed_values()
        probed, self._snapshot, self._probed_keys = self._probed_keys, None, None
        keys_at = probed.keys_at if probed is not None else index.keys_at
        if len(raw) != count * RECORD_DTYPE.itemsize:
            return False
        records = np.frombuffer(raw, dtype=RECORD_DTYPE)
        inflight = self.files.inflight
        suspects = set(inflight.read()) if inflight is not None else set()
        bad = self._bad_suspects(keys_at, records, sizes, suspects) if suspects else None
        scan = settle(records, self.layout, sizes, self.files.slab_fds, bad)
        dropped = scan.dropped.tolist()
        if dropped:
            keys = keys_at(dropped)
            for position, why in zip(dropped, scan.reasons, strict=True):
                slot = int(records["slot"][position])
                self.problems.append(CheckProblem(keys[position], slot, why))
            index.delete(keys.values())
        next_seq = int(records["seq"].max()) + 1 if count else 1
        if suspects and inflight is not None:
            self._clear_unowned_headers(suspects, self._owned(records, scan.kept, suspects))
            inflight.clear()
        self.counters.set_dropped_at_open(len(dropped))
        catalog.load_cold(
            ColdRecords(self.layout.num_blocks, records, scan.kept), next_seq=next_seq
        )
        self.files.fit(self.layout, sizes)
        return True

    @staticmethod
    def _owned(records: np.ndarray, kept: np.ndarray, suspects: set[int]) -> set[int]:
        """The slots in `suspects` that a kept record claims (`kept`: positions, sorted):
        found from the few suspect positions, never an array or a set of every slot."""
        wanted = np.fromiter(suspects, dtype=np.uint64, count=len(suspects))
        positions = np.flatnonzero(np.isin(records["slot"], wanted))
        at = np.searchsorted(kept, positions)
        claimed = at < len(kept)
        claimed[claimed] = kept[at[claimed]] == positions[claimed]
        return set(records["slot"][positions[claimed]].tolist())

    def _bad_suspects(
        self,
        keys_at: Callable[[Iterable[int]], dict[int, OffloadKey]],
        records: np.ndarray,
        sizes: list[int],
        suspects: set[int],
    ) -> np.ndarray:
        """A mask of the records in `suspects` (the slots of an interrupted write group)
        whose bytes no longer verify."""
        bad = np.zeros(len(records), dtype=bool)
        wanted = np.fromiter(suspects, dtype=np.uint64, count=len(suspects))
        positions = np.flatnonzero(np.isin(records["slot"], wanted)).tolist()
        if not positions:
            return bad
        keys = keys_at(positions)
        verifier = BlockVerifier(self.layout, self.files, self.codec)
        scratch = verifier.scratch()
        for position in positions:
            slot, length, codec, checksum, seq = records[position].tolist()
            record = IndexRecord(slot, length, codec, checksum, seq)
            if self._drop_reason(record, sizes, {}) is None:
                bad[position] = verifier.problem(keys[position], record, scratch) is not None
        return bad

    def _clear_unowned_headers(self, suspects: set[int], owned: set[int]) -> None:
        """Clear the slot headers of an interrupted write group's slots that no kept record
        claims: blocks never reported stored, so that `check` does not call them lost records
        and a later rebuild does not bring them back. Best effort, synced before the in-flight
        log is cleared (a failure leaves sound blocks under their own keys: never wrong
        bytes)."""
        unowned = sorted(slot for slot in suspects if slot not in owned)
        if not unowned or self.files.headers_fd is None:
            return
        self.interrupted = [slot for slot in unowned if self._has_header(slot)]
        with contextlib.suppress(OSError):
            chosen: dict[int, tuple[int | None, bytes | memoryview]] = {
                slot: (None, EMPTY_ENTRY) for slot in unowned if slot < self.layout.num_blocks
            }
            if not self.files.write_entries(chosen):
                self.files.sync_headers()

    def _has_header(self, slot: int) -> bool:
        """Whether the header entry of `slot` holds a readable header."""
        if slot >= self.layout.num_blocks:
            return False
        with contextlib.suppress(OSError):
            entries = self.layout.unpack_entries(self.files.read_entries(slot, 1), slot)
            return bool(entries) and entries[0] is not None
        return False

    def _judge(self, records: Records, sizes: list[int], suspects: set[int]) -> Records:
        """The records to keep, newest first; why each other one is dropped goes to
        `problems`."""
        verifier = BlockVerifier(self.layout, self.files, self.codec)
        scratch = verifier.scratch()
        by_slot: dict[int, OffloadKey] = {}
        for key, record in sorted(records.items(), key=lambda item: -item[1].seq):
            why = self._drop_reason(record, sizes, by_slot)
            if why is None and record.slot in suspects:
                what = verifier.problem(key, record, scratch)
                if what is not None:
                    why = f"rewritten by a write group that did not finish: {what}"
            if why is None:
                by_slot[record.slot] = key
            else:
                self.problems.append(CheckProblem(key, record.slot, why))
        return {key: records[key] for key in by_slot.values()}

    def _drop_reason(
        self, record: IndexRecord, sizes: list[int], by_slot: dict[int, OffloadKey]
    ) -> str | None:
        """Why `record` cannot be served without reading it, or None."""
        layout = self.layout
        if record.slot >= layout.num_blocks:
            return f"slot beyond the store's {layout.num_blocks} slots"
        file, offset = layout.locate(record.slot)
        if self.files.slab_fds and self.files.slab_fds[file] < 0:
            why = self.files.slab_problems.get(file, "is missing")
            return f"its slab file {slab_file_name(file)} {why}"
        if sizes[file] < offset + max(record.length, 1):
            return f"its slab file ends at byte {sizes[file]}, before the block"
        if record.slot in by_slot:
            return f"slot also claimed by the newer record of {by_slot[record.slot].hex()}"
        return None
