"""The on-disk format of a disk store, in one place: its files, where a slot's bytes are, the
slot headers, the index records and the checksum that binds a block to its key.

A store lives in `<directory>/kvtier-<fingerprint>/`::

    lock                 flock'ed while a store has it open
    headers.bin          a layout page, then one fixed-size entry per slot
    slab-00000.bin ...   preallocated; slot s at a fixed offset
    index/               LMDB (index.py): key -> IndexRecord
    inflight             the slots of the write group in progress (inflight.py)

**Slabs.** Slot `s` lives in file `s // slots_per_file` at byte offset `(s % slots_per_file)
* block_size`. Splitting the slots over several files (1 GiB each by default) keeps each file
a size every file system and backup tool handles, and lets a store grow or shrink by whole
files. A batch of slots is cut into runs of consecutive slots in one file, so that each run is
one `pwritev` / `preadv`.

**No record can serve another key's bytes.** A block's checksum is xxh3-64 of the stored
bytes, seeded with a hash of (namespace, key, slot, stored length, codec, sequence number).
The index record holds it and a read recomputes it from the key it was asked for, so a record
that points at another key's slot, at an older block of the same slot or at a block of another
namespace reads as a checksum failure, a miss, never as data.

**The index can be lost.** Every slot has an entry in `headers.bin` that repeats what its
index record says (key, sequence number, length, codec, bound checksum), with a checksum of
its own, so the headers alone can rebuild the index (recovery.py). `headers.bin` starts with a
FILE_HEADER_BYTES page recording the layout (fingerprint, block size, model id, slots per slab
file), so a store can be identified and checked from its directory alone.

`StoreLayout` is one store's geometry and format: the one object that knows its block size.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import xxhash

from kvtier.errors import DiskLayoutError, InvalidValueError
from kvtier.keys import MAX_KEY_BYTES, MIN_KEY_BYTES, OffloadKey
from kvtier.tiers.codec import Codec
from kvtier.tiers.disk.io import IOV_MAX

LAYOUT_VERSION = 2
"""Version of the on-disk layout (slab addressing, record format). Part of the fingerprint,
so blocks written under another layout are never served."""

HEADERS_FILE = "headers.bin"
INDEX_DIR = "index"
LOCK_FILE = "lock"
INFLIGHT_FILE = "inflight"

FILE_HEADER_BYTES = 4096
"""Bytes of `headers.bin` before the first slot's entry: the layout record, padded."""

ENTRY_BYTES = 320
"""Bytes of one slot's entry in `headers.bin`."""

NAMESPACE_BYTES = 20
"""The namespace bound into every block: the store's fingerprint (20 hex characters)."""

EMPTY_ENTRY = bytes(ENTRY_BYTES)
"""The entry of a slot that holds no block."""

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

Entries = np.ndarray[Any, np.dtype[np.void]]
"""Header entries (ENTRY_DTYPE records)."""

if _ENTRY.size > _ENTRY_CHECK_AT:  # pragma: no cover - a layout constant, checked at import
    raise RuntimeError("a header entry does not fit ENTRY_BYTES")


def layout_fingerprint(block_size: int, model_id: str) -> str:
    """A short hash of (layout version, block size, model id): the name of a store's
    directory and the value its index must record. Blocks of another model or block size
    live under another fingerprint and so are never read as this store's."""
    text = json.dumps(["kvtier-disk", LAYOUT_VERSION, block_size, model_id])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def slab_file_name(index: int) -> str:
    """The name of the `index`-th slab file."""
    return f"slab-{index:05d}.bin"


def namespace_bytes(fingerprint: str) -> bytes:
    """The namespace of a store with this fingerprint, as bound into its blocks."""
    raw = fingerprint.encode("ascii")
    if len(raw) != NAMESPACE_BYTES:
        raise ValueError(f"a fingerprint has {NAMESPACE_BYTES} characters, got {fingerprint!r}")
    return raw


