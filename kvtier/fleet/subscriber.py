"""The fleet's subscriber: every node's event batches, over ZMQ, into one `PrefixIndex`.

One thread polls, per node, a SUB socket on its PUB endpoint (one socket each: a SUB does
not say which publisher sent a message) and, when the node has one, a DEALER on its replay
endpoint (`kvtier.fleet.publisher` documents the frames). Each batch goes to
`PrefixIndex.apply_payload`; what the index answers decides what happens next:

- APPLIED, DUPLICATE: nothing more. RESTART (a new incarnation: the node's entries were
  dropped, the batch applied): nothing more either; the restarted node's first batch is
  `AllBlocksCleared`, then it announces what it restored.
- GAP (batches were missed: dropped by the node's bounded queue, by a high-water mark, or
  sent before this subscriber connected): the node is stale and answers nothing; the
  subscriber asks the replay socket for every batch from `expected_seq` on, and while it
  waits, buffers the node's new batches (at most `buffer_batches`; the rest come back by
  the same replay or snapshot). If the replay cannot fill the gap (its end marker comes and
  the node is still stale: the missing batches are older than the replay keeps, or were
  never sent), it asks for a snapshot and hands it to `replace_node`; then the buffered
  batches apply. A node without a replay endpoint stays stale until its next restart.
- REJECTED (a malformed, truncated or oversized payload): counted, dropped.

Frames that are not a batch (wrong count, a sequence frame not 8 bytes, a topic other than
the configured one, with a key a MAC that does not verify) are counted and dropped, never
applied; a publisher not configured is never heard (each socket connects to one node).

A node never heard of (this subscriber started after it, or it was forgotten) is asked for
a snapshot at once, then every `probe_after_s` until one comes (a node that is down is
asked again when it is up). A silent node: while a node sends nothing for `probe_after_s`,
the subscriber sends its replay socket a replay request from `expected_seq` on, as a probe:
it is answered at once (an end marker, or the batches this subscriber missed at the end of
the stream, which no later batch would have revealed as a gap: they are applied). A node
that has answered nothing (no batch, no reply) for `unreachable_after_s` is unreachable:
its entries are dropped (`PrefixIndex.forget`; a router then routes as if it held nothing)
and its replay socket is reopened; when it answers again it is started afresh (a snapshot,
or its batches: a GAP healed as above, or a RESTART). So a dead node's blocks leave the
index `unreachable_after_s` after it was last heard. A node with no replay endpoint is never
probed nor snapshotted: it keeps its entries until it restarts, and a gap leaves it stale
(answering nothing) until then.

A MAC (`kvtier.fleet.auth`) is checked on every batch and snapshot when a key is given;
without one, a message that carries a fourth frame is counted malformed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from kvtier.errors import InvalidValueError, KvtierError
from kvtier.fleet.auth import BatchAuth
from kvtier.fleet.events import BlockStored, decode_batch
from kvtier.fleet.index import ApplyOutcome, PrefixIndex, key_of
from kvtier.fleet.publisher import END_SEQ, SNAPSHOT

try:
    import zmq
except ImportError:  # pragma: no cover - the extra is missing
    zmq = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

POLL_MS = 50
"""How long the thread waits for a message before it looks at its clocks again."""
ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True, slots=True)
class NodeEndpoints:
    """One node: its name in the index, its PUB endpoint and its replay endpoint ("": none)."""

    name: str
    endpoint: str
    replay_endpoint: str = ""

    @classmethod
    def parse(cls, spec: str) -> NodeEndpoints:
        """`name=pub_endpoint[,replay_endpoint]`; InvalidValueError naming `spec` if not."""
        name, sep, rest = spec.partition("=")
        endpoints = rest.split(",") if sep else []
        if not name.strip() or not 1 <= len(endpoints) <= 2:
            raise InvalidValueError(f"node {spec!r}: expected name=pub_endpoint[,replay_endpoint]")
        node = cls(name.strip(), *(endpoint.strip() for endpoint in endpoints))
        node.check()
        return node

    def check(self) -> None:
        """InvalidValueError naming the node and endpoint that is not a ZMQ address."""
        for endpoint in (self.endpoint, self.replay_endpoint):
            if endpoint and not endpoint.startswith(ENDPOINT_SCHEMES):
                raise InvalidValueError(
                    f"node {self.name!r}: {endpoint!r} is not a ZMQ address (tcp://host:port)"
                )
        if not self.endpoint:
            raise InvalidValueError(f"node {self.name!r}: no endpoint")


@dataclass(slots=True)
class NodeCounters:
    """What the subscriber saw of one node."""

    batches: int = 0
    malformed: int = 0
    """Frames dropped: a wrong count or sequence frame, a bad MAC, or a payload REJECTED."""
    wrong_topic: int = 0
    gaps: int = 0
    replays: int = 0
    snapshots: int = 0
    snapshots_unavailable: int = 0
    probes: int = 0
    unreachable: int = 0
    """Times the node stopped answering and its entries were dropped."""


@dataclass(slots=True)
class _Node:
    """One node's sockets and where its healing stands."""

    spec: NodeEndpoints
    sub: zmq.Socket[bytes]
    dealer: zmq.Socket[bytes] | None
    counters: NodeCounters = field(default_factory=NodeCounters)
    asking: str = ""
    """"" nothing asked; "replay" (a heal), "probe", or "snapshot": what the dealer waits for."""
    asked_at: float = 0.0
    heard_at: float = 0.0
    buffer: collections.deque[tuple[int, bytes]] = field(default_factory=collections.deque)
    snapshot_wanted: bool = False


