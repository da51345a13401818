"""The write lane of a log store: every `write` and `forget` queued while it was busy is one
group, appended to the open region in one write per region and made durable with one
fdatasync (group commit); only then are its records put in the index and its calls resolved.

Space is reclaimed a region at a time. When a new region is opened and no clean region would
be left in reserve, the region holding the fewest live bytes is read and its live records (the
blocks the tier's policy still holds, and the forgets still current) are appended to the open
region with the group, byte for byte under the new region's epoch; the region is clean once
that write is durable and the index points at the copies. A block is never dropped to make
room: which blocks stay is the tier's policy's decision (its evictions overwrite or forget
slots), so the hit ratio is the per-block layout's; the cost is the bytes moved, counted in
`moved_bytes` (write amplification: (written + moved) / written).
"""

from __future__ import annotations

import errno
import mmap
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec
from kvtier.tiers.disk.jobs import (
    ForgetJob,
    Job,
    JobQueue,
    Settlement,
    WriteJob,
    settle_by_loop,
    take_group,
)
from kvtier.tiers.disk.log_files import LogFiles
from kvtier.tiers.disk.log_format import (
    PAGE,
    REGION_HEADER_BYTES,
    TOMBSTONE,
    Record,
    bound_checksum,
    pack_header,
    pack_region_header,
    parse_header,
    record_bytes,
    with_epoch,
)
from kvtier.tiers.disk.log_index import LogIndex, Placed
from kvtier.tiers.disk.stats import StoreCounters

GROUP_BYTES = 32 << 20
"""Most bytes of blocks merged into one group (a larger single call is a group of its own)."""

RESERVE_REGIONS = 1
"""Clean regions kept for reclaiming: moving a region's live records needs somewhere to go."""


@dataclass(slots=True)
class _Pending:
    """What a group has placed and not yet written: per region an image of the bytes from
    its first offset (page-aligned memory, written as whole pages), the records to index,
    and the regions being reclaimed."""

    region_bytes: int
    images: dict[int, tuple[int, memoryview]] = field(default_factory=dict)
    placed: list[tuple[Placed, bool]] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    ends: dict[int, int] = field(default_factory=dict)
    flushed: int = 0
    """New records (not moves) of the group already durable and indexed."""
    spare: list[memoryview] = field(default_factory=list)
    """Images' memory for reuse (the lane's: kept from group to group, faulted in once)."""

    def add(self, region: int, offset: int, piece: Any, nbytes: int) -> None:
        """Copy `piece` (`nbytes` bytes) to `offset` of `region` in the group's image."""
        image = self.images.get(region)
        if image is None:
            buffer = self.spare.pop() if self.spare else _region_buffer(self.region_bytes)
            image = self.images[region] = (offset, buffer)
        start, buffer = image
        at = offset - start
        buffer[at : at + nbytes] = piece
        self.ends[region] = offset + nbytes

    def clear(self) -> None:
        """Forget what was placed, keeping the images' memory for the next flush."""
        self.spare.extend(buffer for _, buffer in self.images.values())
        self.images.clear()
        self.ends.clear()
        self.placed.clear()
        self.victims.clear()


def _region_buffer(nbytes: int) -> memoryview:
    """Page-aligned memory for one region's image (anonymous mmap)."""
    return memoryview(mmap.mmap(-1, nbytes))


