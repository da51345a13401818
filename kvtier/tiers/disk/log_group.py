"""A write group of a log store as the lane builds it (log_lane.py): its records placed in
parts, one per region it writes (log_format.py: header pages, then payloads), each record's
payload kept as the caller's memory until the part is written; and the group's records as the
index takes them once durable (`placed`).

A write call's blocks are placed as a run (`fit_run`, `add_run`): how many of them fit the
part and their offsets are array operations over the run, and the part's columns are
extended with slices, so the Python per block is a few list elements, not a placement.
Moved records (reclaiming) and forgets are placed one at a time (`add`)."""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec
from kvtier.tiers.disk.jobs import ForgetJob, Job, Settlement, WriteJob
from kvtier.tiers.disk.log_files import LogFiles, whole_pages
from kvtier.tiers.disk.log_format import (
    PAGE,
    RECORD_HEADER_BYTES,
    bound_checksums,
    head_bytes,
    pack_group_into,
    pack_region_header,
    pad8,
    payload_at,
    round_page,
)
from kvtier.tiers.disk.log_index import NO_REGION, Placed
from kvtier.tiers.disk.stats import StoreCounters

_compiled_page_aligned: Callable[[list[Any], int], list[bool]] | None
try:  # the compiled check, present only when kvtier.compiled selected it
    from kvtier.tiers.disk._io_core import page_aligned as _compiled_page_aligned
except ImportError:
    _compiled_page_aligned = None

_compiled_fit_run: Callable[..., tuple[int, np.ndarray[Any, Any]] | None] | None
try:  # the compiled placing, present only when kvtier.compiled selected it
    from kvtier.tiers.disk._plan_core import fit_run as _compiled_fit_run
except ImportError:
    _compiled_fit_run = None

_compiled_placed: Callable[..., tuple[Any, ...]] | None
try:  # the compiled columns, present only when kvtier.compiled selected them
    from kvtier.tiers.disk._plan_core import placed_columns as _compiled_placed
except ImportError:
    _compiled_placed = None

ZEROS = memoryview(bytes(PAGE))

YIELD_PARTS = 2
"""A group's first parts (and the first after a mid-group flush) after whose hand-off the
lane lets go of the GIL (`let_writers_in`)."""

_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


def let_writers_in(closed: int) -> None:
    """After the hand-off of a group's `closed`-th part, if one of its first YIELD_PARTS:
    let go of the GIL once (and of the CPU), so the write and head threads just handed the
    part take it and start their system calls, which release it, before the lane places
    the next part. Else the lane held it through placing the next parts (array work that
    never lets go), and a 64 MiB call's first write began ~1.4 ms after its first part was
    handed over: the device idle (docs/BENCHMARKS.md, "Log writes on a fast device, second
    round")."""
    if closed <= YIELD_PARTS:
        _yield()


@dataclass(slots=True)
class Part:
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
    checksum: list[int | None] = field(default_factory=list)
    """None for a new record until the part is written (computed while its payloads are)."""
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
class Pending:
    """What a group has placed and not yet made durable: its parts (the last one still
    taking records), the writes in flight, the regions being reclaimed and the memory the
    writes read from (kept alive until they are done)."""

    parts: list[Part] = field(default_factory=list)
    writes: list[Future[Any]] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    keep: list[Any] = field(default_factory=list)
    spares: list[np.ndarray[Any, np.dtype[np.uint8]]] = field(default_factory=list)
    """The lane's spare buffers this group took."""
    closed: int = 0
    """Parts already written (the rest, at most one, still takes records)."""
    flushed: int = 0
    """New records (not moves) of the group already durable and indexed."""
    written: int = 0
    """The highest number (`LogFiles.writes_done`) of the writes waited for: a sync begun
    after that write returned made all of them durable (`LogFiles.synced_through`)."""

    def wait(self) -> None:
        """Wait for every write of the group started so far; raise the first one's OSError
        (after all of them are done: no write is left in flight over a skipped group)."""
        first: BaseException | None = None
        for future in self.writes:
            try:
                self.written = max(self.written, future.result())
            except BaseException as error:
                first = first or error
        self.writes.clear()
        if first is not None:
            raise first

    def split(self) -> Pending:
        """What is placed so far (every part closed) as a group of its own, made durable
        apart (an early flush, log_lane.py); this one goes on taking records, from none."""
        done = Pending(self.parts, self.writes, self.victims, self.keep, self.spares)
        done.closed = self.closed
        self.parts, self.writes, self.victims, self.keep, self.spares = [], [], [], [], []
        self.closed = 0
        return done

    def clear(self) -> None:
        """Forget what was placed (every write done)."""
        self.parts.clear()
        self.writes.clear()
        self.victims.clear()
        self.keep.clear()
        self.closed = 0


