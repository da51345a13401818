"""The stats schema of a running chain, and the snapshot that fills it.

`HierarchyStats` is what `Hierarchy.stats()` returns and what the Prometheus collector
(`kvtier.metrics.prometheus`) exports: one copy of the counters the bookkeeping
(`ChainCounters`, per tier `TierStats`), the transfer engine (`EngineCounters`), the
supervisor and the API calls (`HierarchyCounters`) keep anyway. Taking it only reads, and
copies each mutable container in one step, so a scrape may take it from another thread.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtier.engine import SupervisorCounters, TransferEngine
from kvtier.latency import LatencyHistogram
from kvtier.manager import ChainCounters, TieredManager, TierStats
from kvtier.tiers.storage import BlockStorage


@dataclass(frozen=True, slots=True)
class TierInfo:
    """One tier of an open hierarchy: its config'd name and medium, and where it really is."""

    name: str
    medium: str
    policy: str
    num_blocks: int
    where: str


@dataclass(slots=True)
class HierarchyCounters:
    """What the API calls did (blocks)."""

    put_blocks: int = 0
    put_stored: int = 0
    put_present: int = 0
    """Blocks a tier already held (not stored again)."""
    put_refused: int = 0
    """Blocks not stored: the top tier had no room (every block pinned), its policy did not
    admit them (`CachePolicy.admit`), or they came past the whole chain's capacity in one
    put (only its first blocks are kept)."""
    put_partial: int = 0
    """Partial blocks (`put(partial_last=True)`) not stored."""
    put_failed: int = 0
    put_backpressure_waits: int = 0
    """Puts that found the top tier's reserve exhausted and waited for background demotions
    to give slots back."""
    put_admission_waits: int = 0
    """Puts (parts of puts) that waited to enter the chain: too many puts in flight, or a
    get waiting for room at the top (`chain/gate.py`: loads first)."""
    put_demotion_waits: int = 0
    """Puts that had to evict at once and waited for their victims' snapshot (a memory copy)."""
    put_store_timeouts: int = 0
    """Puts whose wait for room passed `store_timeout_s` (they went on and evicted or
    refused as they had to)."""
    get_blocks: int = 0
    get_served: int = 0
    get_timeouts: int = 0
    get_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Latency of `get` / `get_into` calls, in fixed buckets (see `LatencyHistogram`)."""
    put_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Latency of `put` calls, backpressure included."""

    # -- per-block lookups ----------------------------------------------------------------
    # A lookup's miss is counted once per call by the chain (`ChainCounters.misses`, the
    # tiers' `misses`): the first key no tier holds. These count every block, so that the
    # hit ratio of a lookup-then-get workload (kvtier replay's) is read from the counters:
    # the tiers' hits (per block, counted by the gets) over `lookup_blocks`.
    lookup_blocks: int = 0
    """Keys given to `lookup` (every one, also those after the first miss)."""
    lookup_held: int = 0
    """Of those, the leading ones some tier held: `lookup`'s answers summed. The others
    (`lookup_missed`) are the first key no tier held and every key after it, which the
    caller recomputes."""

    @property
    def lookup_missed(self) -> int:
        """Keys given to `lookup` that it did not count as held (`lookup_blocks` -
        `lookup_held`)."""
        return self.lookup_blocks - self.lookup_held

    def copy(self) -> HierarchyCounters:
        """A snapshot (the histograms copied too)."""
        snapshot = copy.copy(self)
        snapshot.get_latency = self.get_latency.copy()
        snapshot.put_latency = self.put_latency.copy()
        return snapshot


@dataclass(frozen=True, slots=True)
class TierActivity:
    """What one tier did since the hierarchy opened (blocks), for `stats()` and the metrics.

    `hits`: lookups it answered; `misses`: keys asked of it and not found there (hits of the
    tiers below it and misses of the chain, so the bottom tier counts every miss of the
    chain, from `lookup` and `get` alike); `stored`: blocks stored into it; `refused`: blocks
    it did not take (its policy did not admit them, or no room); `evicted`: blocks its policy
    evicted; `demoted` / `promoted`: blocks copied from it to a tier below / into it from a
    tier below; `corrupt`: blocks read from it that failed their checksum; `events_dropped`:
    blocks of events dropped because nobody took them (`take_events`) before its event log
    was full; `gone`: blocks read from it (a shared store) that it no longer held, having
    evicted them itself, or could not be asked for: misses, not damage (they are among the
    `failed` blocks of its transfers, never among `corrupt`); `problems`: values read from
    it (a shared store) and not served, by reason (forged, foreign, damaged, oversized, and
    a shared-fs file's symlink, not_regular, linked, unsafe_dir, forgotten, and unencrypted
    where `require_encrypted = true`: `BlockStorage.value_problems`), each a miss;
    `unencrypted_served`: values a key holder wrote without encryption that this `encrypt =
    true` tier served (`BlockStorage.unencrypted_served`)."""

    name: str
    hits: int
    misses: int
    stored: int
    refused: int
    evicted: int
    demoted: int
    promoted: int
    corrupt: int
    events_dropped: int
    gone: int = 0
    problems: dict[str, int] = field(default_factory=dict)
    unencrypted_served: int = 0


