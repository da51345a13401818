"""The write lane of a log store: every `write` and `forget` queued while it was busy is one
group, appended to the open region and made durable with one fdatasync (group commit); only
then are its records put in the index and its calls resolved.

A group's records in one region are a part (log_format.py): header pages with every record's
entry and key, then the payloads. The payloads are written straight from the caller's memory
(one pwritev of the header pages and the caller's rows, with O_DIRECT where they are
page-aligned whole pages; else copied once into an aligned image), and a part's write starts
on the write threads as soon as the group moves on to the next region, so the next part's
checksums are computed while it is in flight. The Python per block is its placement and its
bound checksum; the header and the index's update are array operations over the group.

Space is reclaimed a region at a time. When a new region is opened and no clean region would
be left in reserve, the region holding the fewest live bytes is read and its live records (the
blocks the tier's policy still holds, and the forgets still current) are appended to the open
region with the group, byte for byte (their bound checksums verified first); the region is
clean once that write is durable and the index points at the copies. A block is never dropped
to make room: which blocks stay is the tier's policy's decision (its evictions overwrite or
forget slots), so the hit ratio is the per-block layout's; the cost is the bytes moved,
counted in `moved_bytes` (write amplification: (written + moved) / written).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
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
from kvtier.tiers.disk.log_files import LogFiles, whole_pages
from kvtier.tiers.disk.log_format import (
    PAGE,
    REGION_HEADER_BYTES,
    TOMBSTONE,
    bound_checksum,
    head_bytes,
    pack_group,
    pack_region_header,
    payload_at,
    record_bytes,
    round_page,
)
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex, Placed
from kvtier.tiers.disk.stats import StoreCounters

GROUP_BYTES = 32 << 20
"""Most bytes of blocks merged into one group (a larger single call is a group of its own)."""

RESERVE_REGIONS = 1
"""Clean regions kept for reclaiming: moving a region's live records needs somewhere to go."""

_ZEROS = memoryview(bytes(PAGE))


@dataclass(slots=True)
class _Part:
    """A group's records in one region, placed and not yet written: where its header pages
    start, and per record its key, slot, sequence, checksum, payload offset (from the end of
    the header pages) and length, codec, stored bytes and the region it was moved from."""

    region: int
    start: int
    epoch: int
    opens: bool
    """Whether the region's first page is written with it (the region was just opened)."""
    keys: list[OffloadKey] = field(default_factory=list)
    slot: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    checksum: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    length: list[int] = field(default_factory=list)
    codec: list[int] = field(default_factory=list)
    payloads: list[Any] = field(default_factory=list)
    moved_from: list[int] = field(default_factory=list)
    key_bytes: int = 0
    end: int = 0
    """Bytes of payload placed (from the end of the header pages)."""
    direct: bool = True
    """Whether every payload is page-aligned memory of whole pages (O_DIRECT from it)."""
    head_pages: int = 0
    """Set when the part is written."""

    def fits(self, key_len: int, length: int, region_bytes: int) -> int | None:
        """The payload offset of one more record, or None when it does not fit the region."""
        at = payload_at(self.end, length)
        head = round_page(head_bytes(len(self.keys) + 1, self.key_bytes + key_len))
        if self.start + head + round_page(at + length) > region_bytes:
            return None
        return at

    @property
    def stop(self) -> int:
        """Where the part ends in its region (valid once written)."""
        return self.start + self.head_pages * PAGE + round_page(self.end)


@dataclass(slots=True)
class _Pending:
    """What a group has placed and not yet made durable: its parts (the last one still
    taking records), the writes in flight, the regions being reclaimed and the memory the
    writes read from (kept alive until they are done)."""

    parts: list[_Part] = field(default_factory=list)
    writes: list[Future[int]] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    keep: list[Any] = field(default_factory=list)
    spares: list[np.ndarray[Any, np.dtype[np.uint8]]] = field(default_factory=list)
    """The lane's spare buffers this group took."""
    closed: int = 0
    """Parts already written (the rest, at most one, still takes records)."""
    flushed: int = 0
    """New records (not moves) of the group already durable and indexed."""

    def clear(self) -> None:
        """Forget what was placed (every write done)."""
        self.parts.clear()
        self.writes.clear()
        self.victims.clear()
        self.keep.clear()
        self.closed = 0


