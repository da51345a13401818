"""The read path of a log store: each block read from where its slot's newest record is,
verified against its bound checksum, and re-checked against the index when it does not
verify (a region reclaimed meanwhile moved it: read again from the new place).

A batch takes its rows from the index in one locked look-up (region, payload offset, length,
codec, sequence, checksum, key: array operations for a large batch, a few scalars a block for
a small one, where the arrays' set-up would cost more), and raw blocks whose payloads lie back
to back in a region are read with one preadv straight into the caller's buffers (O_DIRECT
where they are page-aligned: a single block too, with no staging copy), in runs of at most
RUN_BYTES; a batch of several runs has them read by the store's read threads at once
(`ReadThreads.fan_out`: the thread the call runs in and the idle others), so the disk sees
several reads in flight, as a device is rated, while the event loop sees one call. Each block
is then verified against the in-memory checksum. Anything else (a zstd block, a block that
does not verify, a failed read) takes the one-block path, which re-reads the index when a
reclaim moved it."""

from __future__ import annotations

import functools

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec, Codec, CodecError
from kvtier.tiers.disk.io import IOV_MAX
from kvtier.tiers.disk.log_files import LogFiles, whole_pages
from kvtier.tiers.disk.log_format import bound_checksum
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex, Row
from kvtier.tiers.disk.read_threads import ReadThreads, run_parts
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.storage import HostBuffer, ReadFailure

RUN_BYTES = 1 << 20
"""Most bytes one preadv of back-to-back payloads reads: a large batch is cut into runs of
this size or less so that the read threads keep several in flight at once."""

SMALL_BATCH = 16
"""Batches of fewer blocks are looked up scalar by scalar (no array set-up)."""

Entry = tuple[int, int, int, int]
"""A block to read in a run: (position in the batch, region, payload offset, length)."""

Run = tuple[list[int], int, int]
"""Back-to-back payloads read with one preadv: (positions in the batch, region, start)."""

_RAW = int(Codec.NONE)
"""The codec of a raw block, as the index stores it (an int: no enum look-up a block)."""

_TRIES = 3
"""Reads of one block when its record moves under it (a reclaim per try is unlikely)."""


