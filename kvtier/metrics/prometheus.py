"""kvtier's metrics on a prometheus_client registry (imported only when metrics are asked for).

One `KvtierCollector` per registry serves every hierarchy registered on it, each with its own
value of the `hierarchy` label: a registry refuses two collectors that export the same
names, so hierarchies share one, and two hierarchies given the same name on one registry are
an InvalidValueError at construction (never a silent merge of their series).

At each scrape the collector takes each hierarchy's `stats()` (one snapshot: cheap, and safe
to take from the scrape's thread, see `Hierarchy.stats`) and turns it into metric families;
nothing is counted twice, and a hierarchy that is closed (or gone) is simply left out.
"""

from __future__ import annotations

import errno
import math
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kvtier.errors import InvalidValueError, KvtierError
from kvtier.latency import EXPORTED_BOUNDS_S, LatencyHistogram
from kvtier.metrics.catalog import METRICS, StatsSource

if TYPE_CHECKING:
    from kvtier.chain.stats import HierarchyStats

_LOCK = threading.Lock()
_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, KvtierCollector] = (
    weakref.WeakKeyDictionary()
)
"""The collector serving each registry (a registry that is dropped takes its collector)."""

TIER_STATES = ("free", "pending", "evictable", "pinned", "draining")


class _Families:
    """The families of one scrape, by metric name (`kvtier.metrics.METRICS`, in its order),
    each with `hierarchy` as its first label."""

    def __init__(self) -> None:
        self.scalars: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        self.histograms: dict[str, HistogramMetricFamily] = {}
        self.ordered: list[Metric] = []
        for info in METRICS:
            labels = ["hierarchy", *info.labels]
            family: Metric
            if info.kind == "histogram":
                family = self.histograms[info.name] = HistogramMetricFamily(
                    info.name, info.help, labels=labels
                )
            elif info.kind == "counter":
                family = self.scalars[info.name] = CounterMetricFamily(
                    info.name, info.help, labels=labels
                )
            else:
                family = self.scalars[info.name] = GaugeMetricFamily(
                    info.name, info.help, labels=labels
                )
            self.ordered.append(family)

    def add(self, name: str, labels: list[str], value: float) -> None:
        self.scalars[name].add_metric(labels, value)

    def histogram(self, name: str, label: str, histogram: LatencyHistogram) -> None:
        buckets = [
            ("+Inf" if math.isinf(bound) else repr(bound), count)
            for bound, count in histogram.cumulative(EXPORTED_BOUNDS_S)
        ]
        self.histograms[name].add_metric([label], buckets, histogram.sum_s)


def _add_hierarchy(families: _Families, name: str, stats: HierarchyStats) -> None:
    """Every metric of one hierarchy's snapshot (see `kvtier.metrics.METRICS`)."""
    add = families.add
    for tier, activity in zip(stats.tiers, stats.activity, strict=True):
        labels = [name, tier.name]
        add("kvtier_tier_capacity_blocks", labels, tier.num_blocks)
        add("kvtier_tier_capacity_bytes", labels, tier.num_blocks * stats.block_size)
        add("kvtier_tier_block_bytes", labels, stats.block_size)
        add("kvtier_tier_used_blocks", labels, tier.used)
        for state in TIER_STATES:
            add("kvtier_tier_blocks", [*labels, state], getattr(tier, state))
        add("kvtier_tier_hits_total", labels, activity.hits)
        add("kvtier_tier_misses_total", labels, activity.misses)
        add("kvtier_tier_stored_blocks_total", labels, activity.stored)
        add("kvtier_tier_refused_blocks_total", labels, activity.refused)
        add("kvtier_tier_evicted_blocks_total", labels, activity.evicted)
        add("kvtier_tier_demoted_blocks_total", labels, activity.demoted)
        add("kvtier_tier_promoted_blocks_total", labels, activity.promoted)
        add("kvtier_tier_corrupt_blocks_total", labels, activity.corrupt)
        add("kvtier_tier_gone_blocks_total", labels, activity.gone)
        add("kvtier_tier_events_dropped_total", labels, activity.events_dropped)
        for reason, count in sorted(activity.problems.items()):
            add("kvtier_tier_value_problems_total", [*labels, reason], count)
        add("kvtier_tier_unencrypted_served_total", labels, activity.unencrypted_served)
    for lane, depth in stats.queue_depths.items():
        add("kvtier_tier_queue_depth", [name, lane], depth)
    for transfer in stats.transfers:
        labels = [name, transfer.source, transfer.target]
        add("kvtier_transfer_blocks_total", labels, transfer.blocks)
        add("kvtier_transfer_bytes_total", labels, transfer.bytes)
        add("kvtier_transfer_seconds_total", labels, transfer.seconds)
        add("kvtier_transfer_failed_blocks_total", labels, transfer.failed)
    calls = stats.calls
    for outcome, value in (
        ("stored", calls.put_stored),
        ("present", calls.put_present),
        ("refused", calls.put_refused),
        ("partial", calls.put_partial),
        ("failed", calls.put_failed),
    ):
        add("kvtier_put_blocks_total", [name, outcome], value)
    add("kvtier_get_blocks_total", [name, "served"], calls.get_served)
    add("kvtier_get_blocks_total", [name, "missed"], calls.get_blocks - calls.get_served)
    add("kvtier_get_timeouts_total", [name], calls.get_timeouts)
    add("kvtier_lookup_blocks_total", [name, "held"], calls.lookup_held)
    add("kvtier_lookup_blocks_total", [name, "missed"], calls.lookup_missed)
    add("kvtier_put_store_timeouts_total", [name], calls.put_store_timeouts)
    add("kvtier_fleet_events_total", [name, "sent"], stats.fleet_events_sent)
    add("kvtier_fleet_events_total", [name, "dropped"], stats.fleet_events_dropped)
    for kind, value in (
        ("put", calls.put_backpressure_waits),
        ("demotion", calls.put_demotion_waits),
        ("staging", stats.staging_waits),
        ("admission", calls.put_admission_waits),
    ):
        add("kvtier_backpressure_waits_total", [name, kind], value)
    add("kvtier_hint_never_blocks_total", [name, "dropped"], stats.chain.hint_dropped)
    add("kvtier_hint_never_blocks_total", [name, "not_copied"], stats.chain.hint_not_cascaded)
    add("kvtier_cascades_dropped_total", [name], stats.cascades_dropped)
    for error, value in stats.errors.items():
        add("kvtier_copy_errors_total", [name, error], value)
    families.histogram("kvtier_get_seconds", name, calls.get_latency)
    families.histogram("kvtier_put_seconds", name, calls.put_latency)


