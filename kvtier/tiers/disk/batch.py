"""The argument checks of a disk store's batch calls: keys, slots and buffers of a layout.

Every `read` and `write` passes through `check_batch`: a quick pass that only compares types
and attributes (the common case: bytes keys, int slots, contiguous block-sized uint8 arrays),
and, only when that fails, a slow pass that converts what it can and names what is wrong.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey, check_key
from kvtier.tiers.disk.layout import StoreLayout
from kvtier.tiers.storage import HostBuffer

_UINT8 = np.dtype(np.uint8)


def check_slot(slot: object, num_blocks: int, what: str) -> int:
    """`slot` as an int in [0, num_blocks), or an InvalidValueError naming `what`."""
    if isinstance(slot, bool):
        raise InvalidValueError(f"{what} must be an int, got {slot!r}")
    try:
        value = operator.index(slot)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidValueError(f"{what} must be an int, got {slot!r}") from None
    if not 0 <= value < num_blocks:
        raise InvalidValueError(f"{what} must be in [0, {num_blocks}), got {value}")
    return value


def check_keys(keys: Sequence[object]) -> list[OffloadKey]:
    """Every key checked (KeyFormatError naming the first bad one)."""
    return [check_key(key, f"keys[{i}]") for i, key in enumerate(keys)]


def check_batch(
    layout: StoreLayout,
    keys: Sequence[OffloadKey],
    slots: Sequence[int],
    buffers: Sequence[HostBuffer],
    *,
    writable: bool,
) -> tuple[list[OffloadKey], list[int], list[HostBuffer]]:
    """The batch as lists, or an InvalidValueError / KeyFormatError naming what is wrong:
    lengths that differ, a bad key, slot or buffer (`writable`: a buffer a read fills),
    a slot or key twice."""
    if not len(keys) == len(slots) == len(buffers):
        raise InvalidValueError(
            f"keys, slots and buffers must have the same length, got {len(keys)}, "
            f"{len(slots)} and {len(buffers)}"
        )
    key_list, slot_list, buffer_list = list(keys), list(slots), list(buffers)
    if not _plain(layout, key_list, slot_list, buffer_list, writable):
        key_list = check_keys(key_list)
        slot_list = [check_slot(s, layout.num_blocks, f"slots[{i}]") for i, s in enumerate(slots)]
        for i, buffer in enumerate(buffer_list):
            _check_buffer(layout, buffer, f"buffers[{i}]", writable)
    if len(set(slot_list)) != len(slot_list):
        twice = sorted(slot for slot in set(slot_list) if slot_list.count(slot) > 1)
        raise InvalidValueError(f"slots must be distinct within a batch, got {twice} twice")
    if len(set(key_list)) != len(key_list):
        raise InvalidValueError("keys must be distinct within a batch")
    return key_list, slot_list, buffer_list


def _plain(
    layout: StoreLayout, keys: list[Any], slots: list[Any], buffers: list[Any], writable: bool
) -> bool:
    """Whether every key, slot and buffer is of the plain valid kind (bytes, int, a contiguous
    block-sized uint8 array): a few type and attribute comparisons per block."""
    for key in keys:
        if type(key) is not bytes or not 0 < len(key) <= 511:
            return False
    num_blocks = layout.num_blocks
    for slot in slots:
        if type(slot) is not int or not 0 <= slot < num_blocks:
            return False
    shape = (layout.block_size,)
    for buffer in buffers:
        if (
            type(buffer) is not np.ndarray
            or buffer.dtype is not _UINT8
            or buffer.shape != shape
            or buffer.strides != (1,)
            or (writable and not buffer.flags.writeable)
        ):
            return False
    return True


def _check_buffer(layout: StoreLayout, buffer: object, what: str, writable: bool) -> None:
    """InvalidValueError naming `what` unless `buffer` is a contiguous 1-D uint8 array of the
    block size (and writable, with `writable`)."""
    if not isinstance(buffer, np.ndarray):
        raise InvalidValueError(f"{what} must be a numpy uint8 array, got {type(buffer).__name__}")
    contiguous = buffer.flags.c_contiguous
    if (
        buffer.dtype != np.uint8
        or buffer.ndim != 1
        or buffer.shape[0] != layout.block_size
        or not contiguous
    ):
        raise InvalidValueError(
            f"{what} must be a contiguous 1-D uint8 array of block_size "
            f"{layout.block_size} bytes, got dtype {buffer.dtype} shape {buffer.shape}"
            f"{'' if contiguous else ' (not contiguous)'}"
        )
    if writable and not buffer.flags.writeable:
        raise InvalidValueError(f"{what} is read-only; a read must fill it")
