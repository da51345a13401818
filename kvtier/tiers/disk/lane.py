"""The write lane of a disk store: every `write` and `forget`, merged into group commits.

One thread runs the lane. It merges every call queued while it was busy into one group (in
call order, up to WRITE_GROUP_BYTES; a call that touches a slot or key the group already
touches waits for the next group). A group:

1. drops from memory the records of the slots it is about to overwrite and of the keys it
   forgets, so nothing in this process is served from a slot being rewritten (a read that
   overlaps the rewrite re-checks its record, see reader.py);
2. notes its slots in the in-flight log (inflight.py), then writes the bytes: one `pwritev`
   per run of consecutive slots across the whole group (a large group's runs are spread over
   helper threads, so the disk sees several at once);
3. writes their slot headers and makes everything durable: one `fdatasync` per slab file the
   group touched, and the header file;
4. checks that the files it wrote are still the store's files (guard.py), disabling the
   store (and committing nothing) if not;
5. commits ONE index transaction that deletes the stale records (overwritten slots,
   forgotten keys) and puts the records of the blocks that made it;
6. resolves every call with its own per-block results.

Steps 2 and 3-4 are each one batch of system calls (ops.py): with the compiled core, one call
that makes them all without the GIL, so that the lane thread takes the GIL back twice, not
some fifteen times, each of which costs up to the switch interval (5 ms) while the serving
process's own thread runs Python.

A new block counts as stored only once its group's fdatasync and commit are done, so a
process killed at any point loses no block reported stored, and an indexed block is never one
whose bytes were not completely on disk. A failed run (ENOSPC, EIO) fails only its blocks; a
failed fdatasync fails that file's blocks; a failed commit fails every block of the group (none
is indexed; the stale records are then dropped in a second transaction where the index allows
it). Without `fsync`, the same steps run with no fdatasync and non-durable commits.

The lane's helpers only ever run parts of the lane's current group (never anything that waits
on the lane), so the lane always makes progress; reads never wait behind it.
"""

from __future__ import annotations

import errno
import functools
import logging
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass

import lmdb
import numpy as np

from kvtier.errors import DiskTierError
from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec, Codec, Stored
from kvtier.tiers.disk.catalog import Catalog, Records
from kvtier.tiers.disk.files import StoreFiles
from kvtier.tiers.disk.guard import Guard
from kvtier.tiers.disk.index import BlockIndex
from kvtier.tiers.disk.jobs import (
    ForgetJob,
    Job,
    JobQueue,
    Results,
    Settlement,
    WriteJob,
    settle_by_loop,
    take_group,
)
from kvtier.tiers.disk.layout import (
    EMPTY_ENTRY,
    ENTRY_BYTES,
    Entries,
    IndexRecord,
    Run,
    StoreLayout,
)
from kvtier.tiers.disk.ops import Op, SyncOp, WriteOp, run_batch
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.storage import HostBuffer
from kvtier.tiers.trusted import FileId

READS_FIRST_WAIT_S = 0.01
"""Longest a write group waits, before it starts, for the reads in flight to finish: on one
device a write in flight slows a read down, so reads go first; writes are never starved."""

WRITE_GROUP_BYTES = 32 << 20
"""Most block bytes one write group takes from the queue (a single larger call is a group of
its own): bounds the latency of one group, so that a call queued behind it waits little."""

WRITE_SPLIT_BYTES = 4 << 20
"""A write group of at least twice this many bytes spreads its runs over helper threads."""

PLAN_ASIDE_BYTES = 1 << 20
"""A write group of at least this many bytes plans its bookkeeping (checksums, header
entries, index records: `_Plan`) in a helper thread while its data is written (that holds
the GIL, the data batch does not); a smaller one after its writes."""

_log = logging.getLogger("kvtier.disk")


def split_runs(runs: list[Run], lengths: list[int], ways: int) -> list[list[Run]]:
    """`runs` (in slot order) cut into at most `ways` consecutive parts of about equal bytes."""
    if ways <= 1 or len(runs) <= 1:
        return [runs]
    sizes = [sum(lengths[member] for member in run.members) for run in runs]
    share = sum(sizes) / min(ways, len(runs))
    parts: list[list[Run]] = [[]]
    done = 0
    for run, size in zip(runs, sizes, strict=True):
        if parts[-1] and done >= share * len(parts):
            parts.append([])
        parts[-1].append(run)
        done += size
    return parts


