"""The fleet's subscriber (issue 32, item 3, the wire side): N publishers into one
`PrefixIndex`; a gap healed by the replay socket, or by a snapshot when the replay cannot
fill it; bad frames counted and dropped; a node that stops answering forgotten. The node is
played by the test (a PUB and a ROUTER it drives), so every gap is made on purpose. No test
races a clock: each waits for a condition, with a generous deadline that only catches a hang."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hierarchy_helpers import blocks_of, chain_config, key

from kvtier import Hierarchy
from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from kvtier.fleet.auth import BatchAuth  # noqa: E402 - needs the events extra
from kvtier.fleet.events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    WireEvent,
    block_stored,
    encode_batch,
)
from kvtier.fleet.index import PrefixIndex  # noqa: E402
from kvtier.fleet.publisher import END_SEQ, SEQ_BITS, SNAPSHOT  # noqa: E402
from kvtier.fleet.subscriber import FleetSubscriber, NodeEndpoints  # noqa: E402
from kvtier.tiers.shared.auth import ValueKey  # noqa: E402

pytestmark = pytest.mark.timeout(300)

DEADLINE_S = 60.0
INCARNATION = 7


def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for `condition` (a deadline that only catches a hang)."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.01)


def stored(keys: list[OffloadKey], medium: str = "CPU") -> BlockStored:
    return block_stored(keys, medium)


def payload(*events: WireEvent) -> bytes:
    return encode_batch(KVEventBatch(ts=0.0, events=list(events)))


def seq(n: int) -> bytes:
    return (INCARNATION << SEQ_BITS | n).to_bytes(8, "big")


class FakeNode:
    """A node's two sockets, driven by the test."""

    def __init__(self, auth: BatchAuth | None = None) -> None:
        self.auth = auth
        self.context = zmq.Context()
        self.pub = self.context.socket(zmq.PUB)
        self.pub.bind("tcp://127.0.0.1:0")
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.RCVTIMEO, int(DEADLINE_S * 1000))
        self.router.bind("tcp://127.0.0.1:0")

    def endpoints(self, name: str) -> NodeEndpoints:
        return NodeEndpoints(
            name,
            self.pub.getsockopt_string(zmq.LAST_ENDPOINT),
            self.router.getsockopt_string(zmq.LAST_ENDPOINT),
        )

    def frames(self, topic: bytes, number: bytes, body: bytes) -> list[bytes]:
        if self.auth is None:
            return [topic, number, body]
        return [topic, number, body, self.auth.sign(topic, number, body)]

    def publish(self, n: int, *events: WireEvent) -> None:
        self.pub.send_multipart(self.frames(b"", seq(n), payload(*events)))

    def request(self) -> tuple[bytes, bytes]:
        """The next request on the replay socket: (identity, body)."""
        while True:
            identity, empty, body = self.router.recv_multipart()
            if empty == b"" and body != b"":
                return identity, body

    def reply(self, identity: bytes, *frames: bytes) -> None:
        self.router.send_multipart([identity, b"", *frames])

    def answer_snapshot(self, identity: bytes, n: int, *events: WireEvent) -> None:
        body = payload(AllBlocksCleared(), *events)
        self.reply(identity, *self.frames(SNAPSHOT, seq(n), body))

    def close(self) -> None:
        self.pub.close(linger=0)
        self.router.close(linger=0)
        self.context.term()


def holdings(index: PrefixIndex, node: str) -> dict[bytes, set[str]]:
    return {k: set(media) for k, media in index.holdings(node).items()}


def connected(node: FakeNode, index: PrefixIndex, n: int, *events: WireEvent) -> None:
    """Publish batch `n` until the subscriber applied it (a PUB drops what it sends before
    the subscription reaches it)."""
    wanted = INCARNATION << SEQ_BITS | (n + 1)
    deadline = time.monotonic() + DEADLINE_S
    while index.expected_seq("a") != wanted:
        if time.monotonic() > deadline:
            raise AssertionError("the subscriber never received")
        node.publish(n, *events)
        time.sleep(0.02)