class FleetSubscriber:
    """Feeds `index` from `nodes` in a thread of its own, from `start` until `close`."""

    def __init__(
        self,
        index: PrefixIndex,
        nodes: Sequence[NodeEndpoints],
        *,
        topic: bytes = b"",
        auth: BatchAuth | None = None,
        probe_after_s: float = 5.0,
        unreachable_after_s: float = 30.0,
        buffer_batches: int = 10_000,
        receive_hwm: int = 1000,
        max_message_bytes: int = 128 << 20,
    ) -> None:
        """InvalidValueError naming a node or value that is wrong (two nodes of one name, a
        bad endpoint, a bound not positive); EventsEndpointError if the extra is missing.
        `receive_hwm`: messages a SUB socket queues (past it ZMQ drops: a gap, healed)."""
        if zmq is None:
            raise KvtierError(
                "the fleet index needs the events extra: pip install 'kvtier[events]'"
            )
        names = [node.name for node in nodes]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise InvalidValueError(f"node {duplicates[0]!r} is given twice")
        if not nodes:
            raise InvalidValueError("no node to subscribe to")
        for name, value in (
            ("probe_after_s", probe_after_s),
            ("unreachable_after_s", unreachable_after_s),
            ("buffer_batches", buffer_batches),
            ("receive_hwm", receive_hwm),
            ("max_message_bytes", max_message_bytes),
        ):
            if not value > 0:
                raise InvalidValueError(f"{name} must be > 0, got {value!r}")
        for node in nodes:
            node.check()
        self.index = index
        self.topic = topic
        self.auth = auth
        self.probe_after_s = probe_after_s
        self.unreachable_after_s = unreachable_after_s
        self.buffer_batches = buffer_batches
        self._receive_hwm = receive_hwm
        self._max_bytes = max_message_bytes
        self._context = zmq.Context()
        now = time.monotonic()
        self._nodes: dict[str, _Node] = {}
        try:
            for spec in nodes:
                state = _Node(spec, self._sub(spec), self._dealer(spec), heard_at=now)
                state.asked_at = now - probe_after_s  # the first tick asks a snapshot
                self._nodes[spec.name] = state
        except BaseException:
            self._close_sockets()
            raise
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtier-fleet-sub", daemon=True)

    def _sub(self, spec: NodeEndpoints) -> zmq.Socket[bytes]:
        socket: zmq.Socket[bytes] = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, self._receive_hwm)
        socket.setsockopt(zmq.MAXMSGSIZE, self._max_bytes)
        socket.setsockopt(zmq.SUBSCRIBE, self.topic)
        self._connect(socket, spec.name, spec.endpoint)
        return socket

    def _dealer(self, spec: NodeEndpoints) -> zmq.Socket[bytes] | None:
        if not spec.replay_endpoint:
            return None
        socket: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IMMEDIATE, 1)  # a request to a node not connected fails at once
        socket.setsockopt(zmq.MAXMSGSIZE, self._max_bytes)
        self._connect(socket, spec.name, spec.replay_endpoint)
        return socket

    @staticmethod
    def _connect(socket: zmq.Socket[bytes], name: str, endpoint: str) -> None:
        try:
            socket.connect(endpoint)
        except zmq.ZMQError as error:
            socket.close(linger=0)
            raise InvalidValueError(
                f"node {name!r}: cannot connect to {endpoint}: {error}"
            ) from None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and close the sockets. Idempotent."""
        self._stopping.set()
        if self._thread.ident is None:
            self._close_sockets()
            return
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("kvtier fleet: the subscriber thread did not stop in %ss", timeout_s)

    def _close_sockets(self) -> None:
        for node in self._nodes.values():
            for socket in (node.sub, node.dealer):
                if socket is not None:
                    socket.close(linger=0)
        if not self._context.closed:
            self._context.term()

    def counters(self) -> dict[str, NodeCounters]:
        """Per node, a copy of what the subscriber saw."""
        return {name: dataclasses.replace(node.counters) for name, node in self._nodes.items()}

    def healing(self) -> list[str]:
        """The nodes whose replay or snapshot is being waited for."""
        return [name for name, node in self._nodes.items() if node.asking in ("replay", "snapshot")]

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        owners: dict[zmq.Socket[bytes], tuple[_Node, bool]] = {}
        try:
            while not self._stopping.is_set():
                for node in self._nodes.values():
                    for socket, is_sub in ((node.sub, True), (node.dealer, False)):
                        if socket is not None and socket not in owners:
                            poller.register(socket, zmq.POLLIN)
                            owners[socket] = (node, is_sub)
                for socket, _ in poller.poll(POLL_MS):
                    node, is_sub = owners[socket]
                    try:
                        if is_sub:
                            self._on_batch(node, socket.recv_multipart(zmq.NOBLOCK))
                        else:
                            self._on_reply(node, socket.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        continue
                    except Exception as error:  # one node's trouble must not stop the rest
                        node.counters.malformed += 1
                        log.warning("kvtier fleet: node %s: %s", node.spec.name, error)
                now = time.monotonic()
                for node in self._nodes.values():
                    retired = self._on_clock(node, now)
                    if retired is not None:
                        poller.unregister(retired)
                        owners.pop(retired, None)
                        retired.close(linger=0)
        finally:
            self._close_sockets()

    def _split(self, node: _Node, frames: list[bytes], topic: bytes) -> tuple[int, bytes] | None:
        """(seq, payload) of a message [topic, seq, payload(, mac)], or None (counted)."""
        if len(frames) != (3 if self.auth is None else 4) or len(frames[1]) != 8:
            node.counters.malformed += 1
            return None
        if frames[0] != topic:
            node.counters.wrong_topic += 1
            return None
        if self.auth is not None and not self.auth.verify(frames):
            node.counters.malformed += 1
            return None
        return int.from_bytes(frames[1], "big"), frames[2]

    def _on_batch(self, node: _Node, frames: list[bytes]) -> None:
        message = self._split(node, frames, self.topic)
        if message is None:
            return
        node.heard_at = time.monotonic()
        if node.asking == "probe":
            node.asking = ""  # heard: the probe's answer, if late, is harmless
        if node.asking in ("replay", "snapshot"):
            if len(node.buffer) < self.buffer_batches:
                node.buffer.append(message)
            return
        self._apply(node, *message)

    def _apply(self, node: _Node, seq: int, payload: bytes) -> None:
        node.counters.batches += 1
        outcome = self.index.apply_payload(node.spec.name, seq, payload)
        if outcome is ApplyOutcome.REJECTED:
            node.counters.malformed += 1
        elif outcome is ApplyOutcome.GAP:
            node.counters.gaps += 1
            self._heal(node)

    def _heal(self, node: _Node) -> None:
        """Ask the replay socket for what the index misses (or, once a replay could not
        fill it, a snapshot)."""
        if node.dealer is None:
            return  # no replay socket: stale until the node restarts
        if node.snapshot_wanted:
            self._ask(node, "snapshot", SNAPSHOT)
            return
        expected = self.index.expected_seq(node.spec.name)
        self._ask(node, "replay", (expected or 0).to_bytes(8, "big"))

    def _ask(self, node: _Node, what: str, body: bytes) -> None:
        node.asking, node.asked_at = what, time.monotonic()
        counters = node.counters
        if what == "replay":
            counters.replays += 1
        elif what == "probe":
            counters.probes += 1
        dealer = node.dealer
        if dealer is None:
            return
        with contextlib.suppress(zmq.Again):  # not connected: asked again (`_on_clock`)
            dealer.send_multipart((b"", body), zmq.NOBLOCK)

    def _on_reply(self, node: _Node, frames: list[bytes]) -> None:
        if not frames or frames[0] != b"":
            node.counters.malformed += 1
            return
        frames = frames[1:]
        node.heard_at = time.monotonic()
        if len(frames) == 3 and frames[0] == b"" and frames[1] == END_SEQ:
            self._replay_ended(node)
        elif frames and frames[0] == SNAPSHOT:
            self._on_snapshot(node, frames)
        else:
            message = self._split(node, frames, self.topic)
            if message is not None:
                node.counters.batches += 1
                if self.index.apply_payload(node.spec.name, *message) is ApplyOutcome.REJECTED:
                    node.counters.malformed += 1

    def _replay_ended(self, node: _Node) -> None:
        if node.asking not in ("replay", "probe"):
            return  # a late answer
        node.asking = ""
        if self.index.is_stale(node.spec.name):
            node.snapshot_wanted = True  # the replay could not fill the gap
            self._heal(node)
        else:
            self._drain(node)

    def _on_snapshot(self, node: _Node, frames: list[bytes]) -> None:
        if node.asking != "snapshot":
            return  # a late answer
        if len(frames) == 3 and frames[1] == END_SEQ:
            node.counters.snapshots_unavailable += 1
            node.asking, node.snapshot_wanted = "", False
            node.buffer.clear()  # stale until the node restarts: nothing to apply them to
            return
        message = self._split(node, frames, SNAPSHOT)
        holdings: dict[str, list[bytes]] = collections.defaultdict(list)
        try:
            if message is None:
                raise ValueError("not a snapshot")
            for event in decode_batch(message[1]).events:
                if isinstance(event, BlockStored):
                    holdings[event.medium or "GPU"].extend(map(key_of, event.block_hashes))
            self.index.replace_node(node.spec.name, message[0], holdings)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as error:
            node.counters.malformed += 1
            log.warning("kvtier fleet: node %s: a bad snapshot: %s", node.spec.name, error)
            return  # asked again when the request times out
        node.counters.snapshots += 1
        node.asking, node.snapshot_wanted = "", False
        self._drain(node)

    def _drain(self, node: _Node) -> None:
        """Apply the batches buffered while healing, in order (older ones are duplicates)."""
        while node.buffer and not node.asking:
            self._apply(node, *node.buffer.popleft())

    def _on_clock(self, node: _Node, now: float) -> zmq.Socket[bytes] | None:
        """Give up on a node silent past `unreachable_after_s` (its entries dropped, its
        replay socket reopened: the old one is returned to be closed); at most once per
        `probe_after_s`, ask a snapshot of a node never heard of, heal a stale one, probe a
        silent one."""
        if node.dealer is None:
            return None
        name = node.spec.name
        expected = self.index.expected_seq(name)
        if expected is not None and now - node.heard_at >= self.unreachable_after_s:
            node.counters.unreachable += 1
            log.warning("kvtier fleet: node %s does not answer: its entries are dropped", name)
            self.index.forget(name)
            old, node.dealer = node.dealer, self._dealer(node.spec)
            node.asking, node.snapshot_wanted = "", False
            node.buffer.clear()
            return old
        if now - node.asked_at < self.probe_after_s:
            return None
        if expected is None:
            node.snapshot_wanted = True
            self._heal(node)
        elif self.index.is_stale(name):
            self._heal(node)
        elif now - node.heard_at >= self.probe_after_s:
            self._ask(node, "probe", expected.to_bytes(8, "big"))
        return None


def nodes_from(specs: Iterable[str]) -> list[NodeEndpoints]:
    """`NodeEndpoints.parse` of each `name=pub[,replay]`."""
    return [NodeEndpoints.parse(spec) for spec in specs]
