"""Self-verifying blocks: the checksum that binds a block to its key, and the header file.

Two guarantees rest on this module.

**No record can serve another key's bytes.** A block's checksum is not of its bytes alone:
it is xxh3-64 of the stored bytes, seeded with a hash of (namespace, key, slot, stored
length, codec, sequence number). The index record holds that checksum, and a read recomputes it from
the key it was asked for, so a record that points at another key's slot (two records
swapped by a damaged index), at an older block of the same slot (a stale record) or at a
block of another namespace reads as a checksum failure, a miss, never as data.

**The index can be lost.** Every slot has a fixed-size entry in `headers.bin` that repeats
what the index record says (key, sequence number, length, codec, bound checksum), with a
checksum of its own. A write group writes its blocks' entries after their bytes and before
its one index commit, and syncs them with the slab files, so the headers alone can rebuild
the index (see `rebuild.py`) when it is missing or damaged. A forgotten block's entry is
cleared in the same group.

`headers.bin` starts with a FILE_HEADER_BYTES page that records the store's layout
(fingerprint, block size, model id, slots per slab file), so a store can be identified and
checked from its directory alone.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from kvtier.keys import MAX_KEY_BYTES, MIN_KEY_BYTES, OffloadKey

HEADERS_FILE = "headers.bin"
"""The name of the header file in a store directory."""

FILE_HEADER_BYTES = 4096
"""Bytes before the first slot's entry: the layout record, padded."""

ENTRY_BYTES = 320
"""Bytes of one slot's entry."""

_FILE_MAGIC = b"kvtierhd"
_FILE_PREFIX = struct.Struct("<8sI")  # magic, length of the layout JSON
_FILE_TRAILER = struct.Struct("<Q")  # xxh3-64 of prefix + JSON

_ENTRY_MAGIC = b"K2"
_BINDING = struct.Struct(f"<2sQQBB20s{MAX_KEY_BYTES}sQ")
"""The part of an entry a block's checksum is bound to: magic, seq, stored length, codec,
key length, namespace, key (zero padded), slot."""
_ENTRY = struct.Struct(f"<{_BINDING.size}sQx")  # binding, bound checksum, pad
_ENTRY_CHECK = struct.Struct("<Q")
_ENTRY_CHECK_AT = ENTRY_BYTES - _ENTRY_CHECK.size

ENTRY_DTYPE = np.dtype(
    {
        "names": [
            *("magic", "seq", "length", "codec", "key_len", "namespace", "key", "slot"),
            *("checksum", "entry_check"),
        ],
        "formats": [
            *("S2", "<u8", "<u8", "u1", "u1", "S20", f"S{MAX_KEY_BYTES}", "<u8"),
            *("<u8", "<u8"),
        ],
        "offsets": [
            *(0, 2, 10, 18, 19, 20, 40, 40 + MAX_KEY_BYTES),
            *(_BINDING.size, _ENTRY_CHECK_AT),
        ],
        "itemsize": ENTRY_BYTES,
    }
)
"""One entry as a numpy record, so a write group builds all its entries at once."""

NAMESPACE_BYTES = 20
"""The namespace bound into every block: the store's fingerprint (20 hex characters)."""

EMPTY_ENTRY = bytes(ENTRY_BYTES)
"""The entry of a slot that holds no block."""

if _ENTRY.size > _ENTRY_CHECK_AT:  # pragma: no cover - a layout constant, checked at import
    raise RuntimeError("a header entry does not fit ENTRY_BYTES")


def namespace_bytes(fingerprint: str) -> bytes:
    """The namespace of a store with this fingerprint, as bound into its blocks."""
    raw = fingerprint.encode("ascii")
    if len(raw) != NAMESPACE_BYTES:
        raise ValueError(f"a fingerprint has {NAMESPACE_BYTES} characters, got {fingerprint!r}")
    return raw


def bound_checksum(
    namespace: bytes,
    key: OffloadKey,
    slot: int,
    length: int,
    codec: int,
    seq: int,
    stored: Any,
) -> int:
    """xxh3-64 of `stored` (the bytes in the slot), seeded with a hash of everything the
    block is: namespace, key, slot, stored length, codec and sequence number (the binding
    part of its header entry). `stored` is any buffer (bytes, memoryview)."""
    binding = _BINDING.pack(_ENTRY_MAGIC, seq, length, codec, len(key), namespace, key, slot)
    return xxhash.xxh3_64_intdigest(stored, seed=xxhash.xxh3_64_intdigest(binding))