def test_a_gap_is_healed_by_the_replay_else_by_a_snapshot() -> None:
    node = FakeNode()
    index = PrefixIndex()
    subscriber = FleetSubscriber(index, [node.endpoints("a")], probe_after_s=600)
    subscriber.start()
    try:
        identity, body = node.request()  # never heard of: a snapshot first
        assert body == SNAPSHOT
        node.answer_snapshot(identity, 0, stored([key(0)]))
        until(lambda: holdings(index, "a") == {key(0): {"CPU"}}, "the snapshot applied")
        connected(node, index, 1, stored([key(1)]))
        node.publish(3, stored([key(3)]))  # 2 is missed: a gap
        identity, body = node.request()
        assert body == seq(2)  # a replay from what the index expects
        node.reply(identity, *node.frames(b"", seq(2), payload(stored([key(2)]))))
        node.reply(identity, *node.frames(b"", seq(3), payload(stored([key(3)]))))
        node.reply(identity, b"", END_SEQ, b"")
        until(lambda: len(holdings(index, "a")) == 4, "the replay healed the gap")
        assert not index.is_stale("a")
        node.publish(5, BlockRemoved(block_hashes=[key(0)], medium="CPU"))  # 4 missed
        identity, body = node.request()
        assert body == seq(4)
        node.reply(identity, b"", END_SEQ, b"")  # the replay no longer has it
        identity, body = node.request()
        assert body == SNAPSHOT
        node.answer_snapshot(identity, 5, stored([key(1), key(5)]), stored([key(2)], "DISK"))
        node.publish(6, stored([key(6)]))  # after the snapshot: applies
        until(
            lambda: (
                holdings(index, "a")
                == {key(1): {"CPU"}, key(5): {"CPU"}, key(2): {"DISK"}, key(6): {"CPU"}}
            ),
            "the snapshot and the batch after it applied",
        )
        counters = subscriber.counters()["a"]
        assert counters.gaps == 2 and counters.replays == 2 and counters.snapshots == 2
    finally:
        subscriber.close()
        node.close()


def test_bad_frames_are_counted_and_dropped() -> None:
    node = FakeNode()
    index = PrefixIndex()
    subscriber = FleetSubscriber(index, [node.endpoints("a")], topic=b"", probe_after_s=600)
    subscriber.start()
    try:
        identity, _ = node.request()
        node.answer_snapshot(identity, 0)
        connected(node, index, 1, stored([key(1)]))
        node.pub.send_multipart([b"", seq(2)])  # two frames
        node.pub.send_multipart([b"", b"short", payload(stored([key(9)]))])
        node.pub.send_multipart([b"", seq(2), b"\x93garbage"])  # not a batch: REJECTED
        node.pub.send_multipart([b"", seq(2), payload(stored([key(9)])), b"a mac"])
        node.publish(2, stored([key(2)]))  # still applied after all that
        until(lambda: key(2) in holdings(index, "a"), "the good batch applied")
        assert key(9) not in holdings(index, "a")
        assert subscriber.counters()["a"].malformed == 4
    finally:
        subscriber.close()
        node.close()


def test_another_topic_is_ignored() -> None:
    node = FakeNode()
    index = PrefixIndex()
    subscriber = FleetSubscriber(index, [node.endpoints("a")], topic=b"kv", probe_after_s=600)
    subscriber.start()
    try:
        identity, _ = node.request()
        node.answer_snapshot(identity, 0)
        until(lambda: index.expected_seq("a") is not None, "the snapshot applied")
        wanted = INCARNATION << SEQ_BITS | 2
        while index.expected_seq("a") != wanted:  # until the subscription is there
            node.pub.send_multipart([b"kv-other", seq(1), payload(stored([key(9)]))])
            node.pub.send_multipart([b"kv", seq(1), payload(stored([key(1)]))])
            time.sleep(0.02)
        assert holdings(index, "a") == {key(1): {"CPU"}}
        assert subscriber.counters()["a"].wrong_topic >= 1
    finally:
        subscriber.close()
        node.close()


def test_with_a_key_only_signed_messages_apply() -> None:
    auth = BatchAuth(ValueKey(bytes(range(32)), "test"), "ns")
    node = FakeNode(auth)
    index = PrefixIndex()
    subscriber = FleetSubscriber(index, [node.endpoints("a")], auth=auth, probe_after_s=600)
    subscriber.start()
    try:
        identity, _ = node.request()
        node.answer_snapshot(identity, 0, stored([key(0)]))
        connected(node, index, 1, stored([key(1)]))
        forged = BatchAuth(ValueKey(bytes(32), "forged"), "ns")
        body = payload(stored([key(9)]))
        node.pub.send_multipart([b"", seq(2), body, forged.sign(b"", seq(2), body)])
        node.publish(2, stored([key(2)]))
        until(lambda: key(2) in holdings(index, "a"), "the signed batch applied")
        assert key(9) not in holdings(index, "a")
        assert subscriber.counters()["a"].malformed == 1
    finally:
        subscriber.close()
        node.close()


def test_a_node_that_stops_answering_is_forgotten() -> None:
    node = FakeNode()
    index = PrefixIndex()
    subscriber = FleetSubscriber(
        index, [node.endpoints("a")], probe_after_s=0.2, unreachable_after_s=1.0
    )
    subscriber.start()
    try:
        identity, _ = node.request()
        node.answer_snapshot(identity, 0, stored([key(0)]))
        until(lambda: holdings(index, "a") == {key(0): {"CPU"}}, "the snapshot applied")
        identity, body = node.request()  # silent: probed, from what the index expects
        assert body == seq(1)
        node.reply(identity, b"", END_SEQ, b"")  # answered: still known
        node.close()  # then gone
        until(lambda: "a" not in index.nodes(), "the silent node forgotten")
        assert subscriber.counters()["a"].unreachable == 1
    finally:
        subscriber.close()


