"""The read path of a log store: each block read from where its slot's newest record is,
verified against its bound checksum, and re-checked against the index when it does not
verify (a region reclaimed meanwhile moved it: read again from the new place).

A batch takes its rows from the index in one locked look-up (region, payload offset, length,
codec, sequence, checksum, key: array operations for a large batch, a few scalars a block for
a small one, where the arrays' set-up would cost more), and raw blocks whose payloads lie back
to back in a region are read with one preadv straight into the caller's buffers (O_DIRECT
where they are page-aligned: a single block too, with no staging copy); each is then verified
against the in-memory checksum. Anything else (a zstd block, a block that does not verify, a
failed read) takes the one-block path, which re-reads the index when a reclaim moved it."""

from __future__ import annotations

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec, Codec, CodecError
from kvtier.tiers.disk.io import IOV_MAX
from kvtier.tiers.disk.log_files import LogFiles, whole_pages
from kvtier.tiers.disk.log_format import bound_checksum
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex, Row
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.storage import HostBuffer, ReadFailure

RUN_BYTES = 2 << 20
"""Most bytes one preadv of back-to-back payloads reads."""

SMALL_BATCH = 16
"""Batches of fewer blocks are looked up scalar by scalar (no array set-up)."""

Entry = tuple[int, int, int, int]
"""A block to read in a run: (position in the batch, region, payload offset, length)."""

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
    ) -> None:
        self.files = files
        self.index = index
        self.codec = codec
        self.counters = counters
        self.namespace = namespace

    def read(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> list[ReadFailure | None]:
        """Fill each buffer with its block; one result per block (None: intact)."""
        count = len(keys)
        results: list[ReadFailure | None] = [None] * count
        done = [False] * count
        nbytes = 0
        lookup = self._lookup_small if count < SMALL_BATCH else self._lookup
        entries, expected = lookup(keys, slots, buffers)
        for run, region, start in _runs(entries):
            views = [buffers[i].data.cast("B") for i in run]
            direct = all(whole_pages(buffers[i]) for i in run)
            try:
                got = self.files.read_run(region, start, views, direct)
            except OSError:
                continue  # each block of the run takes the one-block path
            nbytes += got
            namespace = self.namespace
            for i, view in zip(run, views, strict=True):
                got -= view.nbytes
                if got < 0:
                    break
                seq, checksum = expected[i]
                if checksum == bound_checksum(
                    namespace, keys[i], slots[i], view.nbytes, _RAW, seq, buffers[i]
                ):
                    done[i] = True
        for i in range(count):
            if not done[i]:
                results[i], got = self._read_one(keys[i], slots[i], buffers[i])
                nbytes += got
        self.counters.count_reads(results, nbytes)
        return results

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


def _runs(entries: list[Entry]) -> list[tuple[list[int], int, int]]:
    """`entries` (in the order of their place in the regions) as runs of back-to-back
    payloads of one region, each at most RUN_BYTES and IOV_MAX blocks: (positions, region,
    start)."""
    runs: list[tuple[list[int], int, int]] = []
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