def group_entries(
    namespace: bytes,
    keys: Sequence[OffloadKey],
    slots: Sequence[int],
    lengths: Sequence[int],
    codecs: Sequence[int],
    seqs: Sequence[int],
    blocks: Sequence[Any],
) -> np.ndarray[Any, np.dtype[np.void]]:
    """The header entries of a write group's blocks, their bound checksums (`checksum`)
    and entry checksums filled in: the same values as `bound_checksum` and
    `BlockHeader.pack`, built for the whole group at once."""
    count = len(keys)
    entries = np.zeros(count, dtype=ENTRY_DTYPE)
    if not count:
        return entries
    entries["magic"] = _ENTRY_MAGIC
    entries["seq"] = seqs
    entries["length"] = lengths
    entries["codec"] = codecs
    entries["key_len"] = [len(key) for key in keys]
    entries["namespace"] = namespace
    entries["key"] = keys
    entries["slot"] = slots
    raw = entries.view(np.uint8).data
    digest = xxhash.xxh3_64_intdigest
    binding, size = _BINDING.size, ENTRY_BYTES
    entries["checksum"] = [
        digest(block, seed=digest(raw[i * size : i * size + binding]))
        for i, block in enumerate(blocks)
    ]
    end = _ENTRY_CHECK_AT
    entries["entry_check"] = [digest(raw[i * size : i * size + end]) for i in range(count)]
    return entries


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """One slot's entry in `headers.bin`: which block the slot holds."""

    key: OffloadKey
    seq: int
    length: int
    codec: int
    checksum: int
    """The bound checksum (`bound_checksum`) of the slot's first `length` bytes."""

    def pack(self, namespace: bytes, slot: int) -> bytes:
        """The entry of `slot` as written to `headers.bin` (ENTRY_BYTES bytes)."""
        binding = _BINDING.pack(
            _ENTRY_MAGIC,
            self.seq,
            self.length,
            self.codec,
            len(self.key),
            namespace,
            self.key,
            slot,
        )
        body = _ENTRY.pack(binding, self.checksum).ljust(_ENTRY_CHECK_AT, b"\0")
        return body + _ENTRY_CHECK.pack(xxhash.xxh3_64_intdigest(body))


def unpack_entry(data: bytes | memoryview, namespace: bytes, slot: int) -> BlockHeader | None:
    """The header in `slot`'s entry, or None when the entry is empty, torn, damaged, of
    another namespace or slot, or otherwise not a header this store wrote."""
    if len(data) != ENTRY_BYTES or bytes(data[:2]) != _ENTRY_MAGIC:
        return None
    body = bytes(data[:_ENTRY_CHECK_AT])
    (check,) = _ENTRY_CHECK.unpack_from(data, _ENTRY_CHECK_AT)
    if xxhash.xxh3_64_intdigest(body) != check:
        return None
    binding, checksum = _ENTRY.unpack_from(body)
    _, seq, length, codec, key_len, found_namespace, key, found_slot = _BINDING.unpack(binding)
    if found_namespace != namespace or found_slot != slot:
        return None
    if not MIN_KEY_BYTES <= key_len <= MAX_KEY_BYTES:
        return None
    return BlockHeader(OffloadKey(key[:key_len]), seq, length, codec, checksum)


def pack_file_header(layout: dict[str, Any]) -> bytes:
    """The first FILE_HEADER_BYTES of `headers.bin`: the store's layout, checksummed."""
    text = json.dumps(layout, sort_keys=True).encode()
    body = _FILE_PREFIX.pack(_FILE_MAGIC, len(text)) + text
    data = body + _FILE_TRAILER.pack(xxhash.xxh3_64_intdigest(body))
    if len(data) > FILE_HEADER_BYTES:
        raise ValueError(f"the layout record does not fit {FILE_HEADER_BYTES} bytes: {layout}")
    return data.ljust(FILE_HEADER_BYTES, b"\0")


def unpack_file_header(data: bytes) -> dict[str, Any] | None:
    """The layout recorded in the first bytes of a `headers.bin`, or None when they are not
    a header file's (missing, torn, damaged)."""
    if len(data) < _FILE_PREFIX.size:
        return None
    magic, size = _FILE_PREFIX.unpack_from(data)
    end = _FILE_PREFIX.size + size
    if magic != _FILE_MAGIC or len(data) < end + _FILE_TRAILER.size:
        return None
    (check,) = _FILE_TRAILER.unpack_from(data, end)
    if xxhash.xxh3_64_intdigest(data[:end]) != check:
        return None
    try:
        layout = json.loads(data[_FILE_PREFIX.size : end])
    except ValueError:
        return None
    return layout if isinstance(layout, dict) else None


def entry_offset(slot: int) -> int:
    """Byte offset of `slot`'s entry in `headers.bin`."""
    return FILE_HEADER_BYTES + slot * ENTRY_BYTES


def headers_file_bytes(num_blocks: int) -> int:
    """The size of `headers.bin` for a store of `num_blocks` slots."""
    return FILE_HEADER_BYTES + num_blocks * ENTRY_BYTES


def slots_in_headers_file(size: int) -> int:
    """How many slots a `headers.bin` of `size` bytes has entries for."""
    return max(0, size - FILE_HEADER_BYTES) // ENTRY_BYTES
