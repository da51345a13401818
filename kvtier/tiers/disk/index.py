"""The durable index of a disk store: which key lives in which slot, in an LMDB environment.

LMDB gives crash-safe transactions (copy-on-write B-tree, two meta pages), so a batch of
records is committed all or nothing and a process killed mid-commit leaves the previous state.
Two named databases: `meta` holds the layout (fingerprint, block size, model id, slots per
slab file) that every open checks, and `blocks` maps an `OffloadKey` to an `IndexRecord`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import lmdb

from kvtier.keys import OffloadKey

LAYOUT_VERSION = 2
"""Version of the on-disk layout (slab addressing, record format). Part of the fingerprint,
so blocks written under another layout are never served."""

_META_DB = b"meta"
_BLOCKS_DB = b"blocks"
_LAYOUT_KEY = b"layout"
_NUM_BLOCKS_KEY = b"num_blocks"


def layout_fingerprint(block_size: int, model_id: str) -> str:
    """A short hash of (layout version, block size, model id): the name of a store's
    directory and the value its index must record. Blocks of another model or block size
    live under another fingerprint and so are never read as this store's."""
    text = json.dumps(["kvtier-disk", LAYOUT_VERSION, block_size, model_id])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class IndexRecord:
    """Where and how one block is stored.

    `length` is the number of bytes stored at the start of the slot (the block size for a raw
    block, the frame size for a zstd one); `checksum` is xxh3-64 of exactly those bytes;
    `seq` grows with every record written, so the oldest blocks can be listed first.
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


class BlockIndex:
    """The LMDB environment of one store; every method is one transaction.

    Not thread-safe for writers on its own terms: the store serialises the methods that write
    (LMDB would block a second writer, but the store also orders its in-memory map with them).
    With `durable`, every commit is fsynced before it returns.
    """

    def __init__(self, path: Path, *, map_size: int, durable: bool) -> None:
        self.path = path
        self._env = lmdb.open(
            str(path),
            map_size=map_size,
            subdir=True,
            max_dbs=2,
            sync=durable,
            metasync=durable,
            mode=0o600,
            readahead=False,
        )
        try:
            self._meta = self._env.open_db(_META_DB)
            self._blocks = self._env.open_db(_BLOCKS_DB)
        except BaseException:
            self._env.close()
            raise

    @property
    def max_key_size(self) -> int:
        """The longest key LMDB accepts (511 bytes by default)."""
        return self._env.max_key_size()

    def read_layout(self) -> dict[str, Any] | None:
        """The layout recorded at creation, or None for a new index. Raises ValueError if it is
        not readable JSON of an object."""
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(_LAYOUT_KEY)
        if raw is None:
            return None
        layout = json.loads(raw)
        if not isinstance(layout, dict):
            raise ValueError(f"layout is not an object: {raw!r}")
        return layout

    def write_layout(self, layout: dict[str, Any], num_blocks: int) -> None:
        """Record the layout (at creation) and the number of slots of this open."""
        with self._env.begin(db=self._meta, write=True) as txn:
            txn.put(_LAYOUT_KEY, json.dumps(layout, sort_keys=True).encode())
            txn.put(_NUM_BLOCKS_KEY, str(num_blocks).encode())

    def items(self) -> Iterator[tuple[OffloadKey, bytes]]:
        """Every (key, packed record) in key order, from one read snapshot."""
        with self._env.begin(db=self._blocks) as txn, txn.cursor() as cursor:
            for key, value in cursor:
                yield OffloadKey(bytes(key)), bytes(value)

    def delete(self, keys: Iterable[OffloadKey]) -> None:
        """Remove the records of `keys` (absent ones are ignored), in one transaction."""
        with self._env.begin(db=self._blocks, write=True) as txn:
            for key in keys:
                txn.delete(key)

    def put(self, records: Iterable[tuple[OffloadKey, IndexRecord]]) -> None:
        """Write `records` (replacing a key's previous record), in one transaction. Grows the
        map once and retries if it is full."""
        batch = [(key, record.pack()) for key, record in records]
        for attempt in range(2):
            try:
                with self._env.begin(db=self._blocks, write=True) as txn:
                    for key, value in batch:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:
                if attempt:
                    raise
                self._env.set_mapsize(self._env.info()["map_size"] * 2)

    def update(
        self, deleted: Iterable[OffloadKey], records: Iterable[tuple[OffloadKey, bytes]]
    ) -> None:
        """In one transaction: remove the records of `deleted` (absent ones are ignored), then
        write `records` ((key, packed `IndexRecord`) each, replacing a key's record). This is
        the one commit of a store's write group. Grows the map once and retries if it is full."""
        removed = list(deleted)
        written = list(records)
        for attempt in range(2):
            try:
                with self._env.begin(db=self._blocks, write=True) as txn:
                    for key in removed:
                        txn.delete(key)
                    if written:
                        with txn.cursor() as cursor:
                            cursor.putmulti(written)
                return
            except lmdb.MapFullError:
                if attempt:
                    raise
                self._env.set_mapsize(self._env.info()["map_size"] * 2)

    def close(self) -> None:
        """Close the environment (committed data is already on disk)."""
        self._env.close()
