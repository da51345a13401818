"""The node's event publisher: the chain's events, in vLLM's wire format, over ZMQ.

The chain hands each event to `EventPublisher.offer` on the bookkeeping's thread: it is put
into a bounded queue (`EventQueue`) and nothing else, so a slow or absent subscriber never
slows a put; past the bound new events are dropped and counted. One thread drains the queue
into batches and sends each as vLLM's `ZmqEventPublisher` does, three frames on a PUB
socket: the topic, the sequence number (8 bytes, big-endian), the msgpack `KVEventBatch`.

Sequence numbers: `incarnation << 32 | n`. The incarnation is random and new on every start
(`EventPublisher.incarnation`), so a consumer that knows kvtier tells a restart from a gap,
and one that reads the number as vLLM's plain counter still sees it grow within a run.
`n` counts batches from 0, and skips one number wherever events were dropped, so drops
appear to every consumer as a gap (which a replay cannot fill: the events never left).
The first batch of an incarnation is `AllBlocksCleared` (what an earlier run announced is
void); the last, at close, too. Then, as soon as the chain can name them, the blocks it
holds already (a disk tier's restored blocks) are announced as `BlockStored` batches.

The replay socket (ROUTER) answers two requests, each `[identity, b"", body]`:

- replay, `body` = start_seq (8 bytes, big-endian), as vLLM's: every kept batch (the last
  `replay_batches`) from `start_seq` on, each `[identity, b"", topic, seq, payload]`, then
  the end marker `[identity, b"", b"", -1 (8 bytes, signed), b""]`. A start_seq of another
  incarnation (a consumer that knew an earlier run) is answered from the first batch kept.
  A consumer whose missing seq is older than the first batch answered cannot be filled: it
  asks for a snapshot.
- snapshot (kvtier only), `body` = `SNAPSHOT` (b"kvtier-snapshot"): one reply
  `[identity, b"", SNAPSHOT, seq, payload]`, the payload a `KVEventBatch` of
  `AllBlocksCleared` then one `BlockStored` per tier (medium, ownership = tier name) per
  `SNAPSHOT_KEYS` keys: what the node holds as of `seq`. Applying it (replacing all the
  node's entries) and then the batches numbered after `seq` gives the node's contents. seq
  -1 with an empty payload: no snapshot (the node cannot list its contents).

Why a snapshot is exact: the contents are read on the chain's own thread (`ContentsSource`),
and in the same step a marker is put into the event queue, so the events before the marker
are exactly those the contents reflect. The thread publishes the events before the marker,
then answers with the seq of the last of them (events dropped before the marker skip one
number first, and the snapshot takes that number: it covers them; drops after the marker
skip a number after it). A removal the chain holds until the copy below lands (a move down,
`ChainEvents`) is already out of the contents and still to come in the stream; applying it
again changes nothing. The read is one pass over every block of the chain, on its loop
(`TieredManager.contents`: 1M blocks of an LRU tier took about 3 s on a loaded 2-core
machine, pure Python), which is why a subscriber asks for a snapshot only when it starts
or when a replay cannot fill a gap.

No authentication by default: vLLM's consumers read exactly three frames, and an extra
frame (a MAC) would break them. A fleet whose event network is not trusted configures a key
(`auth_key_file` / `auth_key_env`): every message, replies of the replay socket too, then
has a last frame, its MAC (`kvtier.fleet.auth`; a snapshot's is over SNAPSHOT as its
topic), which kvtier's consumers check. No secret is in any event: keys, tier names, media.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.config_events import EventsConfig
from kvtier.errors import EventsEndpointError
from kvtier.fleet.auth import BatchAuth
from kvtier.fleet.events import (
    AllBlocksCleared,
    KVEventBatch,
    WireEvent,
    encode_batch,
    to_wire,
)
from kvtier.manager.base import OffloadingEvent
from kvtier.manager.events import AllCleared, ChainEvent, TierContents

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
SNAPSHOT = b"kvtier-snapshot"
"""The body of a snapshot request, and the first frame of its reply."""
SNAPSHOT_KEYS = 4096
"""Most keys in one `BlockStored` of a snapshot or an announcement."""
ASK_AGAIN_S = 0.1
"""How long the thread waits before asking again for contents the chain could not name."""

Contents = list[TierContents] | None
"""The chain's contents, or None: it cannot name them all yet (ask again)."""
ContentsSource = Callable[[Callable[[Contents], None]], None]
"""Asks the chain for its contents: `source(deliver)` returns at once, and the chain calls
`deliver(contents)` later on its own thread (the one that records its events), in one step
with reading them. The fleet gets this from the hierarchy; it never imports the chain."""


