"""The write lane of a log store: every `write` and `forget` queued while it was busy is one
group, appended to the open region and made durable with one fdatasync (group commit); only
then are its records put in the index and its calls resolved.

A group's records in one region are a part (log_format.py): header pages with every record's
entry and key, then the payloads, written straight from the caller's memory (O_DIRECT where
they are page-aligned whole pages; else copied once into an aligned image). A call's blocks
are placed as runs (log_group.py's `fit_run`: array operations, no Python per block but a
few list elements); a part's payload writes start as soon as the group moves on to the next
region, and a head thread computes its bound checksums (xxh3 releases the GIL) and writes
its header pages while the lane places the next part. The index's update is array
operations over the group (docs/BENCHMARKS.md, "The write lane's per-block work").

Space is reclaimed a region at a time (log_reclaim.py), the bytes moved counted in
`moved_bytes`.
"""

from __future__ import annotations

import contextlib
import errno
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec
from kvtier.tiers.disk.jobs import (
    ForgetJob,
    Job,
    JobQueue,
    WriteJob,
    settle_by_loop,
    take_group,
)
from kvtier.tiers.disk.log_calls import call_columns
from kvtier.tiers.disk.log_files import WRITE_PIECE_BYTES, LogFiles
from kvtier.tiers.disk.log_format import (
    PAGE,
    REGION_HEADER_BYTES,
    TOMBSTONE,
    head_bytes,
    record_bytes,
    round_page,
)
from kvtier.tiers.disk.log_group import (
    ZEROS,
    Flight,
    Part,
    Pending,
    Spares,
    add,
    add_run,
    copy_payloads,
    encoded,
    fit_run,
    let_writers_in,
    payload_views,
    placed,
    with_checksums,
    write_front,
)
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex, Plan
from kvtier.tiers.disk.log_reclaim import live_rows, pick_victim, span, verified
from kvtier.tiers.disk.stats import StoreCounters

GROUP_BYTES = 32 << 20
"""Most bytes of blocks merged into one group (a larger single call is a group of its own)."""

MAX_IN_FLIGHT = 4
"""Groups placed and written but not yet synced and indexed, at most (the lane thread waits)."""

HEAD_THREADS = 2
"""Threads computing parts' checksums and writing their header pages (`write_front`)."""

FIRST_PIECE_BYTES = 1 << 20
"""The least a piece of a group's first part holds (`write_parts`; later parts' pieces hold
WRITE_PIECE_BYTES): a lone call of a few MiB, the replay's demotions, starts every write
thread at once rather than one, 4-5 % less wall a call (docs/BENCHMARKS.md, "Item 7 on the
lent H200 machine, both sides paired")."""

