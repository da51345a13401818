"""Walk every record of a disk store's LMDB index, in a process of its own.

Run as a script (`python -I index_probe.py INDEX_DIR RECORD_BYTES MAX_KEY_BYTES`) by
`index_check.probe_index`, never imported by kvtier: a damaged LMDB file can make the process
that maps it die of SIGBUS or SIGSEGV, so the first walk of an index that was not closed
cleanly happens here, where such a death is an answer ("damaged") instead of a crash of the
serving engine. It imports only the standard library and lmdb, so it starts fast.

Prints one JSON object: {"records": N, "bad": M} (M: records whose key or value cannot be
this store's). Exit status 0 when the walk finished, 3 when LMDB refused the file.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    """Walk the index named in `argv` and print what was found."""
    import lmdb

    path, record_bytes, max_key = argv[1], int(argv[2]), int(argv[3])
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
            for key, value in cursor:
                records += 1
                if len(value) != record_bytes or not 1 <= len(key) <= max_key:
                    bad += 1
    except lmdb.Error as error:
        print(json.dumps({"error": str(error)}))
        return 3
    finally:
        env.close()
    print(json.dumps({"records": records, "bad": bad}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
