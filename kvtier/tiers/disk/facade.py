"""`StoreFacade`: what the disk tier's two layouts (`DiskStore`, store.py, and `LogStore`,
log_store.py) do alike around their own parts: the config's arguments, opening in a thread,
closing from a coroutine, the checks every call starts with and the read threads' calls
(`ReadThreads`, read_threads.py: one hop to a thread and one back per call).

One base so that a fix to the lifecycle or the read pool's closing reaches both layouts; each
layout keeps its own parts, `close`, `check` and the calls' bodies.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, TypeVar

from kvtier.errors import DiskTierError, StorageClosedError
from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec, Compression
from kvtier.tiers.disk.fsck import CheckReport
from kvtier.tiers.disk.kind import DiskTierConfig
from kvtier.tiers.disk.read_threads import ReadThreads
from kvtier.tiers.disk.stats import DiskStoreStats, StoreCounters
from kvtier.tiers.storage import BlockStorage

__all__ = ["StoreFacade", "creates_parents", "store_options"]

_T = TypeVar("_T")
_LOG = logging.getLogger(__name__)


def store_options(tier: DiskTierConfig, block_size: int, model_id: str) -> dict[str, Any]:
    """A store's keyword arguments that a validated disk tier config sets. A caller's option
    that repeats one of them stays a TypeError (the chain's open names it)."""
    return {
        "block_size": block_size,
        "num_blocks": tier.num_blocks,
        "model_id": model_id,
        "compression": tier.compression,
        "zstd_level": tier.zstd_level,
        "direct_io": tier.direct_io,
        "fsync": tier.fsync,
    }


def creates_parents(tier: DiskTierConfig) -> bool:
    """Whether a store for `tier` creates the missing ancestors of its path: only for the
    default path (the per-user cache directory); a configured path must have an existing
    parent (a typo should not grow a directory tree)."""
    from kvtier.config_fields import default_cache_dir

    return tier.path == default_cache_dir()


class StoreFacade(BlockStorage):
    """The part of a disk store's facade both layouts share. A subclass sets the attributes
    below in its constructor and defines `close` and `check`."""

    path: Path
    """The store's own directory."""
    model_id: str
    """The model id (with a tenant, the combined one) the store's blocks are bound to."""
    inspect: bool
    """Whether the store was opened only to be checked."""
    _closed: bool
    _read_pool: ReadThreads | None
    _codec: BlockCodec
    _counters: StoreCounters

    @classmethod
    async def open_async(cls, directory: str | os.PathLike[str], **kwargs: Any) -> Self:
        """The constructor, run in a thread so the event loop does not wait on the disk."""
        construct: Callable[..., Self] = cls  # each layout's own constructor and arguments
        return await asyncio.to_thread(functools.partial(construct, directory, **kwargs))

    @abstractmethod
    def close(self) -> None:
        """Finish every call already made, then close the files. Idempotent; blocking."""

    @abstractmethod
    def check(self, repair: bool = False) -> CheckReport:
        """Verify every block the store holds (blocking)."""

    @abstractmethod
    def __len__(self) -> int:
        """How many blocks the store holds now."""

    @abstractmethod
    def keys(self) -> list[OffloadKey]:
        """The keys of the blocks the store holds now."""

    async def aclose(self) -> None:
        """`close()` in a thread. Idempotent. When no thread can be started any more (the
        loop's executor is shut down: an embedder's interpreter is exiting without closing
        its serving engine), the store closes on the calling thread instead, so its files are
        still closed cleanly and the next open finds a clean shutdown."""
        if self._closed:
            return
        try:
            await asyncio.to_thread(self.close)
        except RuntimeError:
            _LOG.info("disk tier %s: no thread to close in; closing on the loop", self.path)
            self.close()

    @property
    def closed(self) -> bool:
        """Whether the store was closed."""
        return self._closed

    @property
    def persistent(self) -> bool:
        return True

    @property
    def compression(self) -> Compression:
        """The codec new blocks are written with ("none" or "zstd")."""
        return self._codec.compression

    @property
    def stats(self) -> DiskStoreStats:
        """A snapshot of the store's counters."""
        return self._counters.snapshot()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError(f"the disk tier at {self.path} is closed")

    def _check_writable(self) -> None:
        if self.inspect:
            raise DiskTierError(f"the disk tier at {self.path} is open only to be checked")

    async def _run(self, call: Callable[[], _T]) -> _T:
        """`call` in the read threads (reads and `acheck`; never the write lane): one hop
        there, one back."""
        threads = self._read_pool
        if self._closed or threads is None:
            raise StorageClosedError(f"the disk tier at {self.path} is closed")
        try:
            future = threads.submit(asyncio.get_running_loop(), call)
        except RuntimeError:  # the threads were shut down between the check and the submit
            raise StorageClosedError(f"the disk tier at {self.path} is closed") from None
        return await future

    async def acheck(self, repair: bool = False) -> CheckReport:
        """`check()` in the store's read threads."""
        return await self._run(functools.partial(self.check, repair))
