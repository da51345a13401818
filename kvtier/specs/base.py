"""The LoadStoreSpec classes: one per built-in medium, and a generic one for any other."""

from __future__ import annotations

import enum
import functools
from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterable, Sequence
from typing import ClassVar, Self

import numpy as np
import numpy.typing as npt

from kvtier.errors import SpecError


class Medium(enum.StrEnum):
    """The built-in media: where kvtier's own tiers keep their blocks.

    A medium is a name (a `str`): tiers added through `kvtier.tiers.registry` have media of
    their own ("redis", ...), carried as plain strings; a `Medium` member equals its name.
    """

    GPU = "gpu"
    CPU = "cpu"
    DISK = "disk"


class LoadStoreSpec(ABC):
    """Says where a batch of blocks lives (or is to be written) in one medium.

    Specs are made per transfer, so every class declares `__slots__` (this one too: a
    subclass's slots only drop the per-instance dict when every base declares them)."""

    __slots__ = ()

    @classmethod
    @abstractmethod
    def medium(cls) -> str:
        """The medium this kind of spec addresses (a `Medium` for a built-in one)."""


def _as_block_ids(block_ids: Iterable[int] | npt.ArrayLike) -> npt.NDArray[np.int64]:
    if isinstance(block_ids, np.ndarray | list | tuple):
        array = np.asarray(block_ids)
    else:
        array = np.asarray(list(block_ids))  # type: ignore[arg-type]
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.ndim != 1:
        raise SpecError(f"block_ids must be one-dimensional, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise SpecError(f"block_ids must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=True)
    if array.size and int(array.min()) < 0:
        raise SpecError(f"block_ids must be non-negative, got {int(array.min())}")
    array.flags.writeable = False
    return array


_INT64 = np.dtype(np.int64)
_NO_BLOCK_IDS: npt.NDArray[np.int64] = np.empty(0, dtype=_INT64)
_NO_BLOCK_IDS.flags.writeable = False  # shared by every empty spec: immutable, so safe
_frombuffer = np.frombuffer


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    """Blocks addressed by slot ids within one medium's pool (an int64 numpy array)."""

    __slots__ = ("block_ids",)

    def __init__(self, block_ids: Iterable[int] | npt.ArrayLike) -> None:
        self.block_ids: npt.NDArray[np.int64] = _as_block_ids(block_ids)

    @classmethod
    def from_valid_ids(cls, block_ids: list[int]) -> Self:
        """A spec of `block_ids`, which the caller guarantees are non-negative ints (a
        backend's own slot ids); equal to `cls(block_ids)` but skips the constructor's
        validation and copies, which cost microseconds on every bookkeeping call. A subclass
        whose constructor sets more fields overrides it (as `GPULoadStoreSpec` does)."""
        spec = cls.__new__(cls)
        # `array("q")` converts the ints in C, and an array over immutable `bytes` is read-only
        # by construction: no `flags.writeable = False`, which costs as much as the copy.
        spec.block_ids = (
            _frombuffer(array("q", block_ids).tobytes(), _INT64) if block_ids else _NO_BLOCK_IDS
        )
        return spec

    def __len__(self) -> int:
        return int(self.block_ids.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockIDsLoadStoreSpec) or type(other) is not type(self):
            return NotImplemented
        return bool(np.array_equal(self.block_ids, other.block_ids)) and self._extra() == (
            other._extra()
        )

    def __hash__(self) -> int:
        return hash((type(self), self.block_ids.tobytes(), self._extra()))

    def _extra(self) -> tuple[object, ...]:
        return ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.block_ids.tolist()})"


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """Blocks of the GPU pool, possibly spanning several KV-cache groups.

    Block ids are ordered by group; `group_sizes[i]` blocks belong to group i (None: one group
    holding every block). `block_indices[i]`, when given, is the logical index (within the
    request) of group i's first block, so a worker can skip the unaligned head of an offloaded
    block that is larger than a GPU block.
    """

    __slots__ = ("block_indices", "group_sizes")

    def __init__(
        self,
        block_ids: Iterable[int] | npt.ArrayLike,
        group_sizes: Sequence[int] | None = None,
        block_indices: Sequence[int] | None = None,
    ) -> None:
        super().__init__(block_ids)
        sizes = (len(self),) if group_sizes is None else tuple(int(s) for s in group_sizes)
        if any(size < 0 for size in sizes):
            raise SpecError(f"group_sizes must be non-negative, got {list(sizes)}")
        if sum(sizes) != len(self):
            raise SpecError(
                f"sum(group_sizes) must equal len(block_ids): {sum(sizes)} != {len(self)}"
            )
        indices = None if block_indices is None else tuple(int(i) for i in block_indices)
        if indices is not None:
            if len(indices) != len(sizes):
                raise SpecError(
                    "len(block_indices) must equal len(group_sizes): "
                    f"{len(indices)} != {len(sizes)}"
                )
            if any(index < 0 for index in indices):
                raise SpecError(f"block_indices must be non-negative, got {list(indices)}")
        self.group_sizes: tuple[int, ...] = sizes
        self.block_indices: tuple[int, ...] | None = indices

    @classmethod
    def from_valid_ids(cls, block_ids: list[int]) -> Self:
        """A single-group spec of `block_ids` (see `BlockIDsLoadStoreSpec.from_valid_ids`)."""
        spec = super().from_valid_ids(block_ids)
        spec.group_sizes = (len(block_ids),)
        spec.block_indices = None
        return spec

    @classmethod
    def medium(cls) -> Medium:
        return Medium.GPU

    def _extra(self) -> tuple[object, ...]:
        return (self.group_sizes, self.block_indices)

    def __repr__(self) -> str:
        return (
            f"GPULoadStoreSpec({self.block_ids.tolist()}, group_sizes={list(self.group_sizes)}, "
            f"block_indices={None if self.block_indices is None else list(self.block_indices)})"
        )


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """Slots of a (pinned) host-memory pool."""

    __slots__ = ()

    @classmethod
    def medium(cls) -> Medium:
        return Medium.CPU


