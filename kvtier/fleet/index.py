"""The fleet's prefix index: which node holds which block, on which tier, from their events.

Pure bookkeeping: no sockets, no threads of its own. A subscriber thread feeds it the
batches each node publishes (`apply_payload`, or `apply` for decoded ones); a router, or the
HTTP endpoint (`kvtier.fleet.query`), asks it to `score` nodes for a request's block keys.
One lock makes it thread-safe.

Layout: per node, one dict block key -> media bitmask (bit i: the block is readable on
medium i of the index's media, `MEDIA` first). Six wire media are known, up to
`MAX_MEDIA` are learnt, so a mask is a small int (below 256 it is one of Python's cached
ints: no object per entry). Dropping a node (a restart, `forget`) is dropping its dict.
Measured (`python -m kvtier_tools.bench.fleet_index`: tracemalloc, 1M entries on one
node, CPython 3.11): 111 bytes per entry with 36-byte keys (a 32-byte hash and its group
index: the key's bytes object 69, the dict's slot 42), 87 with 12-byte keys; `memory_bytes`
estimates the same way (each node dict's size plus each key's bytes object) and matched
tracemalloc to 0.1 %. (A mask of a 9th or later medium is an int object of its own, 28 bytes
more, not counted.) Applying 512-key batches: about 1.8M key-events/s from payloads (msgpack
decoding included), 4.7M/s from decoded ones (moves); a score over 8 nodes and 64 keys
about 50 us (one core of a busy 2-core host, process time, medians of 3).

Keys are compared as the wire carries them: kvtier's OffloadKey bytes (1 to 255 bytes). A
vLLM engine's int hashes are mapped to bytes by `key_of` (their 64 bits, big-endian, two's
complement for negatives), so an int and its 8 bytes are the same key; a router asking for
an int hash passes it through `key_of` too (`score` does).

Sequence numbers are the publisher's `incarnation << 32 | n` (`kvtier.fleet.publisher`):

- a node's first batch, or the first of a new incarnation (`RESTART`: what the node held is
  dropped), applies when its `n` is 0; a later `n` means batches were missed: `GAP`;
- `n` below the next expected: `DUPLICATE` (a replayed or repeated batch), ignored;
- `n` above it: `GAP`: the batch is not applied and the node is stale. A stale node answers
  nothing (`score`, `holdings`), but its entries are kept aside, so that a replay of the
  missed batches heals it: the batch with the expected `n` applies and the node is fresh
  again. Other batches of a stale node are ignored (`STALE`). A snapshot (`replace_node`)
  replaces the node's entries and makes it fresh; `forget` drops it;
- a batch that is not a `KVEventBatch` (truncated, oversized, a bad key or medium) is
  `REJECTED`: counted, and nothing of it applied.

A move between tiers (a store on the new medium, then a removal from the old) leaves the
block on the new medium only. A block's place is a medium (a bit), not a tier name: a node
with two tiers of one medium reads a move between them as a removal (the index then
under-reports, never over-reports). `AllBlocksCleared` drops what the node held.

Scoring: a node's `matched_blocks` is the longest prefix of the asked keys it holds on any
medium; its score is the sum, over that prefix, of the weight of each block's best medium
(`DEFAULT_TIER_WEIGHTS`), minus `load_weight * load`. Nodes rank by score, then by name, so
equal scores always come in the same order. A node never heard of, or stale, answers nothing.

Memory is bounded by `max_entries` ((node, key) pairs): past it, a store of a new key is
dropped and counted (`IndexStats.stores_dropped`), never grown into.
"""

from __future__ import annotations

import enum
import math
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from typing import cast

import msgspec

from kvtier.errors import InvalidValueError, KeyFormatError
from kvtier.fleet.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
)

SEQ_BITS = 32
"""Bits of a sequence number below the incarnation (as `kvtier.fleet.publisher`'s)."""
_N_MASK = (1 << SEQ_BITS) - 1
MAX_SEQ = (1 << 64) - 1
"""Sequence numbers are 8 unsigned bytes on the wire."""

MEDIA = ("GPU", "CPU", "DISK", "REDIS", "REDIS-CLUSTER", "SHARED-FS")
"""The wire media known from the start (bits 0..5); others are learnt as they come."""
MAX_MEDIA = 16
"""Most distinct media the index learns; a batch naming one more is REJECTED."""
MAX_MEDIUM_CHARS = 64
"""Longest medium name accepted."""

DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {
    "GPU": 1.0,
    "CPU": 0.8,
    "DISK": 0.5,
    "REDIS": 0.3,
    "REDIS-CLUSTER": 0.3,
    "SHARED-FS": 0.3,
}
"""What a block is worth on each medium: the faster to read, the more (gpu > cpu > disk >
shared)."""
UNKNOWN_WEIGHT = 0.1
"""The weight of a medium the weights do not name."""

MIN_KEY_BYTES = 1
MAX_KEY_BYTES = 255
"""A key's length bounds, as kvtier's (`kvtier.keys`): a longer one makes its batch REJECTED."""
MAX_PAYLOAD_BYTES = 64 << 20
"""A larger payload is REJECTED before it is decoded."""
MAX_LOADS = 4096
"""Most nodes with a load set that the index has not heard of (the loads stay bounded)."""
DEFAULT_MAX_ENTRIES = 50_000_000

_INT_KEY_MIN = -(1 << 63)
_INT_KEY_MAX = (1 << 64) - 1


def key_of(value: bytes | int) -> bytes:
    """A block key as the index keeps it: bytes unchanged; an int (vLLM's hashes) as its 64
    bits, big-endian, two's complement for a negative one. KeyFormatError naming the value
    when it is neither, or out of range (1 to 255 bytes; ints in [-2**63, 2**64))."""
    if isinstance(value, bytes):
        if not MIN_KEY_BYTES <= len(value) <= MAX_KEY_BYTES:
            raise KeyFormatError(f"block key must have 1 to 255 bytes, got {len(value)}")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if not _INT_KEY_MIN <= value <= _INT_KEY_MAX:
            raise KeyFormatError(f"int block key out of 64 bits: {value}")
        return (value & _INT_KEY_MAX).to_bytes(8, "big")
    raise KeyFormatError(f"block key must be bytes or int, got {type(value).__name__}")


class ApplyOutcome(enum.Enum):
    """What `apply` did with a batch (see the module docstring)."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    RESTART = "restart"
    GAP = "gap"
    STALE = "stale"
    REJECTED = "rejected"


@dataclass(frozen=True)
class NodeMatch:
    """One node's answer for a request's keys."""

    node: str
    matched_blocks: int
    """The longest prefix of the asked keys this node holds, on any medium."""
    per_tier: dict[str, int]
    """Medium -> blocks of that prefix whose best medium it is."""
    score: float
    """Sum over the prefix of each block's best medium weight, minus the load term."""
    load: float


@dataclass(frozen=True)
class IndexStats:
    """What the index holds and what it did with the batches it was given."""

    nodes: int
    stale_nodes: int
    keys: int
    """Distinct (node, key) pairs of fresh nodes (a key on two nodes counts twice)."""
    entries: int
    """(node, key) pairs held, a stale node's kept-aside ones included (what `max_entries`
    bounds)."""
    memory_bytes: int
    """Estimate of the memory the entries take (see the module docstring)."""
    batches_applied: int
    batches_rejected: int
    gaps: int
    restarts: int
    duplicates: int
    stale_batches: int = 0
    """Batches of a stale node that were ignored."""
    stores_dropped: int = 0
    """Stores of a new key not kept because the index held `max_entries`."""


@dataclass(frozen=True)
class NodeInfo:
    """One node's state, as `node_info` reports it."""

    node: str
    stale: bool
    entries: int
    incarnation: int
    expected_seq: int
    load: float


@dataclass
class _Node:
    incarnation: int
    next_n: int
    stale: bool = False
    blocks: dict[bytes, int] = field(default_factory=dict)
    key_bytes: int = 0
    """Sum of sys.getsizeof of the keys in `blocks` (the memory estimate's keys part)."""


_BYTES_OVERHEAD = sys.getsizeof(b"")


class _Rejected(Exception):
    """A batch is malformed (internal: becomes REJECTED)."""


