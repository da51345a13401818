"""The chain's ordered event stream (issue 32, item 1): every tier's stored and removed
batches, in an order a consumer can apply, a move down being a store on the new tier before
the removal from the old, from the chain itself (so every way in emits them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hierarchy_helpers import BLOCK, blocks_of, chain_config, key

from kvtier import Hierarchy
from kvtier.errors import ManagerClosedError
from kvtier.keys import OffloadKey
from kvtier.manager.base import EventLog, OffloadingEvent
from kvtier.manager.events import AllCleared, ChainEvent, ChainEvents


def apply(events: list[ChainEvent]) -> dict[str, set[OffloadKey]]:
    """What a consumer knows after `events`: per tier, the keys it holds."""
    held: dict[str, set[OffloadKey]] = {}
    for event in events:
        if isinstance(event, AllCleared):
            held.clear()
        elif event.removed:
            held.setdefault(event.tier, set()).difference_update(event.keys)
        else:
            held.setdefault(event.tier, set()).update(event.keys)
    return held


def truth(h: Hierarchy, keys: list[OffloadKey]) -> dict[str, set[OffloadKey]]:
    """Per tier, the keys it holds readable now."""
    return {
        tier.name: {k for k in keys if tier.has(k) is True}
        for tier in h.manager.tiers
        if any(tier.has(k) is True for k in keys)
    }


def never_lost(events: list[ChainEvent], keys: list[OffloadKey]) -> list[str]:
    """Keys that, once stored, were on no tier at some point of the stream."""
    held: dict[OffloadKey, set[str]] = {}
    lost = []
    for event in events:
        assert isinstance(event, OffloadingEvent)
        for k in event.keys:
            tiers = held.setdefault(k, set())
            if event.removed:
                tiers.discard(event.tier)
                if not tiers:
                    lost.append(f"{keys.index(k)} left {event.tier} for nowhere")
            else:
                tiers.add(event.tier)
    return lost


@pytest.mark.parametrize(
    ("reserve", "write_policy"),
    [(False, "write-back"), (True, "write-back"), (True, "write-through")],
    ids=["evict-in-store", "background-reserve", "write-through"],
)
async def test_a_consumer_of_the_stream_knows_what_every_tier_holds(
    tmp_path: Path, reserve: bool, write_policy: str
) -> None:
    """A gpu(4) -> cpu(8) -> disk(32) chain takes 24 blocks, so most move down twice (in the
    store that needs the room, or by the background reserve refills, or cascaded); the
    stream, applied in order, ends equal to every tier's contents, and no block is ever on
    no tier in it (each move is a store below, then the removal above)."""
    config = chain_config(
        tmp_path, 4, 8, 32, device="cpu", reserve=reserve, write_policy=write_policy
    )
    ks = [key(i) for i in range(24)]
    received: list[ChainEvent] = []
    async with Hierarchy.from_config(config) as h:
        h.manager.connect_events(received.append)
        for first in range(0, 24, 4):
            part = ks[first : first + 4]
            assert await h.put(part, blocks_of(part)) == 4
        await h.drain()
        assert h.manager.events.num_held == 0
        assert apply(received) == truth(h, ks)
        assert {e.tier for e in received if isinstance(e, OffloadingEvent) and e.removed} == {
            "gpu",
            "cpu",
        }
        assert never_lost(received, ks) == []
        stored_on_top = [e for e in received if isinstance(e, OffloadingEvent) and not e.removed]
        stored_on_top = [e for e in stored_on_top if e.tier == "gpu"]
        assert [k for e in stored_on_top for k in e.keys] == ks  # in prefix order
        assert {(e.medium, e.block_size) for e in stored_on_top} == {("gpu", BLOCK)}
        # per-tier logs (what vLLM's path takes) still get every batch too
        assert sum(len(e.keys) for e in h.take_events()) == sum(
            len(e.keys) for e in received if isinstance(e, OffloadingEvent)
        )


async def test_a_get_that_promotes_adds_the_block_on_top_and_keeps_it_below(
    tmp_path: Path,
) -> None:
    """A promotion is a copy: a store on the top tier, no removal from the tier it came
    from (unless that tier evicts it later, which the stream then says)."""
    config = chain_config(tmp_path, 4, 8, None, device="cpu", reserve=False)
    ks = [key(i) for i in range(8)]
    received: list[ChainEvent] = []
    async with Hierarchy.from_config(config) as h:
        h.manager.connect_events(received.append)
        for first in range(0, 8, 4):
            part = ks[first : first + 4]
            assert await h.put(part, blocks_of(part)) == 4
        await h.drain()
        assert h.where(ks[0]) == "cpu"
        before = len(received)
        assert len(await h.get(ks[:2])) == 2
        await h.drain()
        promoted = received[before:]
        assert any(
            isinstance(e, OffloadingEvent) and not e.removed and e.tier == "gpu" and ks[0] in e.keys
            for e in promoted
        )
        assert not any(
            isinstance(e, OffloadingEvent) and e.removed and e.tier == "cpu" and ks[0] in e.keys
            for e in promoted
        )
        assert apply(received) == truth(h, ks)
        assert never_lost(received, ks) == []


async def test_a_failed_copy_down_still_tells_the_removal(tmp_path: Path) -> None:
    """A removal held for a copy down passes when the copy's job settles without it."""
    events = ChainEvents(["top", "below"])
    received: list[ChainEvent] = []
    events.sink = received.append
    k = key(1)
    events.begin(0)
    events.record(OffloadingEvent((k, key(2)), BLOCK, "cpu", True, "top"))
    events.end(0, moved_down=[k])
    assert received == [OffloadingEvent((key(2),), BLOCK, "cpu", True, "top")]
    assert events.num_held == 1
    events.settled(1, [k])  # the write below failed: no store came
    assert received[-1] == OffloadingEvent((k,), BLOCK, "cpu", True, "top")
    assert events.num_held == 0


async def test_a_copy_down_is_a_store_below_then_the_removal_above() -> None:
    events = ChainEvents(["top", "below"])
    received: list[ChainEvent] = []
    events.sink = received.append
    ks = (key(1), key(2))
    events.begin(0)
    events.record(OffloadingEvent(ks, BLOCK, "cpu", True, "top"))
    events.end(0, moved_down=ks)
    assert received == []
    events.record(OffloadingEvent(ks, BLOCK, "disk", False, "below"))
    assert received == [
        OffloadingEvent(ks, BLOCK, "disk", False, "below"),
        OffloadingEvent(ks, BLOCK, "cpu", True, "top"),
    ]
    events.settled(1, ks)  # already released: nothing more
    assert len(received) == 2
    events.cleared()
    assert received[-1] == AllCleared()


def test_no_consumer_no_cost() -> None:
    """With no sink nothing is staged or held, and a tier's log with no sink records as
    before."""
    events = ChainEvents(["top"])
    events.begin(0)
    events.record(OffloadingEvent((key(1),), BLOCK, "cpu", True, "top"))
    events.end(0, [key(1)])
    assert events.num_held == 0
    log = EventLog(BLOCK, "cpu", "top", enabled=False)
    seen: list[OffloadingEvent] = []
    log.sink = seen.append
    log.record([key(1)], removed=False)
    assert len(seen) == 1 and log.take() == []


async def test_connect_events_after_close_is_refused(tmp_path: Path) -> None:
    config = chain_config(tmp_path, 4, None, None, device="cpu")
    h = Hierarchy.from_config(config)
    await h.open()
    manager = h.manager
    await h.close()
    with pytest.raises(ManagerClosedError):
        manager.connect_events(print)
