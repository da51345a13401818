"""`BlockStorage`: the bytes of one tier, addressed by slot.

The bookkeeping (`TierManager`) decides which slot holds which key; a storage only moves
bytes in and out of slots. Transfer handlers use it through host buffers: one contiguous
`block_size`-byte numpy uint8 array per block (a row of a host pool, or a staging buffer), so
that a disk tier can `pread`/`pwrite` straight into and out of a pinned CPU pool.

Every method that touches a device or a file is a coroutine that keeps blocking work off the
event loop. Failures are per block and are values, not exceptions: a block that cannot be
written or read back intact is reported in the returned list, and the rest of the batch goes
on. Only a broken contract (wrong buffer size, a slot out of range) raises.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from kvtier.keys import OffloadKey

if TYPE_CHECKING:
    import torch

HostBuffer = npt.NDArray[np.uint8]
"""One block's bytes in host memory: a contiguous, one-dimensional uint8 array."""


class ReadFailure(enum.StrEnum):
    """Why a block could not be read back intact (the read is then a miss, never data)."""

    CHECKSUM = "checksum"
    """The bytes read do not match the checksum taken when the block was stored."""
    SHORT_READ = "short-read"
    """The file ended before the block did."""
    IO_ERROR = "io-error"
    """The operating system reported an error (EIO, ...)."""
    NOT_INDEXED = "not-indexed"
    """The index has no record of this key in this slot (never stored, or dropped)."""
    CODEC = "codec"
    """The stored bytes could not be decompressed."""


class TierAccess(enum.Enum):
    """How a tier's bytes are reached: declared by a tier's kind (`TierKind.access`) and by
    its storage class (`BlockStorage.access`), which the registry checks agree when it opens
    a storage. The transfer engine routes bytes by it, never by a storage's concrete type."""

    TENSOR = "tensor"
    """A torch tensor pool (`TensorStorage`): copies in and out are tensor copies (gpu, cpu)."""
    HOST_BUFFERS = "host-buffers"
    """The storage reads and writes host buffers by slot (disk)."""
    CLIENT = "client"
    """A client that sends and fetches bytes by key (Redis, ...): a `KeyedStorage`."""


@dataclass(frozen=True, slots=True)
class RestoredBlock:
    """A block found in a persistent tier when it was opened: `key` lives in `slot`."""

    key: OffloadKey
    slot: int


class ColdSource(Protocol):
    """The blocks a persistent storage restored at open, held compactly
    (`BlockStorage.restore_cold`): what a tier's bookkeeping keeps them by instead of an
    object per block (`kvtier.manager.cold`)."""

    def slots(self) -> npt.NDArray[np.int64]:
        """The slots of the restored blocks, oldest first."""
        ...

    def slot_of(self, key: OffloadKey) -> int | None:
        """The slot of restored block `key` while the storage holds it, or None."""
        ...

    def key_of(self, slot: int) -> OffloadKey | None:
        """The key of the restored block in `slot`, or None (none, or not known yet)."""
        ...


class BlockStorage(ABC):
    """`num_blocks` slots of `block_size` bytes each."""

    num_blocks: int
    block_size: int
    access: ClassVar[TierAccess] = TierAccess.HOST_BUFFERS
    """How the transfer engine reaches the bytes (see `TierAccess`)."""

    @property
    @abstractmethod
    def persistent(self) -> bool:
        """Whether blocks survive a restart (and so must be verified when read)."""

    def restore(self) -> list[RestoredBlock]:
        """Blocks stored by an earlier process, oldest first; [] for a volatile tier."""
        return []

    def restore_cold(self) -> ColdSource | None:
        """The blocks stored by an earlier process as a compact view, which the chain's
        bookkeeping holds outside its policy; None (the default) when the storage has none:
        the chain then asks `restore()`."""
        return None

    def describe(self) -> str:
        """Where the bytes live, for `Hierarchy.tiers` and reports (fixed for the storage's
        lifetime, never with credentials); by default the class's name."""
        return type(self).__name__

    def value_problems(self) -> dict[str, int]:
        """Values this storage read and did not serve since it opened, by reason (a shared
        store's forged, foreign, damaged, oversized values, ...): what `stats()` and the
        metrics export per tier, so a fleet can alert on forgery attempts. {} for a storage
        that checks no such thing (the default); an absent key is not a problem. It may be
        called from another thread: it returns a copy."""
        return {}

    def unencrypted_served(self) -> int:
        """Values served unencrypted by a storage whose own are encrypted (a shared store
        with `encrypt = true` reading a key holder's MAC-only value), since it opened; 0 for
        a storage that encrypts nothing (the default)."""
        return 0

    @property
    def disabled_reason(self) -> str | None:
        """Why the storage disabled itself while open (its ground moved: a disk store whose
        files were removed or replaced), or None while it serves. Once set, its writes fail
        and its reads miss; the hierarchy lists it in `disabled_tiers`."""
        return None

    @abstractmethod
    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        """Store `buffers[i]` (block `keys[i]`) in `slots[i]`; one result per block: None when
        it is completely (and, where configured, durably) stored, else the error."""

    @abstractmethod
    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        """Fill `buffers[i]` with block `keys[i]` from `slots[i]`; one result per block: None
        when the bytes are intact, else why not (the buffer's contents are then undefined)."""

    async def forget(self, keys: Sequence[OffloadKey]) -> None:  # noqa: B027 - optional hook
        """The keys were dropped by the bookkeeping (evicted from the bottom tier, or found
        bad): a persistent tier removes them from its index. A volatile tier does nothing."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Flush and release files and memory. Idempotent."""


class TensorStorage(BlockStorage):
    """A storage whose slots are the rows of one `[num_blocks, block_size]` uint8 tensor
    (`tensor`, on `device`): the transfer engine copies to and from it with tensor copies (on
    a CUDA stream between devices), and hands host rows of it to other tiers' reads and
    writes directly."""

    access: ClassVar[TierAccess] = TierAccess.TENSOR
    tensor: torch.Tensor
    """The blocks, one row per slot."""
    device: torch.device
    """Where the blocks live."""
    fallback: str | None = None
    """Why the blocks do not live where the tier asked (a GPU pool in host memory when CUDA
    is missing), or None."""
