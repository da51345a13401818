"""The stores of a log index's commit for a batch's new records (log_index.py's
`LogIndex._apply_new`), apart from it: the slots that held their keys cleared, the newest
record per slot written, the regions' live bytes kept. In one compiled loop when the core is
built (`_plan_core.apply_new`), else with array operations (`apply_new_arrays`, the
reference): the same index after either (`tests/test_disk_log_plan.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.log_format import RECORD_HEADER_BYTES, TOMBSTONE
from kvtier.tiers.disk.log_rows import NO_REGION, NewRecords, Placed

_compiled_apply: Callable[..., int] | None
try:  # the compiled stores, present only when kvtier.compiled selected them
    from kvtier.tiers.disk._plan_core import apply_new as _compiled_apply
except ImportError:
    _compiled_apply = None

_INDEX_TYPES = (
    ("keys", np.uint8),
    ("key_len", np.uint8),
    ("region", np.int32),
    ("offset", np.uint32),
    ("length", np.uint32),
    ("codec", np.uint8),
    ("seq", np.uint64),
    ("checksum", np.uint64),
    ("live", np.int64),
)
_PLACED_TYPES = (
    ("region", np.int64),
    ("offset", np.int64),
    ("length", np.int64),
    ("codec", np.int64),
    ("seq", np.uint64),
    ("checksum", np.uint64),
)
_NEW_TYPES = (
    ("chosen", np.int64),
    ("target", np.int64),
    ("clear", np.int64),
    ("rows", np.uint8),
    ("lengths", np.int64),
    ("key_sizes", np.int64),
)


class LogIndex(Protocol):
    """What these stores use of log_index.py's `LogIndex` (which imports this module)."""

    keys: np.ndarray[Any, np.dtype[np.uint8]]
    key_len: np.ndarray[Any, np.dtype[np.uint8]]
    region: np.ndarray[Any, np.dtype[np.int32]]
    offset: np.ndarray[Any, np.dtype[np.uint32]]
    length: np.ndarray[Any, np.dtype[np.uint32]]
    codec: np.ndarray[Any, np.dtype[np.uint8]]
    seq: np.ndarray[Any, np.dtype[np.uint64]]
    checksum: np.ndarray[Any, np.dtype[np.uint64]]
    live: np.ndarray[Any, np.dtype[np.int64]]
    blocks: int
    written: dict[OffloadKey, int]
    compiled_commit: Callable[..., int] | None

    def _sizes(self, slots: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.int64]]: ...


def _typed(owner: Any, types: tuple[tuple[str, Any], ...]) -> bool:
    """Whether each array named in `types` is C-contiguous of its dtype."""
    for name, dtype in types:
        array = getattr(owner, name)
        if array.dtype != dtype or not array.flags.c_contiguous:
            return False
    return True


def apply_new(index: LogIndex, placed: Placed, new: NewRecords) -> None:
    """`index`'s stores for the new records of `placed` as its plan chose them (`new`), under
    its lock: compiled when every array is of the types it is built with (a checkpoint's,
    loaded, checked too), else `apply_new_arrays`."""
    compiled = index.compiled_commit
    if (
        compiled is not None
        and _typed(index, _INDEX_TYPES)
        and _typed(placed, _PLACED_TYPES)
        and _typed(new, _NEW_TYPES)
    ):
        cleared = compiled(
            new.chosen, new.target, new.clear, new.rows, new.lengths, new.key_sizes,
            placed.region, placed.offset, placed.length, placed.codec, placed.seq,
            placed.checksum, index.keys, index.key_len, index.region, index.offset,
            index.length, index.codec, index.seq, index.checksum, index.live,
            TOMBSTONE, RECORD_HEADER_BYTES,
        )  # fmt: skip
        index.blocks += new.held - cleared
        index.written.update(new.written)
        return
    apply_new_arrays(index, placed, new)


def apply_new_arrays(index: LogIndex, placed: Placed, new: NewRecords) -> None:
    """`apply_new` with array operations: the slots that held the keys cleared
    (`clear_many`), the newest record per slot written."""
    clear_many(index, new.clear)
    chosen, target = new.chosen, new.target
    index.keys[target] = new.rows
    index.key_len[target] = new.lengths
    index.region[target] = placed.region[chosen]
    index.offset[target] = placed.offset[chosen]
    index.length[target] = placed.length[chosen]
    index.codec[target] = placed.codec[chosen]
    index.seq[target] = placed.seq[chosen]
    index.checksum[target] = placed.checksum[chosen]
    sizes = new.key_sizes + ((placed.length[chosen].astype(np.int64) + 7) & ~7)
    np.add.at(index.live, placed.region[chosen], sizes)  # `_sizes`, from the batch
    index.blocks += new.held
    index.written.update(new.written)


def clear_many(index: LogIndex, slots: np.ndarray[Any, Any]) -> None:
    """`index._clear` of each of `slots` (distinct), with array operations."""
    regions = index.region[slots]
    held = regions != NO_REGION
    slots = slots[held]
    if not slots.size:
        return
    np.subtract.at(index.live, regions[held], index._sizes(slots))
    index.blocks -= int(np.count_nonzero(index.codec[slots] != TOMBSTONE))
    index.region[slots] = NO_REGION
