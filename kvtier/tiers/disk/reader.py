"""The read path of a disk store: a batch of blocks read and verified, and one record checked.

A read looks each key's record up in memory (catalog.py), reads the runs of consecutive slots
with one `preadv` each (a raw block straight into the caller's buffer where O_DIRECT allows
it, a zstd frame into staging memory and only as far as it goes), recomputes every block's
bound checksum from the key it was asked for (layout.py), decodes, and finally looks the
records up again: a record that changed while its bytes were read means a write or a forget
overlapped, and its bytes are not served. A mismatch, a short read, an I/O error or a frame
that does not decode is a `ReadFailure` (a miss), never data and never an exception.

`BlockVerifier` checks one record against its slot, with reasons in words: what recovery
uses to keep or drop a record and what `check` reports.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec, Codec, CodecError
from kvtier.tiers.disk.catalog import Catalog
from kvtier.tiers.disk.files import StoreFiles
from kvtier.tiers.disk.guard import Guard
from kvtier.tiers.disk.io import ALIGNMENT, is_aligned, round_up, staging_buffer
from kvtier.tiers.disk.layout import IndexRecord, Run, StoreLayout, slab_file_name
from kvtier.tiers.disk.read_threads import ReadThreads, run_parts
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.storage import HostBuffer, ReadFailure

Scratch = np.ndarray[Any, np.dtype[np.uint8]]
"""Two block-sized rows: the stored bytes of a block, and the block they decode to."""

READ_SPLIT_BYTES = 8 << 20
"""A read of at least twice this many bytes is split over the read threads (`read_parts`,
`read_in_parts`)."""


def read_parts(slots: list[int], block_size: int, max_workers: int) -> list[list[int]]:
    """The positions of a batch of `slots`, cut into parts of consecutive slots to read in
    parallel: at most one part per read thread, each at least READ_SPLIT_BYTES (a small batch
    is one part). Several reads in flight keep the disk busier than one, and one part's
    checksums run while another part waits for the disk."""
    ways = min(max_workers, len(slots) * block_size // READ_SPLIT_BYTES)
    if ways <= 1:
        return [list(range(len(slots)))]
    order = sorted(range(len(slots)), key=slots.__getitem__)
    size = -(-len(order) // ways)
    return [order[start : start + size] for start in range(0, len(order), size)]


Outcomes = list[ReadFailure | None]
PartReader = Callable[[list[OffloadKey], list[int], list[HostBuffer]], Outcomes]


def read_in_parts(
    threads: ReadThreads | None,
    read: PartReader,
    keys: list[OffloadKey],
    slots: list[int],
    buffers: list[HostBuffer],
    parts: list[list[int]],
) -> Outcomes:
    """One batch read as `parts` (`read_parts`), each by `read`, by the read threads at
    once (`run_parts`, from the read thread the batch's one call runs in; one after the
    other without threads): each block's outcome at its position in the batch."""
    if len(parts) == 1:
        return read(keys, slots, buffers)
    outcomes: list[Outcomes] = [[] for _ in parts]

    def read_part(number: int) -> None:
        part = parts[number]
        outcomes[number] = read(
            [keys[m] for m in part], [slots[m] for m in part], [buffers[m] for m in part]
        )

    run_parts(threads, [functools.partial(read_part, number) for number in range(len(parts))])
    results: Outcomes = [None] * len(keys)
    for part, outcome in zip(parts, outcomes, strict=True):
        for member, result in zip(part, outcome, strict=True):
            results[member] = result
    return results


class BlockVerifier:
    """Checks stored blocks of one store against their index records."""

    def __init__(self, layout: StoreLayout, files: StoreFiles, codec: BlockCodec) -> None:
        self.layout = layout
        self.files = files
        self.codec = codec

    def scratch(self) -> Scratch:
        """Memory for `problem` (this thread's staging memory, valid until it stages again)."""
        block_size = self.layout.block_size
        return staging_buffer(2 * block_size).reshape(2, block_size)

    def problem(self, key: OffloadKey, record: IndexRecord, scratch: Scratch) -> str | None:
        """What is wrong with `record` of `key` and the bytes in its slot, or None: a slot,
        codec or length the layout cannot have, a missing or short slab file, a failed read,
        a bound checksum that does not match, bytes that do not decode."""
        impossible = self.layout.record_problem(record)
        if impossible is not None:
            return impossible
        file, offset = self.layout.locate(record.slot)
        if self.files.slab_fds[file] < 0:
            why = self.files.slab_problems.get(file, "is missing")
            return f"its slab file {slab_file_name(file)} {why}"
        try:
            size = self.files.slab_size(file)
        except OSError as error:
            return f"cannot stat the slab file: {error}"
        end = offset + record.length
        if size < end:
            return f"slab file ends at byte {size}, before the block's end at byte {end}"
        raw, block = scratch[0], scratch[1]
        try:
            got = self.files.read(file, [raw.data], offset)
        except OSError as error:
            return f"read failed: {error}"
        if got < record.length:
            return f"short read: {got} of {record.length} bytes"
        stored = raw[: record.length].data
        actual = self.layout.checksum(key, record, stored)
        if actual != record.checksum:
            return (
                f"checksum mismatch: indexed {record.checksum:016x}, stored bytes give "
                f"{actual:016x} (damaged, or another block's)"
            )
        try:
            self.codec.decode_into(record.codec, stored, block)
        except CodecError as error:
            return f"does not decode: {error}"
        return None


