"""A simulated fleet node, and the fleet-shared tier below every node.

`SimNode` is one node's chain, served with instant copies by the product's simulator
(`serve_request` over `build_chain`, as `kvtier simulate --config` serves a trace). When its
events are wanted, the chain's ordered event stream (`TieredManager.connect_events`, what a
node's `EventPublisher` is given) is collected as it happens and handed out as the payloads
the publisher would send: vLLM's `KVEventBatch` (`kvtier.fleet.events.to_wire`), at most
`MAX_BATCH_EVENTS` events each, numbered `incarnation << 32 | n`, the first one
`AllBlocksCleared`. No socket: the fleet's index reads the payloads directly.

`SharedStore` is a fleet-shared tier (Redis, a shared filesystem) as the nodes see it: one
store of a fixed capacity, which evicts by its own rules (LRU here, as Redis's
`allkeys-lru`), written with every block a node computes (write-through into the shared
tier, so a block one node computed is there for the next) and read where a node's own chain
ends its prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.blocks import BlockStatus
from kvtier.errors import KvtierError
from kvtier.keys import OffloadKey
from kvtier.manager.base import OffloadingEvent
from kvtier.manager.events import AllCleared, ChainEvent
from kvtier.manager.planner import WritePolicy
from kvtier.policies import get_policy_class
from kvtier_tools.workloads.simulation.chain import ChainTier, build_chain, serve_request

MAX_BATCH_EVENTS = 512
"""Most events in one batch, as `kvtier.fleet.publisher.MAX_BATCH_EVENTS` (not imported: that
module needs msgspec, which only the kvtier router does; a test keeps the two equal)."""
SEQ_BITS = 32
"""Bits of a sequence number below the incarnation (`kvtier.fleet.publisher.SEQ_BITS`)."""


class SimNode:
    """One node: a fresh chain of `tiers`, its hits per tier, and (with `publish`) its
    events as wire payloads."""

    def __init__(
        self,
        name: str,
        tiers: Sequence[ChainTier],
        write_policy: WritePolicy,
        *,
        publish: bool = False,
        incarnation: int = 1,
        block_size_tokens: int = 0,
    ) -> None:
        """`incarnation`: the high bits of every sequence number (a real publisher draws it
        at random; a simulation keeps it fixed, so runs repeat). `block_size_tokens`: the
        events' `block_size` (0: unknown)."""
        self.name = name
        self.manager = build_chain(tiers, write_policy)
        self.tier_hits = [0] * len(tiers)
        self.requests = 0
        self.accesses = 0
        self.incarnation = incarnation
        self.block_size_tokens = block_size_tokens
        self.publish = publish
        self.events = 0
        """Wire events handed out so far."""
        self.event_blocks = 0
        """Block keys in those events (a stored or removed event names several)."""
        self._next = 0
        self._pending: list[ChainEvent] = []
        if publish:
            self._pending.append(AllCleared())  # a publisher's first batch
            self.manager.connect_events(self._pending.append)

    def serve(self, keys: Sequence[OffloadKey]) -> int:
        """Serve one request (lookup, get, put of the rest); return its prefix hits."""
        outcome = serve_request(self.manager, keys)
        for source in outcome.served_from:
            self.tier_hits[source] += 1
        self.requests += 1
        self.accesses += len(keys)
        return len(outcome.served_from)

    def take_payloads(self, ts: float) -> list[tuple[int, bytes]]:
        """The events since the last call, as (sequence number, msgpack payload) batches
        stamped `ts`: what the node's publisher would send. Needs msgspec (the events extra)."""
        if not self._pending:
            return []
        from kvtier.fleet.events import KVEventBatch, encode_batch, to_wire

        pending = list(self._pending)
        self._pending.clear()
        payloads = []
        for start in range(0, len(pending), MAX_BATCH_EVENTS):
            part = pending[start : start + MAX_BATCH_EVENTS]
            batch = KVEventBatch(
                ts=ts, events=[to_wire(event, self.block_size_tokens) for event in part]
            )
            payloads.append((self.incarnation << SEQ_BITS | self._next, encode_batch(batch)))
            self._next += 1
            self.events += len(part)
            self.event_blocks += sum(
                len(event.keys) for event in part if isinstance(event, OffloadingEvent)
            )
        return payloads

    def close(self) -> None:
        """Check the chain's invariants and shut it down."""
        self.manager.check()
        self.manager.shutdown()


class SharedStore:
    """A fleet-shared tier: `capacity` blocks, evicted by its own `policy` (see the module
    docstring); counts its hits and the blocks written into it."""

    def __init__(self, capacity: int, policy: str = "lru") -> None:
        self.capacity = capacity
        self.policy_name = policy
        self._policy = get_policy_class(policy)(capacity)
        self.hits = 0
        self.written = 0

    def continuation(self, keys: Sequence[OffloadKey]) -> int:
        """How many leading `keys` the store holds (a prefix: the first absent one ends it);
        those are read (touched) and counted as hits."""
        get = self._policy.get
        held = 0
        while held < len(keys) and get(keys[held]) is not None:
            held += 1
        if held:
            self._policy.touch(keys[:held])
            self.hits += held
        return held

    def write(self, keys: Sequence[OffloadKey]) -> None:
        """Blocks a node computed: stored, the least valuable evicted when full."""
        policy = self._policy
        for key in keys:
            if policy.get(key) is not None:
                policy.touch((key,))
                continue
            policy.on_store_miss((key,))
            if not policy.admits_all and not policy.admit((key,))[0]:
                continue
            if len(policy) >= self.capacity and policy.evict(1) is None:
                raise KvtierError(f"shared tier ({self.policy_name}): a full store evicted none")
            block = BlockStatus(0)
            block.ref_cnt = 0
            policy.insert(key, block)
            self.written += 1