class LogReader:
    """Reads blocks of one log store (any thread; never the write lane's)."""

    def __init__(
        self,
        files: LogFiles,
        index: LogIndex,
        codec: BlockCodec,
        counters: StoreCounters,
        namespace: bytes,
        threads: ReadThreads | None = None,
    ) -> None:
        self.files = files
        self.index = index
        self.codec = codec
        self.counters = counters
        self.namespace = namespace
        self.threads = threads
        """The store's read threads, which read a batch's runs at once (None: one by one)."""

    def read(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> list[ReadFailure | None]:
        """Fill each buffer with its block; one result per block (None: intact). A batch of
        several runs has them read by the read threads at once (`threads.fan_out`)."""
        count = len(keys)
        lookup = self._lookup_small if count < SMALL_BATCH else self._lookup
        entries, expected = lookup(keys, slots, buffers)
        runs = _runs(entries)
        done = [False] * count
        got = [0] * len(runs)

        def read_run(number: int) -> None:
            got[number] = self._read_run(runs[number], keys, slots, buffers, expected, done)

        run_parts(self.threads, [functools.partial(read_run, n) for n in range(len(runs))])
        nbytes = sum(got)
        results: list[ReadFailure | None] = [None] * count
        for i in range(count):
            if not done[i]:
                results[i], one = self._read_one(keys[i], slots[i], buffers[i])
                nbytes += one
        self.counters.count_reads(results, nbytes)
        return results

    def _read_run(
        self,
        run: Run,
        keys: list[OffloadKey],
        slots: list[int],
        buffers: list[HostBuffer],
        expected: list[tuple[int, int]],
        done: list[bool],
    ) -> int:
        """Read one run with one preadv and mark `done` each of its blocks that verifies
        against its bound checksum (the rest, and every block of a failed read, take the
        one-block path); the bytes read."""
        members, region, start = run
        views = [buffers[i].data.cast("B") for i in members]
        direct = all(whole_pages(buffers[i]) for i in members)
        try:
            got = self.files.read_run(region, start, views, direct)
        except OSError:
            return 0
        left = got
        namespace = self.namespace
        for i, view in zip(members, views, strict=True):
            size = view.nbytes
            left -= size
            if left < 0:
                break
            seq, checksum = expected[i]
            stored = buffers[i]
            if checksum == bound_checksum(namespace, keys[i], slots[i], size, _RAW, seq, stored):
                done[i] = True
        return got

    def _lookup(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> tuple[list[Entry], list[tuple[int, int]]]:
        """The raw blocks of a batch whose index rows hold them (key, codec, length checked
        with array operations), in the order of their place in the regions, and per position
        the sequence and checksum its block must verify against."""
        index = self.index
        count = len(keys)
        at = np.fromiter(slots, dtype=np.int64, count=count)
        with index.lock:
            region = index.region[at]
            offset = index.offset[at].astype(np.int64)
            length = index.length[at].astype(np.int64)
            codec = index.codec[at]
            seq = index.seq[at]
            checksum = index.checksum[at]
            key_len = index.key_len[at].astype(np.int64)
            rows = index.keys[at]
        width = rows.shape[1]
        lengths = np.fromiter(map(len, keys), dtype=np.int64, count=count)
        wanted = np.frombuffer(
            b"".join(key[:width].ljust(width, b"\0") for key in keys), dtype=np.uint8
        ).reshape(count, width)
        sizes = np.fromiter((buffer.nbytes for buffer in buffers), dtype=np.int64, count=count)
        ok = (
            (region != NO_REGION)
            & (codec == _RAW)
            & (length == sizes)
            & (key_len == lengths)
            & (lengths <= width)
            & (rows == wanted).all(axis=1)
        )
        expected = list(zip(seq.tolist(), checksum.tolist(), strict=True))
        chosen = np.flatnonzero(ok)
        if not chosen.size:
            return [], expected
        chosen = chosen[np.lexsort((offset[chosen], region[chosen]))]
        entries = list(
            zip(
                chosen.tolist(),
                region[chosen].tolist(),
                offset[chosen].tolist(),
                length[chosen].tolist(),
                strict=True,
            )
        )
        return entries, expected

    def _lookup_small(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> tuple[list[Entry], list[tuple[int, int]]]:
        """`_lookup` for a handful of blocks: the same checks on each row's scalars, under
        one hold of the lock."""
        index = self.index
        entries: list[Entry] = []
        expected: list[tuple[int, int]] = []
        with index.lock:
            for i, (key, slot, buffer) in enumerate(zip(keys, slots, buffers, strict=True)):
                expected.append((int(index.seq[slot]), int(index.checksum[slot])))
                region = int(index.region[slot])
                length = int(index.length[slot])
                size = len(key)
                if (
                    region == NO_REGION
                    or index.codec[slot] != _RAW
                    or length != buffer.nbytes
                    or index.key_len[slot] != size
                    or index.keys[slot, :size].tobytes() != key
                ):
                    continue
                entries.append((i, region, int(index.offset[slot]), length))
        entries.sort(key=lambda entry: (entry[1], entry[2]))
        return entries, expected

    def _read_one(
        self, key: OffloadKey, slot: int, buffer: HostBuffer
    ) -> tuple[ReadFailure | None, int]:
        result: ReadFailure | None = ReadFailure.NOT_INDEXED
        total = 0
        for _ in range(_TRIES):
            row = self.index.row(slot)
            if row is None or row.key != key:
                return ReadFailure.NOT_INDEXED, total
            result, got = self._read_row(row, slot, buffer)
            total += got
            if result is None or self.index.holds(slot, row.region, row.seq):
                return result, total
        return result, total

    def _read_row(self, row: Row, slot: int, buffer: HostBuffer) -> tuple[ReadFailure | None, int]:
        raw = row.codec == Codec.NONE
        if raw and row.length != buffer.nbytes:
            return ReadFailure.CHECKSUM, 0
        target = buffer if raw else np.empty(row.length, dtype=np.uint8)
        try:
            got = self.files.read_into(row.region, row.payload_offset, target)
        except OSError:
            return ReadFailure.IO_ERROR, 0
        if got < row.length:
            return ReadFailure.SHORT_READ, got
        expected = bound_checksum(
            self.namespace, row.key, slot, row.length, row.codec, row.seq, target
        )
        if expected != row.checksum:
            return ReadFailure.CHECKSUM, got
        if not raw:
            try:
                self.codec.decode_into(row.codec, target.data, buffer)
            except CodecError:
                return ReadFailure.CODEC, got
        return None, got


def _runs(entries: list[Entry]) -> list[Run]:
    """`entries` (in the order of their place in the regions) as runs of back-to-back
    payloads of one region, each at most RUN_BYTES and IOV_MAX blocks: (positions, region,
    start)."""
    runs: list[Run] = []
    run: list[int] = []
    start = end = run_region = -1
    for i, where, first, size in entries:
        if (
            where != run_region
            or first != end
            or len(run) >= IOV_MAX
            or end - start + size > RUN_BYTES
        ):
            if run:
                runs.append((run, run_region, start))
            run, run_region, start = [], where, first
        run.append(i)
        end = first + size
    if run:
        runs.append((run, run_region, start))
    return runs
