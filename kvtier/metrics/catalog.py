"""The metrics kvtier exports, listed once (`METRICS`; the README's table is checked against
it), and what the Prometheus collector reads them from (`StatsSource`).

Nothing here imports `prometheus_client` or the hierarchy: the collector
(`kvtier.metrics.prometheus`) reads any `StatsSource`, whose `stats()` is the chain's snapshot
(`kvtier.chain.stats.HierarchyStats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvtier.chain.stats import HierarchyStats


class StatsSource(Protocol):
    """What the collector exports: an object (a `Hierarchy`) whose `stats()` is one snapshot
    of its counters, cheap and safe to take from the scrape's thread, raising a KvtierError
    while it is not open."""

    @property
    def closed(self) -> bool:
        """Whether it was closed (a closed source is no longer exported)."""
        ...

    def stats(self) -> HierarchyStats:
        """One snapshot of every counter."""
        ...


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """One exported metric: its name, Prometheus type, labels (besides `hierarchy`) and
    meaning. `METRICS` lists them all; the README's table is checked against it."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str


METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("kvtier_tier_capacity_blocks", "gauge", ("tier",), "Slots of the tier."),
    MetricInfo(
        "kvtier_tier_capacity_bytes",
        "gauge",
        ("tier",),
        "Bytes the tier's slots hold (capacity in blocks x block bytes; for a tier that owns "
        "its index, the blocks kvtier keeps track of there).",
    ),
    MetricInfo(
        "kvtier_tier_block_bytes",
        "gauge",
        ("tier",),
        "Bytes of one block (the chain's block_size: all K and V of every layer for the "
        "tokens of one block).",
    ),
    MetricInfo(
        "kvtier_tier_blocks",
        "gauge",
        ("tier", "state"),
        "Slots by state now: free, pending (being written), evictable (ready, unpinned), "
        "pinned (being read), draining (evicted, being copied down).",
    ),
    MetricInfo("kvtier_tier_used_blocks", "gauge", ("tier",), "Slots not free (capacity - free)."),
    MetricInfo(
        "kvtier_tier_hits_total",
        "counter",
        ("tier",),
        "Lookups answered by the tier (ready at the top, found below and promoted, or "
        "read from its copy on its way into the tier).",
    ),
    MetricInfo(
        "kvtier_tier_misses_total",
        "counter",
        ("tier",),
        "Keys asked of the tier and not found there (by lookup, get or a serving engine's "
        "lookups): hits of the tiers below it and misses of the chain, so the bottom tier "
        "counts every miss of the chain. A miss of the chain is one per lookup that missed "
        "(its first key no tier holds; the keys after it are not asked): for misses per "
        "block see kvtier_lookup_blocks_total.",
    ),
    MetricInfo(
        "kvtier_tier_stored_blocks_total",
        "counter",
        ("tier",),
        "Blocks stored into the tier (puts at the top, demotions, promotions, cascades).",
    ),
    MetricInfo(
        "kvtier_tier_refused_blocks_total",
        "counter",
        ("tier",),
        "Blocks the tier did not take: not admitted by its policy, or no room (all pinned).",
    ),
    MetricInfo(
        "kvtier_tier_evicted_blocks_total",
        "counter",
        ("tier",),
        "Blocks evicted by the tier's policy (in a store, or to refill its reserve).",
    ),
    MetricInfo(
        "kvtier_tier_demoted_blocks_total",
        "counter",
        ("tier",),
        "Blocks copied from the tier to a tier below (demotions; write-through cascades).",
    ),
    MetricInfo(
        "kvtier_tier_promoted_blocks_total",
        "counter",
        ("tier",),
        "Blocks copied into the tier from a tier below (promotions).",
    ),
    MetricInfo(
        "kvtier_tier_corrupt_blocks_total",
        "counter",
        ("tier",),
        "Blocks read from the tier that failed their checksum (dropped; a miss).",
    ),
    MetricInfo(
        "kvtier_tier_gone_blocks_total",
        "counter",
        ("tier",),
        "Blocks read from the tier (a shared store) that it no longer held, having evicted "
        "them itself, or could not be asked for: a miss, not damage.",
    ),
    MetricInfo(
        "kvtier_tier_value_problems_total",
        "counter",
        ("tier", "reason"),
        "Values read from the tier (a shared store) and not served, by reason: forged (not "
        "made with a key this node holds: alert on it), foreign, damaged, oversized, and a "
        "shared-fs file's symlink, not_regular, linked, unsafe_dir, forgotten, and unencrypted "
        "(require_encrypted = true). Each a miss.",
    ),
    MetricInfo(
        "kvtier_tier_unencrypted_served_total",
        "counter",
        ("tier",),
        "Values a key holder wrote without encryption that the tier (a shared store with "
        "encrypt = true) served; require_encrypted = true makes them misses instead.",
    ),
    MetricInfo(
        "kvtier_tier_queue_depth",
        "gauge",
        ("tier",),
        "Copies waiting at the tier's transfer queue now (caller: copies to and from the "
        "embedder's tensors).",
    ),
    MetricInfo(
        "kvtier_tier_events_dropped_total",
        "counter",
        ("tier",),
        "Blocks of stored / removed events dropped, oldest first, because nobody took "
        "them (take_events) before the tier's event log was full.",
    ),
    MetricInfo(
        "kvtier_transfer_blocks_total",
        "counter",
        ("source", "target"),
        "Blocks copied from source to target (caller: the embedder's tensors).",
    ),
    MetricInfo("kvtier_transfer_bytes_total", "counter", ("source", "target"), "Bytes copied."),
    MetricInfo(
        "kvtier_transfer_seconds_total",
        "counter",
        ("source", "target"),
        "Seconds during which at least one copy of the pair was in flight (bytes / seconds "
        "is the pair's throughput).",
    ),
    MetricInfo(
        "kvtier_transfer_failed_blocks_total",
        "counter",
        ("source", "target"),
        "Blocks whose copy failed (an I/O error, a corrupt or vanished source, a block a "
        "shared store no longer held): a failed store into target, or a failed load when "
        "target is caller.",
    ),
    MetricInfo(
        "kvtier_put_blocks_total",
        "counter",
        ("outcome",),
        "Blocks given to put, by outcome: stored, present (already held), refused (no room "
        "or not admitted), partial (a prompt's partial last block, never stored), failed "
        "(the write failed).",
    ),
    MetricInfo(
        "kvtier_get_blocks_total",
        "counter",
        ("outcome",),
        "Blocks asked of get / get_into, by outcome: served, missed (absent, corrupt or late).",
    ),
    MetricInfo("kvtier_get_timeouts_total", "counter", (), "get calls whose deadline passed."),
    MetricInfo(
        "kvtier_put_store_timeouts_total",
        "counter",
        (),
        "put calls whose wait for room passed store_timeout_s (they evicted or refused).",
    ),
    MetricInfo(
        "kvtier_fleet_events_total",
        "counter",
        ("outcome",),
        "KV events of the [events] publisher: sent, or dropped because its queue was full "
        "(subscribers see a gap in the sequence numbers).",
    ),
    MetricInfo(
        "kvtier_backpressure_waits_total",
        "counter",
        ("kind",),
        "Waits for room: put (the top tier's reserve was exhausted), demotion (a put waited "
        "for its victims' copy), staging (a copy waited for the staging arena), admission "
        "(a put part queued at the put gate: loads go first).",
    ),
    MetricInfo(
        "kvtier_hint_never_blocks_total",
        "counter",
        ("fate",),
        'Blocks hinted "never" that no slower tier was made to write, by fate: dropped '
        "(evicted instead of demoted), not_copied (left out of a write-through cascade or a "
        "flush).",
    ),
    MetricInfo(
        "kvtier_cascades_dropped_total",
        "counter",
        (),
        "Blocks of write-through cascades dropped over the backlog limit.",
    ),
    MetricInfo(
        "kvtier_copy_errors_total",
        "counter",
        ("error",),
        "Copies that raised, by exception class (each is a miss or a failed store).",
    ),
    # -- per-block lookups (kvtier.chain.stats.HierarchyCounters.lookup_blocks) -----------
    MetricInfo(
        "kvtier_lookup_blocks_total",
        "counter",
        ("outcome",),
        "Keys given to lookup, by outcome: held (the leading keys some tier holds: its "
        "answers summed), missed (the first key no tier holds and every key after it). The "
        "sum of kvtier_tier_hits_total over all keys given to lookup is the per-block hit "
        "ratio of a lookup-then-get workload (kvtier replay's).",
    ),
    MetricInfo(
        "kvtier_get_seconds",
        "histogram",
        (),
        "Latency of get / get_into calls (kvtier's fixed buckets, 1 us to 100 s).",
    ),
    MetricInfo(
        "kvtier_put_seconds",
        "histogram",
        (),
        "Latency of put calls, backpressure included.",
    ),
)


__all__ = ["METRICS", "MetricInfo", "StatsSource"]
