"""The values of a log store's index (log_index.py), apart from it: a slot's record as a
reader copies it out (`Row`), a batch of durable records as the index takes them
(`Placed`), and `apply`'s look-ups for a batch made ahead of its stores (`Plan`: the lane
plans a group while its writes and fdatasync run and commits it once they succeeded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtier.keys import OffloadKey

NO_REGION = -1
"""A slot holding no record (its region)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One slot's newest record, copied out of the index (`region` is never NO_REGION)."""

    key: OffloadKey
    region: int
    offset: int
    length: int
    codec: int
    seq: int
    checksum: int

    @property
    def payload_offset(self) -> int:
        """Offset of the stored bytes from the region's start (`offset`)."""
        return self.offset


@dataclass(slots=True)
class Placed:
    """Records written and synced, in the order written: what `LogIndex.apply` puts in the
    index, as arrays (one element per record) and the records' keys. A moved record
    (`moved_from` not NO_REGION: its region before a reclaim) applies only while its slot
    still holds it there."""

    keys: list[OffloadKey]
    slot: np.ndarray[Any, np.dtype[np.int64]]
    region: np.ndarray[Any, np.dtype[np.int64]]
    offset: np.ndarray[Any, np.dtype[np.int64]]
    length: np.ndarray[Any, np.dtype[np.int64]]
    codec: np.ndarray[Any, np.dtype[np.int64]]
    seq: np.ndarray[Any, np.dtype[np.uint64]]
    checksum: np.ndarray[Any, np.dtype[np.uint64]]
    moved_from: np.ndarray[Any, np.dtype[np.int64]]


@dataclass(slots=True)
class NewRecords:
    """What `apply` stores for a batch's records that were not moved (`LogIndex._plan_new`):
    per slot written its newest record (`chosen`: positions in the batch; `target`: the
    slots; their key rows, key lengths and record sizes less the payloads), the slots that
    lose a key (`clear`), the blocks among them and the dict's new entries; `width`: the
    key rows' width it was planned at."""

    width: int
    chosen: np.ndarray[Any, np.dtype[np.int64]]
    target: np.ndarray[Any, np.dtype[np.int64]]
    clear: np.ndarray[Any, np.dtype[np.int64]]
    rows: np.ndarray[Any, np.dtype[np.uint8]]
    lengths: np.ndarray[Any, np.dtype[np.int64]]
    key_sizes: np.ndarray[Any, np.dtype[np.int64]]
    held: int
    written: dict[OffloadKey, int]


@dataclass(slots=True)
class Plan:
    """`LogIndex.apply` of a batch worked out ahead (`LogIndex.plan`), to be `commit`ted:
    the batch, the index's `version` it was planned at (any change since, and it is planned
    again), the positions of its moved and new records, and what the new ones store."""

    placed: Placed
    version: int
    moved: np.ndarray[Any, np.dtype[np.int64]]
    new: np.ndarray[Any, np.dtype[np.int64]]
    new_records: NewRecords | None
