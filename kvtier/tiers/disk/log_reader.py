"""The read path of a log store: each block read from where its slot's newest record is,
verified against its bound checksum, and re-checked against the index when it does not
verify (a region reclaimed meanwhile moved it: read again from the new place)."""

from __future__ import annotations

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec, Codec, CodecError
from kvtier.tiers.disk.log_files import LogFiles
from kvtier.tiers.disk.log_format import bound_checksum
from kvtier.tiers.disk.log_index import LogIndex, Row
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.storage import HostBuffer, ReadFailure

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
        results: list[ReadFailure | None] = []
        nbytes = 0
        for key, slot, buffer in zip(keys, slots, buffers, strict=True):
            result, got = self._read_one(key, slot, buffer)
            results.append(result)
            nbytes += got
        self.counters.count_reads(results, nbytes)
        return results

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