class LogLane:
    """The queue, the lane thread and the region allocator of one log store."""

    def __init__(
        self,
        files: LogFiles,
        index: LogIndex,
        codec: BlockCodec,
        counters: StoreCounters,
        namespace: bytes,
        *,
        fsync: bool,
        next_seq: int,
        next_epoch: int,
        on_flush: Callable[[int], None],
    ) -> None:
        self.files = files
        self.index = index
        self.codec = codec
        self.counters = counters
        self.namespace = namespace
        self.fsync = fsync
        self.next_seq = next_seq
        self.next_epoch = next_epoch
        self.on_flush = on_flush
        """Called after each durable flush with the regions opened so far (checkpointing)."""
        self.region_bytes = files.geo.region_bytes
        self.cursor = index.fill.copy()
        """Where the next record of each region goes (ahead of `index.fill` while unsynced)."""
        self.open: int | None = None
        self.opened = 0
        self.moved_bytes = 0
        self.appended_bytes = 0
        self.lost: str | None = None
        self.syncs = 0
        self._reclaiming = False
        self._overwritten: set[int] = set()
        """The slots the running group writes: a reclaim moves none of their old records."""
        self._images: list[memoryview] = []
        self._jobs = JobQueue(files.root, "kvtier-log-write", self._take_group, self._run_group)

    # -- the queue -------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue `job`; StorageClosedError once the lane is closing."""
        self._jobs.submit(job)

    def close(self) -> None:
        """Refuse new calls and run every group queued before (blocking)."""
        self._jobs.close()

    def _take_group(self, queue: deque[Job]) -> list[Job]:
        """The next group (`take_group`): up to GROUP_BYTES, never two jobs on one key (a
        forget looks its key's slot up before the group is indexed)."""
        return take_group(queue, GROUP_BYTES, distinct_slots=False)

    def _run_group(self, jobs: list[Job]) -> None:
        settlements: list[Settlement] = []
        try:
            results = self.commit(jobs)
        except Exception as error:  # a bug: every call of the group fails with it
            settlements = [(job.future, None, error) for job in jobs if job.future is not None]
        else:
            for job, result in zip(jobs, results, strict=True):
                if job.future is not None:
                    settlements.append((job.future, result, None))
        settle_by_loop(settlements)

    # -- one group -------------------------------------------------------------------------

    def commit(self, jobs: list[Job]) -> list[Any]:
        """Run one group; per job its result (a write: one OSError or None per block)."""
        results: list[list[OSError | None]] = [
            [None] * len(job.keys) if isinstance(job, WriteJob) else [] for job in jobs
        ]
        where: list[tuple[int, int]] = []
        if self.lost is not None:
            error = OSError(
                errno.ESTALE, f"the disk tier at {self.files.root} is disabled: {self.lost}"
            )
            return [
                [error] * len(r) if isinstance(j, WriteJob) else None
                for j, r in zip(jobs, results, strict=True)
            ]
        pending = _Pending(self.region_bytes, spare=self._images)
        self._overwritten = {
            slot for job in jobs if isinstance(job, WriteJob) for slot in job.slots
        }
        before, syncs = self.appended_bytes, self.syncs
        raw = 0
        written: set[int] = set()
        try:
            for number, job in enumerate(jobs):
                if isinstance(job, WriteJob):
                    for i, (key, slot, buffer) in enumerate(
                        zip(job.keys, job.slots, job.buffers, strict=True)
                    ):
                        codec, stored = self.codec.encode(buffer)
                        self._append(pending, key, slot, int(codec), stored)
                        where.append((number, i))
                        written.add(slot)
                        raw += buffer.nbytes
                else:
                    for key in job.keys:
                        held = self.index.find(key)
                        if held is not None and held not in written:  # else written over
                            self._append(pending, key, held, TOMBSTONE, b"")
                            where.append((-1, 0))
            self._flush(pending)
        except OSError as error:
            for number, i in where[pending.flushed :]:
                if number >= 0 and results[number][i] is None:
                    results[number][i] = error
            self._skip(pending)
        failed = sum(1 for r in results for e in r if e is not None)
        done = sum(len(r) for r in results) - failed
        self.counters.count_group(
            writes=sum(isinstance(job, WriteJob) for job in jobs),
            forgets=sum(isinstance(job, ForgetJob) for job in jobs),
            fsyncs=self.syncs - syncs,
            commits=0,
            stored=done,
            failed=failed,
            raw_bytes=raw if not failed else 0,
            stored_bytes=self.appended_bytes - before,
        )
        return [
            r if isinstance(job, WriteJob) else None for job, r in zip(jobs, results, strict=True)
        ]

    def _append(
        self, pending: _Pending, key: OffloadKey, slot: int, codec: int, stored: Any
    ) -> None:
        """Place one new record (a block, or a forget) and add it to the group."""
        view = memoryview(stored).cast("B")
        seq = self.next_seq
        self.next_seq += 1
        checksum = bound_checksum(self.namespace, key, slot, view.nbytes, codec, seq, view)
        size = record_bytes(len(key), view.nbytes)
        region, offset = self._place(pending, size)
        epoch = int(self.index.epoch[region])
        header = pack_header(self.namespace, key, slot, view.nbytes, codec, epoch, seq, checksum)
        pending.add(region, offset, header, len(header))
        pending.add(region, offset + len(header), view, view.nbytes)
        record = Record(key, slot, view.nbytes, codec, epoch, seq, checksum, offset)
        pending.placed.append((Placed(record, region), True))
        self.appended_bytes += size

    def _place(self, pending: _Pending, size: int) -> tuple[int, int]:
        """(region, offset) for `size` bytes: the open region, or a new one."""
        while self.open is None or self.cursor[self.open] + size > self.region_bytes:
            self._open_region(pending)  # (its reclaiming may fill the region it opened)
        assert self.open is not None
        offset = int(self.cursor[self.open])
        self.cursor[self.open] = offset + size
        return self.open, offset

    def _clean(self, pending: _Pending) -> list[int]:
        """Regions that hold nothing live and are in no unsynced write or reclaim."""
        busy = set(pending.images) | set(pending.victims)
        if self.open is not None:
            busy.add(self.open)
        with self.index.lock:
            empty = np.flatnonzero(self.index.live == 0).tolist()
        return [region for region in empty if region not in busy]

    def _open_region(self, pending: _Pending) -> None:
        clean = self._clean(pending)
        if len(clean) <= RESERVE_REGIONS and not self._reclaiming and pending.images:
            self._flush(pending)  # what was placed becomes durable; reclaimed regions clean
            clean = self._clean(pending)
        if not clean:
            raise OSError(errno.ENOSPC, f"the log store at {self.files.root} has no clean region")
        region = clean[0]
        epoch = self.next_epoch
        self.next_epoch += 1
        with self.index.lock:
            self.index.epoch[region] = epoch
            self.index.fill[region] = 0
        self.open = region
        self.opened += 1
        header = pack_region_header(self.namespace, epoch, region, self.region_bytes)
        pending.add(region, 0, header, len(header))
        self.cursor[region] = REGION_HEADER_BYTES
        if len(clean) - 1 <= RESERVE_REGIONS and not self._reclaiming:
            self._reclaim(pending)

    def _reclaim(self, pending: _Pending) -> None:
        """Move the live records of the region with the fewest live bytes into the group."""
        busy = set(pending.images) | set(pending.victims)
        with self.index.lock:
            live = self.index.live.copy()
        candidates = [r for r in np.argsort(live, kind="stable").tolist() if live[r] > 0]
        candidates = [r for r in candidates if r not in busy]
        if not candidates:
            return
        victim = candidates[0]
        data = np.empty(self.region_bytes, dtype=np.uint8)
        self._reclaiming = True
        try:
            got = self.files.read_into(victim, 0, data)
            view = data.data[:got]
            epoch = int(self.index.epoch[victim])
            for slot in self.index.live_slots(victim):
                if slot in self._overwritten:
                    continue  # this group writes the slot over: its old block is not moved
                offset = int(self.index.offset[slot])
                record = parse_header(view, offset, self.namespace, epoch, got)
                if record is None or record.slot != slot:
                    continue  # damaged: not moved (its reads would fail anyway)
                start = offset + record.payload_offset
                payload = view[start : start + record.length]
                if record.codec != TOMBSTONE and record.checksum != bound_checksum(
                    self.namespace,
                    record.key,
                    slot,
                    record.length,
                    record.codec,
                    record.seq,
                    payload,
                ):
                    continue
                region, at = self._place(pending, record.size)
                head = view[offset : offset + record.payload_offset].tobytes()
                new_epoch = int(self.index.epoch[region])
                moved_head = with_epoch(self.namespace, head, new_epoch)
                pending.add(region, at, moved_head, len(moved_head))
                pending.add(region, at + record.payload_offset, payload, record.length)
                moved = Record(
                    record.key,
                    slot,
                    record.length,
                    record.codec,
                    new_epoch,
                    record.seq,
                    record.checksum,
                    at,
                )
                pending.placed.append((Placed(moved, region, moved_from=victim), False))
                self.moved_bytes += record.size
        except OSError:
            pass  # an unreadable region is not moved; its blocks read as misses
        finally:
            self._reclaiming = False
        pending.victims.append(victim)

    def _flush(self, pending: _Pending) -> None:
        """Write every segment of the group (one write per region, whole pages), sync, then
        index what it placed and release the reclaimed regions; raises the OSError of a
        failed write or sync (nothing of the group is then indexed)."""
        for region, (start, buffer) in pending.images.items():
            used = pending.ends[region] - start
            span = -(-used // PAGE) * PAGE
            buffer[used:span] = bytes(span - used)  # the page's rest: nothing a scan parses
            self.files.write_at(region, start, buffer[:span])
        if self.fsync and pending.images:
            self.files.sync()
            self.syncs += 1
        lost = self.files.check_ground()
        if lost is not None:  # the files are no longer the store's: fail closed
            self.lost = lost
            raise OSError(errno.ESTALE, f"the disk tier at {self.files.root} is disabled: {lost}")
        ends = dict(pending.ends)
        pending.flushed += sum(1 for _, new in pending.placed if new)
        self.index.apply([placed for placed, _ in pending.placed])
        with self.index.lock:
            for region, end in ends.items():
                self.index.fill[region] = -(-end // PAGE) * PAGE
            for victim in pending.victims:
                if self.index.live[victim] != 0:  # records that could not be moved
                    for slot in np.flatnonzero(self.index.region == victim).tolist():
                        self.index._clear(slot)
        for region, end in ends.items():
            self.cursor[region] = max(int(self.cursor[region]), -(-end // PAGE) * PAGE)
        pending.clear()
        self.on_flush(self.opened)

    def _skip(self, pending: _Pending) -> None:
        """After a failed write: the group's space is skipped (never rewritten: a later scan
        must not find half of it under a later group) and nothing it placed is indexed."""
        for region, end in pending.ends.items():
            self.cursor[region] = -(-end // PAGE) * PAGE
        self.open = None  # a region whose header may not be written takes no more records
        pending.clear()
