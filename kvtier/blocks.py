"""`BlockStatus`: the per-block state shared by a tier's backend, policy and manager."""

from __future__ import annotations

import ctypes


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