class DiskLoadStoreSpec(BlockIDsLoadStoreSpec):
    """Slots of a disk tier's slab files (slot i lives at offset i * block_size)."""

    __slots__ = ()

    @classmethod
    def medium(cls) -> Medium:
        return Medium.DISK


class SlotLoadStoreSpec(BlockIDsLoadStoreSpec):
    """Slots of a tier whose medium has no spec type of its own (a tier added through the
    registry). Each medium gets its own subclass from `slot_spec_type`, so that `medium()`
    names it and specs of two media never compare equal."""

    __slots__ = ()
    _medium: ClassVar[str] = ""

    @classmethod
    def medium(cls) -> str:
        return cls._medium


@functools.cache
def slot_spec_type(medium: str) -> type[SlotLoadStoreSpec]:
    """The `SlotLoadStoreSpec` subclass of `medium` (the same class on every call)."""
    if not isinstance(medium, str) or not medium:
        raise SpecError(f"a medium must be a non-empty string, got {medium!r}")
    return type(
        f"SlotLoadStoreSpec[{medium}]", (SlotLoadStoreSpec,), {"__slots__": (), "_medium": medium}
    )


_BUILT_IN_SPECS: dict[str, type[BlockIDsLoadStoreSpec]] = {
    Medium.GPU: GPULoadStoreSpec,
    Medium.CPU: CPULoadStoreSpec,
    Medium.DISK: DiskLoadStoreSpec,
}


def as_medium(medium: str) -> str:
    """`medium` as a spec and a backend carry it: the `Medium` member for a built-in name (so
    that `Medium.GPU` and "gpu" are one medium), else the name itself."""
    return Medium(medium) if medium in Medium._value2member_map_ else medium


def spec_type_of(medium: str) -> type[BlockIDsLoadStoreSpec]:
    """The spec type that addresses `medium`'s slots: vLLM's class for a built-in medium,
    else the medium's own `slot_spec_type`."""
    return _BUILT_IN_SPECS.get(medium) or slot_spec_type(medium)
