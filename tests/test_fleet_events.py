"""A node's KV events on the wire (issue 32, item 2): vLLM's format, read by vLLM 0.33's own
classes over a real loopback ZMQ socket; the replay socket; drops seen as a gap; a bad
endpoint fails at open, naming it. No test races a clock: each waits on a condition, with a
generous deadline that only catches a hang."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# The events extra (msgspec, pyzmq) and vLLM's reader of them: without either, the module
# skips (kvtier.fleet.events imports msgspec itself).
pytest.importorskip("msgspec")
import msgspec
from hierarchy_helpers import BLOCK, blocks_of, chain_config, key

from kvtier import Hierarchy
from kvtier.config import parse_config
from kvtier.config_events import EventsConfig
from kvtier.errors import ConfigError, EventsEndpointError
from kvtier.fleet.events import (
    KVEventBatch,
    decode_batch,
    encode_batch,
    to_wire,
    wire_medium,
)
from kvtier.fleet.publisher import END_SEQ, SEQ_BITS, EventPublisher
from kvtier.keys import SGLANG_PAGE_TAG, make_offload_key
from kvtier.manager.base import OffloadingEvent
from kvtier.manager.events import AllCleared

zmq = pytest.importorskip("zmq")
kv_events = pytest.importorskip("vllm.distributed.kv_events")

HANG_S = 60_000
"""Milliseconds a receive may wait before the test calls it a hang."""

pytestmark = pytest.mark.timeout(300)


class Subscriber:
    """A SUB socket on a publisher's endpoint, decoding with vLLM's classes."""

    def __init__(self, endpoint: str, topic: bytes = b"") -> None:
        self.context = zmq.Context()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.setsockopt(zmq.RCVTIMEO, HANG_S)
        self.sub.connect(endpoint)
        self.decoder = kv_events.msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)

    def receive(self) -> tuple[bytes, int, Any]:
        topic, seq, payload = self.sub.recv_multipart()
        return topic, int.from_bytes(seq, "big"), self.decoder.decode(payload)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.context.term()


def connected(
    publisher: EventPublisher, subscriber: Subscriber, tier: str = "cpu"
) -> list[tuple[int, Any]]:
    """Wait until the subscriber receives (a PUB drops what it sends before a subscription
    arrives): the publisher's AllBlocksCleared went out before it connected, so offer
    probes until one arrives; returns the batches received, the probes' included."""
    got = []
    probe = OffloadingEvent((b"probe",), BLOCK, "cpu", True, tier)  # removes nothing real
    subscriber.sub.setsockopt(zmq.RCVTIMEO, 50)
    for _ in range(HANG_S // 50):
        publisher.offer(probe)
        try:
            _, seq, batch = subscriber.receive()
        except zmq.Again:
            continue
        got.append((seq, batch))
        break
    else:
        raise AssertionError("the subscriber never connected")
    subscriber.sub.setsockopt(zmq.RCVTIMEO, HANG_S)
    return got


def events_config(**overrides: Any) -> EventsConfig:
    return EventsConfig(enabled=True, endpoint="tcp://127.0.0.1:0", **overrides)


def test_a_batch_encodes_as_vllm_encodes_it() -> None:
    """Byte for byte: kvtier's payload equals vLLM's encoding of the same events."""
    ks = (key(1), key(2))
    ours = KVEventBatch(
        ts=1.5,
        events=[
            to_wire(OffloadingEvent(ks, BLOCK, "disk", False, "disk"), 16),
            to_wire(OffloadingEvent(ks[:1], BLOCK, "cpu", True, "cpu"), 16),
            to_wire(AllCleared(), 16),
        ],
    )
    theirs = kv_events.KVEventBatch(
        ts=1.5,
        events=[
            kv_events.BlockStored(
                block_hashes=list(ks),
                parent_block_hash=None,
                token_ids=[],
                block_size=16,
                lora_id=None,
                medium="DISK",
                lora_name=None,
                ownership="disk",
            ),
            kv_events.BlockRemoved(block_hashes=[ks[0]], medium="CPU", ownership="cpu"),
            kv_events.AllBlocksCleared(),
        ],
    )
    assert encode_batch(ours) == kv_events.msgspec.msgpack.encode(theirs)
    assert decode_batch(encode_batch(ours)) == ours
    assert [wire_medium(m) for m in ("gpu", "cpu", "disk", "redis")] == [
        "GPU",
        "CPU",
        "DISK",
        "REDIS",
    ]


async def test_vllm_reads_a_nodes_events_over_zmq(tmp_path: Path) -> None:
    """A standalone Hierarchy with [events] on: a vLLM subscriber decodes its batches, sees
    the blocks stored on each tier by name and medium, moves down in order, and the
    AllBlocksCleared of the close; sequence numbers carry the incarnation and count up."""
    config = chain_config(tmp_path, 4, 8, None, device="cpu", reserve=False)
    config["events"] = {"enabled": True, "endpoint": "tcp://127.0.0.1:0", "topic": "node-a"}
    ks = [key(i) for i in range(8)]
    h = Hierarchy.from_config(config)
    await h.open()
    publisher = h._publisher  # the test reads the endpoint it bound
    assert publisher is not None
    subscriber = Subscriber(publisher.endpoint, b"node-a")
    try:
        first = connected(publisher, subscriber)
        for i in range(0, 8, 4):
            assert await h.put(ks[i : i + 4], blocks_of(ks[i : i + 4])) == 4
        await h.drain()
        stats = h.stats()
        await h.close()
        # `first` may hold the open's AllBlocksCleared (when the subscription beat it):
        # read on until the close's, which comes after every batch of the puts
        batches = list(first)
        while True:
            _, seq, batch = subscriber.receive()
            batches.append((seq, batch))
            if any(isinstance(e, kv_events.AllBlocksCleared) for e in batch.events):
                break
    finally:
        subscriber.close()
    seqs = [seq for seq, _ in batches]
    assert {seq >> SEQ_BITS for seq in seqs} == {publisher.incarnation}
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert [seq & 0xFFFFFFFF for seq in seqs] == list(
        range(seqs[0] & 0xFFFFFFFF, (seqs[0] & 0xFFFFFFFF) + len(seqs))
    )  # no gap: nothing was dropped
    events = [e for _, batch in batches for e in batch.events]
    stored = [e for e in events if isinstance(e, kv_events.BlockStored)]
    assert [k for e in stored if e.ownership == "gpu" for k in e.block_hashes] == ks
    assert {(e.ownership, e.medium) for e in stored} == {("gpu", "GPU"), ("cpu", "CPU")}
    removed_gpu = [
        k
        for e in events
        if isinstance(e, kv_events.BlockRemoved) and e.ownership == "gpu"
        for k in e.block_hashes
    ]
    assert removed_gpu == ks[:4]
    for k in removed_gpu:  # each move down: the store below came first
        store_at = next(
            i
            for i, e in enumerate(events)
            if isinstance(e, kv_events.BlockStored) and e.ownership == "cpu" and k in e.block_hashes
        )
        remove_at = next(
            i
            for i, e in enumerate(events)
            if isinstance(e, kv_events.BlockRemoved)
            and e.ownership == "gpu"
            and k in e.block_hashes
        )
        assert store_at < remove_at
    assert isinstance(events[-1], kv_events.AllBlocksCleared)
    assert stats.fleet_events_sent >= 1 and stats.fleet_events_dropped == 0


def test_the_replay_socket_serves_missed_batches_as_vllm_does() -> None:
    """A REQ-style request for a start sequence number gets every kept batch from it on,
    then vLLM's end marker; a malformed request is counted and ignored."""
    publisher = EventPublisher(events_config(replay_endpoint="tcp://127.0.0.1:0"))
    publisher.start()
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, HANG_S)
    dealer.connect(publisher.replay_endpoint)
    try:
        for i in range(3):
            publisher.offer(OffloadingEvent((key(i),), BLOCK, "cpu", False, "cpu"))
        base = publisher.incarnation << SEQ_BITS
        # wait until all four batches (AllBlocksCleared and three stores) are kept
        replies: list[list[bytes]] = []
        for _ in range(1000):
            dealer.send_multipart((b"", base.to_bytes(8, "big")))
            replies = []
            while True:
                frames = dealer.recv_multipart()
                if frames[2] == END_SEQ:
                    break
                replies.append(frames)
            kept = sum(len(decode_batch(f[3]).events) for f in replies)
            if kept == 4:
                break
        else:
            raise AssertionError("the batches never reached the replay buffer")
        decoder = kv_events.msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
        events = [e for f in replies for e in decoder.decode(f[3]).events]
        assert isinstance(events[0], kv_events.AllBlocksCleared)
        assert [e.block_hashes for e in events[1:]] == [[key(0)], [key(1)], [key(2)]]
        assert all(f[1] == b"" for f in replies)  # the topic frame
        later = int.from_bytes(replies[-1][2], "big")
        dealer.send_multipart((b"", later.to_bytes(8, "big")))
        tail = [dealer.recv_multipart(), dealer.recv_multipart()]
        assert int.from_bytes(tail[0][2], "big") == later and tail[1][2] == END_SEQ
        dealer.send_multipart((b"", b"short"))
        dealer.send_multipart((b"", (0).to_bytes(8, "big")))  # answered: still serving
        while dealer.recv_multipart()[2] != END_SEQ:
            pass
        assert publisher.stats().bad_replay_requests == 1
    finally:
        dealer.close(linger=0)
        context.term()
        publisher.close()


