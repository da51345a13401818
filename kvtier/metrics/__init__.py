"""kvtier's observability: the latency histograms `Hierarchy.stats()` reports, and the
Prometheus metrics built from the same counters.

Nothing here imports `prometheus_client`: the Prometheus side (`kvtier.metrics.prometheus`)
is imported only when an embedder asks for metrics (`Hierarchy(metrics=registry)`), so
`import kvtier` works without the `metrics` extra and costs nothing more with it.

Every metric is read from kvtier's own counters when it is scraped (a collector, not a
mirror of every increment), so the hot path pays for none of it; the latency histograms are
kvtier's own too (`LatencyHistogram`, fixed buckets, `latency.py`), kept whether or not
Prometheus is installed. The metrics are listed once, in `catalog.py` (`METRICS`). This
package never imports the hierarchy: the collector reads a `StatsSource`.
"""

from __future__ import annotations

import threading
from typing import Any

from kvtier.errors import KvtierError
from kvtier.latency import EXPORTED_BOUNDS_S, LATENCY_BOUNDS_S, LatencyHistogram
from kvtier.metrics.catalog import METRICS, MetricInfo, StatsSource

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


def register_metrics(registry: Any, hierarchy: StatsSource, name: str) -> None:
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


def unregister_metrics(registry: Any, hierarchy: StatsSource) -> None:
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
    "StatsSource",
    "register_metrics",
    "require_prometheus",
    "serve_metrics",
    "unregister_metrics",
]