class BlockReader:
    """Reads batches of blocks of one store into callers' buffers (blocking: it runs in the
    store's read threads)."""

    def __init__(
        self,
        layout: StoreLayout,
        files: StoreFiles,
        catalog: Catalog,
        codec: BlockCodec,
        counters: StoreCounters,
        guard: Guard,
    ) -> None:
        self.layout = layout
        self.files = files
        self.catalog = catalog
        self.codec = codec
        self.counters = counters
        self.guard = guard

    def refuse(self, count: int) -> list[ReadFailure | None]:
        """`count` failed reads (IO_ERROR: misses) of a disabled store, counted."""
        results: list[ReadFailure | None] = [ReadFailure.IO_ERROR] * count
        self.counters.count_reads(results, 0)
        return results

    def read(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> list[ReadFailure | None]:
        """Read and verify the blocks (validated, distinct) into `buffers`: None for a block
        read intact, else why not. Counted as in flight, so a write group lets it finish
        before it starts, and a store disabling itself before it closes its files."""
        if not self.guard.enter_read():
            return self.refuse(len(keys))
        try:
            return self._read(keys, slots, buffers)
        finally:
            self.guard.leave_read()

    def _read(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> list[ReadFailure | None]:
        results: list[ReadFailure | None] = [None] * len(keys)
        found: dict[int, IndexRecord] = {}  # batch position -> its record, for indexed blocks
        for member, record in enumerate(self.catalog.lookup(keys)):
            if record is None or record.slot != slots[member]:
                results[member] = ReadFailure.NOT_INDEXED
            else:
                found[member] = record
        targets = self._targets(found, buffers)
        bytes_read = self._read_runs(found, slots, targets, results)
        self._verify(keys, found, targets, buffers, results)
        # A record that changed while the bytes were read means a write or a forget
        # overlapped: the bytes may be the new block's, so they are not served, and a checksum
        # mismatch they caused is no sign of a damaged disk. Either way, a miss.
        now = self.catalog.lookup(keys[member] for member in found)
        for (member, record), current in zip(found.items(), now, strict=True):
            if current != record:
                results[member] = ReadFailure.NOT_INDEXED
        self.counters.count_reads(results, bytes_read)
        return results

    def _targets(
        self, found: dict[int, IndexRecord], buffers: list[HostBuffer]
    ) -> dict[int, HostBuffer]:
        """Where each found block's stored bytes are read to: a raw block straight into the
        caller's buffer (when O_DIRECT allows it), anything else into staging memory. A frame
        is read only as far as it goes (rounded up to 4 KiB under O_DIRECT), so it ends its
        run of slots, as it did when it was written."""
        block_size = self.layout.block_size
        direct = self.files.direct_io
        targets: dict[int, HostBuffer] = {}
        staged: dict[int, int] = {}  # member -> bytes to read into staging
        for member, record in found.items():
            buffer = buffers[member]
            if record.codec == Codec.NONE and (not direct or is_aligned(buffer)):
                targets[member] = buffer
            elif record.codec == Codec.NONE:
                staged[member] = block_size
            else:
                wanted = round_up(record.length, ALIGNMENT) if direct else record.length
                staged[member] = max(1, min(wanted, block_size))
        if staged:
            staging = staging_buffer(sum(staged.values()))
            start = 0
            for member, size in staged.items():
                targets[member] = staging[start : start + size]
                start += size
        return targets

    def _read_runs(
        self,
        found: dict[int, IndexRecord],
        slots: list[int],
        targets: dict[int, HostBuffer],
        results: list[ReadFailure | None],
    ) -> int:
        """Read every run of the found blocks (one preadv each, resumed when partial), then
        each block that its run did not read whole on its own; the bytes read."""
        block_size = self.layout.block_size
        runs = self.layout.runs(
            list(found), slots, ends_run=lambda member: targets[member].nbytes < block_size
        )
        bytes_read = 0
        for run in runs:
            views = [targets[member] for member in run.members]
            try:
                got = self.files.read(run.file, [view.data for view in views], run.offset)
            except OSError:
                got = 0
            bytes_read += got + self._retry_short(run, views, got, found, results)
        return bytes_read

    def _retry_short(
        self,
        run: Run,
        views: list[HostBuffer],
        got: int,
        found: dict[int, IndexRecord],
        results: list[ReadFailure | None],
    ) -> int:
        """Read again, alone, each block of `run` that its one call (`got` bytes) did not read
        completely, so a bad sector or the end of a truncated file fails only the blocks it
        touches; the bytes read."""
        bytes_read = 0
        start = 0
        for member, view in zip(run.members, views, strict=True):
            record = found[member]
            offset, start = run.offset + start, start + view.nbytes
            if got >= offset - run.offset + record.length:
                continue
            try:
                alone = self.files.read(run.file, [view.data], offset)
            except OSError:
                results[member] = ReadFailure.IO_ERROR
                continue
            bytes_read += alone
            if alone < record.length:
                results[member] = ReadFailure.SHORT_READ
        return bytes_read

    def _verify(
        self,
        keys: list[OffloadKey],
        found: dict[int, IndexRecord],
        targets: dict[int, HostBuffer],
        buffers: list[HostBuffer],
        results: list[ReadFailure | None],
    ) -> None:
        """Check each block read against its bound checksum and decode it into its buffer
        (a raw block read in place is already there)."""
        block_size = self.layout.block_size
        for member, record in found.items():
            if results[member] is not None:
                continue
            target = targets[member]
            stored = target[: record.length].data
            if self.layout.checksum(keys[member], record, stored) != record.checksum:
                results[member] = ReadFailure.CHECKSUM
                continue
            if target is buffers[member] and record.length == block_size:
                continue
            try:
                self.codec.decode_into(record.codec, stored, buffers[member])
            except CodecError:
                results[member] = ReadFailure.CODEC