def test_a_full_queue_drops_counts_and_leaves_a_gap() -> None:
    """Offers past the queue's bound return at once and are counted, and the next batch's
    sequence number skips one: the gap a subscriber sees (here, through the replay)."""
    publisher = EventPublisher(events_config(queue_events=2, replay_endpoint="tcp://127.0.0.1:0"))
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, HANG_S)
    dealer.connect(publisher.replay_endpoint)
    try:
        for i in range(5):  # not started: the thread takes nothing yet; 2 fit
            publisher.offer(OffloadingEvent((key(i),), BLOCK, "cpu", False, "cpu"))
        assert publisher.stats().dropped == 3
        publisher.start()  # its AllBlocksCleared is dropped too: the queue is full
        assert publisher.stats().dropped == 4
        base = publisher.incarnation << SEQ_BITS
        for _ in range(1000):
            dealer.send_multipart((b"", base.to_bytes(8, "big")))
            frames = dealer.recv_multipart()
            if frames[2] != END_SEQ:
                break
        else:
            raise AssertionError("no batch was ever published")
        assert int.from_bytes(frames[2], "big") == base | 1  # 0 skipped: the gap
        batch = decode_batch(frames[3])
        assert [e.block_hashes for e in batch.events] == [[key(0)], [key(1)]]
    finally:
        dealer.close(linger=0)
        context.term()
        publisher.close()


