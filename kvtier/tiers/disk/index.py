"""The durable index of a disk store: which key lives in which slot, in an LMDB environment.

LMDB gives crash-safe transactions (copy-on-write B-tree, two meta pages), so a batch of
records is committed all or nothing and a process killed mid-commit leaves the previous state.
Two named databases: `meta` holds the layout record (layout.py) that every open checks, and
`blocks` maps an `OffloadKey` to a packed `IndexRecord` (layout.py). This module is the LMDB
I/O only; what the records mean is layout.py's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import lmdb

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.index_check import DATA_FILE, move_aside
from kvtier.tiers.disk.io import round_up
from kvtier.tiers.disk.layout import IndexRecord, StoreLayout
from kvtier.tiers.disk.safety import preallocate
from kvtier.tiers.trusted import FILE_MODE, FileId, file_id, make_dirs, open_file, refuse_symlink

_META_DB = b"meta"
_BLOCKS_DB = b"blocks"
_LAYOUT_KEY = b"layout"
_NUM_BLOCKS_KEY = b"num_blocks"

DAMAGE_ERRORS = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.PanicError,
    lmdb.InvalidError,
    lmdb.BadTxnError,
)
"""LMDB errors that mean the index file is damaged (not full, not busy)."""

_log = logging.getLogger("kvtier.disk")
_LMDB_FILES = (DATA_FILE, "lock.mdb")
_SCAN_CHUNK = 4096
"""Records per slice of a whole-index read (`packed_values`)."""
_REPLACE_BATCH = 65536
"""Records per transaction when an index is written whole (a rebuild, a replacement)."""


def index_reserve(num_blocks: int) -> int:
    """Bytes reserved for the index file of `num_blocks` slots (about 512 per slot, at least
    1 MiB)."""
    return max(1 << 20, round_up(num_blocks * 512, 1 << 20))


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
        self._reading = threading.Lock()
        """Held by the read transactions of other threads than the writer's (`get`,
        `chunks`), so that growing the map never happens under one of them."""
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

    def packed_values(self) -> tuple[bytes, int]:
        """(every packed record joined, in key order; how many records), from one read
        snapshot: the records of a whole index in one pass without an object per record."""
        with self._env.begin(db=self._blocks) as txn, txn.cursor() as cursor:
            count = int(txn.stat(self._blocks)["entries"])
            values = cursor.iternext(keys=False, values=True)
            joined = bytearray()
            # In slices: never an object per record for the whole index at once (they
            # would stay as fragmented small-object memory after being freed).
            while chunk := list(itertools.islice(values, _SCAN_CHUNK)):
                joined += b"".join(chunk)
            return bytes(joined), count

    def keys_at(self, positions: Iterable[int]) -> dict[int, OffloadKey]:
        """The keys at these positions of the key order (as `packed_values` lists them)."""
        wanted = set(positions)
        found: dict[int, OffloadKey] = {}
        if not wanted:
            return found
        with self._env.begin(db=self._blocks) as txn, txn.cursor() as cursor:
            keys = cursor.iternext(keys=True, values=False)
            at = 0
            for position in sorted(position for position in wanted if position >= 0):
                # The keys between two wanted positions are skipped inside C (islice), not
                # by a Python loop over the whole index: a few keys near the end of 10^6
                # cost a fraction of the walk.
                key = next(itertools.islice(keys, position - at, None), None)
                if key is None:
                    break
                found[position] = OffloadKey(bytes(key))
                at = position + 1
        return found

    def get(self, key: OffloadKey) -> bytes | None:
        """The packed record of `key`, or None."""
        with self._reading, self._env.begin(db=self._blocks) as txn:
            value = txn.get(key)
        return None if value is None else bytes(value)

    def chunks(self, size: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """Every (keys, packed records) in key order, `size` at a time, each chunk from a
        read snapshot of its own (a long walk never holds one snapshot open)."""
        after: bytes | None = None
        while True:
            with self._reading, self._env.begin(db=self._blocks) as txn, txn.cursor() as cursor:
                if after is None:
                    positioned = cursor.first()
                else:
                    positioned = cursor.set_range(after) and (
                        cursor.key() != after or cursor.next()
                    )
                if not positioned:
                    return
                items = list(itertools.islice(cursor.iternext(keys=True, values=True), size))
            if not items:
                return
            keys = [key for key, _ in items]
            values = [value for _, value in items]
            after = keys[-1]
            yield keys, values

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
                with self._reading:  # no read transaction of another thread may be open
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
                with self._reading:  # no read transaction of another thread may be open
                    self._env.set_mapsize(self._env.info()["map_size"] * 2)

    def close(self) -> None:
        """Close the environment (committed data is already on disk)."""
        self._env.close()

    def write_all(self, records: list[tuple[OffloadKey, bytes]]) -> None:
        """Write `records` (key, packed record) in transactions of a bounded size."""
        for start in range(0, len(records), _REPLACE_BATCH):
            self.update((), records[start : start + _REPLACE_BATCH])


class IndexHome:
    """The directory of a store's index: opens the LMDB environment there, its files' mode
    tightened and its space reserved, and replaces a damaged one with a fresh one."""

    def __init__(self, path: Path, layout: StoreLayout, *, durable: bool) -> None:
        self.path = path
        self.layout = layout
        self.durable = durable

    def open(self) -> BlockIndex:
        """Open (or create) the index, the files it creates 0600 and its map preallocated,
        so a full disk fails here, not at a later commit."""
        reserve = index_reserve(self.layout.num_blocks)
        new_files = []
        for name in _LMDB_FILES:
            refuse_symlink(self.path / name)  # LMDB opens them itself, following links
            if not (self.path / name).exists():
                new_files.append(self.path / name)
        index = BlockIndex(self.path, map_size=reserve, durable=self.durable)
        try:
            for path in new_files:  # only what this open created: a umask may narrow it
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(path, FILE_MODE)
            fd = open_file(self.path / DATA_FILE, os.O_RDWR)
            try:
                if os.fstat(fd).st_size < reserve:
                    preallocate(fd, reserve, self.path / DATA_FILE)
            finally:
                os.close(fd)
        except BaseException:
            index.close()
            raise
        return index

    def file_id(self) -> FileId | None:
        """The identity of the index's data file now, or None when it cannot be examined
        (it is then not watched: the other files still are)."""
        try:
            return file_id(self.path / DATA_FILE)
        except OSError:
            return None

    def replace(
        self, damaged: BlockIndex, records: list[tuple[OffloadKey, bytes]], why: str
    ) -> BlockIndex:
        """Close `damaged` (damaged because `why`), move it aside (logged) and open a fresh
        index holding `records` (key, packed record): the caller's truth in memory. Raises
        lmdb.Error / OSError when that fails (the fresh index is then closed)."""
        with contextlib.suppress(lmdb.Error):
            damaged.close()
        aside = move_aside(self.path)
        _log.error(
            "disk tier %s: %s; moved it aside to %s, rebuilding", self.path.parent, why, aside
        )
        make_dirs(self.path, create_parents=False)
        fresh = self.open()
        try:
            fresh.write_layout(self.layout.meta(), self.layout.num_blocks)
            fresh.write_all(records)
        except BaseException:
            fresh.close()
            raise
        return fresh
