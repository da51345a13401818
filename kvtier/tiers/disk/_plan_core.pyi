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
def apply_new(
    chosen: np.ndarray[Any, np.dtype[np.int64]],
    target: np.ndarray[Any, np.dtype[np.int64]],
    clear: np.ndarray[Any, np.dtype[np.int64]],
    rows: np.ndarray[Any, np.dtype[np.uint8]],
    lengths: np.ndarray[Any, np.dtype[np.int64]],
    key_sizes: np.ndarray[Any, np.dtype[np.int64]],
    placed_region: np.ndarray[Any, np.dtype[np.int64]],
    placed_offset: np.ndarray[Any, np.dtype[np.int64]],
    placed_length: np.ndarray[Any, np.dtype[np.int64]],
    placed_codec: np.ndarray[Any, np.dtype[np.int64]],
    placed_seq: np.ndarray[Any, np.dtype[np.uint64]],
    placed_checksum: np.ndarray[Any, np.dtype[np.uint64]],
    index_keys: np.ndarray[Any, np.dtype[np.uint8]],
    key_len: np.ndarray[Any, np.dtype[np.uint8]],
    region: np.ndarray[Any, np.dtype[np.int32]],
    offset: np.ndarray[Any, np.dtype[np.uint32]],
    length: np.ndarray[Any, np.dtype[np.uint32]],
    codec: np.ndarray[Any, np.dtype[np.uint8]],
    seq: np.ndarray[Any, np.dtype[np.uint64]],
    checksum: np.ndarray[Any, np.dtype[np.uint64]],
    live: np.ndarray[Any, np.dtype[np.int64]],
    tombstone: int,
    header_bytes: int,
) -> int: ...
def placed_columns(
    parts: list[Any], page: int, checksums: bool
) -> tuple[
    list[OffloadKey],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.uint64]],
    np.ndarray[Any, np.dtype[np.uint64]],
    np.ndarray[Any, np.dtype[np.int64]],
]: ...
def call_columns(
    keys: list[OffloadKey], buffers: list[Any], page: int, entry_bytes: int
) -> tuple[
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.int64]],
]: ...