def test_only_the_configured_tiers_are_announced() -> None:
    publisher = EventPublisher(events_config(tiers=("disk",)))
    try:
        publisher.offer(OffloadingEvent((key(1),), BLOCK, "cpu", False, "cpu"))
        publisher.offer(OffloadingEvent((key(2),), BLOCK, "disk", False, "disk"))
        publisher.offer(AllCleared())
        items, _ = publisher.queue.take(10, 0)
        assert items == [OffloadingEvent((key(2),), BLOCK, "disk", False, "disk"), AllCleared()]
    finally:
        publisher.close()


async def test_an_endpoint_that_cannot_bind_fails_at_open_naming_it(tmp_path: Path) -> None:
    holder = EventPublisher(events_config())
    try:
        config = chain_config(tmp_path, 4, None, None, device="cpu")
        config["events"] = {"enabled": True, "endpoint": holder.endpoint}
        h = Hierarchy.from_config(config)
        with pytest.raises(EventsEndpointError, match=r"^events\.endpoint: cannot bind tcp://"):
            await h.open()
        assert h.closed
        config["events"] = {
            "enabled": True,
            "endpoint": "tcp://127.0.0.1:0",
            "replay_endpoint": holder.endpoint,
        }
        with pytest.raises(EventsEndpointError, match=r"^events\.replay_endpoint: "):
            await Hierarchy.from_config(config).open()
    finally:
        holder.close()


def test_the_events_table_is_off_by_default_and_checked() -> None:
    base: dict[str, Any] = {
        "block_size": BLOCK,
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 4}],
    }
    assert parse_config(base).events.enabled is False
    cases = [
        ({"endpoint": "http://x:1"}, "events.endpoint: expected a ZMQ address"),
        ({"replay_endpoint": "tcp://"}, "events.replay_endpoint: expected a ZMQ address"),
        ({"queue_events": 0}, "events.queue_events: expected 1 to"),
        ({"replay_batches": -1}, "events.replay_batches: expected 1 to"),
        ({"tiers": ["gpu"]}, 'events.tiers: no tier is named "gpu"'),
        ({"wire_block_size": -16}, "events.wire_block_size: expected 0"),
        ({"block_hashes": "int"}, "events.block_hashes: expected one of bytes, vllm-int"),
        ({"port": 5557}, "events.port: unknown key"),
    ]
    for table, message in cases:
        with pytest.raises(ConfigError) as caught:
            parse_config({**base, "events": table})
        assert str(caught.value).splitlines()[-1].startswith(message), str(caught.value)


