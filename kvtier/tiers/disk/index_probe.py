"""Walk every record of a disk store's LMDB index, in a process of its own.

Run as a script (`python -I index_probe.py INDEX_DIR RECORD_BYTES MAX_KEY_BYTES`) by
`index_check.probe_index`, never imported by kvtier: a damaged LMDB file can make the process
that maps it die of SIGBUS or SIGSEGV, so the first walk of an index that was not closed
cleanly happens here, where such a death is an answer ("damaged") instead of a crash of the
serving engine. It imports only the standard library and lmdb, so it starts fast.

Prints one JSON object: {"records": N, "bad": M} (M: records whose key or value cannot be
this store's). Exit status 0 when the walk finished, 3 when LMDB refused the file. With a
fourth argument OUT_PATH, a walk that found no bad record also writes every record's value,
joined in key order, to OUT_PATH, and the keys to OUT_PATH.keys (their sizes, then the keys
joined): the opening store reads them from there instead of walking the index again.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

KEYS_SUFFIX = ".keys"
"""Next to OUT_PATH: every key's size (one byte each, key order), then the keys joined."""
_CHUNK = 16384


def _key_sizes(keys: list[bytes], max_key: int) -> bytes | None:
    """Every key's size, one byte each, or None when one is not in [1, max_key] (at most
    255): built and checked in C (bytes over map, translate), no loop per key in Python."""
    try:
        sizes = bytes(map(len, keys))
    except ValueError:  # a key longer than 255 bytes
        return None
    if sizes.translate(None, bytes(range(1, min(max_key, 255) + 1))):
        return None
    return sizes


class _Walk:
    """What a walk of the blocks database found: counts, and (while no record is bad) every
    record's value, every key's size and every key, joined in key order."""

    def __init__(self, record_bytes: int, max_key: int) -> None:
        self.record_bytes = record_bytes
        self.max_key = max_key
        self.records = 0
        self.bad = 0
        self.values = bytearray()
        self.sizes = bytearray()
        self.keys = bytearray()
        self.whole = True
        """Whether `values`, `sizes` and `keys` hold every record walked."""

    def add(self, keys: list[bytes], values: list[bytes]) -> None:
        """Take the next chunk of keys and their values (as many, unless the walk is
        damaged)."""
        self.records += len(keys)
        sizes = _key_sizes(keys, self.max_key)
        if len(keys) != len(values) or set(map(len, values)) - {self.record_bytes} or not sizes:
            self.bad += sum(
                1
                for key, value in zip(keys, values, strict=False)
                if len(value) != self.record_bytes or not 1 <= len(key) <= self.max_key
            ) + abs(len(keys) - len(values))
        if sizes is None:
            self.whole = False  # a key of over 255 bytes (sound only where max_key allows)
        elif not self.bad and self.whole:
            self.values += b"".join(values)
            self.sizes += sizes
            self.keys += b"".join(keys)


def _walk(txn: Any, blocks: Any, walk: _Walk) -> None:
    """Walk every record of `blocks`: two cursors in step (keys only, values only), a chunk
    at a time; each chunk made into objects in C (list over islice over the cursor's
    iterator) and checked by map. Chunks instead of two whole lists: the same objects' memory
    is reused, ~25 % faster at 10^6 records."""
    with txn.cursor(db=blocks) as by_key, txn.cursor(db=blocks) as by_value:
        keys = by_key.iternext(keys=True, values=False)
        values = by_value.iternext(keys=False, values=True)
        while chunk := list(itertools.islice(keys, _CHUNK)):
            walk.add(chunk, list(itertools.islice(values, len(chunk))))
        walk.bad += sum(1 for _ in values)  # values without a key: never in a sound walk


def main(argv: list[str]) -> int:
    """Walk the index named in `argv` and print what was found."""
    home = os.environ.get("KVTIER_PROBE_LMDB_HOME", "")
    if home and home not in sys.path:
        sys.path.append(home)  # after the standard library: lmdb's own folder (index_check)
    import lmdb

    path, record_bytes, max_key = argv[1], int(argv[2]), int(argv[3])
    out_path = argv[4] if len(argv) > 4 else None
    try:
        env = lmdb.open(path, readonly=True, lock=False, subdir=True, max_dbs=2, readahead=False)
    except lmdb.Error as error:
        print(json.dumps({"error": str(error)}))
        return 3
    walk = _Walk(record_bytes, max_key)
    try:
        meta = env.open_db(b"meta", create=False)
        blocks = env.open_db(b"blocks", create=False)
        with env.begin(db=meta) as txn, txn.cursor() as cursor:
            for _key, _value in cursor:
                pass
        with env.begin(db=blocks) as txn:
            _walk(txn, blocks, walk)
    except lmdb.Error as error:
        print(json.dumps({"error": str(error)}))
        return 3
    finally:
        env.close()
    if out_path is not None and not walk.bad and walk.whole:
        with open(out_path, "wb") as out:
            out.write(walk.values)
        with open(out_path + KEYS_SUFFIX, "wb") as out:
            out.write(walk.sizes)
            out.write(walk.keys)
    print(json.dumps({"records": walk.records, "bad": walk.bad}))
    return 0


if __name__ == "__main__":
    status = main(sys.argv)
    sys.stdout.flush()
    # Without the interpreter's teardown: freeing the walk's 2 x 10^6 objects one by one
    # would keep the opening store waiting ~0.1 s for nothing (the files are closed).
    os._exit(status)
