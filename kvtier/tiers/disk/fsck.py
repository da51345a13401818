"""The check of a disk store (`DiskStore.check`, `kvtier check`): every record against its slot.

Every index record is checked against its slot's header and bytes (slot in range and not
shared, the header of the same key and sequence, a sane length and codec, a file long enough,
the bound checksum, bytes that decode), every header against the index (a sound block with no
record is a lost record), and the files of the store directory (stray ones). With `repair`,
the bad records are dropped, the lost blocks indexed again and stray slab files removed, all
durably. A store opened only to inspect (`inspect=True`) also reports what a normal open would
have dropped (recovery.py keeps it as `problems`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvtier.errors import DiskTierError
from kvtier.keys import OffloadKey
from kvtier.tiers.disk.catalog import Catalog, Records
from kvtier.tiers.disk.files import StoreFiles
from kvtier.tiers.disk.guard import Guard
from kvtier.tiers.disk.index import BlockIndex
from kvtier.tiers.disk.layout import (
    HEADERS_FILE,
    INDEX_DIR,
    INFLIGHT_FILE,
    LOCK_FILE,
    BlockHeader,
    IndexRecord,
    StoreLayout,
    slab_file_name,
)
from kvtier.tiers.disk.reader import BlockVerifier, Scratch

_HEADER_CHUNK_SLOTS = 4096
"""Slot headers read per system call."""


@dataclass(frozen=True, slots=True)
class CheckProblem:
    """One thing `DiskStore.check` found wrong: the record of `key` (in `slot`, None when the
    record itself is unreadable) and what is wrong with it."""

    key: OffloadKey
    slot: int | None
    what: str

    def __str__(self) -> str:
        where = "?" if self.slot is None else str(self.slot)
        return f"key {self.key.hex()} slot {where}: {self.what}"


@dataclass(frozen=True, slots=True)
class CheckReport:
    """The result of `DiskStore.check`: how many records were examined, every problem found,
    and how many bad records were dropped (0 unless `repair=True`)."""

    records: int
    problems: tuple[CheckProblem, ...]
    repaired: int = 0
    reindexed: int = 0
    """Blocks whose lost index record was written again from their header (`repair=True`)."""
    notes: tuple[str, ...] = ()
    """What is worth knowing but not wrong with a block (stray files, a removed one)."""
    opened: tuple[str, ...] = ()
    """What the store's (normal) open repaired before the check ran, one line each: the
    records it dropped and why, the headers of an interrupted write group it cleared."""

    @property
    def ok(self) -> bool:
        """Whether every record is sound."""
        return not self.problems

    def __str__(self) -> str:
        head = f"{self.records} records, {len(self.problems)} problems"
        if self.repaired:
            head += f", {self.repaired} records dropped"
        if self.reindexed:
            head += f", {self.reindexed} lost records restored"
        lines = [head, *(f"  {problem}" for problem in self.problems)]
        return "\n".join(lines + [f"  note: {note}" for note in self.notes])


def read_headers(
    layout: StoreLayout, files: StoreFiles, slots: int
) -> dict[int, BlockHeader | None]:
    """The headers of slots [0, slots) (None for an empty or unreadable entry), by slot."""
    found: dict[int, BlockHeader | None] = {}
    if files.headers_fd is None:
        return found
    for first in range(0, slots, _HEADER_CHUNK_SLOTS):
        count = min(_HEADER_CHUNK_SLOTS, slots - first)
        for i, header in enumerate(layout.unpack_entries(files.read_entries(first, count), first)):
            found[first + i] = header
    return found


def header_problem(key: OffloadKey, record: IndexRecord, header: BlockHeader | None) -> str | None:
    """What the slot's header says is wrong with `record` of `key`, or None when it agrees
    (or is unreadable: the checksum then decides)."""
    if header is None:
        return None
    if header.key != key:
        return (
            f"the slot holds the block of another key ({header.key.hex()}, seq "
            f"{header.seq}): a swapped or stale record"
        )
    if header.seq != record.seq:
        return (
            f"stale record (seq {record.seq}): the slot was rewritten with this key's "
            f"block seq {header.seq}"
        )
    if (header.length, header.codec, header.checksum) != (
        record.length,
        record.codec,
        record.checksum,
    ):
        return "the record and the slot's header disagree on length, codec or checksum"
    return None


class StoreChecker:
    """Checks (and repairs) one open store."""

    def __init__(
        self,
        layout: StoreLayout,
        files: StoreFiles,
        catalog: Catalog,
        verifier: BlockVerifier,
        guard: Guard,
        *,
        open_problems: list[CheckProblem],
        inspect: bool,
        interrupted: Sequence[int] = (),
    ) -> None:
        self.layout = layout
        self.files = files
        self.catalog = catalog
        self.verifier = verifier
        self.guard = guard
        self.open_problems = open_problems
        """What opening the store to inspect kept but a normal open would have dropped."""
        self.inspect = inspect
        self.interrupted = set(interrupted)
        """Slots of an interrupted write group that no record claims (`Recovery.interrupted`):
        opened to inspect, their blocks are reported as such, never as lost records (a
        repair's open clears their headers instead of indexing blocks never reported
        stored); opened normally, their headers were cleared."""
        self._root = files.root

    def check(self, repair: bool = False) -> CheckReport:
        """Verify the store (module docstring); with `repair`, fix what can be fixed.
        Blocking; run it with no batch in flight (an overlapping write could be reported as
        a problem)."""
        if repair and self.inspect:
            raise DiskTierError(f"{self._root} is open only to be checked; reopen it to repair")
        with self.catalog.writing:
            if self.guard.reason is not None:
                raise DiskTierError(
                    f"the disk tier at {self._root} is disabled: {self.guard.reason}"
                )
            index = self.catalog.index
            # Opening to inspect keeps what a normal open drops; a normal open has dropped it.
            problems = list(self.open_problems) if self.inspect else []
            examined, by_slot = self._records_by_slot(index, problems)
            headers = read_headers(self.layout, self.files, self.layout.num_blocks)
            scratch = self.verifier.scratch()
            sound = self._check_slots(by_slot, headers, problems, scratch)
            lost = self._lost_blocks(headers, sound, scratch)
            lost = [(key, record) for key, record in lost if record.slot not in self.interrupted]
            bad = list(dict.fromkeys(problem.key for problem in problems))
            if self.inspect:
                problems += self._unfinished(headers)
            problems += [
                CheckProblem(
                    key,
                    record.slot,
                    "lost record: the slot holds this key's sound block (header and checksum "
                    "agree) but the index has no record of it",
                )
                for key, record in lost
            ]
            strays = self._stray_files()
            notes = [f"unknown file in the store directory: {path.name}" for path in strays]
            repaired = reindexed = 0
            if repair and problems:
                repaired, reindexed = self._repair(index, bad, lost)
            if repair:
                notes += self._remove_stray_slabs(strays)
        opened: list[str] = []
        if not self.inspect:
            opened = [
                f"{problem} (dropped when the store opened)" for problem in self.open_problems
            ]
            if self.interrupted:
                opened.append(
                    f"cleared the headers of {len(self.interrupted):,} slots an interrupted "
                    "write group wrote (blocks never reported stored) when the store opened"
                )
        return CheckReport(
            examined, tuple(problems), repaired, reindexed, tuple(notes), tuple(opened)
        )

    def _unfinished(self, headers: dict[int, BlockHeader | None]) -> list[CheckProblem]:
        """The headers that an interrupted write group left in slots no record claims: what
        a repair's open clears (`interrupted`), reported as such, not as lost records."""
        return [
            CheckProblem(
                header.key,
                slot,
                "written by a write group that did not finish (never reported stored): a "
                "repair clears its slot's header",
            )
            for slot in sorted(self.interrupted)
            if (header := headers.get(slot)) is not None
        ]

    def _records_by_slot(
        self, index: BlockIndex, problems: list[CheckProblem]
    ) -> tuple[int, dict[int, Records]]:
        """Every index record, by slot; how many there were (unreadable ones are problems)."""
        by_slot: dict[int, Records] = {}
        examined = 0
        for key, value in index.items():
            examined += 1
            try:
                record = IndexRecord.unpack(value)
            except ValueError as error:
                problems.append(CheckProblem(key, None, f"unreadable index record: {error}"))
                continue
            by_slot.setdefault(record.slot, []).append((key, record))
        return examined, by_slot

    def _check_slots(
        self,
        by_slot: dict[int, Records],
        headers: dict[int, BlockHeader | None],
        problems: list[CheckProblem],
        scratch: Scratch,
    ) -> dict[OffloadKey, int]:
        """Check the newest record of each slot (an older one sharing it is a problem); the
        sequence number of each key's sound record."""
        sound: dict[OffloadKey, int] = {}
        reported = {problem.key for problem in problems}
        for slot in sorted(by_slot):
            entries = sorted(by_slot[slot], key=lambda entry: entry[1].seq)
            newest_key, newest = entries[-1]
            for key, _ in entries[:-1]:
                if key not in reported:
                    shared = f"slot also claimed by the newer record of {newest_key.hex()}"
                    problems.append(CheckProblem(key, slot, shared))
            if newest_key in reported:
                continue
            what = header_problem(newest_key, newest, headers.get(slot))
            if what is None:
                what = self.verifier.problem(newest_key, newest, scratch)
            if what is None:
                sound[newest_key] = newest.seq
            else:
                problems.append(CheckProblem(newest_key, slot, what))
        return sound

    def _lost_blocks(
        self,
        headers: dict[int, BlockHeader | None],
        sound: dict[OffloadKey, int],
        scratch: Scratch,
    ) -> Records:
        """Sound blocks that have a header and no sound record newer than it (newest per
        key), in slot order."""
        newest: dict[OffloadKey, tuple[int, BlockHeader]] = {}
        for slot, header in headers.items():
            if header is None or sound.get(header.key, -1) >= header.seq:
                continue
            if header.key in newest and newest[header.key][1].seq >= header.seq:
                continue
            newest[header.key] = (slot, header)
        lost = []
        for key, (slot, header) in newest.items():
            record = header.record(slot)
            if self.files.slab_fds[self.layout.locate(slot)[0]] < 0:
                continue
            if self.verifier.problem(key, record, scratch) is None:
                lost.append((key, record))
        return sorted(lost, key=lambda item: item[1].slot)

    def _repair(self, index: BlockIndex, bad: list[OffloadKey], lost: Records) -> tuple[int, int]:
        """Drop the `bad` records and index the `lost` blocks whose slots no record claims,
        durably; (records dropped, records restored)."""
        self.catalog.drop(bad)  # first: a restored record is found through the index
        index.delete(bad)
        claimed = self.catalog.claimed_slots()
        restore = [(key, record) for key, record in lost if record.slot not in claimed]
        index.update((), [(key, record.pack()) for key, record in restore])
        self.catalog.remember(restore)
        return len(bad), len(restore)

    def _stray_files(self) -> list[Path]:
        """Files of the store directory that this store does not use."""
        known = {LOCK_FILE, INFLIGHT_FILE, HEADERS_FILE, INDEX_DIR}
        known.update(slab_file_name(file) for file in range(self.layout.num_files))
        return [
            path
            for path in sorted(self._root.iterdir())
            if path.name not in known and not path.name.startswith(f"{INDEX_DIR}.damaged-")
        ]

    @staticmethod
    def _remove_stray_slabs(strays: list[Path]) -> list[str]:
        """Remove the stray slab files among `strays`; a note for each one removed."""
        notes = []
        for path in strays:
            if path.name.startswith("slab-") and path.name.endswith(".bin"):
                with contextlib.suppress(OSError):
                    path.unlink()
                    notes.append(f"removed the stray slab file {path.name}")
        return notes
