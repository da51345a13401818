"""`BlockStatus`: the per-block state shared by a tier's backend, policy and manager."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterable
from itertools import repeat


class BlockStatus(ctypes.Structure):
    """State of one block held by a tier.

    `ref_cnt`: -1 while the block is being written (not readable, not evictable); 0 when it is
    ready and evictable; n > 0 while n readers (loads, demotions) pin it.
    `block_id`: the slot that holds the block's bytes in its tier.

    A ctypes structure keeps the two fields in 16 bytes with no per-instance dict, since a tier
    holds one of these for every block it stores.
    """

    _fields_ = [("ref_cnt", ctypes.c_int32), ("block_id", ctypes.c_int64)]

    ref_cnt: int
    block_id: int

    def __init__(self, block_id: int) -> None:
        super().__init__()
        self.ref_cnt = -1
        self.block_id = block_id

    @property
    def is_ready(self) -> bool:
        """Whether the block's bytes are completely written and it may be read."""
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"BlockStatus(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


# BlockStatus's memory layout (native alignment, as ctypes lays the structure out).
_RECORD = struct.Struct("@iq")
if _RECORD.size != ctypes.sizeof(BlockStatus):  # pragma: no cover - a platform we never saw
    raise ImportError("BlockStatus does not have the layout of struct 'iq'")


def pending_blocks(block_ids: Iterable[int]) -> list[BlockStatus]:
    """New blocks being written (`ref_cnt == -1`), one per slot id, as `BlockStatus(block_id)`
    makes them.

    A backend allocates one per stored block. With the compiled constructor
    (`COMPILED_INIT`) each is `BlockStatus(block_id)`; without it each is copied from a
    packed (-1, block_id) record in C (`from_buffer_copy`), about three times faster than the
    Python-level `__init__`.
    """
    if COMPILED_INIT:
        return list(map(BlockStatus, block_ids))
    return list(map(BlockStatus.from_buffer_copy, map(_RECORD.pack, repeat(-1), block_ids)))


COMPILED_INIT = False
"""Whether `BlockStatus.__init__` is the compiled one (`kvtier/_blocks_core.pyx`): built by
`scripts/build-core` and selected by `kvtier.compiled`, it writes the two fields in C, about a
quarter of the Python `__init__`'s cost."""

try:  # the compiled constructor, present only when kvtier.compiled selected it
    import kvtier._blocks_core as _blocks_core
except ImportError:
    pass
else:
    COMPILED_INIT = _blocks_core.install(BlockStatus)
