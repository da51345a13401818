"""The on-disk format of a log-structured disk store (`layout = "log"`), in one place.

A store lives in `<directory>/kvtier-log-<fingerprint>/`::

    lock          flock'ed while a store has it open
    regions.bin   `num_regions` regions of `region_bytes` each, preallocated
    checkpoint/   LMDB: the in-memory index as packed arrays, written in the background

**Regions.** Space is a fixed number of regions, each written front to back. A region's first
page (REGION_HEADER_BYTES) names its epoch: a number that grows every time a region is
(re)opened, so a record left from an earlier use of the region is never taken as current. A
write group appends its records from a page boundary, so no write rewrites a page holding an
earlier group's bytes.

**Records.** Every block is one self-describing record: a header (magic, version, codec,
key length, slot, stored length, region epoch, sequence number, bound checksum, header
checksum), the key, then the stored bytes, each padded to 8 bytes. The bound checksum is
xxh3-64 of the stored bytes seeded with a hash of (namespace, key, slot, length, codec,
sequence), as in the per-block layout: a record never serves another key's, slot's, store's
or older write's bytes. A forget is a record with codec TOMBSTONE and no bytes, so a restart
does not bring a forgotten block back. The header checksum covers the header and key, so a
torn or stale header is never parsed as a record.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import NamedTuple

import xxhash

from kvtier.keys import OffloadKey

LOG_FORMAT_VERSION = 3
"""Version of the log layout (records, regions, checkpoint). The per-block layout is 2."""

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
_HEADER = struct.Struct("<2sBBB3xQIIQQ")  # magic, version, codec, key_len, slot, length,
#                                           epoch, seq, checksum
_HEADER_MAGIC = b"KL"
_CHECK = struct.Struct("<Q")
_BINDING = struct.Struct("<2s20sQIBQ")  # magic, namespace, slot, length, codec, seq

RECORD_HEADER_BYTES = _HEADER.size + _CHECK.size
"""Bytes of a record's header before its key (the header checksum included)."""


def log_fingerprint(block_size: int, model_id: str) -> str:
    """A short hash of (log format version, block size, model id): the name of the store's
    directory (`kvtier-log-<fingerprint>`) and the namespace bound into its records."""
    text = json.dumps(["kvtier-disk-log", LOG_FORMAT_VERSION, block_size, model_id])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def pad8(value: int) -> int:
    """`value` rounded up to a multiple of 8."""
    return (value + 7) & ~7


def record_bytes(key_len: int, length: int) -> int:
    """Bytes one record takes in a region: header, key and stored bytes, each padded."""
    return RECORD_HEADER_BYTES + pad8(key_len) + pad8(length)


def bound_checksum(
    namespace: bytes, key: bytes, slot: int, length: int, codec: int, seq: int, stored: object
) -> int:
    """xxh3-64 of `stored`, seeded with everything the block is bound to."""
    binding = _BINDING.pack(_HEADER_MAGIC, namespace, slot, length, codec, seq)
    seed = xxhash.xxh3_64_intdigest(binding + key)
    return xxhash.xxh3_64_intdigest(stored, seed=seed)  # type: ignore[arg-type]


class Record(NamedTuple):
    """One record's header, as parsed from a region (`offset`: where the record starts in
    its region; the stored bytes start at `offset + payload_offset`). A named tuple: an
    open makes one per record scanned, and a tuple is made several times faster than a
    frozen dataclass."""

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
        """Bytes from the record's start to its stored bytes."""
        return RECORD_HEADER_BYTES + pad8(len(self.key))

    @property
    def size(self) -> int:
        """Bytes the record takes in its region."""
        return record_bytes(len(self.key), self.length)


def pack_header(
    namespace: bytes,
    key: bytes,
    slot: int,
    length: int,
    codec: int,
    epoch: int,
    seq: int,
    checksum: int,
) -> bytes:
    """A record's header and key, padded to 8 bytes (its stored bytes follow)."""
    head = _HEADER.pack(
        _HEADER_MAGIC, LOG_FORMAT_VERSION, codec, len(key), slot, length, epoch, seq, checksum
    )
    check = xxhash.xxh3_64_intdigest(head + key, seed=_seed(namespace))
    return head + _CHECK.pack(check) + key + bytes(pad8(len(key)) - len(key))