def test_bad_node_lists_fail_naming_the_value() -> None:
    with pytest.raises(InvalidValueError, match="node 'a': no endpoint"):
        NodeEndpoints.parse("a=")
    with pytest.raises(InvalidValueError, match="node 'tcp://x': expected name=pub_endpoint"):
        NodeEndpoints.parse("tcp://x")
    with pytest.raises(InvalidValueError, match="node 'b': 'http://x' is not a ZMQ address"):
        NodeEndpoints.parse("b=http://x")
    with pytest.raises(InvalidValueError, match="node 'c' is given twice"):
        FleetSubscriber(
            PrefixIndex(), [NodeEndpoints("c", "tcp://127.0.0.1:1")] * 2, probe_after_s=1
        )
    with pytest.raises(InvalidValueError, match="probe_after_s must be > 0"):
        FleetSubscriber(PrefixIndex(), [NodeEndpoints("c", "tcp://127.0.0.1:1")], probe_after_s=0)
    node = NodeEndpoints.parse(" d = tcp://127.0.0.1:5557 , tcp://127.0.0.1:5558")
    assert node == NodeEndpoints("d", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558")


async def test_a_hierarchys_tiers_as_the_index_sees_them(tmp_path: Path) -> None:
    """A real node (a Hierarchy with [events]) and the subscriber in one process: once the
    chain is quiet, the index holds exactly what each tier holds, on its medium."""
    config = chain_config(tmp_path, None, 4, 8, device="cpu")
    config["events"] = {
        "enabled": True,
        "endpoint": "tcp://127.0.0.1:0",
        "replay_endpoint": "tcp://127.0.0.1:0",
    }
    ks = [key(i) for i in range(24)]
    index = PrefixIndex()
    async with Hierarchy.from_config(config) as h:
        publisher = h._publisher  # the test reads the endpoints it bound
        assert publisher is not None
        spec = NodeEndpoints("n", publisher.endpoint, publisher.replay_endpoint)
        subscriber = FleetSubscriber(index, [spec], probe_after_s=0.2)
        subscriber.start()
        try:
            for i in range(0, 24, 4):
                await h.put(ks[i : i + 4], blocks_of(ks[i : i + 4]))
            await h.drain()
            media = {tier.name: tier.medium.upper() for tier in h.manager.tiers}
            truth: dict[bytes, set[str]] = {}
            for tier in h.manager.tiers:
                for k in ks:
                    if tier.has(k) is True:
                        truth.setdefault(k, set()).add(media[tier.name])
            assert len(truth) < len(ks)  # evictions happened
            assert {"CPU", "DISK"} <= {m for found in truth.values() for m in found}

            def equal() -> bool:
                return holdings(index, "n") == truth

            deadline = time.monotonic() + DEADLINE_S
            while not equal() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert equal()
        finally:
            subscriber.close()


def test_random_frames_are_counted_and_never_stop_the_subscriber() -> None:
    """A fuzz: messages of random frames (some with a valid sequence number and a mangled
    payload) on the PUB socket and as the replay socket's answers; each is dropped and
    counted, and a good batch after them all still applies."""
    rng = random.Random(32)
    node = FakeNode()
    index = PrefixIndex()
    subscriber = FleetSubscriber(index, [node.endpoints("a")], probe_after_s=600)
    subscriber.start()
    good = payload(stored([key(1)]), BlockRemoved(block_hashes=[key(0)], medium="CPU"))

    def junk() -> list[bytes]:
        frames = [rng.randbytes(rng.choice((0, 1, 8, 30))) for _ in range(rng.randint(1, 6))]
        if len(frames) >= 3 and rng.random() < 0.5:  # a real header, a truncated payload
            frames[0], frames[1] = b"", seq(rng.randint(1, 3))
            cut = bytearray(good[: rng.randrange(len(good))])
            if cut and rng.random() < 0.5:
                cut[rng.randrange(len(cut))] ^= 0xFF
            frames[2] = bytes(cut)
        return frames

    try:
        identity, _ = node.request()
        node.answer_snapshot(identity, 0, stored([key(0)]))
        until(lambda: index.expected_seq("a") is not None, "the snapshot applied")
        for _ in range(300):
            node.pub.send_multipart(junk())
            node.reply(identity, *junk())
        connected(node, index, 1, stored([key(5)]))
        assert holdings(index, "a") == {key(0): {"CPU"}, key(5): {"CPU"}}
        assert subscriber.counters()["a"].malformed > 0
        assert subscriber._thread.is_alive()  # the test reads the thread it started
    finally:
        subscriber.close()
        node.close()