@dataclass(slots=True)
class _Plan:
    """A group's bookkeeping as if every block is written (the common case), made while its
    data is: the header entries (with the bound checksums), the entries to write (slot ->
    (owner, entry), the `cleared` slots' empty entries included) and their writes, and the
    index records to commit, also packed."""

    entries: Entries
    chosen: dict[int, tuple[int | None, bytes | memoryview]]
    entry_writes: list[tuple[list[int], WriteOp]]
    new: Records
    packed: list[tuple[OffloadKey, bytes]]


@dataclass(slots=True)
class _Written:
    """What writing a group's data left: per block its error (None: written), the group's
    plan (which holds the codecs and stored lengths), and the blocks per slab file."""

    results: Results
    plan: _Plan
    files: dict[int, list[int]]

    @property
    def entries(self) -> Entries:
        return self.plan.entries

    @property
    def whole(self) -> bool:
        """Whether every block is written so far (the plan holds as made); `results` are
        updated as later steps fail blocks."""
        return all(result is None for result in self.results)


class WriteLane:
    """The write lane of one store: a queue, one lane thread and `max_workers` helpers."""

    def __init__(
        self,
        layout: StoreLayout,
        files: StoreFiles,
        catalog: Catalog,
        codec: BlockCodec,
        counters: StoreCounters,
        guard: Guard,
        *,
        max_workers: int,
        fsync: bool,
    ) -> None:
        self.layout = layout
        self.files = files
        self.catalog = catalog
        self.codec = codec
        self.counters = counters
        self.guard = guard
        self.max_workers = max_workers
        self.fsync = fsync
        self._where = files.root
        self._jobs = JobQueue(
            files.root,
            "kvtier-disk-write",
            self._take_group,
            self._run_group,
            functools.partial(guard.wait_for_reads, READS_FIRST_WAIT_S),
        )
        self._helpers = ThreadPoolExecutor(max_workers, thread_name_prefix="kvtier-disk-write-io")

    @property
    def queued(self) -> int:
        """Calls waiting in the queue (not counting the group running)."""
        return self._jobs.queued

    def submit(self, job: Job) -> None:
        """Queue `job`, starting a drain task if none is queued or running;
        StorageClosedError once the lane is closing."""
        self._jobs.submit(job)

    def close(self) -> None:
        """Refuse new calls and run every group queued before (blocking)."""
        self._jobs.close()
        self._helpers.shutdown(wait=True)

    def lost_error(self, why: str) -> OSError:
        """The per-block error of a write not reported stored because the store's files were
        lost (`why`)."""
        return OSError(errno.ESTALE, f"the disk tier at {self._where} is disabled: {why}")

    def refuse(self, count: int, why: str) -> Results:
        """`count` failed results for a write after the store disabled itself (counted)."""
        self.counters.count_write_failures(count)
        return [self.lost_error(why)] * count

    def write_now(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> Results:
        """Write one validated batch as a group of its own, in the calling thread (for tools
        and tests; `write` goes through the queue)."""
        results, _ = self._commit_group([WriteJob(keys, slots, buffers, None)], [])
        return results

    # -- the lane thread ----------------------------------------------------------------------

    def _take_group(self, queue: deque[Job]) -> list[Job]:
        """The next group (`take_group`, by the `JobQueue`'s task, which first lets the reads
        in flight finish, for at most READS_FIRST_WAIT_S): up to WRITE_GROUP_BYTES, never two
        jobs on one slot or key."""
        return take_group(queue, WRITE_GROUP_BYTES, distinct_slots=True)

    def _run_group(self, jobs: list[Job]) -> None:
        """Run one group and settle the futures of its jobs, with one callback per event
        loop (not one wake-up per call). Never raises: an unexpected error (a bug) fails
        every job of the group with it."""
        writes = [job for job in jobs if isinstance(job, WriteJob)]
        forgets = [job for job in jobs if isinstance(job, ForgetJob)]
        settlements: list[Settlement] = []
        try:
            results, forget_error = self._commit_group(writes, forgets)
        except Exception as error:
            settlements = [(job.future, None, error) for job in jobs if job.future is not None]
        else:
            start = 0
            for write in writes:
                end = start + len(write.keys)
                if write.future is not None:
                    settlements.append((write.future, results[start:end], None))
                start = end
            settlements += [(forget.future, None, forget_error) for forget in forgets]
        settle_by_loop(settlements)

    # -- one group ----------------------------------------------------------------------------

    def _commit_group(
        self, writes: list[WriteJob], forgets: list[ForgetJob]
    ) -> tuple[Results, DiskTierError | None]:
        """The body of a group (module docstring, steps 1 to 5): the results of the blocks of
        `writes`, in order, and the error of the forgets (None when committed)."""
        keys = [key for write in writes for key in write.keys]
        slots = [slot for write in writes for slot in write.slots]
        buffers = [buffer for write in writes for buffer in write.buffers]
        forgotten = [key for forget in forgets for key in forget.keys]
        count = len(keys)
        catalog = self.catalog
        with catalog.writing:
            lost = self.guard.reason
            if lost is not None:  # queued before the store disabled itself
                return self.refuse(count, lost), None
            index = catalog.index
            before = catalog.drop_for_group(slots, forgotten)  # 1.
            seqs = catalog.take_seqs(count)
            written, fsyncs, problem = self._write_group(  # 2., 3., 4.
                keys, slots, seqs, buffers, before, catalog.index_file
            )
            if problem is None:
                new, commits, forget_error = self._commit(  # 5.
                    index, keys, slots, seqs, written, before
                )
                results = written.results
            else:  # a disabled store holds no block, forgotten or not: nothing to commit
                results = [self.lost_error(problem)] * count
                new, commits, forget_error = [], 0, None
            catalog.remember(new)
            self.counters.count_group(
                writes=len(writes),
                forgets=len(forgets),
                fsyncs=fsyncs,
                commits=commits,
                stored=len(new),
                failed=count - len(new),
                raw_bytes=len(new) * self.layout.block_size,
                stored_bytes=sum(record.length for _, record in new),
            )
            if problem is not None:
                self._lose(problem)
        return results, forget_error

    def _write_group(
        self,
        keys: list[OffloadKey],
        slots: list[int],
        seqs: range,
        buffers: list[HostBuffer],
        before: dict[OffloadKey, IndexRecord],
        index_file: FileId | None,
    ) -> tuple[_Written, int, str | None]:
        """Steps 2 to 4, in two batches of system calls (ops.py): the slots noted in the
        in-flight log and the bytes written; then the header entries written (and those of
        forgotten blocks whose slots this group does not rewrite cleared), the slab files and
        the header file synced and the ground checked. What was written, how many slab files
        were synced, and why the store's files are no longer its own (None: they are)."""
        files = self.files
        inflight = files.inflight
        # The log's own outcome is not looked at: see inflight.py (a lost log only weakens
        # the cleanup after a crash).
        log: list[Op] = [inflight.record_op(slots)] if slots and inflight is not None else []
        rewritten = set(slots)
        cleared = [record.slot for record in before.values() if record.slot not in rewritten]
        written = self._write_data(keys, slots, seqs, buffers, cleared, log)
        if written.whole:
            chosen, entry_writes = written.plan.chosen, written.plan.entry_writes
        else:
            chosen = self._chosen_entries(written.entries, slots, written.results, cleared)
            entry_writes = files.entry_ops(chosen)
        slab_syncs: list[tuple[list[int], SyncOp]] = []
        header_sync: SyncOp | None = None
        if self.fsync:
            slab_syncs = [
                (members, files.sync_slab_op(file)) for file, members in written.files.items()
            ]
            header_sync = files.sync_headers_op() if entry_writes else None
        ground = files.ground_check(written.files, index_file)
        ops: list[Op] = [op for _, op in entry_writes]
        ops += [op for _, op in slab_syncs]
        ops += [header_sync] if header_sync is not None else []
        run_batch(files.io, [*ops, *ground.ops])
        results = written.results
        for run, write in entry_writes:
            if write.error is not None:
                for slot in run:
                    owner = chosen[slot][0]
                    if owner is not None:
                        results[owner] = write.error
        for members, sync in slab_syncs:
            if sync.error is not None:
                for member in members:
                    results[member] = sync.error
        if header_sync is not None and header_sync.error is not None:
            error = header_sync.error
            results[:] = [error if result is None else result for result in results]
        return written, len(slab_syncs), ground.problem()

    def _commit(
        self,
        index: BlockIndex,
        keys: list[OffloadKey],
        slots: list[int],
        seqs: range,
        written: _Written,
        before: dict[OffloadKey, IndexRecord],
    ) -> tuple[Records, int, DiskTierError | None]:
        """Step 5: one transaction, the stale records out and the new ones in. The records
        committed, the commits made and the forgets' error (None when committed)."""
        results = written.results
        if written.whole:  # as planned (no run, header write or sync failed)
            new, packed = written.plan.new, written.plan.packed
        else:
            new, packed = [], []
            for member, result in enumerate(results):
                if result is None:
                    new.append(written.plan.new[member])
                    packed.append(written.plan.packed[member])
        stored_keys = {key for key, _ in new}
        dropped = list(before)
        deleted = [key for key in dropped if key not in stored_keys]
        if not (deleted or packed):
            return new, 0, None
        try:
            self.catalog.commit(index, deleted, new, packed)
        except lmdb.Error as error:
            failure = OSError(errno.EIO, f"disk tier index: {error}")
            results[:] = [failure if result is None else result for result in results]
            # Their headers go too (best effort): a block reported failed is not brought
            # back by a rebuild, nor reported lost by `check`.
            self.files.write_entries({record.slot: (None, EMPTY_ENTRY) for _, record in new})
            # The index still holds the records dropped from memory in step 1; try once more
            # to drop them there too, so that the two agree (if this fails as well, those
            # records point at rewritten bytes, and a read after a reopen finds their
            # checksums wrong: a miss).
            commits = int(bool(dropped) and self.catalog.delete_quietly(index, dropped))
            why = f"the disk tier at {self._where} could not commit its index: {error}"
            return [], commits, DiskTierError(why)
        return new, 1, None

    def _lose(self, why: str) -> None:
        """Disable the store for good: no read starts any more and those in flight finish,
        the blocks are forgotten in memory (they are in files nobody will read), one line is
        logged, and the files are closed, so the space of removed files is given back now,
        not when the process ends."""
        if not self.guard.disable(why):
            return
        self.catalog.clear()
        _log.error(
            "disk tier at %s disabled while open: %s; its writes fail and its reads are misses "
            "from now on (blocks it stored may be gone: open the path again to start from what "
            "is there)",
            self._where,
            why,
        )
        self.files.close(clean=False, catalog=self.catalog)

    # -- bytes --------------------------------------------------------------------------------

    def _write_data(
        self,
        keys: list[OffloadKey],
        slots: list[int],
        seqs: Sequence[int],
        buffers: list[HostBuffer],
        cleared: list[int],
        log: list[Op],
    ) -> _Written:
        """Encode and write the blocks of a group, after the ops `log` (the in-flight log's
        write). A group's runs are one batch; a large group's runs are cut into parts written
        in parallel (the lane thread writes one, helpers the others, once the log is written),
        and all but a small group make their plan (`_plan`) in a helper meanwhile."""
        count = len(slots)
        block_size = self.layout.block_size
        codecs, stored, lengths = self._encode(buffers)
        plan = functools.partial(self._plan, keys, slots, lengths, codecs, seqs, stored, cleared)
        if not count:
            return _Written([], plan(), {})
        total = sum(lengths)
        ways = (
            min(self.max_workers, total // WRITE_SPLIT_BYTES)
            if total >= 2 * WRITE_SPLIT_BYTES
            else 1
        )
        short = total < count * block_size
        runs = self.layout.runs(
            range(count), slots, ends_run=(lambda m: lengths[m] < block_size) if short else None
        )
        parts = split_runs(runs, lengths, ways)
        pending: list[Future[list[tuple[Run, OSError | None]]]] = []
        planning: Future[_Plan] | None = None
        try:
            if total >= PLAN_ASIDE_BYTES:
                planning = self._helpers.submit(plan)
            if len(parts) > 1:
                run_batch(self.files.io, log)
                log = []
            write_runs = self.files.write_runs
            pending = [self._helpers.submit(write_runs, p, stored, lengths) for p in parts[1:]]
            outcomes = write_runs(parts[0], stored, lengths, before=log)
            for part in pending:
                outcomes += part.result()
            made = plan() if planning is None else planning.result()
        finally:
            # Also on an unexpected error: the buffers are not touched once we return.
            wait_all(pending)
            if planning is not None:
                wait_all([planning])
        results: Results = [None] * count
        files: dict[int, list[int]] = {}
        for run, error in outcomes:
            if error is None:
                files.setdefault(run.file, []).extend(run.members)
            else:
                for member in run.members:
                    results[member] = error
        return _Written(results, made, files)

    def _plan(
        self,
        keys: list[OffloadKey],
        slots: list[int],
        lengths: list[int],
        codecs: list[int],
        seqs: Sequence[int],
        stored: list[Stored],
        cleared: list[int],
    ) -> _Plan:
        """The group's bookkeeping as if every block is written (`_Plan`)."""
        entries = self.layout.entries(keys, slots, lengths, codecs, seqs, stored)
        chosen = self._chosen_entries(entries, slots, [None] * len(slots), cleared)
        pack = IndexRecord.FORMAT.pack
        new: Records = []
        packed: list[tuple[OffloadKey, bytes]] = []
        checksums = entries["checksum"].tolist()
        for key, slot, length, codec, checksum, seq in zip(
            keys, slots, lengths, codecs, checksums, seqs, strict=True
        ):
            new.append((key, IndexRecord(slot, length, codec, checksum, seq)))
            packed.append((key, pack(slot, length, codec, checksum, seq)))
        return _Plan(entries, chosen, self.files.entry_ops(chosen), new, packed)

    def _encode(self, buffers: list[HostBuffer]) -> tuple[list[int], list[Stored], list[int]]:
        """(codec, bytes to store, their length) per block; zstd work is spread over the
        helpers for a large group (zstd releases the GIL)."""
        count = len(buffers)
        block_size = self.layout.block_size
        if self.codec.compression == "none":
            return (
                [int(Codec.NONE)] * count,
                [buffer.data for buffer in buffers],
                [block_size] * count,
            )
        ways = min(self.max_workers, count * block_size // WRITE_SPLIT_BYTES)
        if ways <= 1:
            encoded = self._encode_some(buffers)
        else:
            size = -(-count // ways)
            chunks = [buffers[start : start + size] for start in range(0, count, size)]
            futures = [self._helpers.submit(self._encode_some, chunk) for chunk in chunks]
            encoded = [item for future in futures for item in future.result()]
        codecs = [int(codec) for codec, _ in encoded]
        stored = [data for _, data in encoded]
        lengths = [memoryview(data).nbytes for data in stored]
        return codecs, stored, lengths

    def _encode_some(self, buffers: list[HostBuffer]) -> list[tuple[Codec, Stored]]:
        encode = self.codec.encode
        return [encode(buffer) for buffer in buffers]

    def _chosen_entries(
        self, entries: Entries, slots: list[int], results: Results, cleared: list[int]
    ) -> dict[int, tuple[int | None, bytes | memoryview]]:
        """The header entries to write, slot -> (owner, entry): those of the group's written
        blocks (`entries[member]` for the block in `slots[member]`, owner `member`) and the
        empty entry of each `cleared` slot (owner None). None without a header file."""
        if self.files.headers_fd is None:
            return {}
        raw = entries.view(np.uint8).data
        chosen: dict[int, tuple[int | None, bytes | memoryview]] = {}
        for slot in cleared:
            chosen[slot] = (None, EMPTY_ENTRY)
        for member, result in enumerate(results):
            if result is None:
                start = member * ENTRY_BYTES
                chosen[slots[member]] = (member, raw[start : start + ENTRY_BYTES])
        return chosen
