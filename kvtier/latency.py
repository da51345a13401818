"""Latency in fixed buckets: `LatencyHistogram`, what `Hierarchy.stats()` reports for `get` and
`put` and what the Prometheus histograms are built from.

A module of its own (no Prometheus, no hierarchy), so the chain's counters and the collector
both read it without importing each other.
"""

from __future__ import annotations

from bisect import bisect_left

from kvtier.errors import InvalidValueError

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


__all__ = ["EXPORTED_BOUNDS_S", "LATENCY_BOUNDS_S", "LatencyHistogram"]
