"""Opening a log store: its index from the last checkpoint, then only the regions written
since scanned, every record found there verified before it is indexed.

In order: the checkpoint (log_checkpoint.py; absent, damaged, of another geometry or not this
store's, one copied from another store or written for an earlier regions file: none);
every region's first page (its epoch: a region reused since the checkpoint, or one whose page
is damaged or cut off, loses the checkpoint's records in it); the regions scanned from where
the checkpoint left them (from their start when reused, or when the regions file ends inside
them: what it still holds is scanned), group by group up to the first header
page that is not sound (a torn one ends the region there), each record's bytes verified
against the checksum its group's header holds (a torn payload is not indexed); the
newest record per slot kept (never one older than what the checkpoint held there), a key kept
only in its newest slot. What was dropped is counted and said (`problems`).

An open that may write (not a store opened to inspect) also clears a damaged first page, so
that the region reads as unused (it held nothing the index keeps) and the next open, or
`kvtier check` after `--repair`, finds nothing to say about it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.tiers.disk import log_checkpoint
from kvtier.tiers.disk.log_files import LogFiles
from kvtier.tiers.disk.log_format import (
    CHECKPOINT_DIR,
    LOG_FORMAT_VERSION,
    REGION_HEADER_BYTES,
    TOMBSTONE,
    Record,
    bound_checksum,
    parse_region_header,
    scan_groups,
)
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex, sorted_hashes

_LOG = logging.getLogger(__name__)


@dataclass(slots=True)
class Opened:
    """What an open found: where numbering resumes, and what it dropped, one line each."""

    next_seq: int = 1
    next_epoch: int = 1
    from_checkpoint: bool = False
    scanned_regions: int = 0
    scanned_records: int = 0
    dropped: int = 0
    problems: list[str] = field(default_factory=list)


def checkpoint_meta(
    fingerprint: str, store_id: str, index: LogIndex, region_bytes: int
) -> dict[str, Any]:
    """What a checkpoint must have been written for to be used: this store (its fingerprint
    and the identity of its regions file, log_layout.py) and this geometry."""
    return {
        "version": LOG_FORMAT_VERSION,
        "fingerprint": fingerprint,
        "store": store_id,
        "num_blocks": index.num_blocks,
        "num_regions": index.num_regions,
        "region_bytes": region_bytes,
    }


def recover(
    files: LogFiles, index: LogIndex, fingerprint: str, namespace: bytes, store_id: str
) -> Opened:
    """Fill `index` from the checkpoint and the regions written since (see the module)."""
    opened = Opened()
    geo = files.geo
    meta = checkpoint_meta(fingerprint, store_id, index, geo.region_bytes)
    arrays = log_checkpoint.load(files.root / CHECKPOINT_DIR, meta)
    epochs = np.zeros(geo.num_regions, dtype=np.uint64)
    bases = np.arange(geo.num_regions, dtype=np.int64) * geo.region_bytes
    present = np.clip(files.found_bytes - bases, 0, geo.region_bytes)
    """Bytes of each region the regions file holds (fewer where it was cut short)."""
    page = np.empty(REGION_HEADER_BYTES, dtype=np.uint8)
    damaged: list[int] = []
    for region in range(geo.num_regions):
        if files.base(region) + REGION_HEADER_BYTES > files.found_bytes:
            continue  # cut off with its first page: lost
        try:
            got = files.read_into(region, 0, page)
        except OSError as error:
            opened.problems.append(f"region {region}: its first page is unreadable ({error})")
            continue
        epochs[region] = parse_region_header(
            page[:got].tobytes(), namespace, region, geo.region_bytes
        )
        if epochs[region] == 0 and page[:got].any():
            damaged.append(region)
    _clear_damaged(files, damaged, opened)
    if arrays is not None:
        meta_values = arrays.pop("meta")
        index.load(arrays)
        settled = index.settle(epochs, present, geo.region_bytes)
        opened.from_checkpoint = True
        opened.next_seq = int(meta_values[0])
        opened.next_epoch = int(meta_values[1])
    else:
        settled = np.zeros(0, dtype=np.int64)
        index.epoch[:] = epochs
    found: list[tuple[int, Record]] = []
    torn = 0
    # One buffer for every region scanned: a group is parsed only when it ends inside what
    # was read into it this time (`parse_group`), so nothing left from another region is
    # read, and the open's memory stays one region's (freed ones would stay resident).
    full = np.empty(geo.region_bytes, dtype=np.uint8)
    view = full.data
    for region in np.flatnonzero(epochs).tolist():
        start = max(int(index.fill[region]), REGION_HEADER_BYTES)
        if start >= geo.region_bytes:
            continue
        try:
            got = files.read_into(region, start, full[start:])
        except OSError as error:
            opened.problems.append(f"region {region}: unreadable past the checkpoint ({error})")
            continue
        records, end = scan_groups(view, namespace, int(epochs[region]), start, start + got)
        opened.scanned_regions += 1
        for record in records:
            key, slot, length, codec, _, seq, checksum, at = record
            if codec != TOMBSTONE and checksum != bound_checksum(
                namespace, key, slot, length, codec, seq, view[at : at + length]
            ):
                torn += 1
                continue
            found.append((region, record))
        index.fill[region] = end
    del view, full  # before the replay's arrays are made
    if torn:
        opened.problems.append(f"{torn} records of an interrupted write were not indexed")
    opened.scanned_records = len(found)
    index.replay(found)
    # Dropped from the checkpoint and found by no scan (a block moved by a reclaim, written
    # over or forgotten since is found again): lost.
    lost = int(np.count_nonzero(index.region[settled] == NO_REGION))
    if lost:
        opened.problems.append(
            f"{lost} checkpointed blocks in regions reused or cut off since were lost"
        )
    opened.dropped += lost
    duplicates = index.rebuild(hashed=arrays is not None)
    opened.dropped += duplicates
    top_seq = max(
        int(index.seq.max()) if index.num_blocks else 0,
        max((record.seq for _, record in found), default=0),
    )
    opened.next_seq = max(opened.next_seq, top_seq + 1)
    opened.next_epoch = max(opened.next_epoch, int(epochs.max(initial=0)) + 1)
    for problem in opened.problems:
        _LOG.warning("log store %s: %s", files.root, problem)
    return opened


def _clear_damaged(files: LogFiles, regions: list[int], opened: Opened) -> None:
    """Say which regions' first pages are damaged, and unless the files are open only to
    read, zero those pages (synced) so that the regions read as unused from now on."""
    if not regions:
        return
    cleared = False
    if not files.readonly:
        zeros = np.zeros(REGION_HEADER_BYTES, dtype=np.uint8)
        try:
            for region in regions:
                files.io.pwritev(files.fd, [zeros.data], files.base(region))
            files.io.fsync(files.fd)
            cleared = True
        except OSError as error:
            opened.problems.append(f"damaged first pages not cleared ({error})")
    what = "cleared" if cleared else "not read"
    for region in regions:
        opened.problems.append(f"region {region}: its first page is damaged ({what})")


def save_checkpoint(
    root: Path,
    fingerprint: str,
    store_id: str,
    index: LogIndex,
    region_bytes: int,
    next_seq: int,
    epoch: int,
) -> None:
    """Write the index as the store's checkpoint (blocking: call it off the write path)."""
    arrays, written = index.snapshot()
    hashes, slots = sorted_hashes(
        arrays["keys"], arrays["key_len"], arrays["region"], arrays["codec"]
    )
    arrays["hashes"], arrays["hashed_slots"] = hashes, slots
    meta = checkpoint_meta(fingerprint, store_id, index, region_bytes)
    meta.update(next_seq=next_seq, next_epoch=epoch)
    log_checkpoint.save(root / CHECKPOINT_DIR, meta, arrays)
    index.adopt(hashes, slots, int(arrays["keys"].shape[1]), written)