@dataclass(frozen=True, slots=True)
class IndexRecord:
    """Where and how one block is stored: its index record.

    `length` is the number of bytes stored at the start of the slot (the block size for a raw
    block, the frame size for a zstd one); `checksum` is the bound checksum of exactly those
    bytes; `seq` grows with every record written, so the oldest blocks can be listed first.
    """

    slot: int
    length: int
    codec: int
    checksum: int
    seq: int

    FORMAT: ClassVar[struct.Struct] = struct.Struct("<QQBQQ")

    def pack(self) -> bytes:
        """The record as stored in LMDB (fixed size, little-endian)."""
        return self.FORMAT.pack(self.slot, self.length, self.codec, self.checksum, self.seq)

    @classmethod
    def unpack(cls, data: bytes) -> IndexRecord:
        """The record stored as `data`; raises ValueError if it has the wrong size."""
        if len(data) != cls.FORMAT.size:
            raise ValueError(f"an index record has {cls.FORMAT.size} bytes, got {len(data)}")
        return cls(*cls.FORMAT.unpack(data))


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
) -> Entries:
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

    def record(self, slot: int) -> IndexRecord:
        """The index record this header stands for, in `slot`."""
        return IndexRecord(slot, self.length, self.codec, self.checksum, self.seq)


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


@dataclass(frozen=True, slots=True)
class Run:
    """Blocks `members` (indices into a batch) in consecutive slots of file `file`, starting
    at byte `offset`; one system call moves them all."""

    file: int
    offset: int
    members: tuple[int, ...]


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidValueError(f"{name} must be a positive int, got {value!r}")
    return value


