"""The node's event publisher: the chain's events, in vLLM's wire format, over ZMQ.

The chain hands each event to `EventPublisher.offer` on the bookkeeping's thread: it is put
into a bounded queue (`EventQueue`) and nothing else, so a slow or absent subscriber never
slows a put; past the bound new events are dropped and counted. One thread drains the queue
into batches and sends each as vLLM's `ZmqEventPublisher` does, three frames on a PUB
socket: the topic, the sequence number (8 bytes, big-endian), the msgpack `KVEventBatch`.
It keeps the last `replay_batches` payloads for the replay socket (ROUTER): a request
`[identity, b"", start_seq (8 bytes)]` is answered with every kept batch from `start_seq` on,
each `[identity, b"", topic, seq, payload]`, then the end marker `[identity, b"", b"", -1
(8 bytes, signed), b""]`.

Sequence numbers: `incarnation << 32 | n`. The incarnation is random and new on every start
(`EventPublisher.incarnation`), so a consumer that knows kvtier tells a restart from a gap,
and one that reads the number as vLLM's plain counter still sees it grow within a run.
`n` counts batches from 0, and skips one number wherever events were dropped, so drops
appear to every consumer as a gap (which a replay cannot fill: the events never left).
The first batch of an incarnation is `AllBlocksCleared` (what an earlier run announced is
void); the last, at close, too.

No authentication by default: vLLM's consumers read exactly three frames, and an extra
frame (a MAC) would break them. A fleet whose event network is not trusted configures a key
(`auth_key_file` / `auth_key_env`): every message then has a fourth frame, its MAC
(`kvtier.fleet.auth`), which kvtier's consumers check. No secret is in any event: keys,
tier names, media.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.config_events import EventsConfig
from kvtier.errors import EventsEndpointError
from kvtier.fleet.auth import BatchAuth
from kvtier.fleet.events import KVEventBatch, encode_batch, to_wire
from kvtier.manager.base import OffloadingEvent
from kvtier.manager.events import AllCleared, ChainEvent

log = logging.getLogger(__name__)

try:
    import zmq
except ImportError:  # pragma: no cover - the extra is missing
    zmq = None  # type: ignore[assignment]

MAX_BATCH_EVENTS = 512
"""Most events in one batch (one message)."""
POLL_S = 0.05
"""How long the thread waits for events before it looks at the replay socket again."""
END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""vLLM's end-of-replay marker."""
SEQ_BITS = 32
"""Bits of a sequence number below the incarnation."""


