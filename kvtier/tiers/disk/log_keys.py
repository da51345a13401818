"""The keys of a log store's index as arrays (log_index.py): a batch's keys as zero-padded
rows, a 64-bit hash per row (what the index's sorted hashes are searched by), and the keys a
batch writes twice. Array operations only, so that applying a batch runs no Python code per
key; one key's hash in Python integers (`key_hash`) for a single look-up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvtier.keys import OffloadKey


def pick(keys: list[OffloadKey], at: np.ndarray[Any, Any]) -> list[OffloadKey]:
    """The keys at positions `at` (C-level iteration, no Python code per key)."""
    return list(map(keys.__getitem__, at.tolist()))


def key_rows(
    keys: list[OffloadKey], lengths: np.ndarray[Any, Any], width: int
) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The keys as zero-padded rows of `width` bytes (each at most that long): their bytes
    joined once and scattered into the rows with array operations."""
    joined = np.frombuffer(b"".join(keys), dtype=np.uint8)
    if joined.size == len(keys) * width:  # every key of the full width
        return joined.reshape(len(keys), width).copy()
    rows = np.zeros((len(keys), width), dtype=np.uint8)
    rows[np.arange(width) < lengths[:, None]] = joined
    return rows


def written_again(
    rows: np.ndarray[Any, Any],
    lengths: np.ndarray[Any, Any],
    blocks: np.ndarray[Any, Any],
    last: np.ndarray[Any, Any],
) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """For each record at position `last` (each its slot's last in the batch), whether it
    is a block (one of the positions `blocks`) whose key a later block record of the batch
    wrote again (into another slot: this one was its slot's last): that one is the key's
    newest."""
    again = np.zeros(last.size, dtype=bool)
    named = np.concatenate([rows[blocks], lengths[blocks, None].astype(np.uint8)], axis=1)
    whole = np.ascontiguousarray(named).view(np.dtype((np.void, named.shape[1]))).ravel()
    _, group = np.unique(whole, return_inverse=True)
    newest = np.full(int(group.max()) + 1, -1, dtype=np.int64)
    np.maximum.at(newest, group, blocks)
    group_of = np.full(rows.shape[0], -1, dtype=np.int64)
    group_of[blocks] = group
    mine = group_of[last]
    again[mine >= 0] = newest[mine[mine >= 0]] > last[mine >= 0]
    return again


_MASK = (1 << 64) - 1
_LENGTH_MIX = 0x9E3779B97F4A7C15
_WORD_MIX = 0xFF51AFD7ED558CCD


def key_hash(key: bytes, width: int) -> int:
    """`row_hashes` of one key, in Python integers (no array built for one key)."""
    padded = key.ljust(width, b"\0")
    value = (len(key) * _LENGTH_MIX) & _MASK
    for at in range(0, width, 8):
        value ^= int.from_bytes(padded[at : at + 8], "little")
        value = (value * _WORD_MIX) & _MASK
        value ^= value >> 33
    return value


def row_hashes(rows: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A 64-bit hash of each zero-padded key row (its length mixed in), with array operations."""
    words = np.ascontiguousarray(rows).view(np.uint64)
    with np.errstate(over="ignore"):
        hashes = lengths.astype(np.uint64) * np.uint64(_LENGTH_MIX)
        for column in range(words.shape[1]):
            hashes ^= words[:, column]
            hashes *= np.uint64(_WORD_MIX)
            hashes ^= hashes >> np.uint64(33)
    return hashes