class Spares:
    """Aligned buffers of `nbytes` (a region: images, reclaimed regions) kept from group to
    group, at most `keep`: faulted in once, not per group (`take`, `give_back`)."""

    def __init__(self, nbytes: int, keep: int = 4) -> None:
        self.nbytes = nbytes
        self.keep = keep
        self._lock = threading.Lock()
        self._free: list[np.ndarray[Any, np.dtype[np.uint8]]] = []

    def take(self, pending: Pending, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """Aligned memory of at least `nbytes` (at most `self.nbytes`) for the writes of
        `pending`'s group, given back to the spares once they are done (`give_back`)."""
        with self._lock:
            spare = self._free.pop() if self._free else None
        buffer = spare if spare is not None else aligned_buffer(self.nbytes)
        pending.keep.append(buffer)
        pending.spares.append(buffer)
        return buffer[:nbytes]

    def give_back(self, pending: Pending) -> None:
        """The buffers `pending` took back to the spares (every write of it done)."""
        with self._lock:
            self._free.extend(pending.spares[: max(0, self.keep - len(self._free))])
        pending.spares.clear()


def encoded(codec: BlockCodec, buffers: list[Any]) -> tuple[list[Any], list[int], int | None]:
    """A write call's blocks as stored (the buffers themselves without compression), their
    codecs, and their raw bytes when encoded (None: as stored)."""
    if codec.compression == "none":
        return buffers, [0] * len(buffers), None
    pairs = [codec.encode(buffer) for buffer in buffers]
    stored = [memoryview(data).cast("B") for _, data in pairs]
    return stored, [int(kind) for kind, _ in pairs], sum(buffer.nbytes for buffer in buffers)


def page_aligned(buffers: list[Any]) -> list[bool]:
    """Per buffer whether O_DIRECT can write it from its memory (`whole_pages`; an empty one:
    True); in C with the compiled core."""
    if _compiled_page_aligned is not None:
        return _compiled_page_aligned(buffers, PAGE)
    return [_page_aligned(buffer) for buffer in buffers]


def _page_aligned(buffer: Any) -> bool:
    array = buffer if isinstance(buffer, np.ndarray) else np.frombuffer(buffer, dtype=np.uint8)
    return array.nbytes == 0 or whole_pages(array)


def aligned_buffer(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Page-aligned memory (anonymous mmap) of at least `nbytes`, whole pages."""
    return np.frombuffer(mmap.mmap(-1, max(PAGE, round_page(nbytes))), dtype=np.uint8)


def add(
    part: Part,
    key: OffloadKey,
    slot: int,
    seq: int,
    checksum: int | None,
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


def fit_run(
    part: Part,
    key_lens: np.ndarray[Any, np.dtype[np.int64]],
    lengths: np.ndarray[Any, np.dtype[np.int64]],
    region_bytes: int,
) -> tuple[int, np.ndarray[Any, np.dtype[np.int64]]] | None:
    """How many of a run of records (in order; their keys' and payloads' lengths) fit in
    `part` and their payload offsets, as `Part.fits` would place them one by one, looking
    at no more than `_run_cap` of them (the caller calls again while all it took fit); None
    when they mix payloads of whole pages with others (placed one by one instead)."""
    count = min(
        lengths.size, region_bytes // RECORD_HEADER_BYTES + 1, _run_cap(part, lengths, region_bytes)
    )
    lengths, key_lens = lengths[:count], key_lens[:count]
    if _compiled_fit_run is not None and _fits_compiled(key_lens, lengths):
        return _compiled_fit_run(
            part.start, part.end, len(part.keys), part.key_bytes, key_lens, lengths, count,
            region_bytes, PAGE, RECORD_HEADER_BYTES, head_bytes(0, 0),
        )  # fmt: skip
    return _fit_run_arrays(part, key_lens, lengths, count, region_bytes)


def _fits_compiled(*arrays: np.ndarray[Any, Any]) -> bool:
    """Whether the compiled `fit_run` takes these arrays (int64, contiguous)."""
    return all(array.dtype == np.int64 and array.flags.c_contiguous for array in arrays)


def _fit_run_arrays(
    part: Part,
    key_lens: np.ndarray[Any, np.dtype[np.int64]],
    lengths: np.ndarray[Any, np.dtype[np.int64]],
    count: int,
    region_bytes: int,
) -> tuple[int, np.ndarray[Any, np.dtype[np.int64]]] | None:
    """`fit_run` of the `count` records it looks at, with array operations (the fallback
    of the compiled loop, `_plan_core.fit_run`, and its reference)."""
    whole = (lengths % PAGE == 0) & (lengths > 0)
    if whole.all():  # each on a page boundary, back to back
        ends = round_page(part.end) + np.cumsum(lengths)
        at = ends - lengths
    elif not whole.any():  # each on 8 bytes
        padded = (lengths + 7) & ~7
        at = pad8(part.end) + np.cumsum(padded) - padded
        ends = at + lengths
    else:
        return None
    records = len(part.keys) + np.arange(1, count + 1, dtype=np.int64)
    heads = head_bytes(0, part.key_bytes) + records * RECORD_HEADER_BYTES + np.cumsum(key_lens)
    used = part.start + (-(-heads // PAGE) + -(-ends // PAGE)) * PAGE
    fits: np.ndarray[Any, np.dtype[np.bool_]] = np.asarray(used <= region_bytes)
    taken = count if fits.all() else int(np.argmin(fits))
    return taken, at[:taken]


def _run_cap(part: Part, lengths: np.ndarray[Any, np.dtype[np.int64]], region_bytes: int) -> int:
    """How many records of a run `fit_run` looks at: twice as many as the part's free bytes
    would take of the run's first record's size (at least 64). A run of more is placed in
    turns (the lane calls `fit_run` again while a whole run fits), so each record is looked
    at about twice, not once per region the rest of its call goes to (a 64 MiB call of
    16 KiB blocks went over its whole remainder once per region)."""
    free = max(0, region_bytes - part.start - round_page(part.end))
    first = int(lengths[0]) + RECORD_HEADER_BYTES if lengths.size else RECORD_HEADER_BYTES
    return max(64, 2 * (free // first) + 1)


def add_run(
    part: Part,
    keys: list[OffloadKey],
    slots: list[int],
    first_seq: int,
    at: np.ndarray[Any, np.dtype[np.int64]],
    lengths: np.ndarray[Any, np.dtype[np.int64]],
    codecs: list[int],
    payloads: list[Any],
    direct: bool,
) -> None:
    """Add a run of new records to `part` (as `add` would one by one) at the payload offsets
    `at` (from `fit_run`), with sequence numbers from `first_seq`; `direct`: whether every
    payload of the run with bytes is page-aligned memory of whole pages."""
    count = len(keys)
    part.keys.extend(keys)
    part.slot.extend(slots)
    part.seq.extend(range(first_seq, first_seq + count))
    part.checksum.extend([None] * count)
    part.offset.extend(at.tolist())
    part.length.extend(lengths.tolist())
    part.codec.extend(codecs)
    part.payloads.extend(payloads)
    part.moved_from.extend([NO_REGION] * count)
    part.key_bytes += sum(map(len, keys))
    part.end = int(at[-1] + lengths[-1])
    part.direct = part.direct and direct


def payload_views(part: Part, span: int) -> tuple[list[Any], list[int]]:
    """A part's payloads as the buffers of its write (the caller's memory, not copied),
    with zeros in the gaps and up to `span`, and each buffer's bytes. The payloads are
    passed as they are (contiguous buffers: the caller's arrays, views of a reclaimed
    region), not wrapped in a view each; when they lie back to back from the payloads'
    start (a call's whole-page blocks) the part's own lists are the write's, with no Python
    per block (docs/BENCHMARKS.md, "The write row's CPU per block")."""
    lengths = part.length
    end = part.end
    if sum(lengths) == end and 0 not in lengths:  # back to back from 0: no gap, no empty one
        buffers, sizes = list(part.payloads), list(lengths)
    else:
        buffers, sizes = [], []
        end = 0
        for payload, at, length in zip(part.payloads, part.offset, lengths, strict=True):
            if length:
                if at > end:
                    buffers.append(ZEROS[: at - end])
                    sizes.append(at - end)
                buffers.append(payload)
                sizes.append(length)
                end = at + length
    if span > end:
        buffers.append(memoryview(bytes(span - end)))
        sizes.append(span - end)
    return buffers, sizes


def copy_payloads(part: Part, image: np.ndarray[Any, np.dtype[np.uint8]]) -> memoryview:
    """A part's payloads copied into `image` (aligned memory of its span), zeros between."""
    for payload, at, length in zip(part.payloads, part.offset, part.length, strict=True):
        if length:
            image[at : at + length] = np.frombuffer(payload, np.uint8)
    image[part.end :] = 0
    return image.data


def write_front(files: LogFiles, namespace: bytes, part: Part, span: int) -> int:
    """On one of the lane's head threads, once `part` takes no more records and its payloads'
    writes are started: the bound checksums of its new records (xxh3 releases the GIL over
    the payloads: this runs beside the lane thread, which places the next part), then its
    header pages (after the region's first page when it opens the region) written; the
    write's number (`LogFiles.writes_done`), or the write's OSError."""
    checksums = part.checksum
    fresh = checksums.count(None)
    if fresh == len(checksums):  # every record new (no move): the part's columns as they are
        checksums = part.checksum = list(
            bound_checksums(
                namespace, part.keys, part.slot, part.length, part.codec, part.seq, part.payloads
            )
        )
    elif fresh:
        new = [i for i, check in enumerate(checksums) if check is None]
        computed = bound_checksums(
            namespace,
            [part.keys[i] for i in new],
            [part.slot[i] for i in new],
            [part.length[i] for i in new],
            [part.codec[i] for i in new],
            [part.seq[i] for i in new],
            [part.payloads[i] for i in new],
        )
        for i, check in zip(new, computed, strict=True):
            checksums[i] = check
    fields = {
        "slot": part.slot,
        "seq": part.seq,
        "checksum": checksums,
        "offset": part.offset,
        "length": part.length,
        "codec": part.codec,
    }
    first = b""
    if part.opens:
        first = pack_region_header(namespace, part.epoch, part.region, files.geo.region_bytes)
    head = round_page(head_bytes(len(part.keys), part.key_bytes)) if part.keys else 0
    front = _front_buffer(len(first) + head)
    front[: len(first)] = np.frombuffer(first, dtype=np.uint8)
    if part.keys:  # the header pages packed in place (no copy of them)
        pack_group_into(front, len(first), namespace, part.epoch, part.keys, fields, span)
    start = 0 if part.opens else part.start
    return files.write_here(part.region, start, [front.data], True)


_fronts = threading.local()


def _front_buffer(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Aligned memory for a part's header pages, this head thread's own and reused part
    after part (its write is done before `write_front` returns): not a new mapping, faulted
    in, per part."""
    buffer: np.ndarray[Any, np.dtype[np.uint8]] | None = getattr(_fronts, "buffer", None)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = _fronts.buffer = aligned_buffer(max(nbytes, 64 << 10))
    return buffer[: round_page(nbytes)]


def placed(parts: list[Part], *, checksums: bool = True) -> Placed:
    """The records of written parts as the index takes them (offsets from the region's
    start), in the order placed; without `checksums` (parts still being written: their new
    records' checksums are not computed yet) zeros in their place, set by `with_checksums`
    once the parts are written. In one compiled loop when the core is built
    (`_plan_core.placed_columns`), else with a conversion a column (`placed_arrays`)."""
    if _compiled_placed is not None:
        return Placed(*_compiled_placed(parts, PAGE, checksums))
    return placed_arrays(parts, checksums=checksums)


def placed_arrays(parts: list[Part], *, checksums: bool = True) -> Placed:
    """`placed` with a conversion a column (the compiled loop's fallback and reference)."""
    keys = [key for part in parts for key in part.keys]
    count = len(keys)

    def column(name: str, dtype: Any) -> np.ndarray[Any, Any]:
        values = chain.from_iterable(getattr(part, name) for part in parts)
        return np.fromiter(values, dtype, count)

    base = np.repeat(
        np.array([part.start + part.head_pages * PAGE for part in parts], np.int64),
        [len(part.keys) for part in parts],
    )
    region = np.repeat(
        np.array([part.region for part in parts], np.int64), [len(part.keys) for part in parts]
    )
    return Placed(
        keys,
        column("slot", np.int64),
        region,
        base + column("offset", np.int64),
        column("length", np.int64),
        column("codec", np.int64),
        column("seq", np.uint64),
        column("checksum", np.uint64) if checksums else np.zeros(count, np.uint64),
        column("moved_from", np.int64),
    )


def with_checksums(records: Placed, parts: list[Part]) -> Placed:
    """`records` (`placed(parts, checksums=False)`) with the checksums of `parts`, which are
    written now."""
    values = chain.from_iterable(part.checksum for part in parts)
    records.checksum[:] = np.fromiter(values, np.uint64, len(records.keys))
    return records


@dataclass(eq=False, slots=True)
class Flight:
    """One group between the lane thread (placed, its writes started) and the sync thread
    (written, synced, indexed, its calls settled): its calls, their results (a write's: one
    OSError or None per block), which records are which call's blocks (`where`: (call,
    blocks) per call in the order placed, a call's blocks placed in order; (-1, 1) for a
    forget's record: spans, not a tuple per block) and its counters."""

    jobs: list[Job]
    results: list[list[OSError | None]]
    pending: Pending
    where: list[tuple[int, int]] = field(default_factory=list)
    raw_bytes: int = 0
    appended: int = 0
    syncs: int = 0
    taken: bool = False
    """Whether the sync thread has taken it."""

    def fail(self, error: OSError) -> None:
        """Every block of the group's writes not yet durable fails with `error`: those placed
        after the last mid-group flush and those never placed (a disabled store's group, the
        calls after the one whose placing failed), so no block is reported stored that is
        not durable."""
        durable: dict[int, int] = {}  # per call: how many of its first blocks are durable
        left = self.pending.flushed
        for number, blocks in self.where:
            if left <= 0:
                break
            durable[number] = durable.get(number, 0) + min(blocks, left)
            left -= blocks
        for number, result in enumerate(self.results):
            for i in range(durable.get(number, 0), len(result)):
                if result[i] is None:
                    result[i] = error

    def count(self, counters: StoreCounters) -> None:
        """Count the group, once its results are final, in the store's `counters`."""
        jobs, results = self.jobs, self.results
        failed = sum(1 for r in results for e in r if e is not None)
        counters.count_group(
            writes=sum(isinstance(job, WriteJob) for job in jobs),
            forgets=sum(isinstance(job, ForgetJob) for job in jobs),
            fsyncs=self.syncs,
            commits=0,
            stored=sum(len(r) for r in results) - failed,
            failed=failed,
            raw_bytes=self.raw_bytes if not failed else 0,
            stored_bytes=self.appended,
        )

    def settled(self) -> list[Settlement]:
        """Its calls' futures and their results (`settle_by_loop`)."""
        return [
            (job.future, result, None)
            for job, result in zip(self.jobs, self.outputs(), strict=True)
            if job.future is not None
        ]

    def outputs(self) -> list[Any]:
        """Per call its result: a write's list, None for a forget."""
        return [
            result if isinstance(job, WriteJob) else None
            for job, result in zip(self.jobs, self.results, strict=True)
        ]
