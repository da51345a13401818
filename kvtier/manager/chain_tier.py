"""`ChainTier`: what the chained manager needs of one tier's bookkeeping.

Two kinds implement it:
- `TierManager`: a local slot pool whose contents kvtier decides (a `Backend` plus a
  `CachePolicy`): GPU, CPU and disk tiers.
- `KeyedTierManager`: a tier that owns its own index and evicts by its own rules (a remote
  or shared store): kvtier only remembers what it learnt of it, asks it about the rest
  (maybe asynchronously: "ask again"), and never evicts from it.

`TieredManager` uses only these methods, so a new kind of tier needs no change to it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

from kvtier.blocks import BlockStatus
from kvtier.hints import HeldHint
from kvtier.keys import OffloadKey
from kvtier.manager.base import EventLog, OffloadingEvent, PrepareStoreOutput, ReqContext
from kvtier.manager.tier import TierStats
from kvtier.specs import LoadStoreSpec


class ChainTier(Protocol):
    """One tier of a chain, as `TieredManager` drives it (see `OffloadingManager` for the
    meaning of lookup / prepare_load / touch / complete_load / prepare_store /
    complete_store)."""

    name: str
    block_size: int
    blocks_written: int
    """Blocks stored into the tier so far (what a tier-aware admission spares)."""
    blocks_evicted: int
    """Blocks the tier's policy evicted so far."""
    blocks_refused: int
    """Blocks a store asked the tier to take and it did not (not admitted, or no room)."""

    @property
    def events_dropped(self) -> int:
        """Blocks of events dropped because nobody took them in time."""
        ...

    @property
    def medium(self) -> str: ...

    @property
    def owns_index(self) -> bool:
        """Whether the tier answers lookups and evicts by its own rules."""
        ...

    @property
    def num_blocks(self) -> int:
        """Capacity in blocks (for a tier that owns its index: how many blocks kvtier keeps
        track of, not what the store holds)."""
        ...

    @property
    def num_free(self) -> int: ...

    @property
    def num_draining(self) -> int: ...

    @property
    def num_evictable(self) -> int: ...

    def lookup(self, key: OffloadKey, req_context: ReqContext | None = None) -> bool | None:
        """True ready, None ask again (being written, or being asked about), False absent."""
        ...

    def has(self, key: OffloadKey) -> bool | None:
        """What the tier is known to hold, without asking anyone: True ready, None being
        written, False absent or unknown."""
        ...

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> LoadStoreSpec: ...

    def touch(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> None: ...

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> None: ...

    def prepare_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext | None = None,
        *,
        moved: bool = False,
    ) -> PrepareStoreOutput | None: ...

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        success: bool = True,
        req_context: ReqContext | None = None,
    ) -> None: ...

    def spec_of(self, keys: Collection[OffloadKey]) -> LoadStoreSpec:
        """Where blocks already pinned (or being written) by the caller are."""
        ...

    def idle_keys(self) -> list[OffloadKey]:
        """Ready, unpinned blocks (what a flush would copy down)."""
        ...

    def ready_keys(self) -> list[OffloadKey] | None:
        """Every ready block, pinned ones too (not those being written): what the tier's
        stored events announced and its removals did not take back. None while it cannot
        name them all yet (a disk store loads its restored keys in the background)."""
        ...

    def discard(self, keys: Collection[OffloadKey]) -> list[OffloadKey]:
        """Drop ready, unpinned blocks found bad or gone; the keys dropped."""
        ...

    def evict_to_drain(self, count: int) -> tuple[list[OffloadKey], list[BlockStatus]]: ...

    def release_drained(self, blocks: Collection[BlockStatus]) -> None: ...

    def hint(self, keys: Collection[OffloadKey], hint: HeldHint | None) -> None:
        """An application's reuse hint on the keys the tier holds (None: withdraw it)."""
        ...

    def rank(self, ranks: Mapping[OffloadKey, Any]) -> None:
        """An application's eviction rank of each key the tier holds (None: withdraw it)."""
        ...

    def hint_of(self, key: OffloadKey) -> HeldHint | None:
        """The hint `key` holds in this tier now, or None."""
        ...

    def take_evicted_hints(self) -> dict[OffloadKey, HeldHint]:
        """The hints of the blocks its last eviction took, once (what a demotion carries)."""
        ...

    def rank_of(self, key: OffloadKey) -> Any:
        """The rank `key` holds in this tier now, or None."""
        ...

    def take_evicted_ranks(self) -> dict[OffloadKey, Any]:
        """The ranks of the blocks its last eviction took, once (what a demotion carries)."""
        ...

    def take_events(self) -> list[OffloadingEvent]: ...

    @property
    def event_log(self) -> EventLog:
        """The tier's event log (the chain's `ChainEvents` is its `sink`)."""
        ...

    def stats(self) -> TierStats: ...

    def check(self) -> None: ...

    def shutdown(self) -> None: ...