def test_vllm_int_hashes_are_the_ints_vllms_own_events_carry() -> None:
    """With `block_hashes = "vllm-int"` a block's key is the int vLLM's events give the same
    block (its default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES), so a router matches kvtier's
    tiers to the engine's own device events; vLLM's classes decode the batch."""
    kv_cache_utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    hashes = [bytes([n]) * 32 for n in (1, 0x80, 0xFF)]  # high bits set: unsigned ints
    event = OffloadingEvent(
        tuple(make_offload_key(h, group) for h, group in zip(hashes, (0, 1, 2), strict=True)),
        BLOCK,
        "disk",
        False,
        "disk",
    )
    wire = to_wire(event, 16, "vllm-int")
    assert wire.block_hashes == [kv_cache_utils.maybe_convert_block_hash(h) for h in hashes]
    assert all(isinstance(h, int) and 0 <= h < 1 << 64 for h in wire.block_hashes)
    batch = KVEventBatch(ts=1.0, events=[wire])
    decoded = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch).decode(encode_batch(batch))
    assert decoded.events[0].block_hashes == wire.block_hashes


def test_sglang_int_hashes_are_sglangs_int64_of_the_page_hash() -> None:
    """With `block_hashes = "sglang-int"` a page's key is SGLang's `hash_str_to_int64` of its
    page hash (the first 16 hex digits, signed), for the keys kvtier's SGLang backend makes."""
    store = pytest.importorskip("kvtier.integrations.sglang.store")
    pages = ["00" * 32, "7f" + "ab" * 31, "ff" * 32, "80" + "01" * 31]

    def hash_str_to_int64(hash_str: str) -> int:  # SGLang 0.5.23, mem_cache/utils.py
        value = int(hash_str[:16], 16)
        return value - (1 << 64) if value >= 1 << 63 else value

    keys = tuple(store.page_key(page) for page in pages)
    assert all(key.startswith(SGLANG_PAGE_TAG) for key in keys)
    wire = to_wire(OffloadingEvent(keys, BLOCK, "cpu", True, "cpu"), 0, "sglang-int")
    assert wire.block_hashes == [hash_str_to_int64(page) for page in pages]


def test_the_publisher_writes_keys_as_configured() -> None:
    """A publisher with `block_hashes = "vllm-int"` sends ints, by its config."""
    config = EventsConfig(enabled=True, endpoint="inproc://vllm-int", block_hashes="vllm-int")
    publisher = EventPublisher(config)
    assert publisher.block_hashes == "vllm-int"
    publisher.close()


def test_no_secret_reaches_an_event() -> None:
    """An event carries keys, a tier's name and medium, a block size: its encoding has no
    field for anything else (what vLLM defines, nothing of the config)."""
    wire = to_wire(OffloadingEvent((key(1),), BLOCK, "redis", False, "shared"), 0)
    fields = set(type(wire).__struct_fields__)
    assert fields <= set(kv_events.BlockStored.__struct_fields__)
    assert encode_batch(KVEventBatch(ts=0.0, events=[wire])).count(b"redis://") == 0


def test_kvtier_inside_vllm_publishes_what_its_tiers_hold(tmp_path: Path) -> None:
    """The same events from kvtier as vLLM's secondary tier: the chain of the vLLM path
    emits them (its [events] table), a vLLM subscriber reads the disk tier's stores."""
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
    from vllm_support import Driver, disk_chain, kvtier_tier
    from vllm_support import key as vllm_key

    from kvtier.integrations.vllm.testing import offloading_config

    chunk, primary = 4096, 8
    chain = disk_chain(tmp_path / "disk", 64, fsync=False)
    chain["events"] = {"enabled": True, "endpoint": "tcp://127.0.0.1:0", "tiers": ["disk"]}
    extra = {"cpu_bytes_to_use": primary * chunk, "secondary_tiers": [kvtier_tier(chain)]}
    spec = TieringOffloadingSpec(offloading_config(extra, block_bytes=chunk, model="kvtier-e"))
    manager = spec.get_manager()
    driver = Driver(manager)
    tier = manager.secondary_tiers[0]
    publisher = tier.hierarchy.call(lambda h: h._publisher)  # the endpoint it bound
    subscriber = Subscriber(publisher.endpoint)
    try:
        batches = connected(publisher, subscriber, tier="disk")
        keys = [vllm_key(i) for i in range(2 * primary)]
        for first in range(0, len(keys), primary):
            driver.store(keys[first : first + primary], first)
            driver.settle()
        on_disk = tier.hierarchy.call(lambda h: [k for k in keys if h.where(k) == "disk"])
        assert on_disk
        announced: set[bytes] = set()
        while not set(on_disk) <= announced:
            _, _, batch = subscriber.receive()
            for event in batch.events:
                if isinstance(event, kv_events.BlockStored):
                    assert (event.ownership, event.medium) == ("disk", "DISK")
                    assert event.block_size == 0  # wire_block_size not given: unknown
                    announced.update(event.block_hashes)
        assert batches
    finally:
        subscriber.close()
        driver.close()
        manager.shutdown()


