"""`Backend`: slot allocation for one tier, and `SlotPoolBackend`, a pool of N fixed slots."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, NoReturn

from kvtier.blocks import BlockStatus, pending_blocks
from kvtier.errors import AllocationError, DoubleFreeError, InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.specs import BlockIDsLoadStoreSpec, LoadStoreSpec, as_medium, spec_type_of

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def medium_name(medium: str) -> str:
    """`medium` as a backend carries it (`kvtier.specs.as_medium`). Raises
    InvalidValueError for anything but a non-empty string."""
    if not isinstance(medium, str) or not medium:
        raise InvalidValueError(f"medium must be a non-empty string, got {medium!r}")
    return as_medium(medium)


# `list(map(_block_id, blocks))` reads every slot id in C: no comprehension frame, which on
# Python 3.11 costs as much as reading a one-block batch.
_block_id = attrgetter("block_id")


class Backend(ABC):
    """Allocates the slots of one tier and describes them as a LoadStoreSpec.

    A backend knows nothing of keys' recency or of bytes; the policy decides what to evict and
    the transfer handlers move bytes. Allocated blocks start being written (`ref_cnt == -1`).
    """

    def __init__(self, block_size: int, medium: str) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise InvalidValueError(f"block_size must be a positive int, got {block_size!r}")
        self.block_size = block_size
        self.medium: str = medium_name(medium)

    @property
    @abstractmethod
    def num_blocks(self) -> int:
        """Total number of slots."""

    @abstractmethod
    def get_num_free_blocks(self) -> int:
        """Number of slots that `allocate_blocks` can hand out now."""

    @abstractmethod
    def allocate_blocks(self, block_hashes: Sequence[OffloadKey]) -> list[BlockStatus]:
        """One new block (ref_cnt -1) per hash. Raises AllocationError, allocating nothing,
        when fewer slots are free than asked for."""

    @abstractmethod
    def free(self, block: BlockStatus) -> None:
        """Return a block's slot. Raises DoubleFreeError, changing nothing, if it is not
        allocated."""

    def free_blocks(self, blocks: Sequence[BlockStatus]) -> None:
        """Return the slots of several blocks, as `free` on each in order (which raises
        DoubleFreeError on a slot that is not allocated). A backend may override it to free a
        batch faster; `SlotPoolBackend` then checks every slot first and frees none on error."""
        for block in blocks:
            self.free(block)

    def allocate_with_spec(
        self, block_hashes: Sequence[OffloadKey]
    ) -> tuple[list[BlockStatus], LoadStoreSpec]:
        """`allocate_blocks`, and the spec of where the new blocks are to be written: what a
        store needs, in one call (a backend may build both from the same slot ids)."""
        blocks = self.allocate_blocks(block_hashes)
        return blocks, self.get_load_store_spec(block_hashes, blocks)

    def evict_blocks(
        self, block_hashes: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> LoadStoreSpec:
        """Free the slots of evicted blocks (as `free_blocks`) and return where the blocks
        were: their bytes stay there until a slot is allocated again, which lets a chained
        manager demote them first."""
        spec = self.get_load_store_spec(block_hashes, blocks)
        self.free_blocks(blocks)
        return spec

    @abstractmethod
    def get_load_store_spec(
        self, block_hashes: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> LoadStoreSpec:
        """Where `blocks` (of `block_hashes`) live in this medium."""


class SlotPoolBackend(Backend):
    """A tier of `num_blocks` fixed-size slots, numbered 0..num_blocks-1.

    Fresh slots are handed out in increasing order before freed ones are reused (last freed,
    first reused), so a new tier fills its storage front to back.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        medium: str,
        spec_type: type[BlockIDsLoadStoreSpec] | None = None,
    ) -> None:
        super().__init__(block_size, medium)
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise InvalidValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self._num_blocks = num_blocks
        if spec_type is None:
            spec_type = spec_type_of(self.medium)
        self._spec_type = spec_type
        self._num_fresh_used = 0  # slots [0, _num_fresh_used) have been handed out once
        self._free_list: list[int] = []
        try:
            self._allocated = bytearray(num_blocks)  # 1 where the slot is allocated
        except MemoryError:
            raise InvalidValueError(
                f"num_blocks {num_blocks:,}: this machine has not the memory to keep track of "
                "that many slots; lower the tier's capacity"
            ) from None

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    def get_num_free_blocks(self) -> int:
        return len(self._free_list) + self._num_blocks - self._num_fresh_used

    def allocate_blocks(self, block_hashes: Sequence[OffloadKey]) -> list[BlockStatus]:
        return pending_blocks(self._allocate_slots(len(block_hashes)))

    def allocate_with_spec(
        self, block_hashes: Sequence[OffloadKey]
    ) -> tuple[list[BlockStatus], LoadStoreSpec]:
        # The spec comes from the slot ids just chosen: no block_id read back per block.
        slots = self._allocate_slots(len(block_hashes))
        return pending_blocks(slots), self._spec_type.from_valid_ids(slots)

    def _allocate_slots(self, wanted: int) -> list[int]:
        """Mark `wanted` slots allocated and return them: fresh slots in increasing order,
        then the most recently freed ones."""
        free = self.get_num_free_blocks()
        if wanted > free:
            raise AllocationError(
                f"{self.medium} backend: asked for {wanted} blocks, only {free} of "
                f"{self._num_blocks} are free"
            )
        start = self._num_fresh_used
        num_fresh = min(wanted, self._num_blocks - start)
        self._num_fresh_used = start + num_fresh
        self._allocated[start : start + num_fresh] = b"\x01" * num_fresh
        slots = list(range(start, start + num_fresh))
        num_reused = wanted - num_fresh
        if num_reused:
            # The last freed slots, most recently freed first (as popping them one by one).
            free_list, allocated = self._free_list, self._allocated
            reused = free_list[-num_reused:]
            del free_list[-num_reused:]
            reused.reverse()
            for slot in reused:
                allocated[slot] = 1
            slots += reused
        return slots

    def restore(self, slots: Sequence[int]) -> list[BlockStatus]:
        """Allocate exactly these slots (blocks found in a persistent tier at open), on an empty
        pool. Raises AllocationError, allocating nothing, on a repeated or out-of-range slot or
        a pool already in use."""
        if self._num_fresh_used or self._free_list:
            raise AllocationError(f"{self.medium} backend: restore needs an unused pool")
        wanted = set(slots)
        if len(wanted) != len(slots):
            raise AllocationError(f"{self.medium} backend: restore got a slot twice")
        bad = [slot for slot in slots if not 0 <= slot < self._num_blocks]
        if bad:
            raise AllocationError(
                f"{self.medium} backend: slot {bad[0]} is not a slot of this pool "
                f"(0..{self._num_blocks - 1})"
            )
        if not slots:
            return []
        top = max(slots) + 1
        self._num_fresh_used = top
        # The gaps below the highest restored slot are free; lowest handed out first.
        self._free_list = [slot for slot in range(top - 1, -1, -1) if slot not in wanted]
        for slot in slots:
            self._allocated[slot] = 1
        return [BlockStatus(slot) for slot in slots]

    def restore_slots(self, slots: Sequence[int] | npt.NDArray[np.int64]) -> None:
        """`restore` without an object per slot (a tier's compact restore,
        `kvtier.manager.cold`): the slots are allocated, nothing is returned."""
        import numpy as np

        if self._num_fresh_used or self._free_list:
            raise AllocationError(f"{self.medium} backend: restore needs an unused pool")
        wanted = np.asarray(slots, dtype=np.int64)
        if not len(wanted):
            return
        if wanted.min() < 0 or wanted.max() >= self._num_blocks:
            raise AllocationError(
                f"{self.medium} backend: a restored slot is not a slot of this pool "
                f"(0..{self._num_blocks - 1})"
            )
        marks = np.frombuffer(self._allocated, dtype=np.uint8)
        marks[wanted] = 1
        if int(np.count_nonzero(marks)) != len(wanted):
            marks[:] = 0
            raise AllocationError(f"{self.medium} backend: restore got a slot twice")
        top = int(wanted.max()) + 1
        self._num_fresh_used = top
        # The gaps below the highest restored slot are free; lowest handed out first.
        self._free_list = np.flatnonzero(marks[:top] == 0)[::-1].tolist()

    def free(self, block: BlockStatus) -> None:
        slot = block.block_id
        if not 0 <= slot < self._num_blocks:
            raise DoubleFreeError(
                f"{self.medium} backend: block id {slot} is not a slot of this pool "
                f"(0..{self._num_blocks - 1})"
            )
        if not self._allocated[slot]:
            raise DoubleFreeError(f"{self.medium} backend: block id {slot} is already free")
        self._allocated[slot] = 0
        self._free_list.append(slot)

    def free_blocks(self, blocks: Sequence[BlockStatus]) -> None:
        self._free_slots(list(map(_block_id, blocks)))

    def evict_blocks(
        self, block_hashes: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> LoadStoreSpec:
        # One block_id read per block serves both the spec and the free.
        slots = list(map(_block_id, blocks))
        self._free_slots(slots)
        return self._spec_type.from_valid_ids(slots)

    def _free_slots(self, slots: list[int]) -> None:
        if not slots:
            return
        allocated = self._allocated
        # Check every slot before freeing any, with C-level passes (no Python call per slot).
        if (
            min(slots) < 0
            or max(slots) >= self._num_blocks
            or 0 in map(allocated.__getitem__, slots)
            or len(set(slots)) != len(slots)
        ):
            self._raise_for_bad_batch(slots)
        for slot in slots:
            allocated[slot] = 0
        self._free_list += slots

    def _raise_for_bad_batch(self, slots: list[int]) -> NoReturn:
        """Raise the DoubleFreeError that freeing `slots` one by one would raise first."""
        seen: set[int] = set()
        for slot in slots:
            if not 0 <= slot < self._num_blocks:
                raise DoubleFreeError(
                    f"{self.medium} backend: block id {slot} is not a slot of this pool "
                    f"(0..{self._num_blocks - 1})"
                )
            if not self._allocated[slot] or slot in seen:
                raise DoubleFreeError(f"{self.medium} backend: block id {slot} is already free")
            seen.add(slot)
        raise AssertionError("_raise_for_bad_batch called on a valid batch")

    def get_load_store_spec(
        self, block_hashes: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> LoadStoreSpec:
        # The ids come from our own blocks: valid slot ids, no need to re-validate them.
        return self._spec_type.from_valid_ids(list(map(_block_id, blocks)))

    def __repr__(self) -> str:
        return (
            f"SlotPoolBackend(medium={str(self.medium)!r}, num_blocks={self._num_blocks}, "
            f"block_size={self.block_size}, free={self.get_num_free_blocks()})"
        )
