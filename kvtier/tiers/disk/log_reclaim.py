"""Reclaiming a log store's space, a region at a time (the lane, log_lane.py, does it when a
new region is opened and no clean region would be left in reserve): which region goes
(`pick_victim`: the one holding the fewest live bytes), which of its records are moved
(`live_rows`: the blocks the tier's policy still holds and the forgets still current, less
those the running group writes over) and their bytes, read and verified (`verified`). The
lane appends them to the open region with the group, byte for byte; the region is clean
once that write is durable and the index points at the copies. A block is never dropped to
make room: which blocks stay is the tier's policy's decision (its evictions overwrite or
forget slots), so the hit ratio is the per-block layout's; the cost is the bytes moved
(write amplification: (written + moved) / written)."""

from __future__ import annotations

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.log_files import LogFiles
from kvtier.tiers.disk.log_format import PAGE, TOMBSTONE, bound_checksum, round_page
from kvtier.tiers.disk.log_index import LogIndex

LiveRow = tuple[int, OffloadKey, int, int, int, int, int]
"""A record to move: slot, key, offset in its region, length, codec, seq, checksum."""


def pick_victim(index: LogIndex, busy: set[int]) -> int | None:
    """The region holding the fewest live bytes (and some) of those not `busy`, or None."""
    with index.lock:
        live = index.live.copy()
    candidates = [r for r in np.argsort(live, kind="stable").tolist() if live[r] > 0]
    return next((r for r in candidates if r not in busy), None)


def live_rows(index: LogIndex, victim: int, overwritten: set[int]) -> list[LiveRow]:
    """The records of `victim` whose slots hold them now, but those of the `overwritten`
    slots (the running group writes them over), by offset."""
    slots = [s for s in index.live_slots(victim) if s not in overwritten]
    rows = []
    with index.lock:
        for slot in slots:
            if index.region[slot] == victim:
                fields = (index.offset, index.length, index.codec, index.seq, index.checksum)
                offset, length, codec, seq, checksum = (int(f[slot]) for f in fields)
                rows.append((slot, index._key(slot), offset, length, codec, seq, checksum))
    rows.sort(key=lambda row: row[2])
    return rows


def span(rows: list[LiveRow]) -> tuple[int, int]:
    """The whole pages of the region holding `rows` (start, stop)."""
    return rows[0][2] // PAGE * PAGE, round_page(max(row[2] + row[3] for row in rows))


def verified(
    files: LogFiles,
    namespace: bytes,
    victim: int,
    rows: list[LiveRow],
    first: int,
    view: memoryview,
) -> list[tuple[LiveRow, memoryview]]:
    """`rows` read into `view` (the region's bytes from `first`, `span`) with each one's
    payload, less those cut off (a truncated file) or damaged (their bound checksum wrong):
    not moved. Raises the reads' OSError."""
    reached = files.read_records(victim, first, view, [row[2:4] for row in rows])
    out = []
    for row, end in zip(rows, reached, strict=True):
        slot, key, offset, length, codec, seq, checksum = row
        if offset + length > end:
            continue  # cut off (its reads would fail anyway)
        payload = view[offset - first : offset - first + length]
        if codec != TOMBSTONE and checksum != bound_checksum(
            namespace, key, slot, length, codec, seq, payload
        ):
            continue  # damaged
        out.append((row, payload))
    return out
