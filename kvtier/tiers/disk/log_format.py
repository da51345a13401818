"""The on-disk format of a log-structured disk store (`layout = "log"`), in one place.

A store lives in `<directory>/kvtier-log-<fingerprint>/`::

    lock          flock'ed while a store has it open
    regions.bin   `num_regions` regions of `region_bytes` each, preallocated
    checkpoint/   LMDB: the in-memory index as packed arrays, written in the background

**Regions.** Space is a fixed number of regions, each written front to back. A region's first
page (REGION_HEADER_BYTES) names its epoch: a number that grows every time a region is
(re)opened, so a group left from an earlier use of the region is never taken as current.

**Groups** (format 4). A write group's part in one region starts on a page boundary: its
header page(s), then its payloads. The header pages hold a group header (magic, version,
epoch, record count, header pages, key bytes, payload span), a checksum, then one fixed
entry per record (slot, sequence, bound checksum, payload offset and length, codec, key
offset and length) and the records' keys. The header checksum (xxh3-64 seeded with the
store's namespace) covers all of it, the payloads' checksums included, so a torn header page
ends the region's scan there. Payloads follow the header pages: one whose length is a
multiple of PAGE starts on a page boundary (so a group of raw blocks is written straight from
the caller's page-aligned memory with O_DIRECT), any other on 8 bytes. The next group starts
on the page after the span.

**Records.** The bound checksum is xxh3-64 of the stored bytes seeded with a hash of
(namespace, key, slot, length, codec, sequence), as in the per-block layout: a record never
serves another key's, slot's, store's or older write's bytes, and a payload torn after its
header was written reads as a miss. A forget is a record with codec TOMBSTONE and no bytes,
so a restart does not bring a forgotten block back.

Format 3 (records and their blocks interleaved) is not read: a store in it is refused by the
disk tier's opener (open_checks.py, `OLD_FORMAT_VERSIONS`) in one line saying what to do.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import xxhash

from kvtier.keys import OffloadKey

LOG_FORMAT_VERSION = 4
"""Version of the log layout (groups, regions, checkpoint). The per-block layout is 2."""
OLD_FORMAT_VERSIONS = (3,)
"""Earlier log formats, whose stores recorded no `layout.json` (their directory's name, an
earlier fingerprint, says what they are): the disk tier's opener refuses them (open_checks.py)."""

REGIONS_FILE = "regions.bin"
CHECKPOINT_DIR = "checkpoint"
LOCK_FILE = "lock"

PAGE = 4096
"""Groups start on a page boundary; O_DIRECT writes whole pages."""
REGION_HEADER_BYTES = PAGE
DEFAULT_REGION_BYTES = 16 << 20
"""Default region size: large enough that a region's write is sequential, small enough that
reclaiming one moves little."""

TOMBSTONE = 255
"""The codec of a forget record."""

_REGION = struct.Struct("<8sIQI20sQ")  # magic, version, epoch, index, namespace, region_bytes
_REGION_MAGIC = b"kvtierLG"
_GROUP = struct.Struct("<8sIIIIQQ")  # magic, version, count, head_pages, key_bytes, epoch, span
_GROUP_MAGIC = b"kvtierGR"
_CHECK = struct.Struct("<Q")
_BINDING = struct.Struct("<2s20sQIBQ")  # magic, namespace, slot, length, codec, seq
_BINDING_MAGIC = b"KL"

ENTRY = np.dtype(
    [
        ("slot", "<u8"),
        ("seq", "<u8"),
        ("checksum", "<u8"),
        ("offset", "<u4"),  # from the start of the group's payloads
        ("length", "<u4"),
        ("key_at", "<u4"),  # from the start of the group's keys
        ("key_len", "<u2"),
        ("codec", "u1"),
        ("pad", "u1"),
    ]
)
"""One record's entry in its group's header pages."""

RECORD_HEADER_BYTES = ENTRY.itemsize
"""Bytes of a record's entry (its key and payload come on top): the live-bytes accounting."""

_FIXED = _GROUP.size + _CHECK.size