@dataclass(slots=True)
class _ContentsMarker:
    """The chain's contents, at their place in the event queue."""

    contents: list[TierContents]
    dropped: int
    """Events the queue had dropped when the marker entered it."""


QueueItem = ChainEvent | _ContentsMarker


class EventQueue:
    """A bounded, thread-safe queue: `offer` never waits; past `bound` it drops and counts."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._items: deque[QueueItem] = deque()
        self._ready = threading.Condition(threading.Lock())
        self.dropped = 0
        """Events dropped because the queue was full (never reset)."""
        self.accepted = 0
        """Items queued so far (never reset)."""

    def offer(self, item: ChainEvent) -> bool:
        """Queue `item`; False (counted) when the queue is full."""
        with self._ready:
            if len(self._items) >= self.bound:
                self.dropped += 1
                return False
            self._items.append(item)
            self.accepted += 1
            self._ready.notify()
        return True

    def mark(self, contents: list[TierContents]) -> None:
        """Queue the chain's contents past the bound (one at a time is ever asked for),
        with the drops counted before them."""
        with self._ready:
            self._items.append(_ContentsMarker(contents, self.dropped))
            self.accepted += 1
            self._ready.notify()

    def take(self, most: int, timeout_s: float) -> tuple[list[QueueItem], int]:
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
    snapshots: int
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
        contents: ContentsSource | None = None,
    ) -> None:
        """Raises EventsEndpointError naming the key and endpoint that cannot bind (or the
        missing extra). `block_size_tokens`: `BlockStored.block_size` (None: the config's
        `wire_block_size`). `auth`: sign every message with a fourth frame (None: vLLM's
        three frames, the default). `contents`: how to read the chain's contents, for the
        announcement at start and snapshots (None: neither; a snapshot request is answered
        "no snapshot")."""
        if zmq is None:
            raise EventsEndpointError(
                "[events] needs the events extra: pip install 'kvtier[events]' (pyzmq, msgspec)"
            )
        self.config = config
        self.block_size = config.wire_block_size if block_size_tokens is None else block_size_tokens
        self.block_hashes = config.block_hashes
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
        self._contents = contents
        self._announce = contents is not None
        """The blocks the chain holds at start are still to be announced."""
        self._waiting: list[bytes] = []
        """Replay-socket identities waiting for a snapshot."""
        self._asked_at: float | None = None
        """When the chain was asked for its contents and has not delivered them yet."""
        self._next = 0
        self._seen_dropped = 0
        self._batches = self._events = self._replays = self._bad_requests = self._failed = 0
        self._snapshots = self._handled = 0
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

    @property
    def pending(self) -> int:
        """Items queued and not yet sent (or failed): 0 once what was offered went out."""
        return self.queue.accepted - self._handled

    def stats(self) -> PublisherStats:
        return PublisherStats(
            self.incarnation,
            self._batches,
            self._events,
            self.queue.dropped,
            self._replays,
            self._snapshots,
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
                            self._serve_request(replay)
                    except zmq.ZMQError as error:
                        log.warning("kvtier events: a replay failed: %s", error)
                self._ask_contents()
                items, dropped = self.queue.take(MAX_BATCH_EVENTS, POLL_S)
                if items:
                    try:
                        self._handle(items, dropped)
                    except Exception as error:  # a bad event must not stop the thread
                        self._failed += 1
                        log.warning("kvtier events: a batch was not sent: %s", error)
                    self._handled += len(items)
                elif self._stopping.is_set():
                    return
        finally:
            self._close_sockets()

    def _handle(self, items: Sequence[QueueItem], dropped: int) -> None:
        """Publish `items`, answering at each contents marker (see the module docstring)."""
        run: list[ChainEvent] = []
        for item in items:
            if isinstance(item, _ContentsMarker):
                if run:
                    self._publish(run, item.dropped)
                    run = []
                self._at_marker(item)
            else:
                run.append(item)
        if run:
            self._publish(run, dropped)

    def _publish(self, items: Sequence[ChainEvent], dropped: int) -> None:
        self._send_batch(
            [to_wire(item, self.block_size, self.block_hashes) for item in items], dropped
        )
        self._events += len(items)

    def _send_batch(self, events: list[WireEvent], dropped: int) -> None:
        if dropped != self._seen_dropped:
            self._seen_dropped = dropped
            self._next += 1  # a gap where events were dropped
        seq = self.incarnation << SEQ_BITS | self._next
        self._next += 1
        payload = encode_batch(KVEventBatch(ts=time.time(), events=events))
        seq_bytes = seq.to_bytes(8, "big")
        pub = self._pub
        if pub is not None:  # PUB never blocks: past its high-water mark it drops (a gap)
            pub.send_multipart(self._frames(self.topic, seq_bytes, payload))
        self._replay_buffer.append((seq, payload))
        self._batches += 1

    def _frames(self, topic: bytes, seq: bytes, payload: bytes) -> tuple[bytes, ...]:
        """A message: topic, sequence, payload, and with `auth` its MAC."""
        if self.auth is None:
            return (topic, seq, payload)
        return (topic, seq, payload, self.auth.sign(topic, seq, payload))

    # -- the replay socket --------------------------------------------------------------------

    def _serve_request(self, replay: zmq.Socket[bytes]) -> None:
        frames = replay.recv_multipart(flags=zmq.NOBLOCK)
        if len(frames) != 3 or frames[1] != b"":
            self._bad_requests += 1
            return
        client, _, body = frames
        if body == SNAPSHOT:
            if self._contents is None:
                replay.send_multipart((client, b"", SNAPSHOT, END_SEQ, b""))
            else:
                self._waiting.append(client)
            return
        if len(body) != 8:
            self._bad_requests += 1
            return
        start_seq = int.from_bytes(body, "big")
        if start_seq >> SEQ_BITS != self.incarnation:
            start_seq = 0  # asked by one that knew an earlier run: it missed all of this one
        self._replays += 1
        for seq, payload in list(self._replay_buffer):
            if seq >= start_seq:
                message = self._frames(self.topic, seq.to_bytes(8, "big"), payload)
                replay.send_multipart((client, b"", *message))
        replay.send_multipart((client, b"", b"", END_SEQ, b""))

    # -- the chain's contents: the announcement at start, snapshots ---------------------------

    def _ask_contents(self) -> None:
        """Ask the chain for its contents when they are wanted and not asked for already
        (again `ASK_AGAIN_S` after an answer that could not name them)."""
        source = self._contents
        if source is None or not (self._announce or self._waiting):
            return
        now = time.monotonic()
        if self._asked_at is not None and now - self._asked_at < ASK_AGAIN_S:
            return
        self._asked_at = now
        try:
            source(self._deliver)
        except Exception as error:  # the chain's loop is gone: no contents will come
            log.warning("kvtier events: cannot read the chain's contents: %s", error)
            self._contents = None
            self._announce = False
            self._answer_unavailable()

    def _deliver(self, contents: Contents) -> None:
        """The chain's answer, on its own thread: into the queue, in place (None: ask
        again after ASK_AGAIN_S)."""
        if contents is not None:
            self.queue.mark(contents)

    def _at_marker(self, marker: _ContentsMarker) -> None:
        if marker.dropped != self._seen_dropped:
            self._seen_dropped = marker.dropped
            self._next += 1  # the snapshot takes the skipped number: it covers the drops
        self._asked_at = None
        tiers = [item for item in marker.contents if not self._tiers or item.tier in self._tiers]
        stored = [
            event for item in tiers for event in _stored(item, self.block_size, self.block_hashes)
        ]
        if self._announce:
            self._announce = False
            for start in range(0, len(stored), MAX_BATCH_EVENTS):
                self._send_batch(stored[start : start + MAX_BATCH_EVENTS], self._seen_dropped)
        waiting, self._waiting = self._waiting, []
        replay = self._replay
        if not waiting or replay is None or self._next == 0:
            return
        seq = (self.incarnation << SEQ_BITS | (self._next - 1)).to_bytes(8, "big")
        events: list[WireEvent] = [AllBlocksCleared(), *stored]
        payload = encode_batch(KVEventBatch(ts=time.time(), events=events))
        frames = self._frames(SNAPSHOT, seq, payload)
        for client in waiting:
            try:
                replay.send_multipart((client, b"", *frames), flags=zmq.NOBLOCK)
                self._snapshots += 1
            except zmq.ZMQError as error:
                log.warning("kvtier events: a snapshot was not sent: %s", error)

    def _answer_unavailable(self) -> None:
        waiting, self._waiting = self._waiting, []
        replay = self._replay
        if replay is None:
            return
        for client in waiting:
            replay.send_multipart((client, b"", SNAPSHOT, END_SEQ, b""), flags=zmq.NOBLOCK)


def _stored(contents: TierContents, block_size: int, block_hashes: str) -> list[WireEvent]:
    """One tier's contents as `BlockStored` events of at most SNAPSHOT_KEYS keys each."""
    keys, medium, tier = contents.keys, contents.medium, contents.tier
    return [
        to_wire(
            OffloadingEvent(keys[at : at + SNAPSHOT_KEYS], 0, medium, False, tier),
            block_size,
            block_hashes,
        )
        for at in range(0, len(keys), SNAPSHOT_KEYS)
    ]