def parse_header(
    data: memoryview, offset: int, namespace: bytes, epoch: int, limit: int
) -> Record | None:
    """The record at `offset` of a region's bytes `data` if its header is sound, belongs to
    this store and this epoch of the region, and ends before `limit`; else None."""
    if offset + RECORD_HEADER_BYTES > limit:
        return None
    fields = _HEADER.unpack_from(data, offset)
    magic, version, codec, key_len, slot, length, rec_epoch, seq, checksum = fields
    if magic != _HEADER_MAGIC or version != LOG_FORMAT_VERSION or rec_epoch != epoch:
        return None
    key_at = offset + RECORD_HEADER_BYTES
    if key_len == 0 or key_at + ((key_len + 7) & ~7) + ((length + 7) & ~7) > limit:
        return None
    key = data[key_at : key_at + key_len].tobytes()
    (check,) = _CHECK.unpack_from(data, offset + _HEADER.size)
    seed = _SEEDS.get(namespace)
    if seed is None:
        seed = _SEEDS[namespace] = _seed(namespace)
    if check != xxhash.xxh3_64_intdigest(
        data[offset : offset + _HEADER.size].tobytes() + key, seed=seed
    ):
        return None
    return Record(OffloadKey(key), slot, length, codec, rec_epoch, seq, checksum, offset)


def with_epoch(namespace: bytes, header: bytes, epoch: int) -> bytes:
    """A record's header and key (as packed by `pack_header`) moved to another region: the
    same record under `epoch`, its header checksum made again."""
    fields = list(_HEADER.unpack_from(header))
    key = header[RECORD_HEADER_BYTES : RECORD_HEADER_BYTES + fields[3]]
    return pack_header(namespace, key, fields[4], fields[5], fields[2], epoch, fields[7], fields[8])


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
    return xxhash.xxh3_64_intdigest(namespace)


def scan_records(
    data: memoryview, namespace: bytes, epoch: int, start: int, limit: int
) -> tuple[list[Record], int]:
    """The records of epoch `epoch` in a region's bytes `data`, from `start` (a page
    boundary) to where they end, and the byte offset where the next group would start (a
    page boundary). A header that does not parse ends a group (the rest of its page is
    padding); one at a page boundary ends the region's records.

    `parse_header`'s checks, each record's header checksum among them, in one loop with its
    names bound locally: an open after a crash runs it once per record written since the
    last checkpoint (tens of thousands), so the call and attribute overheads are most of
    its cost."""
    records: list[Record] = []
    append = records.append
    unpack = _HEADER.unpack_from
    unpack_check = _CHECK.unpack_from
    digest = xxhash.xxh3_64_intdigest
    seed = _SEEDS.get(namespace)
    if seed is None:
        seed = _SEEDS[namespace] = _seed(namespace)
    head_bytes = _HEADER.size
    pos = max(start, REGION_HEADER_BYTES)
    while pos < limit:
        if pos + RECORD_HEADER_BYTES <= limit:
            magic, version, codec, key_len, slot, length, rec_epoch, seq, checksum = unpack(
                data, pos
            )
            key_at = pos + RECORD_HEADER_BYTES
            end = key_at + ((key_len + 7) & ~7) + ((length + 7) & ~7)
            if (
                magic == _HEADER_MAGIC
                and version == LOG_FORMAT_VERSION
                and rec_epoch == epoch
                and key_len != 0
                and end <= limit
            ):
                key = data[key_at : key_at + key_len].tobytes()
                if unpack_check(data, pos + head_bytes)[0] == digest(
                    data[pos : pos + head_bytes].tobytes() + key, seed=seed
                ):
                    append(
                        Record(OffloadKey(key), slot, length, codec, rec_epoch, seq, checksum, pos)
                    )
                    pos = end
                    continue
        if pos % PAGE == 0:
            break
        pos = -(-pos // PAGE) * PAGE
    return records, min(-(-pos // PAGE) * PAGE, limit)
