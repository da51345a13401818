"""A node's snapshot and its announcement at start (issue 32, item 3, the node's side): the
replay socket answers `kvtier-snapshot` with the node's contents tagged with a sequence
number, so that the snapshot then the batches after it give exactly what the tiers hold; a
restarted node announces its restored blocks after its AllBlocksCleared. No test races a
clock: each waits on a condition, with a generous deadline that only catches a hang."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hierarchy_helpers import BLOCK, blocks_of, chain_config, key

from kvtier import Hierarchy
from kvtier.config_events import EventsConfig
from kvtier.keys import OffloadKey
from kvtier.manager.base import OffloadingEvent
from kvtier.manager.events import TierContents
from kvtier.manager.tier import make_tier_manager

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from kvtier.fleet.events import (  # noqa: E402 - needs the events extra
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
)
from kvtier.fleet.publisher import (  # noqa: E402
    END_SEQ,
    SEQ_BITS,
    SNAPSHOT,
    Contents,
    EventPublisher,
)

HANG_MS = 60_000
pytestmark = pytest.mark.timeout(300)

Holdings = dict[str, set[bytes]]
"""tier name -> keys: what a consumer believes a node holds."""


def apply(holdings: Holdings, batch: KVEventBatch) -> None:
    """A consumer's reading of one batch (stores add, removals take away, per tier)."""
    for event in batch.events:
        if isinstance(event, AllBlocksCleared):
            holdings.clear()
        elif isinstance(event, BlockStored):
            holdings.setdefault(str(event.ownership), set()).update(map(bytes, event.block_hashes))
        elif isinstance(event, BlockRemoved):
            holdings.setdefault(str(event.ownership), set()).difference_update(
                map(bytes, event.block_hashes)
            )


def truth(h: Hierarchy, keys: list[OffloadKey]) -> Holdings:
    """What each tier holds, asked of each tier key by key (not through `contents`)."""
    return {tier.name: {bytes(k) for k in keys if tier.has(k) is True} for tier in h.manager.tiers}


class Dealer:
    """A DEALER on a publisher's replay socket."""

    def __init__(self, endpoint: str) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.RCVTIMEO, HANG_MS)
        self.socket.connect(endpoint)

    def snapshot(self) -> tuple[int, KVEventBatch | None]:
        self.socket.send_multipart((b"", SNAPSHOT))
        frames = self.socket.recv_multipart()
        assert frames[1] == SNAPSHOT
        if frames[2] == END_SEQ:
            return -1, None
        return int.from_bytes(frames[2], "big"), decode_batch(frames[3])

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


def nonempty(holdings: Holdings) -> Holdings:
    return {tier: keys for tier, keys in holdings.items() if keys}


async def test_a_snapshot_then_the_later_batches_give_what_the_tiers_hold(
    tmp_path: Path,
) -> None:
    """Snapshots asked while puts run (demotions, evictions): each, with every batch
    numbered after its seq, equals what the tiers hold once the chain is quiet."""
    config = chain_config(tmp_path, 4, 8, 16, device="cpu")
    config["events"] = {
        "enabled": True,
        "endpoint": "tcp://127.0.0.1:0",
        "replay_endpoint": "tcp://127.0.0.1:0",
    }
    ks = [key(i) for i in range(40)]
    h = Hierarchy.from_config(config)
    await h.open()
    publisher = h._publisher  # the test reads the endpoints it bound
    assert publisher is not None
    dealer = Dealer(publisher.replay_endpoint)
    snapshots: list[tuple[int, KVEventBatch | None]] = []
    try:

        def ask() -> None:
            snapshots.append(dealer.snapshot())

        for i in range(0, 40, 4):
            asker = threading.Thread(target=ask)
            asker.start()  # answered while the put below runs, or just after
            assert await h.put(ks[i : i + 4], blocks_of(ks[i : i + 4])) >= 0
            await asyncio.to_thread(asker.join)
        await h.drain()
        expected = truth(h, ks)
        await asyncio.to_thread(ask)  # one more, once quiet (the loop answers it)
        # every batch the node sent, from the replay socket (it keeps them all here)
        dealer.socket.send_multipart((b"", (publisher.incarnation << SEQ_BITS).to_bytes(8, "big")))
        batches: list[tuple[int, KVEventBatch]] = []
        while (frames := dealer.socket.recv_multipart())[2] != END_SEQ:
            batches.append((int.from_bytes(frames[2], "big"), decode_batch(frames[3])))
    finally:
        dealer.close()
        await h.close()
    assert len(snapshots) == 11
    assert sum(1 for _, batch in batches for e in batch.events if isinstance(e, BlockRemoved))
    for seq, snapshot in snapshots:
        assert snapshot is not None and seq >> SEQ_BITS == publisher.incarnation
        assert isinstance(snapshot.events[0], AllBlocksCleared)
        holdings: Holdings = {}
        apply(holdings, snapshot)
        for batch_seq, batch in batches:
            if batch_seq > seq:
                apply(holdings, batch)
        assert nonempty(holdings) == nonempty(expected)
    assert snapshots[-1][0] == batches[-1][0]  # the last snapshot: as of the last batch
    last = snapshots[-1][1]
    assert last is not None
    media = {(e.ownership, e.medium) for e in last.events if isinstance(e, BlockStored)}
    assert media == {("gpu", "GPU"), ("cpu", "CPU"), ("disk", "DISK")}