class StoreLayout:
    """The geometry and format of one store: `num_blocks` slots of `block_size` bytes,
    `slots_per_file` to a slab file, its blocks bound to the namespace of (block size, model
    id). Immutable; `with_slots_per_file` gives the layout an existing store recorded."""

    __slots__ = (
        "block_size",
        "fingerprint",
        "model_id",
        "namespace",
        "num_blocks",
        "num_files",
        "slots_per_file",
    )

    def __init__(
        self, num_blocks: int, block_size: int, slots_per_file: int = 1, model_id: str = ""
    ) -> None:
        self.block_size = _positive("block_size", block_size)
        self.num_blocks = _positive("num_blocks", num_blocks)
        self.slots_per_file = _positive("slots_per_file", slots_per_file)
        if not isinstance(model_id, str):
            raise InvalidValueError(f"model_id must be a str, got {model_id!r}")
        self.model_id = model_id
        self.fingerprint = layout_fingerprint(block_size, model_id)
        self.namespace = namespace_bytes(self.fingerprint)
        self.num_files = -(-num_blocks // slots_per_file)

    def with_slots_per_file(self, slots_per_file: int) -> StoreLayout:
        """This layout with `slots_per_file` slots to a slab file."""
        return StoreLayout(self.num_blocks, self.block_size, slots_per_file, self.model_id)

    def store_dir(self, directory: Path) -> Path:
        """The store's own directory under the configured `directory`."""
        return directory / f"kvtier-{self.fingerprint}"

    # -- slabs --------------------------------------------------------------------------------

    def file_bytes(self, file: int) -> int:
        """How long slab file `file` must be to hold its slots."""
        first = file * self.slots_per_file
        return min(self.slots_per_file, self.num_blocks - first) * self.block_size

    def locate(self, slot: int) -> tuple[int, int]:
        """(file index, byte offset in that file) of `slot`."""
        file, index = divmod(slot, self.slots_per_file)
        return file, index * self.block_size

    def runs(
        self,
        members: Sequence[int],
        slots: Sequence[int],
        *,
        ends_run: Callable[[int], bool] | None = None,
    ) -> list[Run]:
        """Cut the batch positions `members` into runs of consecutive slots in one file (at
        most IOV_MAX each), in slot order. A member for which `ends_run(member)` is true is
        the last of its run (a block written short of its slot cannot be followed by the next
        slot's bytes in the same call)."""
        # Hot (once per block of every batch): consecutive slots share a file unless the
        # later one starts a file.
        order = sorted(members, key=slots.__getitem__)
        per_file = self.slots_per_file
        runs: list[Run] = []
        current: list[int] = []
        previous = -2
        for member in order:
            slot = slots[member]
            if (
                slot == previous + 1
                and slot % per_file
                and len(current) < IOV_MAX
                and not (ends_run is not None and ends_run(current[-1]))
            ):
                current.append(member)
            else:
                if current:
                    runs.append(self._run(slots[current[0]], current))
                current = [member]
            previous = slot
        if current:
            runs.append(self._run(slots[current[0]], current))
        return runs

    def _run(self, first_slot: int, members: list[int]) -> Run:
        file, offset = self.locate(first_slot)
        return Run(file, offset, tuple(members))

    # -- records and headers ------------------------------------------------------------------

    def checksum(self, key: OffloadKey, record: IndexRecord, stored: Any) -> int:
        """The checksum `record` must hold for `key` whose stored bytes are `stored`."""
        return bound_checksum(
            self.namespace, key, record.slot, record.length, record.codec, record.seq, stored
        )

    def record_problem(self, record: IndexRecord) -> str | None:
        """What makes `record` impossible in this layout (slot, codec, length), or None."""
        if not 0 <= record.slot < self.num_blocks:
            return f"slot out of range [0, {self.num_blocks})"
        if record.codec not in tuple(Codec):
            return f"unknown codec {record.codec}"
        if not 1 <= record.length <= self.block_size or (
            record.codec == Codec.NONE and record.length != self.block_size
        ):
            return f"stored length {record.length} is impossible for codec {record.codec}"
        return None

    def entries(
        self,
        keys: Sequence[OffloadKey],
        slots: Sequence[int],
        lengths: Sequence[int],
        codecs: Sequence[int],
        seqs: Sequence[int],
        blocks: Sequence[Any],
    ) -> Entries:
        """The header entries of a write group's blocks (`group_entries` in this namespace)."""
        return group_entries(self.namespace, keys, slots, lengths, codecs, seqs, blocks)

    def pack_entry(self, key: OffloadKey, record: IndexRecord) -> bytes:
        """The header entry of `record`'s slot for the block `key`."""
        header = BlockHeader(key, record.seq, record.length, record.codec, record.checksum)
        return header.pack(self.namespace, record.slot)

    def unpack_entries(self, data: bytes, first: int) -> list[BlockHeader | None]:
        """The headers in `data`, the entries of slots `first`, `first + 1`, ... (None for an
        empty or unreadable one)."""
        view = memoryview(data)
        return [
            unpack_entry(view[i * ENTRY_BYTES : (i + 1) * ENTRY_BYTES], self.namespace, first + i)
            for i in range(len(data) // ENTRY_BYTES)
        ]

    # -- the layout record --------------------------------------------------------------------

    def meta(self, slots_per_file: int | None = None) -> dict[str, Any]:
        """The layout record written into the index and the header file."""
        return {
            "fingerprint": self.fingerprint,
            "layout_version": LAYOUT_VERSION,
            "block_size": self.block_size,
            "model_id": self.model_id,
            "slots_per_file": self.slots_per_file if slots_per_file is None else slots_per_file,
        }

    def matches(self, recorded: dict[str, Any]) -> bool:
        """Whether a recorded layout is this store's (any slots per file)."""
        return recorded == self.meta(recorded.get("slots_per_file", 0))

    def recorded_slots_per_file(self, recorded: dict[str, Any], where: str) -> int:
        """The slots per slab file of a recorded layout that must be this store's;
        DiskLayoutError naming `where` (the store and the record) when it is not."""
        if recorded.get("fingerprint") != self.fingerprint or not self.matches(recorded):
            raise DiskLayoutError(
                f"{where} records layout {recorded}, expected fingerprint "
                f"{self.fingerprint} (layout version {LAYOUT_VERSION}, block_size "
                f"{self.block_size}, model_id {self.model_id!r}); refusing to serve its blocks"
            )
        slots = recorded["slots_per_file"]
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise DiskLayoutError(f"{where}: bad slots_per_file {slots!r}")
        return slots
