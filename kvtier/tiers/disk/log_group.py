"""A write group of a log store as the lane builds it (log_lane.py): its records placed in
parts, one per region it writes (log_format.py: header pages, then payloads), each record's
payload kept as the caller's memory until the part is written; and the group's records as the
index takes them once durable (`placed`)."""

from __future__ import annotations

import mmap
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.jobs import Job, WriteJob
from kvtier.tiers.disk.log_format import PAGE, head_bytes, payload_at, round_page
from kvtier.tiers.disk.log_index import Placed

ZEROS = memoryview(bytes(PAGE))


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


def payload_views(part: Part, span: int) -> list[memoryview]:
    """A part's payloads as the buffers of its write (the caller's memory, not copied),
    with zeros in the gaps and up to `span`."""
    buffers: list[memoryview] = []
    pos = 0
    for payload, at, length in zip(part.payloads, part.offset, part.length, strict=True):
        if length:
            if at > pos:
                buffers.append(ZEROS[: at - pos])
            buffers.append(memoryview(payload).cast("B"))
            pos = at + length
    if span > pos:
        buffers.append(memoryview(bytes(span - pos)))
    return buffers


def copy_payloads(part: Part, image: np.ndarray[Any, np.dtype[np.uint8]]) -> memoryview:
    """A part's payloads copied into `image` (aligned memory of its span), zeros between."""
    for payload, at, length in zip(part.payloads, part.offset, part.length, strict=True):
        if length:
            image[at : at + length] = np.frombuffer(payload, np.uint8)
    image[part.end :] = 0
    return image.data


def placed(parts: list[Part]) -> Placed:
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


@dataclass(eq=False, slots=True)
class Flight:
    """One group between the lane thread (placed, its writes started) and the sync thread
    (written, synced, indexed, its calls settled): its calls, their results (a write's: one
    OSError or None per block), which record is which call's block (`where`: (call, block),
    or (-1, 0) for a forget's record, in the order placed) and its counters."""

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
        durable = set(self.where[: self.pending.flushed])
        for number, result in enumerate(self.results):
            for i, held in enumerate(result):
                if held is None and (number, i) not in durable:
                    result[i] = error

    def outputs(self) -> list[Any]:
        """Per call its result: a write's list, None for a forget."""
        return [
            result if isinstance(job, WriteJob) else None
            for job, result in zip(self.jobs, self.results, strict=True)
        ]