async def test_a_restarted_node_announces_its_restored_blocks(tmp_path: Path) -> None:
    """After a restart the disk tier's blocks are back: the new incarnation's first batch
    clears what the old one announced, and its next ones announce what it restored."""
    config = chain_config(tmp_path, None, 4, 16, device="cpu")
    ks = [key(i) for i in range(12)]
    async with Hierarchy.from_config(config) as h:
        for i in range(0, 12, 4):
            await h.put(ks[i : i + 4], blocks_of(ks[i : i + 4]))
    config["events"] = {
        "enabled": True,
        "endpoint": "tcp://127.0.0.1:0",
        "replay_endpoint": "tcp://127.0.0.1:0",
    }
    h = Hierarchy.from_config(config)
    await h.open()
    publisher = h._publisher
    assert publisher is not None
    dealer = Dealer(publisher.replay_endpoint)
    try:
        expected = truth(h, ks)
        assert expected["disk"]  # the restart restored blocks
        start = (publisher.incarnation << SEQ_BITS).to_bytes(8, "big")
        for _ in range(HANG_MS // 10):
            dealer.socket.send_multipart((b"", start))
            batches = []
            while (frames := dealer.socket.recv_multipart())[2] != END_SEQ:
                batches.append(decode_batch(frames[3]))
            holdings: Holdings = {}
            for batch in batches:
                apply(holdings, batch)
            if nonempty(holdings) == nonempty(expected):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the restored blocks were never announced")
        assert isinstance(batches[0].events[0], AllBlocksCleared)
    finally:
        dealer.close()
        await h.close()


def events_config(**overrides: Any) -> EventsConfig:
    return EventsConfig(
        enabled=True,
        endpoint="tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
        **overrides,
    )


def test_a_snapshot_takes_the_number_its_drops_skipped() -> None:
    """Events dropped before a snapshot are in its contents: it is tagged with the number
    the drops skipped, and the next batch follows it with no gap."""
    state = {"cpu": [key(0), key(1)]}

    def contents(deliver: Any) -> None:
        deliver([TierContents(tier, "cpu", tuple(keys)) for tier, keys in state.items()])

    publisher = EventPublisher(events_config(queue_events=2), contents=contents)
    dealer = Dealer(publisher.replay_endpoint)
    try:
        for i in range(3):  # not started: 2 fit (the AllBlocksCleared of start is dropped)
            publisher.offer(OffloadingEvent((key(i),), BLOCK, "cpu", False, "cpu"))
        publisher.start()
        base = publisher.incarnation << SEQ_BITS
        seq, snapshot = dealer.snapshot()
        assert snapshot is not None
        holdings: Holdings = {}
        apply(holdings, snapshot)
        assert holdings == {"cpu": {key(0), key(1)}}
        publisher.offer(OffloadingEvent((key(5),), BLOCK, "cpu", False, "cpu"))
        for _ in range(HANG_MS // 10):
            dealer.socket.send_multipart((b"", (seq + 1).to_bytes(8, "big")))
            frames = dealer.socket.recv_multipart()
            if frames[2] != END_SEQ:
                break
        else:
            raise AssertionError("the batch after the snapshot never came")
        assert int.from_bytes(frames[2], "big") == seq + 1 and seq > base
        assert decode_batch(frames[3]).events[0].block_hashes == [key(5)]  # type: ignore[union-attr]
    finally:
        dealer.close()
        publisher.close()


def test_a_node_that_cannot_list_its_contents_answers_no_snapshot() -> None:
    publisher = EventPublisher(events_config())
    publisher.start()
    dealer = Dealer(publisher.replay_endpoint)
    try:
        assert dealer.snapshot() == (-1, None)
    finally:
        dealer.close()
        publisher.close()


def test_contents_the_chain_cannot_name_yet_are_asked_again() -> None:
    """A chain still loading its restored keys answers None: the publisher asks again, and
    the snapshot comes once it can."""
    asked = []

    def contents(deliver: Any) -> None:
        asked.append(1)
        answer: Contents = None if len(asked) < 3 else [TierContents("cpu", "cpu", (key(1),))]
        deliver(answer)

    publisher = EventPublisher(events_config(), contents=contents)
    publisher.start()
    dealer = Dealer(publisher.replay_endpoint)
    try:
        _, snapshot = dealer.snapshot()
        assert snapshot is not None and len(asked) >= 3
        holdings: Holdings = {}
        apply(holdings, snapshot)
        assert holdings == {"cpu": {key(1)}}
    finally:
        dealer.close()
        publisher.close()


def test_a_replay_asked_from_an_earlier_run_gets_every_batch_kept() -> None:
    """A consumer that knew an earlier incarnation asks from its old seq: whether that
    number is above or below this run's, it missed all of this run, and gets it all."""
    publisher = EventPublisher(events_config())
    publisher.start()
    dealer = Dealer(publisher.replay_endpoint)
    try:
        publisher.offer(OffloadingEvent((key(1),), BLOCK, "cpu", False, "cpu"))
        for _ in range(HANG_MS // 10):
            if not publisher.pending:
                break
            time.sleep(0.01)
        assert publisher.pending == 0
        for other in (publisher.incarnation - 1, publisher.incarnation + 1):
            old = (other << SEQ_BITS | 5).to_bytes(8, "big")
            dealer.socket.send_multipart((b"", old))
            seqs, stored = [], []
            while (frames := dealer.socket.recv_multipart())[2] != END_SEQ:
                seqs.append(int.from_bytes(frames[2], "big"))
                batch = decode_batch(frames[3])
                stored += [
                    k for e in batch.events if isinstance(e, BlockStored) for k in e.block_hashes
                ]
            assert seqs[0] == publisher.incarnation << SEQ_BITS  # from this run's first batch
            assert stored == [key(1)]
    finally:
        dealer.close()
        publisher.close()


class _Restored:
    """A `ColdSource` over a dict, its keys nameable once `loaded` (a disk store loads them
    in the background after opening)."""

    def __init__(self, blocks: dict[OffloadKey, int]) -> None:
        self.blocks = blocks
        self.loaded = False

    def slots(self) -> np.ndarray:
        return np.array(list(self.blocks.values()), dtype=np.int64)

    def slot_of(self, k: OffloadKey) -> int | None:
        return self.blocks.get(k)

    def key_of(self, slot: int) -> OffloadKey | None:
        found = [k for k, s in self.blocks.items() if s == slot]
        return found[0] if self.loaded and found else None


def test_a_tier_lists_its_ready_blocks_once_it_can_name_them() -> None:
    """`ready_keys` (what a snapshot lists): restored blocks once nameable (None before),
    pinned blocks too, never a block still being written."""
    manager = make_tier_manager(8, BLOCK, "disk", "lru")
    source = _Restored({key(1): 3, key(2): 1})
    manager.restore_cold(source)
    assert manager.ready_keys() is None
    source.loaded = True
    assert manager.ready_keys() == [key(1), key(2)]
    assert manager.prepare_store([key(5), key(6)]) is not None
    manager.complete_store([key(5)])
    manager.prepare_load([key(5)])  # pinned: still held
    assert manager.ready_keys() == [key(1), key(2), key(5)]  # key(6) is being written
