"""The checkpoint of a log store's index: its packed arrays in one LMDB transaction.

A checkpoint is written in the background (never on the write path) from a consistent
snapshot of the index (`LogIndex.snapshot`), and read at open so that a restart scans only
the regions written since. LMDB makes a checkpoint all-or-nothing; a digest over its values
(LMDB checks none) makes a damaged one read as absent, and then the open scans every region;
so does one written for another store or geometry (its meta against the open's), and one
whose arrays name a region, bytes or a key length the store does not have (only a faulty
writer could: the open would index out of range on it).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import xxhash

_LOG = logging.getLogger(__name__)

_OWNER = ("version", "fingerprint", "store")
"""The meta naming the store a checkpoint was written for (the rest is its geometry)."""

_META = b"meta"
_DIGEST = b"digest"
_DTYPES = {
    "region": np.int32,
    "offset": np.uint32,
    "length": np.uint32,
    "codec": np.uint8,
    "key_len": np.uint8,
    "seq": np.uint64,
    "checksum": np.uint64,
    "keys": np.uint8,
    "epoch": np.uint64,
    "fill": np.int64,
    "hashes": np.uint64,
    "hashed_slots": np.int32,
}


def _digest(meta: bytes, values: dict[str, Any]) -> bytes:
    """xxh3-64 of the meta and the values (bytes or buffers), in name order."""
    hasher = xxhash.xxh3_64(meta)
    for name in sorted(values):
        hasher.update(name.encode())
        hasher.update(values[name])
    return hasher.digest()


def save(path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> None:
    """Write a checkpoint durably (one LMDB transaction, synced), replacing the last one."""
    values = {name: np.ascontiguousarray(array).tobytes() for name, array in arrays.items()}
    meta = {**meta, "key_width": int(arrays["keys"].shape[1])}
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    # Room for the last checkpoint (kept until this one commits) and this one, many times
    # over: LMDB places a large value in contiguous pages, and the map is only address space.
    need = max(1 << 30, sum(len(value) for value in values.values()) * 4 + (64 << 20))
    path.mkdir(mode=0o700, exist_ok=True)
    env = lmdb.open(str(path), map_size=need, subdir=True, max_dbs=0, lock=False)
    try:
        if env.info()["map_size"] < need:
            env.set_mapsize(need)
        with env.begin(write=True) as txn:
            for name, value in values.items():
                txn.put(name.encode(), value)
            txn.put(_META, meta_bytes)
            txn.put(_DIGEST, _digest(meta_bytes, values))
        env.sync(True)
    finally:
        env.close()


def load(path: Path, meta: dict[str, Any]) -> dict[str, np.ndarray[Any, Any]] | None:
    """The arrays of the checkpoint at `path` when it is sound and was written for a store of
    this `meta` (fingerprint, geometry), with its own meta under "meta"; else None (and a
    line in the log saying why, unless there is none)."""
    if not (path / "data.mdb").is_file():
        return None
    try:
        env = lmdb.open(str(path), readonly=True, subdir=True, lock=False, max_dbs=0)
    except lmdb.Error as error:
        _LOG.warning("log store checkpoint %s unreadable (%s): scanning every region", path, error)
        return None
    try:
        with env.begin(buffers=True) as txn:
            found = _read(txn, path)
    except lmdb.Error as error:
        _LOG.warning("log store checkpoint %s unreadable (%s): scanning every region", path, error)
        return None
    finally:
        env.close()
    if found is None:
        return None
    saved, arrays = found
    if any(saved.get(name) != meta[name] for name in _OWNER if name in meta):
        _LOG.warning(
            "log store checkpoint %s is not this store's (copied from another, or written for "
            "an earlier regions file): ignored, scanning every region",
            path,
        )
        return None
    if any(saved.get(name) != value for name, value in meta.items()):
        _LOG.warning("log store checkpoint %s is of another geometry: scanning every region", path)
        return None
    width = int(saved.get("key_width", 0))
    blocks, regions = int(meta["num_blocks"]), int(meta["num_regions"])
    if width <= 0 or arrays["keys"].size != blocks * width:
        return None
    arrays["keys"] = arrays["keys"].reshape(blocks, width)
    per_slot = ("region", "offset", "length", "codec", "key_len", "seq", "checksum")
    if any(arrays[name].size != blocks for name in per_slot):
        return None
    hashed = arrays["hashed_slots"]
    if arrays["hashes"].size != hashed.size or hashed.size > blocks:
        return None
    if hashed.size and (int(hashed.min()) < 0 or int(hashed.max()) >= blocks):
        return None
    if arrays["epoch"].size != regions or arrays["fill"].size != regions:
        return None
    if not _in_range(arrays, regions, int(meta.get("region_bytes", 0)), width):
        _LOG.warning("log store checkpoint %s names places outside the store: ignored", path)
        return None
    arrays["meta"] = np.array([int(saved.get("next_seq", 0)), int(saved.get("next_epoch", 0))])
    return arrays


def _in_range(
    arrays: dict[str, np.ndarray[Any, Any]], regions: int, region_bytes: int, width: int
) -> bool:
    """Whether every record the arrays hold lies inside the store (a region it has, its
    bytes inside the region, a key no longer than the rows) and every region's fill inside
    its region: what a checkpoint written by a faulty kvtier could break, and the open would
    index out of range on."""
    region = arrays["region"]
    if region.size and (int(region.min()) < -1 or int(region.max()) >= regions):
        return False
    offset, length = arrays["offset"], arrays["length"]
    if region_bytes and offset.size:
        # uint32 arrays: each at most region_bytes (< 2**31) first, so their sum cannot wrap
        if max(int(offset.max()), int(length.max())) > min(region_bytes, (1 << 31) - 1):
            return False
        if int(np.where(region >= 0, offset + length, 0).max()) > region_bytes:
            return False
    if arrays["key_len"].size and int(arrays["key_len"].max()) > width:
        return False
    fill = arrays["fill"]
    return not fill.size or (
        int(fill.min()) >= 0 and (not region_bytes or int(fill.max()) <= region_bytes)
    )


def _read(
    txn: lmdb.Transaction, path: Path
) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]] | None:
    """The checkpoint's meta and its arrays (writable copies, the only copy an open makes of
    them: the values are read and digested in LMDB's map) if complete and sound; else None."""
    meta_bytes = txn.get(_META)
    digest = txn.get(_DIGEST)
    values = {name: txn.get(name.encode()) for name in _DTYPES}
    present = {name: value for name, value in values.items() if value is not None}
    if meta_bytes is None or digest is None or len(present) != len(values):
        _LOG.warning("log store checkpoint %s incomplete: scanning every region", path)
        return None
    meta_bytes = bytes(meta_bytes)
    if _digest(meta_bytes, present) != bytes(digest):
        _LOG.warning("log store checkpoint %s damaged: scanning every region", path)
        return None
    arrays = {
        name: np.frombuffer(value, dtype=_DTYPES[name]).copy() for name, value in present.items()
    }
    return json.loads(meta_bytes), arrays
