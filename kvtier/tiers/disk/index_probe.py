"""Walk every record of a disk store's LMDB index, in a process of its own.

Run as a script (`python -I index_probe.py INDEX_DIR RECORD_BYTES MAX_KEY_BYTES`) by
`index_check.probe_index`, never imported by kvtier: a damaged LMDB file can make the process
that maps it die of SIGBUS or SIGSEGV, so the first walk of an index that was not closed
cleanly happens here, where such a death is an answer ("damaged") instead of a crash of the
serving engine. It imports only the standard library and lmdb, so it starts fast.

Prints one JSON object: {"records": N, "bad": M} (M: records whose key or value cannot be
this store's). Exit status 0 when the walk finished, 3 when LMDB refused the file. With a
fourth argument OUT_PATH, a walk that found no bad record also writes every record's value,
joined in key order, to OUT_PATH: the opening store reads them from there instead of walking
the index a second time.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    """Walk the index named in `argv` and print what was found."""
    import lmdb

    path, record_bytes, max_key = argv[1], int(argv[2]), int(argv[3])
    out_path = argv[4] if len(argv) > 4 else None
    values: list[bytes] = []
    try:
        env = lmdb.open(path, readonly=True, lock=False, subdir=True, max_dbs=2, readahead=False)
    except lmdb.Error as error:
        print(json.dumps({"error": str(error)}))
        return 3
    records = bad = 0
    try:
        meta = env.open_db(b"meta", create=False)
        blocks = env.open_db(b"blocks", create=False)
        with env.begin(db=meta) as txn, txn.cursor() as cursor:
            for _key, _value in cursor:
                pass
        with env.begin(db=blocks) as txn, txn.cursor() as cursor:
            # Whole walks in C (list over the cursor's iterators), the sizes checked by map:
            # a large index is walked in a fraction of the time of a loop over its records.
            keys = list(cursor.iternext(keys=True, values=False))
            cursor.first()
            values = list(cursor.iternext(keys=False, values=True))
        records = len(keys)
        key_sizes = set(map(len, keys))
        if (
            records != len(values)
            or set(map(len, values)) - {record_bytes}
            or (key_sizes and (min(key_sizes) < 1 or max(key_sizes) > max_key))
        ):
            bad = sum(
                1
                for key, value in zip(keys, values, strict=False)
                if len(value) != record_bytes or not 1 <= len(key) <= max_key
            ) + abs(records - len(values))
    except lmdb.Error as error:
        print(json.dumps({"error": str(error)}))
        return 3
    finally:
        env.close()
    if out_path is not None and not bad:
        with open(out_path, "wb") as out:
            out.write(b"".join(values))
    print(json.dumps({"records": records, "bad": bad}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