class EventQueue:
    """A bounded, thread-safe queue: `offer` never waits; past `bound` it drops and counts."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._items: deque[ChainEvent] = deque()
        self._ready = threading.Condition(threading.Lock())
        self.dropped = 0
        """Events dropped because the queue was full (never reset)."""

    def offer(self, item: ChainEvent) -> bool:
        """Queue `item`; False (counted) when the queue is full."""
        with self._ready:
            if len(self._items) >= self.bound:
                self.dropped += 1
                return False
            self._items.append(item)
            self._ready.notify()
        return True

    def take(self, most: int, timeout_s: float) -> tuple[list[ChainEvent], int]:
        """Up to `most` items, oldest first, waiting at most `timeout_s` for the first; and
        the drops counted so far."""
        with self._ready:
            if not self._items:
                self._ready.wait(timeout_s)
            items = [self._items.popleft() for _ in range(min(most, len(self._items)))]
            return items, self.dropped

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """What a publisher did: batches and events sent, events dropped, replays served."""

    incarnation: int
    batches: int
    events: int
    dropped: int
    replays: int
    bad_replay_requests: int
    failed: int
    """Batches the thread could not send (logged)."""


class EventPublisher:
    """Binds the `[events]` sockets at construction, publishes from its thread once
    `start`ed, until `close`. `offer` is the chain's sink (`TieredManager.connect_events`)."""

    def __init__(
        self,
        config: EventsConfig,
        block_size_tokens: int | None = None,
        *,
        auth: BatchAuth | None = None,
    ) -> None:
        """Raises EventsEndpointError naming the key and endpoint that cannot bind (or the
        missing extra). `block_size_tokens`: `BlockStored.block_size` (None: the config's
        `wire_block_size`). `auth`: sign every message with a fourth frame (None: vLLM's
        three frames, the default)."""
        if zmq is None:
            raise EventsEndpointError(
                "[events] needs the events extra: pip install 'kvtier[events]' (pyzmq, msgspec)"
            )
        self.config = config
        self.block_size = config.wire_block_size if block_size_tokens is None else block_size_tokens
        self.topic = config.topic.encode()
        self.auth = auth
        self.incarnation = secrets.randbelow((1 << 31) - 1) + 1
        """New on every start: the high bits of every sequence number."""
        self._tiers = frozenset(config.tiers)
        self.queue = EventQueue(config.queue_events)
        self._replay_buffer: deque[tuple[int, bytes]] = deque(maxlen=config.replay_batches)
        self._context = zmq.Context()
        self._pub = self._replay = None
        try:
            self._pub = self._bind(zmq.PUB, "events.endpoint", config.endpoint)
            if config.replay_endpoint:
                self._replay = self._bind(
                    zmq.ROUTER, "events.replay_endpoint", config.replay_endpoint
                )
        except BaseException:
            self._close_sockets()
            raise
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        """The PUB address bound (a tcp port 0 in the config is the port chosen)."""
        self.replay_endpoint = (
            "" if self._replay is None else self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        )
        self._next = 0
        self._seen_dropped = 0
        self._batches = self._events = self._replays = self._bad_requests = self._failed = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtier-events", daemon=True)

    def _bind(self, kind: int, key: str, endpoint: str) -> zmq.Socket[bytes]:
        socket: zmq.Socket[bytes] = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        if kind == zmq.ROUTER:
            socket.setsockopt(zmq.SNDHWM, 2 * (self.config.replay_batches + 1))
        try:
            socket.bind(endpoint)
        except zmq.ZMQError as error:
            socket.close(linger=0)
            raise EventsEndpointError(f"{key}: cannot bind {endpoint}: {error}") from None
        return socket

    # -- the chain's side -------------------------------------------------------------------

    def offer(self, event: ChainEvent) -> None:
        """Queue one chain event (of a tier the config names, or all); never waits."""
        if self._tiers and isinstance(event, OffloadingEvent) and event.tier not in self._tiers:
            return
        self.queue.offer(event)

    def stats(self) -> PublisherStats:
        return PublisherStats(
            self.incarnation,
            self._batches,
            self._events,
            self.queue.dropped,
            self._replays,
            self._bad_requests,
            self._failed,
        )

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread; its first batch says AllBlocksCleared."""
        self.queue.offer(AllCleared())
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (at most `timeout_s`), stop the thread, close the sockets."""
        self._stopping.set()
        if self._thread.ident is None:  # never started: the sockets are still ours
            self._close_sockets()
            return
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("kvtier events: the publisher thread did not stop in %ss", timeout_s)

    def _close_sockets(self) -> None:
        for socket in (self._pub, self._replay):
            if socket is not None:
                socket.close(linger=0)
        self._pub = self._replay = None
        if not self._context.closed:
            self._context.term()

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        """Publish until `close`, then close the sockets (this thread's, from `start` on)."""
        try:
            while True:
                replay = self._replay
                if replay is not None:
                    try:
                        while replay.poll(0):
                            self._serve_replay(replay)
                    except zmq.ZMQError as error:
                        log.warning("kvtier events: a replay failed: %s", error)
                items, dropped = self.queue.take(MAX_BATCH_EVENTS, POLL_S)
                if items:
                    try:
                        self._publish(items, dropped)
                    except Exception as error:  # a bad event must not stop the thread
                        self._failed += 1
                        log.warning("kvtier events: a batch was not sent: %s", error)
                elif self._stopping.is_set():
                    return
        finally:
            self._close_sockets()

    def _publish(self, items: Sequence[ChainEvent], dropped: int) -> None:
        if dropped != self._seen_dropped:
            self._seen_dropped = dropped
            self._next += 1  # a gap where events were dropped
        seq = self.incarnation << SEQ_BITS | self._next
        self._next += 1
        batch = KVEventBatch(
            ts=time.time(), events=[to_wire(item, self.block_size) for item in items]
        )
        payload = encode_batch(batch)
        seq_bytes = seq.to_bytes(8, "big")
        pub = self._pub
        if pub is not None:  # PUB never blocks: past its high-water mark it drops (a gap)
            pub.send_multipart(self._frames(seq_bytes, payload))
        self._replay_buffer.append((seq, payload))
        self._batches += 1
        self._events += len(items)

    def _frames(self, seq: bytes, payload: bytes) -> tuple[bytes, ...]:
        """A message: topic, sequence, payload, and with `auth` its MAC."""
        if self.auth is None:
            return (self.topic, seq, payload)
        return (self.topic, seq, payload, self.auth.sign(self.topic, seq, payload))

    def _serve_replay(self, replay: zmq.Socket[bytes]) -> None:
        frames = replay.recv_multipart(flags=zmq.NOBLOCK)
        if len(frames) != 3 or len(frames[2]) != 8:
            self._bad_requests += 1
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        self._replays += 1
        for seq, payload in list(self._replay_buffer):
            if seq >= start_seq:
                replay.send_multipart((client, b"", *self._frames(seq.to_bytes(8, "big"), payload)))
        replay.send_multipart((client, b"", b"", END_SEQ, b""))
