"""The bookkeeping interface every tier manager (and the chained manager) implements.

Bookkeeping is synchronous and does no I/O: it decides where blocks go and hands the decision
to the transfer engine as LoadStoreSpecs. It runs inside a serving engine's scheduler, so it
must never block.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from kvtier.keys import OffloadKey
from kvtier.specs import LoadStoreSpec


@dataclass(slots=True)
class ReqContext:
    """Per-request context passed through the manager (the request id, for now)."""

    req_id: str = ""


@dataclass(frozen=True, slots=True)
class PrepareStoreOutput:
    """What `prepare_store` decided.

    `keys_to_store`: the keys not already present, to be written, in call order.
    `store_spec`: where to write them (one slot per key, same order).
    `evicted_keys`: the keys evicted to make room.
    `evicted_spec`: the slots the evicted blocks occupied, in the order of `evicted_keys`. Their
    bytes stay there until the new keys are written, which is what lets a chained manager
    demote them to the tier below first (None when nothing was evicted).
    `refused_keys`: absent keys the tier's policy did not admit (`CachePolicy.admit`): not
    stored, a miss when asked for again.
    """

    keys_to_store: list[OffloadKey]
    store_spec: LoadStoreSpec
    evicted_keys: list[OffloadKey]
    evicted_spec: LoadStoreSpec | None = None
    refused_keys: list[OffloadKey] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class OffloadingEvent:
    """A batch of blocks that became readable (`removed=False`) or left (`removed=True`)
    one medium (a `Medium` for a built-in one, else the registered medium's name)."""

    keys: tuple[OffloadKey, ...]
    block_size: int
    medium: str
    removed: bool
    tier: str = field(default="")


EVENT_LOG_BLOCKS = 100_000
"""Most blocks a tier's event log holds until they are taken; past it the oldest batches are
dropped (and counted), so an embedder that never calls `take_events` does not grow memory."""


class EventLog:
    """A tier's stored / removed batches since they were last taken (records nothing when
    disabled, e.g. in simulations that never read them).

    Bounded: it holds at most `max_blocks` blocks of batches (always the newest batch, even
    a larger one); older batches are dropped first and their blocks counted in `dropped`."""

    def __init__(
        self,
        block_size: int,
        medium: str,
        tier: str,
        *,
        enabled: bool = True,
        max_blocks: int | None = None,
    ) -> None:
        """`max_blocks`: the bound (None: `EVENT_LOG_BLOCKS`, read now)."""
        self.block_size = block_size
        self.medium = medium
        self.tier = tier
        self.max_blocks = EVENT_LOG_BLOCKS if max_blocks is None else max_blocks
        self._events: deque[OffloadingEvent] | None = deque() if enabled else None
        self._blocks = 0
        self.dropped = 0
        """Blocks of batches dropped because the log was full (never reset)."""
        self.sink: Callable[[OffloadingEvent], None] | None = None
        """Also given every batch as it is recorded, enabled or not (the chain's ordered
        stream, `kvtier.manager.events.ChainEvents.record`); None: nobody."""

    def record(self, keys: Sequence[OffloadKey], removed: bool) -> None:
        """One batch (none when `keys` is empty); drops the oldest past `max_blocks`."""
        events = self._events
        sink = self.sink
        if not keys or (events is None and sink is None):
            return
        event = OffloadingEvent(tuple(keys), self.block_size, self.medium, removed, self.tier)
        if sink is not None:
            sink(event)
        if events is None:
            return
        events.append(event)
        self._blocks += len(keys)
        while self._blocks > self.max_blocks and len(events) > 1:
            oldest = events.popleft()
            self._blocks -= len(oldest.keys)
            self.dropped += len(oldest.keys)

    def take(self) -> list[OffloadingEvent]:
        """The batches recorded since the last call, oldest first."""
        if self._events is None:
            return []
        events = list(self._events)
        self._events.clear()
        self._blocks = 0
        return events

    def __len__(self) -> int:
        """Batches held now."""
        return 0 if self._events is None else len(self._events)


class OffloadingManager(ABC):
    """Tracks which blocks a tier (or chain of tiers) holds, and where.

    The two-phase protocol: `prepare_store` reserves slots (blocks being written, not
    readable, not evictable) and `complete_store` makes them readable or, on failure, frees
    them; `prepare_load` pins readable blocks against eviction and `complete_load` unpins them.
    """

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext | None = None) -> bool | None:
        """True if `key` is present and readable, False if absent, None to ask again later
        (being written, or on its way up from a lower tier)."""

    @abstractmethod
    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> LoadStoreSpec:
        """Pin each key's block against eviction and say where it lives. Raises
        BlockStateError, pinning nothing, if a key is absent or not readable."""

    @abstractmethod
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Mark keys as recently used (head of the prefix first); absent keys are ignored."""

    @abstractmethod
    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> None:
        """Unpin blocks pinned by `prepare_load`. Raises BlockStateError, unpinning nothing,
        if a key is absent or not pinned."""

    @abstractmethod
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> PrepareStoreOutput | None:
        """Reserve slots for the keys not already present, evicting by policy as needed
        (never a key of this call, never a pinned or pending block). Returns None, changing
        nothing, when the space cannot be made."""

    @abstractmethod
    def complete_store(
        self,
        keys: Collection[OffloadKey],
        success: bool = True,
        req_context: ReqContext | None = None,
    ) -> None:
        """Make prepared blocks readable, or with `success=False` remove the ones not yet
        readable and free their slots. Keys already readable are left as they are."""

    @abstractmethod
    def take_events(self) -> list[OffloadingEvent]:
        """Events (stored / removed batches) since the previous call, oldest first."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release resources; any later call raises ManagerClosedError."""