RESERVE_REGIONS = 1
"""Clean regions kept for reclaiming: moving a region's live records needs somewhere to go."""


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
        self.syncs = 0
        self._reclaiming = False
        self._overwritten: set[int] = set()
        """The slots the running group writes: a reclaim moves none of their old records."""
        self._group_regions: set[int] = set()
        """The regions the running group wrote to: never its victims (after a mid-group flush
        they hold its new records, indexed, which a reclaim would drop as old copies)."""
        self._spares = Spares(self.region_bytes)
        self._cond = threading.Condition()
        """Guards the groups in flight and `_poisoned`."""
        self._inflight: list[Flight] = []
        """Groups handed to the sync thread and not finished, in the order placed."""
        self._syncing = False
        self._early: tuple[Pending, Future[None]] | None = None  # (`_flush_early`)
        self._may_flush_early = False
        self._early_error: OSError | None = None  # (for the group's end: `_reclaim` eats it)
        self._poisoned: OSError | None = None
        """Set by the sync thread when a group's write failed; cleared by the lane thread
        once no group is in flight (the open region then takes no more records)."""
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="kvtier-log-sync")
        self._heads = ThreadPoolExecutor(HEAD_THREADS, thread_name_prefix="kvtier-log-head")
        self._jobs = JobQueue(files.root, "kvtier-log-write", self._take_group, self._run_group)

    # -- the queue -------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue `job`; StorageClosedError once the lane is closing."""
        self._jobs.submit(job)

    def close(self) -> None:
        """Refuse new calls and run every group queued before (blocking)."""
        self._jobs.close()
        self._drain()
        self._syncer.shutdown(wait=True)
        self._heads.shutdown(wait=True)

    def _take_group(self, queue: deque[Job]) -> list[Job]:
        """The next group (`take_group`): up to GROUP_BYTES, never two jobs on one key (a
        forget looks its key's slot up before the group is indexed)."""
        return take_group(queue, GROUP_BYTES, distinct_slots=False)

    def _run_group(self, jobs: list[Job]) -> None:
        """On the lane thread: place the group and start its writes, then hand it to the sync
        thread and go on with the next group (a forget first waits for every group in
        flight: it looks its key up in the index)."""
        try:
            if any(isinstance(job, ForgetJob) for job in jobs):
                self._drain()
            flight = self._prepare(jobs)
        except Exception as error:  # a bug: every call of the group fails with it
            settle_by_loop([(job.future, None, error) for job in jobs if job.future is not None])
            return
        if flight.taken:  # failed or disabled before any write: settled now
            self._settle([flight])
            return
        with self._cond:
            while len(self._inflight) >= MAX_IN_FLIGHT:
                self._cond.wait()
            self._inflight.append(flight)
            if not self._syncing:
                self._syncing = True
                self._syncer.submit(self._sync_loop)

    def _sync_loop(self) -> None:
        """On the sync thread: every group handed over since the last pass written, synced
        once (group commit) and indexed, then settled; until none is left."""
        while True:
            with self._cond:
                flights = [flight for flight in self._inflight if not flight.taken]
                if not flights:
                    self._syncing = False
                    self._cond.notify_all()
                    return
                for flight in flights:
                    flight.taken = True
            try:
                self._finish(flights)
            except Exception as error:  # a bug: every call of these groups fails with it
                for flight in flights:
                    flight.fail(OSError(errno.EIO, f"the disk tier failed: {error}"))
            with self._cond:
                for flight in flights:
                    self._inflight.remove(flight)
                self._cond.notify_all()
            self._settle(flights)

    def _settle(self, flights: list[Flight]) -> None:
        settle_by_loop([settlement for flight in flights for settlement in flight.settled()])

    def _drain(self) -> bool:
        """Wait until no group is in flight; whether one of them failed. After a failed write
        the open region takes no more records (a later group there would follow a part a
        restart's scan stops at)."""
        with self._cond:
            while self._inflight:
                self._cond.wait()
            failed, self._poisoned = self._poisoned, None
        if failed is not None:
            self.open = None
        return failed is not None

    # -- one group -------------------------------------------------------------------------

    def commit(self, jobs: list[Job]) -> list[Any]:
        """Run one group now, on the calling thread (once every group in flight is done);
        per job its result (a write: one OSError or None per block)."""
        self._drain()
        flight = self._prepare(jobs)
        if not flight.taken:
            self._finish([flight])
        return flight.outputs()

    def _prepare(self, jobs: list[Job]) -> Flight:
        """Place a group's records and start their writes (a group that fails here, or a
        disabled store's, comes back `taken`: its results final)."""
        results: list[list[OSError | None]] = [
            [None] * len(job.keys) if isinstance(job, WriteJob) else [] for job in jobs
        ]
        flight = Flight(jobs, results, Pending())
        if self._poisoned is not None:
            self._drain()
        if self.files.lost is not None:
            flight.fail(self._disabled(self.files.lost))
            flight.taken = True
            flight.count(self.counters)  # (its blocks count as failed writes)
            return flight
        pending = flight.pending
        self._overwritten = {
            slot for job in jobs if isinstance(job, WriteJob) for slot in job.slots
        }
        self._group_regions = set()
        before, syncs = self.appended_bytes, self.syncs
        written: set[int] = set()
        self._may_flush_early = all(isinstance(job, WriteJob) for job in jobs)
        failed: OSError | None = None
        try:
            for number, job in enumerate(jobs):
                if isinstance(job, WriteJob):
                    flight.where.append((number, len(job.keys)))
                    flight.raw_bytes += self._append_write(pending, job)
                    written.update(job.slots)
                else:
                    for key in job.keys:
                        held = self.index.find(key)
                        if held is not None and held not in written:  # else written over
                            flight.where.append((-1, 1))
                            self._append(pending, key, held, TOMBSTONE, ZEROS[:0], True)
            self._close(pending)
        except OSError as error:
            failed = error
        finally:  # (also on a bug's exception: no early flush outlives its group)
            self._join(pending)
            failed, self._early_error = failed or self._early_error, None
        if failed is not None:
            flight.fail(failed)
            self._skip(pending)
            flight.taken = True
        flight.appended = self.appended_bytes - before
        flight.syncs = self.syncs - syncs  # (mid-group flushes)
        if flight.taken:
            flight.count(self.counters)
        return flight

    def _finish(self, flights: list[Flight]) -> None:
        """Wait for the writes of `flights` (in the order placed), sync once, index them;
        from the first whose write failed on, every one fails (a later one was placed
        after a part a restart's scan stops at) and the lane is told (`_poisoned`)."""
        error: OSError | None = None
        good: list[Flight] = []
        plan = self._plan(flights[0].pending)  # (every group before it is indexed)
        for flight in flights:
            try:
                flight.pending.wait()
            except OSError as failed:
                error = error or failed
            if error is None and self._poisoned is None:
                good.append(flight)
        try:
            if good and self.fsync and self._unsynced(good):
                self.files.sync()
                self.syncs += 1
                good[0].syncs += 1
            self._hold_ground()
        except OSError as failed:
            error, good = error or failed, []
        for flight in good:
            self._apply(flight.pending, plan if flight is flights[0] else None)
        for flight in flights:
            if flight not in good:
                flight.fail(error or OSError(errno.EIO, "an earlier group's write failed"))
                self._spares.give_back(flight.pending)
                flight.pending.clear()
            flight.count(self.counters)
        if error is not None:
            with self._cond:
                self._poisoned = error
        if good:
            self.on_flush(self.opened)

    def _unsynced(self, flights: list[Flight]) -> bool:
        """Whether a write of `flights` returned after the last fdatasync began (else that
        sync made them durable: a group whose last parts were written before an early
        flush's sync began needs none of its own, docs/BENCHMARKS.md, "Item 7: the write
        call's timeline")."""
        return any(flight.pending.written > self.files.synced_through for flight in flights)

    def _disabled(self, why: str) -> OSError:
        return OSError(errno.ESTALE, f"the disk tier at {self.files.root} is disabled: {why}")

    def _hold_ground(self) -> None:
        """Fail closed (raise the disabled store's OSError) when the store's files are no
        longer its own; `LogFiles` remembers why, for every later group."""
        lost = self.files.check_ground()
        if lost is not None:
            raise self._disabled(lost)

    def _append_write(self, pending: Pending, job: WriteJob) -> int:
        """Place the blocks of one write call (encoded; raw blocks are not touched), as runs:
        as many as fit the open region's part at once (`fit_run`), then the next region; the
        call's raw bytes."""
        keys, slots = job.keys, job.slots
        stored, codecs, raw = encoded(self.codec, job.buffers)
        count = len(keys)
        columns = call_columns(keys, stored)  # (a run's bytes and directness: two look-ups)
        lengths, key_lens = columns.lengths, columns.key_lens
        done = 0
        while done < count:
            part = self._current(pending)
            fit = None
            if part is not None:
                fit = fit_run(part, key_lens[done:], lengths[done:], self.region_bytes)
                if fit is None:  # whole pages and not, mixed: this record alone
                    direct = columns.direct(done, done + 1)
                    self._append(
                        pending, keys[done], slots[done], codecs[done], stored[done], direct
                    )
                    done += 1
                    continue
            if part is None or fit is None or not fit[0]:
                self._open_region(pending)  # (its reclaiming may fill the region it opened)
                continue
            taken, at = fit
            stop = done + taken
            runs = (keys[done:stop], slots[done:stop], self.next_seq, at, lengths[done:stop])
            add_run(part, *runs, codecs[done:stop], stored[done:stop], columns.direct(done, stop))
            self.next_seq += taken
            self.appended_bytes += columns.run_bytes(done, stop)
            done = stop
        return int(lengths.sum()) if raw is None else raw

    def _append(
        self, pending: Pending, key: OffloadKey, slot: int, codec: int, stored: Any, direct: bool
    ) -> None:
        """Place one new record (a block, or a forget) in the group: its sequence number and
        place in the open region's part (its bound checksum comes when the part is written)."""
        length = stored.nbytes
        seq = self.next_seq
        self.next_seq += 1
        part, at = self._place(pending, len(key), length)
        add(part, key, slot, seq, None, at, length, codec, stored, NO_REGION, direct)
        self.appended_bytes += record_bytes(len(key), length)

    def _place(self, pending: Pending, key_len: int, length: int) -> tuple[Part, int]:
        """The part (of the open region, or of a new one) and payload offset for one record."""
        while True:
            part = self._current(pending)
            if part is not None:
                at = part.fits(key_len, length, self.region_bytes)
                if at is not None:
                    return part, at
            self._open_region(pending)  # (its reclaiming may fill the region it opened)

    def _current(self, pending: Pending) -> Part | None:
        """The part taking records: the open region's, started at its cursor when the group
        has none there yet; None without an open region."""
        if self.open is None:
            return None
        if pending.closed < len(pending.parts):
            return pending.parts[-1]
        region = self.open
        epoch = int(self.index.epoch[region])
        part = Part(region, int(self.cursor[region]), epoch, opens=False)
        self._group_regions.add(region)
        pending.parts.append(part)
        return part

    def _close(self, pending: Pending) -> None:
        """Start writing the part taking records (if any) and take no more into it: its
        payloads first (their place is known once its records are), then, on a head thread
        while they are in flight, the new records' bound checksums and its header pages
        (`write_front`; the lane goes on placing the next part meanwhile)."""
        if pending.closed == len(pending.parts):
            return
        part = pending.parts[-1]
        pending.closed += 1
        if not part.keys and not part.opens:
            return
        span = round_page(part.end)
        part.head_pages = -(-head_bytes(len(part.keys), part.key_bytes) // PAGE) if part.keys else 0
        self.cursor[part.region] = part.stop
        payloads_at = part.start + part.head_pages * PAGE
        files = self.files
        direct = part.direct and files.direct_fd is not None and span == part.end
        if direct or files.direct_fd is None:
            buffers, sizes = payload_views(part, span)
        else:  # O_DIRECT from memory it cannot use: one copy into an aligned image
            buffers, direct = [copy_payloads(part, self._spares.take(pending, span))], True
            sizes = [span]
        if span:
            least = FIRST_PIECE_BYTES if pending.closed == 1 else WRITE_PIECE_BYTES
            writes = files.write_parts(part.region, payloads_at, buffers, direct, sizes, least)
            pending.writes.extend(writes)
        pending.writes.append(self._heads.submit(write_front, files, self.namespace, part, span))
        let_writers_in(pending.closed)  # (the device starts a group's writes sooner)

    def _busy(self, pending: Pending) -> set[int]:
        """The regions in an unsynced write or reclaim: this group's and those in flight."""
        busy = {part.region for part in pending.parts} | set(pending.victims)
        if self._early is not None:  # (its lists are emptied once it is indexed: not busy)
            busy.update([part.region for part in self._early[0].parts], self._early[0].victims)
        with self._cond:
            for flight in self._inflight:
                busy.update(part.region for part in flight.pending.parts)
                busy.update(flight.pending.victims)
        return busy

    def _clean(self, pending: Pending) -> list[int]:
        """Regions that hold nothing live and are in no unsynced write or reclaim."""
        busy = self._busy(pending)
        if self.open is not None:
            busy.add(self.open)
        with self.index.lock:
            empty = np.flatnonzero(self.index.live == 0).tolist()
        return [region for region in empty if region not in busy]

    def _open_region(self, pending: Pending) -> None:
        self._close(pending)
        clean = self._clean(pending)
        if len(clean) <= RESERVE_REGIONS and self._early is not None:
            if (error := self._join(pending)) is not None:
                raise error
            clean = self._clean(pending)
        if (  # what was placed becomes durable (reclaimed regions clean): now, or meanwhile
            len(clean) <= RESERVE_REGIONS
            and not self._reclaiming
            and (pending.parts or self._inflight)
            and not (clean and self._flush_early(pending))
        ):
            self._flush(pending)
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
        self._group_regions.add(region)
        self.opened += 1
        pending.parts.append(Part(region, REGION_HEADER_BYTES, epoch, opens=True))
        self.cursor[region] = REGION_HEADER_BYTES
        if len(clean) - 1 <= RESERVE_REGIONS and not self._reclaiming:
            self._reclaim(pending)

    def _reclaim(self, pending: Pending) -> None:
        """Move the live records of the region with the fewest live bytes into the group
        (log_reclaim.py; each one's bound checksum verified first: a damaged one is not
        moved)."""
        victim = pick_victim(self.index, self._busy(pending) | self._group_regions)
        if victim is None:
            return
        rows = live_rows(self.index, victim, self._overwritten)
        if rows:  # (else every live record of it is written over by this group)
            first, last = span(rows)
            view = self._spares.take(pending, last - first).data
            self._reclaiming = True
            try:
                for row, payload in verified(self.files, self.namespace, victim, rows, first, view):
                    slot, key, offset, length, codec, seq, checksum = row
                    part, at = self._place(pending, len(key), length)
                    direct = length % PAGE == 0 and offset % PAGE == 0
                    add(part, key, slot, seq, checksum, at, length, codec, payload, victim, direct)
                    self.moved_bytes += record_bytes(len(key), length)
            except OSError:
                pass  # an unreadable region is not moved; its blocks read as misses
            finally:
                self._reclaiming = False
        pending.victims.append(victim)

    def _flush(self, pending: Pending) -> None:
        """Mid-group, on the lane thread (once no group is in flight): write every part
        placed so far, wait, sync once, index them and release the reclaimed regions;
        raises the OSError of a failed write or sync (nothing of the group is indexed)."""
        if self._drain() and pending.parts:  # an earlier group's write failed: these follow it
            raise OSError(errno.EIO, "an earlier group's write failed")
        self._close(pending)
        self._flushed(pending)

    def _flushed(self, pending: Pending) -> None:
        """`_flush` of the closed parts of `pending` (on the sync thread: an early flush)."""
        plan = self._plan(pending)
        pending.wait()
        if self.fsync and pending.parts:
            self.files.sync()
            self.syncs += 1
        self._hold_ground()
        self._apply(pending, plan)
        self.on_flush(self.opened)

    def _flush_early(self, pending: Pending) -> bool:
        """Start `_flush` of the parts placed so far on the sync thread while the lane opens
        the last clean region and places and writes its part (docs/BENCHMARKS.md, "Log
        writes on a fast device, second round"); joined (`_join`) when the next region is
        needed and at the group's end. Only with no group in flight or failed, in a group
        of writes only (a forget looks the index up while placing); whether it started."""
        if self._early is not None or not pending.parts or not self._may_flush_early:
            return False
        with self._cond:
            if self._inflight or self._poisoned is not None:
                return False
        done = pending.split()
        self._early = (done, self._syncer.submit(self._flushed, done))
        return True

    def _join(self, pending: Pending) -> OSError | None:
        """Wait for the early flush, if any: its new records durable in `pending`; or its
        OSError (kept for the group's end), its space skipped, nothing of it indexed."""
        if self._early is None:
            return None
        (done, future), self._early = self._early, None
        try:
            future.result()
        except OSError as error:
            self._skip(done)
            self._early_error = self._early_error or error
            return error
        pending.flushed += done.flushed
        return None

    def _plan(self, pending: Pending) -> Plan:
        """The index's look-ups for a group's records, made while its writes and sync run:
        `_apply` commits them once those succeeded; a failed group drops them."""
        parts = [part for part in pending.parts if part.keys or part.opens]
        return self.index.plan(placed(parts, checksums=False))

    def _apply(self, pending: Pending, plan: Plan | None = None) -> None:
        """Index the durable records of `pending` (with its `plan`, when made), release its
        reclaimed regions and its buffers, and forget it."""
        written = [part for part in pending.parts if part.keys or part.opens]
        records = placed(written) if plan is None else with_checksums(plan.placed, written)
        pending.flushed += int(np.count_nonzero(records.moved_from == NO_REGION))
        if records.keys:
            self.index.commit(plan) if plan is not None else self.index.apply(records)
        with self.index.lock:
            for part in written:
                self.index.fill[part.region] = max(int(self.index.fill[part.region]), part.stop)
            for victim in pending.victims:
                if self.index.live[victim] != 0:  # records that could not be moved
                    for slot in np.flatnonzero(self.index.region == victim).tolist():
                        self.index._clear(slot)
        self._spares.give_back(pending)
        pending.clear()

    def _skip(self, pending: Pending) -> None:
        """After a failed write: the group's space is skipped (never rewritten: a later scan
        must not find half of it under a later group) and nothing it placed is indexed."""
        with contextlib.suppress(OSError):
            pending.wait()
        for part in pending.parts:
            self.cursor[part.region] = max(int(self.cursor[part.region]), part.stop)
        self.open = None  # a region whose header may not be written takes no more records
        self._spares.give_back(pending)
        pending.clear()
