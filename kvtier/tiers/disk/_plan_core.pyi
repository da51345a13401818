"""Types of the log's compiled bookkeeping (`_plan_core.pyx`) for mypy."""

from typing import Any

import numpy as np

from kvtier.keys import OffloadKey

def plan_new(
    keys: list[OffloadKey],
    which_np: np.ndarray[Any, np.dtype[np.int64]],
    slot_np: np.ndarray[Any, np.dtype[np.int64]],
    codec_np: np.ndarray[Any, np.dtype[np.int64]],
    index_keys: np.ndarray[Any, np.dtype[np.uint8]],
    key_len: np.ndarray[Any, np.dtype[np.uint8]],
    region: np.ndarray[Any, np.dtype[np.int32]],
    codec: np.ndarray[Any, np.dtype[np.uint8]],
    written: dict[OffloadKey, int],
    hashes: np.ndarray[Any, np.dtype[np.uint64]],
    hashed_slots: np.ndarray[Any, np.dtype[np.int32]],
    tombstone: int,
    header_bytes: int,
) -> tuple[
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.uint8]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
    int,
    dict[OffloadKey, int],
]: ...
def fit_run(
    start: int,
    end: int,
    records: int,
    key_bytes: int,
    key_lens_np: np.ndarray[Any, np.dtype[np.int64]],
    lengths_np: np.ndarray[Any, np.dtype[np.int64]],
    count: int,
    region_bytes: int,
    page: int,
    entry_bytes: int,
    fixed: int,
) -> tuple[int, np.ndarray[Any, np.dtype[np.int64]]] | None: ...
def pack_entries(
    out: np.ndarray[Any, np.dtype[np.uint8]],
    at: int,
    keys: list[OffloadKey],
    slot: list[int],
    seq: list[int],
    checksum: list[int],
    offset: list[int],
    length: list[int],
    codec: list[int],
) -> int: ...
