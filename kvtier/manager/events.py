"""The chain's ordered event stream: what every tier stored and removed, in one order.

Each tier keeps its own `EventLog` (what `take_events` returns, per tier). A `ChainEvents`
receives the same batches as they are recorded (the logs' `sink`) and hands them, in order, to
one consumer: the fleet's publisher (`kvtier.fleet`), or a test. It is bookkeeping: it runs on
the bookkeeping's thread, synchronously, does no I/O, and its consumer must not block (the
fleet's queue drops instead).

A demotion is a move: the victim is evicted from its tier when the store that needs its slot
is planned, but it is readable below only once the copy lands. So that a consumer never sees
a block on no tier while it is in fact on its way down, the planner stages the eviction's
removal (`begin` / `end`), and a removal whose block is being copied down is held until the
tier below records the block stored (then: the store on the new tier, then the removal from
the old, in that order), or until the copy's job settles without it (`settled`: the removal
alone). Every other removal passes at once.

The consumer receives plain objects (`OffloadingEvent`, `AllCleared`); this module knows
nothing of wires or sockets (`kvtier.fleet` imports it, never the reverse).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvtier.keys import OffloadKey
from kvtier.manager.base import OffloadingEvent


@dataclass(frozen=True, slots=True)
class AllCleared:
    """Every block of the chain is gone (the chain closed): forget all this node held."""


@dataclass(frozen=True, slots=True)
class TierContents:
    """What one tier holds now (`TieredManager.contents`): a node's snapshot, per tier."""

    tier: str
    medium: str
    keys: tuple[OffloadKey, ...]


ChainEvent = OffloadingEvent | AllCleared
"""What a `ChainEvents` consumer receives."""

EventSink = Callable[[ChainEvent], None]
"""A consumer: called on the bookkeeping's thread; must return at once, never block."""


class ChainEvents:
    """One chain's stored / removed batches, in the order a consumer may apply them."""

    def __init__(self, tier_names: Sequence[str]) -> None:
        """`tier_names`: the chain's tiers, top first (their events name them)."""
        self.tier_names = tuple(tier_names)
        self._index = {name: index for index, name in enumerate(self.tier_names)}
        self.sink: EventSink | None = None
        """The consumer (None: nothing is forwarded, nothing is held)."""
        self._staging: dict[int, list[OffloadingEvent]] = {}
        self._held: dict[tuple[int, OffloadKey], OffloadingEvent] = {}
        """(tier below, key) -> the removal from the tier above that waits for its store."""

    @property
    def on(self) -> bool:
        """Whether a consumer is connected."""
        return self.sink is not None

    @property
    def num_held(self) -> int:
        """Removals held until their block is stored below."""
        return len(self._held)

    # -- the tiers' logs -------------------------------------------------------------------

    def record(self, event: OffloadingEvent) -> None:
        """A tier recorded `event` (the `EventLog.sink`)."""
        sink = self.sink
        if sink is None:
            return
        index = self._index.get(event.tier)
        if event.removed:
            staged = None if index is None else self._staging.get(index)
            if staged is not None:
                staged.append(event)
            else:
                sink(event)
            return
        sink(event)
        if index is not None and self._held:
            self._release(index, event.keys)

    def cleared(self) -> None:
        """The whole chain is gone: drop what is held and tell the consumer."""
        self._held.clear()
        self._staging.clear()
        if self.sink is not None:
            self.sink(AllCleared())

    # -- the planner -----------------------------------------------------------------------

    def begin(self, index: int) -> None:
        """Stage tier `index`'s removals until `end(index, ...)` (an eviction is planned)."""
        if self.sink is not None:
            self._staging.setdefault(index, [])

    def end(self, index: int, moved_down: Iterable[OffloadKey] = ()) -> None:
        """Tier `index`'s eviction is planned: of its staged removals, hold those of
        `moved_down` (copied to tier `index + 1`) until stored there, pass the rest."""
        staged = self._staging.pop(index, None)
        sink = self.sink
        if not staged or sink is None:
            return
        moving = set(moved_down)
        below = index + 1
        for event in staged:
            passing = [key for key in event.keys if key not in moving]
            for key in event.keys:
                if key in moving:
                    self._held[(below, key)] = event
            if passing:
                sink(_with_keys(event, passing))

    def settled(self, index: int, keys: Iterable[OffloadKey]) -> None:
        """Tier `index`'s pending `keys` were settled (stored, or failed): any removal still
        held for them passes now (the copy down failed; the block is gone from both)."""
        if self._held:
            self._release(index, keys)

    def _release(self, index: int, keys: Iterable[OffloadKey]) -> None:
        sink = self.sink
        released: dict[int, tuple[OffloadingEvent, list[OffloadKey]]] = {}
        held = self._held
        for key in keys:
            event = held.pop((index, key), None)
            if event is not None:
                released.setdefault(id(event), (event, []))[1].append(key)
        if sink is not None:
            for event, moved in released.values():
                sink(_with_keys(event, moved))


def _with_keys(event: OffloadingEvent, keys: list[OffloadKey]) -> OffloadingEvent:
    """`event` for `keys` only (itself when they are all of its keys)."""
    if len(keys) == len(event.keys):
        return event
    return OffloadingEvent(tuple(keys), event.block_size, event.medium, event.removed, event.tier)
