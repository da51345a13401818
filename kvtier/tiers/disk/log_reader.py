"""The read path of a log store: each block read from where its slot's newest record is,
verified against its bound checksum, and re-checked against the index when it does not
verify (a region reclaimed meanwhile moved it: read again from the new place).

A batch takes its rows from the index in one locked array look-up (region, payload offset,
length, codec, sequence, checksum, key), and raw blocks whose payloads lie back to back in a
region are read with one preadv straight into the caller's buffers (O_DIRECT where they are
page-aligned); each is then verified against the in-memory checksum. Anything else (a zstd
block, a block that does not verify, a failed read) takes the one-block path."""

from __future__ import annotations

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec, Codec, CodecError
from kvtier.tiers.disk.io import IOV_MAX
from kvtier.tiers.disk.log_files import LogFiles, whole_pages
from kvtier.tiers.disk.log_format import TOMBSTONE, bound_checksum
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex, Row
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.storage import HostBuffer, ReadFailure

RUN_BYTES = 2 << 20
"""Most bytes one preadv of back-to-back payloads reads."""

SMALL_BATCH = 4
"""Batches of fewer blocks take the one-block path for each (no array set-up)."""

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
        # a handful of blocks: the one-block path costs less than the batch's array set-up
        runs, expected = self._runs(keys, slots, buffers) if count >= SMALL_BATCH else ([], [])
        for run, region, start in runs:
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
                    namespace, keys[i], slots[i], view.nbytes, Codec.NONE, seq, buffers[i]
                ):
                    done[i] = True
        for i in range(count):
            if not done[i]:
                results[i], got = self._read_one(keys[i], slots[i], buffers[i])
                nbytes += got
        self.counters.count_reads(results, nbytes)
        return results

    def _runs(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> tuple[list[tuple[list[int], int, int]], list[tuple[int, int]]]:
        """The raw blocks of a batch whose index rows hold them (key, codec, length checked
        with array operations), as runs of back-to-back payloads (positions, region, start),
        and per position the sequence and checksum its block must verify against."""
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
            & (codec == Codec.NONE)
            & (length == sizes)
            & (key_len == lengths)
            & (lengths <= width)
            & (rows == wanted).all(axis=1)
        )
        expected = list(zip(seq.tolist(), checksum.tolist(), strict=True))
        chosen = np.flatnonzero(ok & (codec != TOMBSTONE))
        if not chosen.size:
            return [], expected
        chosen = chosen[np.lexsort((offset[chosen], region[chosen]))]
        runs: list[tuple[list[int], int, int]] = []
        run: list[int] = []
        start = end = run_region = -1
        for i, where, first, size in zip(
            chosen.tolist(),
            region[chosen].tolist(),
            offset[chosen].tolist(),
            length[chosen].tolist(),
            strict=True,
        ):
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
        runs.append((run, run_region, start))
        return runs, expected

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
