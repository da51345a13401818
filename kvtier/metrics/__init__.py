"""kvtier's observability: the latency histograms `Hierarchy.stats()` reports, and the
Prometheus metrics built from the same counters.

Nothing here imports `prometheus_client`: the Prometheus side (`kvtier.metrics.prometheus`)
is imported only when an embedder asks for metrics (`Hierarchy(metrics=registry)`), so
`import kvtier` works without the `metrics` extra and costs nothing more with it.

Every metric is read from kvtier's own counters when it is scraped (a collector, not a
mirror of every increment), so the hot path pays for none of it; the latency histograms are
kvtier's own too (`LatencyHistogram`, fixed buckets), kept whether or not Prometheus is
installed.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvtier.errors import InvalidValueError, KvtierError

if TYPE_CHECKING:
    from kvtier.hierarchy import Hierarchy

LATENCY_BOUNDS_S: tuple[float, ...] = (
    *(
        round(mantissa * 10.0**exponent, 12)
        for exponent in range(-6, 2)
        for mantissa in (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
    ),
    100.0,
)
"""Upper bounds (seconds) of the latency buckets: ten a decade from 1 us to 100 s (each
bucket's width at most 25 % of its upper bound), plus one bucket for everything slower."""


def _exported_bounds() -> tuple[float, ...]:
    """The 1 / 2.5 / 5 bounds of each decade: what Prometheus gets (cumulative counts at a
    subset of the bounds are exact, and 25 buckets keep a scrape small)."""
    firsts = ("1.000000e", "2.500000e", "5.000000e")
    return tuple(bound for bound in LATENCY_BOUNDS_S if f"{bound:.6e}".startswith(firsts))


EXPORTED_BOUNDS_S: tuple[float, ...] = _exported_bounds()
"""The bucket bounds of the Prometheus latency histograms (a subset of LATENCY_BOUNDS_S)."""


class LatencyHistogram:
    """Latencies counted in the fixed buckets of `LATENCY_BOUNDS_S` (plus one past the last),
    with their count, sum and maximum: O(1) memory and O(log buckets) per observation,
    however many calls are made (it replaces a list of the last 100,000 samples).

    `percentile` estimates from the buckets: it finds the bucket holding the rank and
    interpolates linearly inside it, so an estimate is off by at most that bucket's width
    (25 % of its upper bound), and never exceeds the largest latency seen."""

    __slots__ = ("count", "counts", "max_s", "sum_s")

    def __init__(self) -> None:
        self.counts: list[int] = [0] * (len(LATENCY_BOUNDS_S) + 1)
        self.count = 0
        self.sum_s = 0.0
        self.max_s = 0.0

    def observe(self, seconds: float) -> None:
        """Count one latency (seconds)."""
        self.counts[bisect_left(LATENCY_BOUNDS_S, seconds)] += 1
        self.count += 1
        self.sum_s += seconds
        if seconds > self.max_s:
            self.max_s = seconds

    def copy(self) -> LatencyHistogram:
        """A snapshot (a list copy: cheap, and safe to take from another thread)."""
        snapshot = LatencyHistogram()
        snapshot.counts = list(self.counts)
        snapshot.count = sum(snapshot.counts)
        snapshot.sum_s = self.sum_s
        snapshot.max_s = self.max_s
        return snapshot

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100) in seconds, estimated from the buckets (0 if none)."""
        if not 0 <= q <= 100:
            raise InvalidValueError(f"a percentile is in 0..100, got {q!r}")
        if not self.count:
            return 0.0
        rank = q / 100 * self.count
        seen = 0
        for index, in_bucket in enumerate(self.counts):
            if not in_bucket or seen + in_bucket < rank:
                seen += in_bucket
                continue
            lower = LATENCY_BOUNDS_S[index - 1] if index else 0.0
            upper = LATENCY_BOUNDS_S[index] if index < len(LATENCY_BOUNDS_S) else self.max_s
            estimate = lower + (upper - lower) * max(0.0, rank - seen) / in_bucket
            return min(estimate, self.max_s)
        return self.max_s

    def cumulative(self, bounds: tuple[float, ...]) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) at each of `bounds` (a subset of
        `LATENCY_BOUNDS_S`), then (inf, count): a Prometheus histogram's buckets."""
        out: list[tuple[float, int]] = []
        seen = 0
        index = 0
        for bound in bounds:
            while index < len(LATENCY_BOUNDS_S) and LATENCY_BOUNDS_S[index] <= bound:
                seen += self.counts[index]
                index += 1
            out.append((bound, seen))
        out.append((float("inf"), sum(self.counts)))
        return out

    def __repr__(self) -> str:
        return (
            f"LatencyHistogram(count={self.count}, p50={self.percentile(50):.6f}s, "
            f"p99={self.percentile(99):.6f}s, max={self.max_s:.6f}s)"
        )


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
        "Lookups answered by the tier (ready at the top, or found below and promoted).",
    ),
    MetricInfo(
        "kvtier_tier_misses_total",
        "counter",
        ("tier",),
        "Lookups the tier could not answer (hits of lower tiers and misses of the chain); "
        "the bottom tier's count is the chain's misses.",
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
        "Blocks whose copy failed (an I/O error, a corrupt or vanished source): a failed "
        "store into target, or a failed load when target is caller.",
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
        "kvtier_backpressure_waits_total",
        "counter",
        ("kind",),
        "Waits for room: put (the top tier's reserve was exhausted), demotion (a put waited "
        "for its victims' copy), staging (a copy waited for the staging arena).",
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

METRICS_EXTRA_HINT = "pip install 'kvtier[metrics]'"
"""How to get what the metrics need; every error about a missing prometheus_client says it."""


def require_prometheus() -> None:
    """KvtierError, naming the extra, when prometheus_client is not installed."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as error:
        raise KvtierError(
            f"metrics need the prometheus-client package ({error}): {METRICS_EXTRA_HINT}"
        ) from None


def register_metrics(registry: Any, hierarchy: Hierarchy, name: str) -> None:
    """Export `hierarchy`'s metrics on `registry` (a prometheus_client CollectorRegistry)
    with the label `hierarchy=name`. See `kvtier.metrics.prometheus.register`."""
    require_prometheus()
    from kvtier.metrics.prometheus import register

    register(registry, hierarchy, name)


class MetricsServer:
    """An HTTP server of a registry's metrics (Prometheus text format, on any path) in a
    daemon thread of its own, until `close`: a scrape never runs on the event loop."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, port: int) -> None:
        self._server = server
        self._thread = thread
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(registry: Any, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve `registry` over HTTP on host:port until the returned server is closed.
    KvtierError naming the extra without prometheus_client; InvalidValueError naming the
    port when it is taken (or cannot be bound)."""
    require_prometheus()
    from kvtier.metrics.prometheus import serve

    server, thread = serve(registry, port, host)
    return MetricsServer(server, thread, host, port)


def unregister_metrics(registry: Any, hierarchy: Hierarchy) -> None:
    """Stop exporting `hierarchy`'s metrics on `registry` (nothing if it never was)."""
    from kvtier.metrics.prometheus import unregister

    unregister(registry, hierarchy)


__all__ = [
    "EXPORTED_BOUNDS_S",
    "LATENCY_BOUNDS_S",
    "METRICS",
    "METRICS_EXTRA_HINT",
    "LatencyHistogram",
    "MetricInfo",
    "MetricsServer",
    "register_metrics",
    "require_prometheus",
    "serve_metrics",
    "unregister_metrics",
]