_compiled_checksums: Callable[..., list[int]] | None = None
try:  # the compiled checksums, present only when kvtier.compiled selected the core
    import kvtier.tiers.disk._io_core as _io_core

    if _io_core.has_checksums():
        _compiled_checksums = _io_core.bound_checksums
except ImportError:
    pass

_compiled_entries: Callable[..., int] | None = None
try:  # the compiled entries, present only when kvtier.compiled selected the core
    from kvtier.tiers.disk._plan_core import pack_entries as _compiled_entries
except ImportError:
    _compiled_entries = None
if sys.byteorder != "little":  # (it writes native integers; the format's are little-endian)
    _compiled_entries = None


def log_fingerprint(block_size: int, model_id: str, version: int = LOG_FORMAT_VERSION) -> str:
    """A short hash of (log format version, block size, model id): the name of the store's
    directory (`kvtier-log-<fingerprint>`) and the namespace bound into its records."""
    text = json.dumps(["kvtier-disk-log", version, block_size, model_id])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def pad8(value: int) -> int:
    """`value` rounded up to a multiple of 8."""
    return (value + 7) & ~7


def round_page(value: int) -> int:
    """`value` rounded up to a multiple of PAGE."""
    return -(-value // PAGE) * PAGE


def record_bytes(key_len: int, length: int) -> int:
    """Bytes one record is counted for in its region's live bytes: entry, key and payload."""
    return RECORD_HEADER_BYTES + pad8(key_len) + pad8(length)


def head_bytes(count: int, key_bytes: int) -> int:
    """Bytes of a group's header (before rounding to pages) for `count` records whose keys
    take `key_bytes`."""
    return _FIXED + count * RECORD_HEADER_BYTES + key_bytes


def payload_at(end: int, length: int) -> int:
    """Where a payload of `length` bytes goes after payloads ending at `end`: on a page
    boundary when `length` is whole pages (O_DIRECT from the caller's memory), else on 8."""
    if length and length % PAGE == 0:
        return round_page(end)
    return pad8(end)


def bound_checksum(
    namespace: bytes, key: bytes, slot: int, length: int, codec: int, seq: int, stored: object
) -> int:
    """xxh3-64 of `stored`, seeded with everything the block is bound to."""
    binding = _BINDING.pack(_BINDING_MAGIC, namespace, slot, length, codec, seq)
    seed = xxhash.xxh3_64_intdigest(binding + key)
    return xxhash.xxh3_64_intdigest(stored, seed=seed)  # type: ignore[arg-type]


def bound_checksums(
    namespace: bytes,
    keys: Sequence[bytes],
    slots: Sequence[int],
    lengths: Sequence[int],
    codecs: Sequence[int],
    seqs: Sequence[int],
    stored: Sequence[object],
) -> list[int]:
    """`bound_checksum` of each record: a log part's records, on a head thread. With the
    compiled core, in one call that computes every hash without the GIL (`_io_core.pyx`:
    python-xxhash holds the GIL over an input of 64 KiB or less, so at 64 KiB blocks the
    head threads held it through all of a call's hashing, and the write threads waited for
    it between writes: docs/BENCHMARKS.md, "Write threads and the GIL"); else
    `bound_checksum` per record."""
    if _compiled_checksums is not None:
        return _compiled_checksums(
            namespace,
            list(keys),
            list(slots),
            list(lengths),
            list(codecs),
            list(seqs),
            list(stored),
        )
    return python_bound_checksums(namespace, keys, slots, lengths, codecs, seqs, stored)


def python_bound_checksums(
    namespace: bytes,
    keys: Sequence[bytes],
    slots: Sequence[int],
    lengths: Sequence[int],
    codecs: Sequence[int],
    seqs: Sequence[int],
    stored: Sequence[object],
) -> list[int]:
    """`bound_checksums` in Python, one `bound_checksum` a record."""
    return [
        bound_checksum(namespace, key, slot, length, codec, seq, data)
        for key, slot, length, codec, seq, data in zip(
            keys, slots, lengths, codecs, seqs, stored, strict=True
        )
    ]


class Record(NamedTuple):
    """One record, as parsed from a group's header (`offset`: where its stored bytes start
    in its region). A named tuple: an open makes one per record scanned."""

    key: OffloadKey
    slot: int
    length: int
    codec: int
    epoch: int
    seq: int
    checksum: int
    offset: int

    @property
    def payload_offset(self) -> int:
        """Where the stored bytes start in the region (`offset`)."""
        return self.offset

    @property
    def size(self) -> int:
        """Bytes the record is counted for in its region."""
        return record_bytes(len(self.key), self.length)


def pack_group(
    namespace: bytes,
    epoch: int,
    keys: Sequence[bytes],
    fields: dict[str, Any],
    span: int,
) -> bytes:
    """A group's header pages: `fields` holds per record arrays (or lists) of slot, seq,
    checksum, offset (from the payloads' start), length and codec; `span` is the payloads'
    bytes (whole pages). Built with array operations: no Python per record beyond the keys'
    join."""
    count = len(keys)
    entries = np.zeros(count, dtype=ENTRY)
    for name in ("slot", "seq", "checksum", "offset", "length", "codec"):
        entries[name] = fields[name]
    key_len = np.fromiter(map(len, keys), dtype=np.int64, count=count)
    entries["key_len"] = key_len
    entries["key_at"] = np.cumsum(key_len) - key_len
    blob = b"".join(keys)
    pages = -(-head_bytes(count, len(blob)) // PAGE)
    group = _GROUP.pack(_GROUP_MAGIC, LOG_FORMAT_VERSION, count, pages, len(blob), epoch, span)
    body = entries.tobytes()
    hasher = xxhash.xxh3_64(group, seed=_seed(namespace))
    hasher.update(body)
    hasher.update(blob)
    head = group + _CHECK.pack(hasher.intdigest()) + body + blob
    return head + bytes(pages * PAGE - len(head))


def pack_group_into(
    out: np.ndarray[Any, np.dtype[np.uint8]],
    at: int,
    namespace: bytes,
    epoch: int,
    keys: Sequence[bytes],
    fields: dict[str, Any],
    span: int,
) -> int:
    """`pack_group`'s header pages written into `out` (a uint8 array) from `at`, the same
    bytes; their length. With the compiled core (`_plan_core.pack_entries`) the entries and
    keys are written there in one loop over the part's lists and the checksum taken over
    `out` itself (a write's header pages without an array a column, a join of the keys and
    two copies of the header); without it, `pack_group`'s bytes copied in."""
    count = len(keys)
    key_bytes = sum(map(len, keys))
    nbytes = -(-head_bytes(count, key_bytes) // PAGE) * PAGE
    if out.shape[0] < at + nbytes:
        raise ValueError(f"pack_group_into: {nbytes} bytes do not fit from {at}")
    columns = [fields[name] for name in ("slot", "seq", "checksum", "offset", "length", "codec")]
    if (
        _compiled_entries is None
        or out.dtype != np.uint8
        or not out.flags.c_contiguous
        or not all(type(column) is list for column in (keys, *columns))
    ):
        head = pack_group(namespace, epoch, keys, fields, span)
        out[at : at + nbytes] = np.frombuffer(head, np.uint8)
        return nbytes
    end = at + _FIXED + _compiled_entries(out, at + _FIXED, keys, *columns)
    pages = nbytes // PAGE
    group = _GROUP.pack(_GROUP_MAGIC, LOG_FORMAT_VERSION, count, pages, key_bytes, epoch, span)
    out[at : at + _GROUP.size] = np.frombuffer(group, np.uint8)
    hasher = xxhash.xxh3_64(group, seed=_seed(namespace))
    hasher.update(out[at + _FIXED : end].data)
    out[at + _GROUP.size : at + _FIXED] = np.frombuffer(_CHECK.pack(hasher.intdigest()), np.uint8)
    out[end : at + nbytes] = 0
    return nbytes


def parse_group(
    data: memoryview, pos: int, namespace: bytes, epoch: int, limit: int
) -> tuple[list[Record], int] | None:
    """The records of the group starting at `pos` (a page boundary) of a region's bytes
    `data`, and where the next group would start, if its header pages are sound, of this
    store and this epoch of the region, and its span ends before `limit`; else None."""
    if pos + PAGE > limit:
        return None
    magic, version, count, pages, key_bytes, group_epoch, span = _GROUP.unpack_from(data, pos)
    if magic != _GROUP_MAGIC or version != LOG_FORMAT_VERSION or group_epoch != epoch:
        return None
    used = head_bytes(count, key_bytes)
    end = pos + pages * PAGE + span
    if count == 0 or pages < 1 or used > pages * PAGE or span % PAGE or end > limit:
        return None
    hasher = xxhash.xxh3_64(data[pos : pos + _GROUP.size], seed=_seed(namespace))
    hasher.update(data[pos + _FIXED : pos + used])
    if _CHECK.unpack_from(data, pos + _GROUP.size)[0] != hasher.intdigest():
        return None
    entries = np.frombuffer(data, dtype=ENTRY, count=count, offset=pos + _FIXED)
    offset = entries["offset"].astype(np.int64)
    key_at = entries["key_at"].astype(np.int64)
    key_len = entries["key_len"].astype(np.int64)
    if (
        np.any(offset + entries["length"] > span)
        or np.any(key_at + key_len > key_bytes)
        or np.any(key_len == 0)
    ):
        return None  # sound checksum, impossible entries: not a group this code wrote
    keys_start = pos + _FIXED + count * RECORD_HEADER_BYTES
    blob = data[keys_start : keys_start + key_bytes].tobytes()
    base = pos + pages * PAGE
    records = [
        Record(OffloadKey(blob[at : at + size]), slot, length, codec, epoch, seq, check, base + off)
        for at, size, slot, length, codec, seq, check, off in zip(
            key_at.tolist(),
            key_len.tolist(),
            entries["slot"].tolist(),
            entries["length"].tolist(),
            entries["codec"].tolist(),
            entries["seq"].tolist(),
            entries["checksum"].tolist(),
            offset.tolist(),
            strict=True,
        )
    ]
    return records, end


def scan_groups(
    data: memoryview, namespace: bytes, epoch: int, start: int, limit: int
) -> tuple[list[Record], int]:
    """The records of epoch `epoch` in a region's bytes `data`, group after group from
    `start` (a page boundary) to the first page that is not a sound group header of this
    epoch (never written, torn, or left from an earlier use), and that page's offset: where
    the next group would start."""
    records: list[Record] = []
    pos = max(start, REGION_HEADER_BYTES)
    while pos < limit:
        found = parse_group(data, pos, namespace, epoch, limit)
        if found is None:
            break
        records.extend(found[0])
        pos = found[1]
    return records, min(pos, limit)


def pack_region_header(namespace: bytes, epoch: int, index: int, region_bytes: int) -> bytes:
    """A region's first page: who it belongs to and its epoch, checksummed, zero padded."""
    body = _REGION.pack(_REGION_MAGIC, LOG_FORMAT_VERSION, epoch, index, namespace, region_bytes)
    check = _CHECK.pack(xxhash.xxh3_64_intdigest(body))
    return (body + check).ljust(REGION_HEADER_BYTES, b"\0")


def parse_region_header(data: bytes, namespace: bytes, index: int, region_bytes: int) -> int:
    """The epoch a region's first page names: 0 for a region never written (or whose page is
    not this store's region `index`: damaged, another store's, another geometry)."""
    if len(data) < _REGION.size + _CHECK.size:
        return 0
    body = data[: _REGION.size]
    (check,) = _CHECK.unpack_from(data, _REGION.size)
    if check != xxhash.xxh3_64_intdigest(body):
        return 0
    magic, version, epoch, at, space, size = _REGION.unpack(body)
    if (magic, version, at, space, size) != (
        _REGION_MAGIC,
        LOG_FORMAT_VERSION,
        index,
        namespace,
        region_bytes,
    ):
        return 0
    return int(epoch)


_SEEDS: dict[bytes, int] = {}
"""The header checksum's seed of each namespace seen (computed once)."""


def _seed(namespace: bytes) -> int:
    seed = _SEEDS.get(namespace)
    if seed is None:
        seed = _SEEDS[namespace] = xxhash.xxh3_64_intdigest(namespace)
    return seed
