"""`OffloadingSpec`: kvtier as the offloading stack of a serving engine that owns paged KV
caches, in the seed interface's terms (vLLM's `kv_offload` vocabulary, no vLLM import).

- `get_manager()`: the chain's bookkeeping for the serving engine's scheduler: `lookup`,
  `prepare_store` / `complete_store`, `prepare_load` / `complete_load`, `touch`. The store
  specs it returns are slots of the host tier (the hierarchy's top tier, a `cpu` tier); the
  tiers below are fed and drained in the background by the hierarchy, as for `put`.
- `get_handlers(kv_caches)`: `(source spec type, destination spec type, handler)` for each
  direction: `PagedKVHandler`s copying between the serving engine's canonical KV caches and
  that host tier (CUDA stream and events on a GPU; a worker thread on the CPU).

The serving engine drives it from the hierarchy's event loop (the bookkeeping is not
thread-safe): plan with the manager, move with a handler, then complete with the manager. A
`lookup` that finds a block below the host tier answers None ("ask again") and starts its
promotion.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING

from kvtier.embed.handler import OffloadingHandler
from kvtier.embed.paged_kv import PagedKVHandler, chunk_bytes, paged_kv_handlers
from kvtier.errors import SpecError
from kvtier.keys import OffloadKey
from kvtier.manager.base import OffloadingEvent, PrepareStoreOutput
from kvtier.specs.base import LoadStoreSpec
from kvtier.specs.canonical import CanonicalKVCaches
from kvtier.tiers.storage import TensorStorage

if TYPE_CHECKING:
    from kvtier.hierarchy import Hierarchy


class SpecManager:
    """The chain's bookkeeping as the serving engine's scheduler sees it: every call is the
    `TieredManager`'s, and the transfer jobs a call plans (demotions to make room,
    promotions of blocks found below) are started at once on the hierarchy's transfer
    engine."""

    def __init__(self, hierarchy: Hierarchy) -> None:
        self._hierarchy = hierarchy
        self._manager = hierarchy.manager

    def lookup(self, key: OffloadKey) -> bool | None:
        """True: at the host tier, readable; False: absent; None: on its way up, ask again."""
        answer = self._manager.lookup(key)
        self._hierarchy.start_planned_jobs()
        return answer

    async def prepare_store(self, keys: Sequence[OffloadKey]) -> PrepareStoreOutput | None:
        """Host-tier slots for the keys no tier holds (`keys_to_store`, `store_spec`), once
        the victims they displace are copied out; None when every block is pinned."""
        return await self._hierarchy.prepare_engine_store(keys)

    def complete_store(self, keys: Collection[OffloadKey], success: bool = True) -> None:
        self._manager.complete_store(keys, success=success)
        self._hierarchy.start_planned_jobs()

    def prepare_load(self, keys: Collection[OffloadKey]) -> LoadStoreSpec:
        return self._manager.prepare_load(keys)

    def complete_load(self, keys: Collection[OffloadKey]) -> None:
        self._manager.complete_load(keys)
        self._hierarchy.start_planned_jobs()

    def touch(self, keys: Collection[OffloadKey]) -> None:
        self._manager.touch(keys)

    def take_events(self) -> list[OffloadingEvent]:
        return self._manager.take_events()


class OffloadingSpec:
    """kvtier's offloading spec over an open `Hierarchy` whose top tier is host memory
    (`medium = "cpu"`) and whose block size is one chunk of `blocks_per_chunk` GPU blocks
    of the serving engine's caches (`chunk_bytes(kv_caches, blocks_per_chunk)`)."""

    def __init__(self, hierarchy: Hierarchy, blocks_per_chunk: int = 1) -> None:
        if isinstance(blocks_per_chunk, bool) or not isinstance(blocks_per_chunk, int):
            raise SpecError(f"blocks_per_chunk must be an int, got {blocks_per_chunk!r}")
        if blocks_per_chunk < 1:
            raise SpecError(f"blocks_per_chunk must be >= 1, got {blocks_per_chunk}")
        top = hierarchy.storages[0]
        if not isinstance(top, TensorStorage) or top.device.type != "cpu" or top.fallback:
            raise SpecError(
                f"the hierarchy's top tier {hierarchy.tiers[0].name!r} must be host memory "
                f"(a tensor pool asked on the CPU, not a {hierarchy.tiers[0].medium} tier): "
                "GPU blocks are offloaded to it"
            )
        self.hierarchy = hierarchy
        self.blocks_per_chunk = blocks_per_chunk
        self._host = top.tensor
        self._manager = SpecManager(hierarchy)

    def get_manager(self) -> SpecManager:
        return self._manager

    def get_handlers(
        self, kv_caches: CanonicalKVCaches
    ) -> Iterator[tuple[type[LoadStoreSpec], type[LoadStoreSpec], OffloadingHandler]]:
        """The store (GPU -> host) and load (host -> GPU) handlers for these caches."""
        wanted = chunk_bytes(kv_caches, self.blocks_per_chunk)
        if wanted != self.hierarchy.block_size:
            raise SpecError(
                f"the hierarchy's block_size is {self.hierarchy.block_size} bytes, but one "
                f"chunk of {self.blocks_per_chunk} block(s) of these caches is {wanted}: set "
                f"block_size = {wanted}"
            )
        handlers: Sequence[tuple[type[LoadStoreSpec], type[LoadStoreSpec], PagedKVHandler]]
        handlers = paged_kv_handlers(kv_caches, self._host, self.blocks_per_chunk)
        yield from handlers