async def test_an_authenticated_publisher_signs_every_message(tmp_path: Path) -> None:
    """With a key, each message has a fourth frame (key id + MAC) that a holder of the key
    and namespace verifies; a changed frame, another namespace or another key fails; no key
    byte is in any frame."""
    from kvtier.fleet.auth import BatchAuth
    from kvtier.tiers.shared.auth import ValueKey, new_key, write_key_file

    material = new_key()
    key_file = tmp_path / "events.key"
    write_key_file(key_file, material)
    config = chain_config(tmp_path, 4, None, None, device="cpu", model_id="m")
    config["events"] = {
        "enabled": True,
        "endpoint": "tcp://127.0.0.1:0",
        "auth_key_file": str(key_file),
    }
    h = Hierarchy.from_config(config)
    await h.open()
    publisher = h._publisher  # the endpoint it bound
    assert publisher is not None and publisher.auth is not None
    subscriber = Subscriber(publisher.endpoint)
    subscriber.sub.setsockopt(zmq.RCVTIMEO, 50)
    try:
        probe = OffloadingEvent((b"probe",), BLOCK, "cpu", True, "gpu")
        for _ in range(HANG_S // 50):
            publisher.offer(probe)
            try:
                frames = subscriber.sub.recv_multipart()
                break
            except zmq.Again:
                continue
        else:
            raise AssertionError("the subscriber never connected")
    finally:
        subscriber.close()
        await h.close()
    namespace = h.config.namespace
    ours = BatchAuth(ValueKey(material, "test"), namespace)
    assert len(frames) == 4 and ours.verify(frames)
    assert not ours.verify([frames[0], frames[1], frames[2] + b"x", frames[3]])
    assert not ours.verify([frames[0], (1).to_bytes(8, "big"), frames[2], frames[3]])
    assert not BatchAuth(ValueKey(material, "test"), namespace + "x").verify(frames)
    assert not BatchAuth(ValueKey(new_key(), "test"), namespace).verify(frames)
    assert not ours.verify(frames[:3])
    assert all(material not in frame and material.hex().encode() not in frame for frame in frames)
    assert "probe" not in repr(ours) and material.hex() not in repr(ours)


async def test_a_missing_events_key_fails_at_open_naming_the_file(tmp_path: Path) -> None:
    config = chain_config(tmp_path, 4, None, None, device="cpu")
    config["events"] = {
        "enabled": True,
        "endpoint": "tcp://127.0.0.1:0",
        "auth_key_file": str(tmp_path / "absent.key"),
    }
    h = Hierarchy.from_config(config)
    with pytest.raises(ConfigError, match=r"absent\.key"):
        await h.open()
    assert h.closed
    both = {"enabled": True, "auth_key_file": "/k", "auth_key_env": "KVTIER_EVENTS_KEY"}
    with pytest.raises(ConfigError, match=r"^events: give auth_key_file or auth_key_env"):
        parse_config({**config, "events": both})


async def test_a_publisher_that_sends_nothing_never_holds_up_a_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publisher's thread never runs (as if the socket were stuck): every put still
    completes, and what did not fit the queue is counted in stats() and the metrics' source."""
    monkeypatch.setattr(EventPublisher, "start", lambda self: None)
    config = chain_config(tmp_path, 4, 8, None, device="cpu")
    config["events"] = {"enabled": True, "endpoint": "tcp://127.0.0.1:0", "queue_events": 3}
    ks = [key(i) for i in range(16)]
    async with Hierarchy.from_config(config) as h:
        for first in range(0, 16, 4):
            assert await h.put(ks[first : first + 4], blocks_of(ks[first : first + 4])) == 4
        await h.drain()
        stats = h.stats()
        assert stats.fleet_events_sent == 0
        assert stats.fleet_events_dropped > 0
        publisher = h._publisher  # its queue, for the count
        assert publisher is not None and len(publisher.queue) == 3