def _aligned_buffer(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Page-aligned memory (anonymous mmap) of at least `nbytes`, whole pages."""
    return np.frombuffer(mmap.mmap(-1, max(PAGE, round_page(nbytes))), dtype=np.uint8)


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
        self._spare: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
        """Region-sized aligned buffers (images, reclaimed regions) kept from group to group:
        faulted in once, not per group."""
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
        pending = _Pending()
        self._overwritten = {
            slot for job in jobs if isinstance(job, WriteJob) for slot in job.slots
        }
        before, syncs = self.appended_bytes, self.syncs
        raw = 0
        written: set[int] = set()
        try:
            for number, job in enumerate(jobs):
                if isinstance(job, WriteJob):
                    where.extend((number, i) for i in range(len(job.keys)))
                    self._append_write(pending, job)
                    written.update(job.slots)
                    raw += sum(buffer.nbytes for buffer in job.buffers)
                else:
                    for key in job.keys:
                        held = self.index.find(key)
                        if held is not None and held not in written:  # else written over
                            where.append((-1, 0))
                            self._append(pending, key, held, TOMBSTONE, _ZEROS[:0], True)
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

    def _append_write(self, pending: _Pending, job: WriteJob) -> None:
        """Place the blocks of one write call (encoded; raw blocks are not touched)."""
        raw = self.codec.compression == "none"
        encode = self.codec.encode
        for key, slot, buffer in zip(job.keys, job.slots, job.buffers, strict=True):
            if raw:
                self._append(pending, key, slot, 0, buffer, whole_pages(buffer))
            else:
                codec, stored = encode(buffer)
                view = memoryview(stored).cast("B")
                self._append(pending, key, slot, int(codec), view, whole_pages(view))

    def _append(
        self, pending: _Pending, key: OffloadKey, slot: int, codec: int, stored: Any, direct: bool
    ) -> None:
        """Place one new record (a block, or a forget) in the group: its sequence number,
        bound checksum and place in the open region's part."""
        length = stored.nbytes
        seq = self.next_seq
        self.next_seq += 1
        checksum = bound_checksum(self.namespace, key, slot, length, codec, seq, stored)
        part, at = self._place(pending, len(key), length)
        _add(part, key, slot, seq, checksum, at, length, codec, stored, NO_REGION, direct)
        self.appended_bytes += record_bytes(len(key), length)

    def _place(self, pending: _Pending, key_len: int, length: int) -> tuple[_Part, int]:
        """The part (of the open region, or of a new one) and payload offset for one record."""
        while True:
            part = self._current(pending)
            if part is not None:
                at = part.fits(key_len, length, self.region_bytes)
                if at is not None:
                    return part, at
            self._open_region(pending)  # (its reclaiming may fill the region it opened)

    def _current(self, pending: _Pending) -> _Part | None:
        """The part taking records: the open region's, started at its cursor when the group
        has none there yet; None without an open region."""
        if self.open is None:
            return None
        if pending.closed < len(pending.parts):
            return pending.parts[-1]
        region = self.open
        epoch = int(self.index.epoch[region])
        part = _Part(region, int(self.cursor[region]), epoch, opens=False)
        pending.parts.append(part)
        return part

    def _close(self, pending: _Pending) -> None:
        """Start writing the part taking records (if any) and take no more into it."""
        if pending.closed == len(pending.parts):
            return
        part = pending.parts[-1]
        pending.closed += 1
        if not part.keys and not part.opens:
            return
        span = round_page(part.end)
        fields = {
            "slot": part.slot,
            "seq": part.seq,
            "checksum": part.checksum,
            "offset": part.offset,
            "length": part.length,
            "codec": part.codec,
        }
        head = pack_group(self.namespace, part.epoch, part.keys, fields, span) if part.keys else b""
        part.head_pages = len(head) // PAGE
        first = b""
        if part.opens:
            first = pack_region_header(self.namespace, part.epoch, part.region, self.region_bytes)
        start = 0 if part.opens else part.start
        front = _aligned_buffer(len(first) + len(head))
        front[: len(first)] = np.frombuffer(first, dtype=np.uint8)
        front[len(first) : len(first) + len(head)] = np.frombuffer(head, dtype=np.uint8)
        pending.keep.append(front)
        direct = part.direct and self.files.direct_fd is not None and span == part.end
        if direct or self.files.direct_fd is None:
            buffers = [front.data]
            pos = 0
            for payload, at, length in zip(part.payloads, part.offset, part.length, strict=True):
                if length:
                    if at > pos:
                        buffers.append(_ZEROS[: at - pos])
                    buffers.append(memoryview(payload).cast("B"))
                    pos = at + length
            if span > pos:
                buffers.append(memoryview(bytes(span - pos)))
        else:  # O_DIRECT from memory it cannot use: one copy into an aligned image
            image = self._buffer(pending, front.nbytes + span)
            image[: front.nbytes] = front
            base = front.nbytes
            for payload, at, length in zip(part.payloads, part.offset, part.length, strict=True):
                if length:
                    image[base + at : base + at + length] = np.frombuffer(payload, np.uint8)
            image[base + part.end : base + span] = 0
            buffers = [image.data[: front.nbytes + span]]
            direct = True
        self.cursor[part.region] = part.stop
        pending.writes.extend(self.files.write_parts(part.region, start, buffers, direct))

    def _buffer(self, pending: _Pending, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """Aligned memory of at least `nbytes` (at most a region) for this group's writes,
        given back to the spares once they are done."""
        buffer = self._spare.pop() if self._spare else _aligned_buffer(self.region_bytes)
        pending.keep.append(buffer)
        pending.spares.append(buffer)
        return buffer[:nbytes]

    def _release(self, pending: _Pending) -> None:
        """The group's buffers back to the spares (every write of it done), at most four."""
        self._spare.extend(pending.spares[: max(0, 4 - len(self._spare))])
        pending.spares.clear()

    def _clean(self, pending: _Pending) -> list[int]:
        """Regions that hold nothing live and are in no unsynced write or reclaim."""
        busy = {part.region for part in pending.parts} | set(pending.victims)
        if self.open is not None:
            busy.add(self.open)
        with self.index.lock:
            empty = np.flatnonzero(self.index.live == 0).tolist()
        return [region for region in empty if region not in busy]

    def _open_region(self, pending: _Pending) -> None:
        self._close(pending)
        clean = self._clean(pending)
        if len(clean) <= RESERVE_REGIONS and not self._reclaiming and pending.parts:
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
        pending.parts.append(_Part(region, REGION_HEADER_BYTES, epoch, opens=True))
        self.cursor[region] = REGION_HEADER_BYTES
        if len(clean) - 1 <= RESERVE_REGIONS and not self._reclaiming:
            self._reclaim(pending)

    def _reclaim(self, pending: _Pending) -> None:
        """Move the live records of the region with the fewest live bytes into the group
        (each one's bound checksum verified first: a damaged one is not moved)."""
        busy = {part.region for part in pending.parts} | set(pending.victims)
        with self.index.lock:
            live = self.index.live.copy()
        candidates = [r for r in np.argsort(live, kind="stable").tolist() if live[r] > 0]
        candidates = [r for r in candidates if r not in busy]
        if not candidates:
            return
        victim = candidates[0]
        index = self.index
        slots = [s for s in index.live_slots(victim) if s not in self._overwritten]
        rows = []
        with index.lock:
            for slot in slots:
                if index.region[slot] == victim:
                    rows.append(
                        (
                            slot,
                            index._key(slot),
                            int(index.offset[slot]),
                            int(index.length[slot]),
                            int(index.codec[slot]),
                            int(index.seq[slot]),
                            int(index.checksum[slot]),
                        )
                    )
        if not rows:  # every live record of it is written over by this group
            pending.victims.append(victim)
            return
        first = min(row[2] for row in rows) // PAGE * PAGE  # only the span holding them
        last = round_page(max(row[2] + row[3] for row in rows))
        data = self._buffer(pending, last - first)
        self._reclaiming = True
        try:
            got = first + self.files.read_run(victim, first, [data.data], True)
            view = data.data
            for slot, key, offset, length, codec, seq, checksum in rows:
                if offset + length > got:
                    continue  # cut off: not moved (its reads would fail anyway)
                payload = view[offset - first : offset - first + length]
                if codec != TOMBSTONE and checksum != bound_checksum(
                    self.namespace, key, slot, length, codec, seq, payload
                ):
                    continue  # damaged: not moved
                part, at = self._place(pending, len(key), length)
                direct = length % PAGE == 0 and offset % PAGE == 0
                _add(part, key, slot, seq, checksum, at, length, codec, payload, victim, direct)
                self.moved_bytes += record_bytes(len(key), length)
        except OSError:
            pass  # an unreadable region is not moved; its blocks read as misses
        finally:
            self._reclaiming = False
        pending.victims.append(victim)

    def _wait(self, pending: _Pending) -> None:
        """Wait for every write of the group started so far; raise the first one's OSError
        (after all of them are done: no write is left in flight over a skipped group)."""
        first: BaseException | None = None
        for future in pending.writes:
            try:
                future.result()
            except BaseException as error:
                first = first or error
        pending.writes.clear()
        if first is not None:
            raise first

    def _flush(self, pending: _Pending) -> None:
        """Write every part of the group, wait for the writes, sync once, then index what it
        placed and release the reclaimed regions; raises the OSError of a failed write or
        sync (nothing of the group is then indexed)."""
        self._close(pending)
        self._wait(pending)
        written = [part for part in pending.parts if part.keys or part.opens]
        if self.fsync and written:
            self.files.sync()
            self.syncs += 1
        lost = self.files.check_ground()
        if lost is not None:  # the files are no longer the store's: fail closed
            self.lost = lost
            raise OSError(errno.ESTALE, f"the disk tier at {self.files.root} is disabled: {lost}")
        placed = _placed(written)
        pending.flushed += int(np.count_nonzero(placed.moved_from == NO_REGION))
        if placed.keys:
            self.index.apply(placed)
        with self.index.lock:
            for part in written:
                self.index.fill[part.region] = max(int(self.index.fill[part.region]), part.stop)
            for victim in pending.victims:
                if self.index.live[victim] != 0:  # records that could not be moved
                    for slot in np.flatnonzero(self.index.region == victim).tolist():
                        self.index._clear(slot)
        self._release(pending)
        pending.clear()
        self.on_flush(self.opened)

    def _skip(self, pending: _Pending) -> None:
        """After a failed write: the group's space is skipped (never rewritten: a later scan
        must not find half of it under a later group) and nothing it placed is indexed."""
        with contextlib.suppress(OSError):
            self._wait(pending)
        for part in pending.parts:
            self.cursor[part.region] = max(int(self.cursor[part.region]), part.stop)
        self.open = None  # a region whose header may not be written takes no more records
        self._release(pending)
        pending.clear()


def _add(
    part: _Part,
    key: OffloadKey,
    slot: int,
    seq: int,
    checksum: int,
    at: int,
    length: int,
    codec: int,
    payload: Any,
    moved_from: int,
    direct: bool,
) -> None:
    """Add one record to `part` at payload offset `at`."""
    part.keys.append(key)
    part.slot.append(slot)
    part.seq.append(seq)
    part.checksum.append(checksum)
    part.offset.append(at)
    part.length.append(length)
    part.codec.append(codec)
    part.payloads.append(payload)
    part.moved_from.append(moved_from)
    part.key_bytes += len(key)
    part.end = at + length
    part.direct = part.direct and (direct or not length)


def _placed(parts: list[_Part]) -> Placed:
    """The records of written parts as the index takes them (offsets from the region's
    start), in the order placed."""
    keys = [key for part in parts for key in part.keys]

    def column(name: str, dtype: Any) -> np.ndarray[Any, Any]:
        return np.fromiter(
            (value for part in parts for value in getattr(part, name)), dtype, len(keys)
        )

    base = np.fromiter(
        (part.start + part.head_pages * PAGE for part in parts for _ in part.keys),
        np.int64,
        len(keys),
    )
    region = np.fromiter((part.region for part in parts for _ in part.keys), np.int64, len(keys))
    return Placed(
        keys,
        column("slot", np.int64),
        region,
        base + column("offset", np.int64),
        column("length", np.int64),
        column("codec", np.int64),
        column("seq", np.uint64),
        column("checksum", np.uint64),
        column("moved_from", np.int64),
    )