class PrefixIndex:
    """Which node holds which block on which medium; scores nodes for a request's keys."""

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        load_weight: float = 0.0,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        """`weights`: medium -> weight, over `DEFAULT_TIER_WEIGHTS` (names upper-cased, so
        "cpu" is "CPU"). `load_weight`: what one unit of a node's load costs its score.
        InvalidValueError naming the value when one is negative or not finite."""
        merged = dict(DEFAULT_TIER_WEIGHTS)
        for medium, weight in (weights or {}).items():
            if not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
                raise InvalidValueError(f"weight of {medium!r} must be >= 0, got {weight!r}")
            merged[str(medium).upper()] = float(weight)
        if not math.isfinite(load_weight) or load_weight < 0:
            raise InvalidValueError(f"load_weight must be >= 0, got {load_weight!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
            raise InvalidValueError(f"max_entries must be an int >= 0, got {max_entries!r}")
        self.weights: Mapping[str, float] = merged
        self.load_weight = float(load_weight)
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._loads: dict[str, float] = {}
        self._media: list[str] = list(MEDIA)
        self._bits: dict[str | None, int] = {m: 1 << i for i, m in enumerate(MEDIA)}
        self._bits[None] = 1  # vLLM's GPU events name no medium
        self._best: dict[int, str] = {}
        self._entries = 0
        self._applied = self._rejected = self._gaps = self._restarts = 0
        self._duplicates = self._stale_batches = self._stores_dropped = 0

    # -- feeding ----------------------------------------------------------------------------

    def apply_payload(self, node: str, seq: int, payload: bytes) -> ApplyOutcome:
        """Decode one message's payload and `apply` it; a malformed or oversized payload is
        REJECTED (counted), never raised."""
        data: object = payload  # a caller's garbage is REJECTED too
        if not isinstance(data, bytes | bytearray | memoryview):
            return self._reject()
        if len(payload) > MAX_PAYLOAD_BYTES:
            return self._reject()
        try:
            batch = decode_batch(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError):
            return self._reject()
        return self.apply(node, seq, batch)

    def apply(self, node: str, seq: int, batch: KVEventBatch) -> ApplyOutcome:
        """Apply one batch of `node` numbered `seq` (see the module docstring); never raises
        for a bad batch or sequence number: REJECTED."""
        if (
            not isinstance(node, str)
            or not node
            or isinstance(seq, bool)
            or not isinstance(seq, int)
            or not 0 <= seq <= MAX_SEQ
        ):
            return self._reject()
        incarnation, n = seq >> SEQ_BITS, seq & _N_MASK
        with self._lock:
            try:
                events = self._checked(batch)
            except _Rejected:
                self._rejected += 1
                return ApplyOutcome.REJECTED
            state = self._nodes.get(node)
            outcome = ApplyOutcome.APPLIED
            if state is None or state.incarnation != incarnation:
                if state is not None:
                    self._restarts += 1
                    self._drop(state)
                    outcome = ApplyOutcome.RESTART
                state = self._nodes[node] = _Node(incarnation, 0)
                if n != 0:
                    state.stale = True
                    self._gaps += 1
                    return ApplyOutcome.GAP
            elif n < state.next_n:
                self._duplicates += 1
                return ApplyOutcome.DUPLICATE
            elif n > state.next_n:
                if state.stale:
                    self._stale_batches += 1
                    return ApplyOutcome.STALE
                state.stale = True
                self._gaps += 1
                return ApplyOutcome.GAP
            state.stale = False
            state.next_n = n + 1
            self._apply_events(state, events)
            self._applied += 1
            return outcome

    def _reject(self) -> ApplyOutcome:
        with self._lock:
            self._rejected += 1
        return ApplyOutcome.REJECTED

    def _checked(self, batch: object) -> list[tuple[int, int, list[bytes]]]:
        """The batch's events as (kind, medium bit, keys): 0 stored, 1 removed, 2 cleared.
        _Rejected when anything is malformed (nothing is applied then); learns new media."""
        if not isinstance(batch, KVEventBatch) or not isinstance(batch.events, list):
            raise _Rejected
        out: list[tuple[int, int, list[bytes]]] = []
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                out.append((2, 0, []))
                continue
            if isinstance(event, BlockStored):
                kind = 0
            elif isinstance(event, BlockRemoved):
                kind = 1
            else:
                raise _Rejected
            bit = self._bit(event.medium)
            out.append((kind, bit, self._keys(event.block_hashes)))
        return out

    def _bit(self, medium: object) -> int:
        """The bit of `medium` (None: vLLM's GPU), learning a new one; _Rejected when it is
        not a short str, or one too many (a rejected batch may have taught one: harmless,
        there are at most MAX_MEDIA)."""
        if medium is None:
            return self._bits[None]
        if not isinstance(medium, str) or not 0 < len(medium) <= MAX_MEDIUM_CHARS:
            raise _Rejected
        bit = self._bits.get(medium)
        if bit is not None:
            return bit
        if len(self._media) >= MAX_MEDIA:
            raise _Rejected
        bit = 1 << len(self._media)
        self._media.append(medium)
        self._bits[medium] = bit
        self._best.clear()
        return bit

    @staticmethod
    def _keys(hashes: object) -> list[bytes]:
        if not isinstance(hashes, list):
            raise _Rejected
        for key in hashes:
            if type(key) is not bytes or not 0 < len(key) <= MAX_KEY_BYTES:
                break
        else:
            return hashes  # every one is bytes
        try:
            return [key_of(key) for key in hashes]
        except KeyFormatError:
            raise _Rejected from None

    def _apply_events(self, state: _Node, events: list[tuple[int, int, list[bytes]]]) -> None:
        blocks = state.blocks
        get = blocks.get
        size = _BYTES_OVERHEAD
        for kind, bit, keys in events:
            if kind == 0:
                room = self.max_entries - self._entries
                added = 0
                added_bytes = 0
                for key in keys:
                    mask = get(key)
                    if mask is None:
                        if added >= room:
                            self._stores_dropped += 1
                            continue
                        blocks[key] = bit
                        added += 1
                        added_bytes += size + len(key)
                    else:
                        blocks[key] = mask | bit
                self._entries += added
                state.key_bytes += added_bytes
            elif kind == 1:
                clear = ~bit
                removed = 0
                removed_bytes = 0
                for key in keys:
                    mask = get(key)
                    if mask is None:
                        continue
                    mask &= clear
                    if mask:
                        blocks[key] = mask
                    else:
                        del blocks[key]
                        removed += 1
                        removed_bytes += size + len(key)
                self._entries -= removed
                state.key_bytes -= removed_bytes
            else:
                self._entries -= len(blocks)
                blocks.clear()
                state.key_bytes = 0

    def _drop(self, state: _Node) -> None:
        self._entries -= len(state.blocks)
        state.blocks = {}
        state.key_bytes = 0

    def replace_node(self, node: str, seq: int, holdings: Mapping[str, Iterable[bytes]]) -> None:
        """A snapshot: `node`'s whole contents, medium -> keys, as of its batch `seq` (the
        next batch wanted is `seq + 1`); the node is fresh. Past `max_entries` the rest is
        dropped and counted. KeyFormatError / InvalidValueError naming the bad key, medium
        or sequence number (nothing changed then)."""
        if not isinstance(node, str) or not node:
            raise InvalidValueError(f"node must be a non-empty str, got {node!r}")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
            raise InvalidValueError(f"snapshot seq must be in [0, 2**64), got {seq!r}")
        checked: list[tuple[str, list[bytes]]] = []
        for medium, keys in holdings.items():
            if not isinstance(medium, str) or not 0 < len(medium) <= MAX_MEDIUM_CHARS:
                raise InvalidValueError(f"snapshot medium must be a short str, got {medium!r}")
            try:
                checked.append((medium, [key_of(key) for key in keys]))
            except KeyFormatError as error:
                raise KeyFormatError(f"snapshot of {node!r}, medium {medium!r}: {error}") from None
        with self._lock:
            old = self._nodes.get(node)
            if old is not None:
                self._drop(old)
            state = self._nodes[node] = _Node(seq >> SEQ_BITS, (seq & _N_MASK) + 1)
            events = []
            for medium, keys in checked:
                try:
                    bit = self._bit(medium)
                except _Rejected:
                    raise InvalidValueError(
                        f"snapshot medium {medium!r}: more than {MAX_MEDIA} media"
                    ) from None
                events.append((0, bit, keys))
            self._apply_events(state, events)

    def forget(self, node: str) -> None:
        """Drop everything about `node` (its entries, its load)."""
        with self._lock:
            state = self._nodes.pop(node, None)
            if state is not None:
                self._drop(state)
            self._loads.pop(node, None)

    def set_load(self, node: str, load: float) -> None:
        """`node`'s load (what the router counts: requests in flight, ...), for the score's
        load term; a node not heard of yet may have one (at most MAX_LOADS such).
        InvalidValueError naming the node or value when not finite, or past that bound."""
        if isinstance(load, bool) or not isinstance(load, int | float) or not math.isfinite(load):
            raise InvalidValueError(f"load of {node!r} must be a finite number, got {load!r}")
        if not isinstance(node, str) or not node:
            raise InvalidValueError(f"node must be a non-empty str, got {node!r}")
        with self._lock:
            if node not in self._loads and node not in self._nodes:
                unknown = sum(1 for name in self._loads if name not in self._nodes)
                if unknown >= MAX_LOADS:
                    raise InvalidValueError(
                        f"load of {node!r}: more than {MAX_LOADS} unknown nodes have a load"
                    )
            self._loads[node] = float(load)

    # -- asking -----------------------------------------------------------------------------

    def expected_seq(self, node: str) -> int | None:
        """The next sequence number wanted from `node` (a replay starts there); None for a
        node never heard of."""
        with self._lock:
            state = self._nodes.get(node)
            return None if state is None else state.incarnation << SEQ_BITS | state.next_n

    def is_stale(self, node: str) -> bool:
        """Whether `node` is stale (a gap not healed yet); False for one never heard of."""
        with self._lock:
            state = self._nodes.get(node)
            return state is not None and state.stale

    def score(
        self, keys: Sequence[bytes | int], nodes: Iterable[str] | None = None
    ) -> list[NodeMatch]:
        """Every fresh node (of `nodes`, if given) ranked best first for a request whose
        blocks are `keys`, in prefix order. A node never heard of, or stale, is left out.
        KeyFormatError naming a key that is not bytes or int."""
        wanted = [key if type(key) is bytes else key_of(key) for key in keys]
        with self._lock:
            if nodes is None:
                names: Iterable[str] = self._nodes
            else:
                names = {name for name in nodes if name in self._nodes}
            matches = [self._match(name, wanted) for name in names if not self._nodes[name].stale]
        matches.sort(key=lambda match: (-match.score, match.node))
        return matches

    def _match(self, name: str, keys: list[bytes]) -> NodeMatch:
        # The prefix's masks up to the first miss, and their counts: both loops run in C.
        held = map(self._nodes[name].blocks.get, keys)
        masks = cast(list[int], list(takewhile(bool, held)))  # a None ends the prefix
        load = self._loads.get(name, 0.0)
        if not masks:
            return NodeMatch(name, 0, {}, 0.0 - self.load_weight * load, load)
        best = self._best
        counts: dict[str, int] = {}
        for mask, count in Counter(masks).items():
            medium = best.get(mask)
            if medium is None:
                medium = best[mask] = self._best_medium(mask)
            counts[medium] = counts.get(medium, 0) + count
        weights = self.weights
        total = sum(
            count * weights.get(medium, UNKNOWN_WEIGHT) for medium, count in sorted(counts.items())
        )
        per_tier = {medium: counts[medium] for medium in self._media if medium in counts}
        return NodeMatch(name, len(masks), per_tier, total - self.load_weight * load, load)

    def _best_medium(self, mask: int) -> str:
        """The medium of `mask` with the highest weight (the first known, on a tie)."""
        found = [m for i, m in enumerate(self._media) if mask >> i & 1]
        return max(
            found, key=lambda m: (self.weights.get(m, UNKNOWN_WEIGHT), -self._media.index(m))
        )

    def holdings(self, node: str) -> dict[bytes, frozenset[str]]:
        """`node`'s blocks, key -> media (empty for a stale node or one never heard of)."""
        with self._lock:
            state = self._nodes.get(node)
            if state is None or state.stale:
                return {}
            media = self._media
            return {
                key: frozenset(m for i, m in enumerate(media) if mask >> i & 1)
                for key, mask in state.blocks.items()
            }

    def nodes(self) -> list[str]:
        """Every node heard of (stale ones too), by name."""
        with self._lock:
            return sorted(self._nodes)

    def node_info(self) -> list[NodeInfo]:
        """Each node heard of, by name: stale or not, entries, incarnation, next seq, load."""
        with self._lock:
            return [
                NodeInfo(
                    name,
                    state.stale,
                    len(state.blocks),
                    state.incarnation,
                    state.incarnation << SEQ_BITS | state.next_n,
                    self._loads.get(name, 0.0),
                )
                for name, state in sorted(self._nodes.items())
            ]

    def stats(self) -> IndexStats:
        with self._lock:
            fresh = [state for state in self._nodes.values() if not state.stale]
            memory = sum(
                sys.getsizeof(state.blocks) + state.key_bytes for state in self._nodes.values()
            )
            return IndexStats(
                nodes=len(self._nodes),
                stale_nodes=len(self._nodes) - len(fresh),
                keys=sum(len(state.blocks) for state in fresh),
                entries=self._entries,
                memory_bytes=memory,
                batches_applied=self._applied,
                batches_rejected=self._rejected,
                gaps=self._gaps,
                restarts=self._restarts,
                duplicates=self._duplicates,
                stale_batches=self._stale_batches,
                stores_dropped=self._stores_dropped,
            )