class KvtierCollector(Collector):
    """Exports the hierarchies registered on one registry, read at scrape time."""

    def __init__(self) -> None:
        self._hierarchies: dict[str, weakref.ref[StatsSource]] = {}
        self._lock = threading.Lock()

    def add(self, hierarchy: StatsSource, name: str) -> None:
        """Export `hierarchy` under `hierarchy=name`; InvalidValueError if another live
        hierarchy has that name here."""
        with self._lock:
            known = self._hierarchies.get(name)
            other = None if known is None else known()
            if other is not None and other is not hierarchy and not other.closed:
                raise InvalidValueError(
                    f"metrics: a hierarchy named {name!r} is already registered on this "
                    "registry; give each hierarchy of a registry its own metrics_name"
                )
            self._hierarchies[name] = weakref.ref(hierarchy)

    def remove(self, hierarchy: StatsSource) -> None:
        with self._lock:
            for name, ref in list(self._hierarchies.items()):
                if ref() is hierarchy or ref() is None:
                    del self._hierarchies[name]

    def describe(self) -> Iterable[Metric]:
        """The families, without samples: lets the registry refuse a clash of names."""
        return _Families().ordered

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        with self._lock:
            live = [(name, ref()) for name, ref in self._hierarchies.items()]
        for name, hierarchy in sorted(live, key=lambda item: item[0]):
            if hierarchy is None:
                continue
            try:
                stats = hierarchy.stats()
            except KvtierError:  # not open (yet, or any more): nothing to say
                continue
            _add_hierarchy(families, name, stats)
        yield from families.ordered


def _check_registry(registry: object) -> CollectorRegistry:
    if not isinstance(registry, CollectorRegistry):
        raise InvalidValueError(
            "metrics must be a prometheus_client.CollectorRegistry (e.g. "
            f"prometheus_client.REGISTRY), got {type(registry).__name__}"
        )
    return registry


def register(registry: object, hierarchy: StatsSource, name: str) -> None:
    """Export `hierarchy` on `registry` under `hierarchy=name` (see the module docstring).
    InvalidValueError for a registry that is not one, a name taken by another live hierarchy
    of that registry, or a registry already holding metrics of kvtier's names."""
    checked = _check_registry(registry)
    with _LOCK:
        collector = _COLLECTORS.get(checked)
        if collector is None:
            collector = KvtierCollector()
            try:
                checked.register(collector)
            except ValueError as error:
                raise InvalidValueError(
                    f"metrics: the registry already has metrics of kvtier's names: {error}"
                ) from None
            _COLLECTORS[checked] = collector
    collector.add(hierarchy, name)


def unregister(registry: object, hierarchy: StatsSource) -> None:
    """Stop exporting `hierarchy` on `registry` (its collector stays, maybe for others)."""
    if not isinstance(registry, CollectorRegistry):
        return
    with _LOCK:
        collector = _COLLECTORS.get(registry)
    if collector is not None:
        collector.remove(hierarchy)


def serve(registry: object, port: int, host: str) -> tuple[Any, threading.Thread]:
    """prometheus_client's HTTP server of `registry` on host:port, in a daemon thread;
    InvalidValueError naming the port when it is in use or cannot be bound."""
    checked = _check_registry(registry)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidValueError(f"a metrics port is an int in 1..65535, got {port!r}")
    try:
        server, thread = start_http_server(port, addr=host, registry=checked)
    except OSError as error:
        why = (
            f"port {port} is in use"
            if error.errno == errno.EADDRINUSE
            else (error.strerror or str(error))
        )
        raise InvalidValueError(f"cannot serve metrics on {host}:{port}: {why}") from None
    return server, thread


__all__ = ["KvtierCollector", "register", "serve", "unregister"]