@dataclass(frozen=True, slots=True)
class TransferStats:
    """Copies from `source` to `target` (tier names, or "caller" for the embedder's
    tensors): blocks and bytes moved, seconds during which a copy was in flight, copies
    made, blocks whose copy failed (a failed store into `target`, or a failed load when it
    is the caller), blocks found corrupt at `source`, blocks `source` (a shared store)
    no longer held (`gone`, also among `failed`), and the most copies of the pair in
    flight at once (`peak_in_flight`)."""

    source: str
    target: str
    blocks: int
    bytes: int
    seconds: float
    copies: int
    failed: int
    corrupt: int
    gone: int = 0
    peak_in_flight: int = 0


@dataclass(frozen=True, slots=True)
class FlushReport:
    """What a flush did: blocks copied to the bottom tier, and blocks still held only by
    volatile tiers when it ended (0: everything readable is in the bottom tier). Blocks
    hinted "never" are not flushed (`stats().chain.hint_not_cascaded`) nor counted here."""

    copied: int
    left: int


@dataclass(frozen=True, slots=True)
class HierarchyStats:
    """A snapshot: occupancy per tier, the chain's decisions, traffic per tier pair."""

    tiers: list[TierStats]
    info: list[TierInfo]
    chain: ChainCounters
    calls: HierarchyCounters
    pairs: dict[tuple[str, str], tuple[int, int, float]]
    """(source, destination) -> (blocks, bytes, seconds during which a copy of the pair was
    in flight: concurrent copies are counted once, so bytes / seconds is its throughput)."""
    jobs: dict[str, int]
    cascades_dropped: int
    corrupt_blocks: int
    failed_blocks: int
    gone_blocks: int = 0
    """Reads of blocks a shared store (Redis, shared-fs) no longer held or could not be
    asked for: misses, not damage."""
    errors: dict[str, int] = field(default_factory=dict)
    """Copies that raised, by exception class (each is a miss or a failed store)."""
    supervisor: SupervisorCounters = field(default_factory=SupervisorCounters)
    staging_waits: int = 0
    """Demotions and cascades that waited for room in the staging arena (backpressure)."""
    queue_depths: dict[str, int] = field(default_factory=dict)
    """Copies waiting at each tier's queue when the snapshot was taken."""
    disabled_tiers: dict[str, str] = field(default_factory=dict)
    """Disabled tiers, name -> why: tiers of the config left out because they could not be
    opened (`strict = false`), and tiers that disabled themselves while open (a disk tier
    whose files were removed or replaced under it: its stores fail, its reads are misses)."""
    activity: list[TierActivity] = field(default_factory=list)
    """Per tier, top first (as `tiers`): what it did (hits, stores, evictions, ...)."""
    transfers: list[TransferStats] = field(default_factory=list)
    """Per tier pair, in the order the engine first moved bytes between them (`pairs`,
    with copies, failures and corrupt blocks)."""
    events_dropped: int = 0
    """Blocks of events dropped, every tier together (see `TierActivity.events_dropped`)."""
    fleet_events_sent: int = 0
    """Events the `[events]` publisher sent (0 when it is off; `kvtier.fleet`)."""
    fleet_events_dropped: int = 0
    """Events dropped before the `[events]` publisher sent them (its queue was full); its
    subscribers see each drop as a gap in the sequence numbers."""
    block_size: int = 0
    """Bytes of one block, in every tier (a tier's capacity in bytes is its `num_blocks`
    times this)."""

    def block_hit_ratio(self) -> float:
        """Blocks served by some tier over the blocks given to `lookup` (0 when none were):
        the hit ratio of a lookup-then-get workload such as `kvtier replay`, per block. The
        tiers' `activity[i].hits` over `calls.lookup_blocks` is each tier's share."""
        blocks = self.calls.lookup_blocks
        return sum(tier.hits for tier in self.activity) / blocks if blocks else 0.0

    def latency_percentile(self, q: float) -> float:
        """The q-th percentile (0..100) of `get` latencies, in seconds (0 if none),
        estimated from `calls.get_latency`'s buckets (within a bucket's width: 25 %)."""
        return self.calls.get_latency.percentile(q)


@dataclass(slots=True)
class _PerTier:
    """Transfer counters summed per tier while a snapshot reads the engine's pairs."""

    demoted: list[int]
    promoted: list[int]
    corrupt: list[int]
    gone: list[int]


def _transfers(engine: TransferEngine, names: list[str]) -> tuple[list[TransferStats], _PerTier]:
    """Every pair's traffic, and per tier the blocks it demoted, had promoted into it, and
    the blocks found corrupt or gone at it (as the source of a copy)."""
    index = {name: position for position, name in enumerate(names)}
    per_tier = _PerTier(*([0] * len(names) for _ in range(4)))
    transfers: list[TransferStats] = []
    for (source, target), counter in list(engine.counters.pairs.items()):
        transfers.append(
            TransferStats(
                source,
                target,
                counter.blocks,
                counter.bytes,
                counter.seconds,
                counter.copies,
                counter.failed,
                counter.corrupt,
                counter.gone,
                counter.peak_in_flight,
            )
        )
        src, dst = index.get(source), index.get(target)
        if src is None:
            continue
        per_tier.corrupt[src] += counter.corrupt
        per_tier.gone[src] += counter.gone
        if dst is not None and src < dst:
            per_tier.demoted[src] += counter.blocks
        elif dst is not None and dst < src:
            per_tier.promoted[dst] += counter.blocks
    return transfers, per_tier


def _activity(
    manager: TieredManager,
    chain: ChainCounters,
    per_tier: _PerTier,
    storages: Sequence[BlockStorage],
) -> list[TierActivity]:
    """What each tier did. A tier's misses are the keys asked of it and not found there:
    the lookups that got past it to a lower tier's hit, and the misses of the chain. Its
    problems are what its storage counts (`storages`, one per tier; none given, none)."""
    activity = []
    below = chain.misses + sum(chain.hits)  # lookups that got past the tiers above
    for position, tier in enumerate(manager.tiers):
        below -= chain.hits[position]
        activity.append(
            TierActivity(
                tier.name,
                chain.hits[position],
                below,
                tier.blocks_written,
                tier.blocks_refused,
                tier.blocks_evicted,
                per_tier.demoted[position],
                per_tier.promoted[position],
                per_tier.corrupt[position],
                tier.events_dropped,
                per_tier.gone[position],
                storages[position].value_problems() if position < len(storages) else {},
                storages[position].unencrypted_served() if position < len(storages) else 0,
            )
        )
    return activity


def snapshot(
    manager: TieredManager,
    engine: TransferEngine,
    supervisor: SupervisorCounters,
    calls: HierarchyCounters,
    info: list[TierInfo],
    disabled: dict[str, str],
    storages: Sequence[BlockStorage] = (),
) -> HierarchyStats:
    """One `HierarchyStats` of a running chain: O(tiers + pairs + latency buckets)."""
    chain = copy.copy(manager.counters)
    chain.hits = list(chain.hits)
    supervised = copy.copy(supervisor)
    supervised.error_types = dict(supervised.error_types)
    transfers, per_tier = _transfers(engine, [tier.name for tier in manager.tiers])
    activity = _activity(manager, chain, per_tier, storages)
    counters = engine.counters
    return HierarchyStats(
        tiers=manager.stats(),
        info=list(info),
        chain=chain,
        calls=calls.copy(),
        pairs={(t.source, t.target): (t.blocks, t.bytes, t.seconds) for t in transfers},
        jobs=dict(counters.jobs),
        cascades_dropped=chain.cascades_dropped,
        corrupt_blocks=counters.corrupt_blocks,
        gone_blocks=counters.gone_blocks,
        failed_blocks=counters.failed_blocks,
        errors=dict(counters.error_types),
        supervisor=supervised,
        staging_waits=0 if engine.staging is None else engine.staging.waits,
        queue_depths=engine.queue_depths(),
        disabled_tiers=disabled,
        activity=activity,
        transfers=transfers,
        events_dropped=sum(tier.events_dropped for tier in activity),
        block_size=manager.block_size,
    )


__all__ = [
    "FlushReport",
    "HierarchyCounters",
    "HierarchyStats",
    "TierActivity",
    "TierInfo",
    "TransferStats",
    "snapshot",
]
