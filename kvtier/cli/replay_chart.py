"""The PNG chart of `kvtier replay`: hit ratio per tier over the replay, and bytes moved.

Drawn from the report's data (`report.json`), so a chart can be redrawn from a saved report.
Same conventions as `kvtier.cli.charts`: matplotlib (the optional `plot` extra) is imported only
here and only when a chart is drawn, through its own `Figure` with an Agg canvas, never
pyplot; without matplotlib a kvtier error says how to install it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvtier.cli.charts import new_figure
from kvtier.workloads.replay import format_size

__all__ = ["plot_replay"]


def _ratios(hits: Sequence[int], accesses: Sequence[int]) -> list[float]:
    return [h / a if a else 0.0 for h, a in zip(hits, accesses, strict=True)]


def _windows(
    requests: Sequence[int], hits: Sequence[int], accesses: Sequence[int], count: int = 20
) -> tuple[list[int], list[float]]:
    """The chain's hit ratio in `count` windows of about equal numbers of series points:
    (window starts, ratios) for a step line; the end is appended, repeating the last ratio,
    so the last step is drawn to the end."""
    if not requests:
        return [], []
    points = len(requests)
    ends = sorted({max(0, round(k * points / count) - 1) for k in range(1, count + 1)})
    starts: list[int] = []
    ratios: list[float] = []
    last_r = last_h = last_a = 0
    for index in ends:
        r, h, a = requests[index], hits[index], accesses[index]
        starts.append(last_r)
        ratios.append((h - last_h) / (a - last_a) if a > last_a else 0.0)
        last_r, last_h, last_a = r, h, a
    starts.append(requests[-1])
    ratios.append(ratios[-1])
    return starts, ratios


def _unit(largest: float) -> tuple[float, str]:
    """A byte unit fitting `largest` bytes: (divisor, name)."""
    for divisor, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if largest >= divisor:
            return divisor, name
    return 1.0, "B"


def plot_replay(path: str | Path, report: Mapping[str, Any]) -> Path:
    """Write the replay chart of `report` (a `ReplayResult.to_dict()`) and return its path.

    Top: each tier's running hit ratio (its hits over all block accesses so far), stacked top
    tier first, so the top edge is the chain's running hit ratio; the chain's hit ratio per
    window of requests as a thin line; the running infinite-cache bound as a dotted line.
    Bottom: bytes moved per tier pair (cumulative), with each pair's total and achieved GB/s.
    """
    series = report["series"]
    requests: list[int] = series["requests"]
    accesses: list[int] = series["block_accesses"]
    tiers = report["tiers"]
    figure = new_figure(10.0, 9.0)
    top, bottom = figure.subplots(2, 1, height_ratios=[3, 2])

    from matplotlib.ticker import FuncFormatter, PercentFormatter, StrMethodFormatter

    running = [_ratios(series["tier_hits"][tier["name"]], accesses) for tier in tiers]
    labels = [
        f"{tier['name']} ({tier['medium']}, {tier['policy']}, {tier['blocks']:,} blocks): "
        f"{tier['hit_ratio']:.2%}"
        for tier in tiers
    ]
    windows_or_zero: list[float] = [0.0]
    if requests:
        top.stackplot(requests, *running, labels=labels, alpha=0.85)
        total_hits = [sum(column) for column in zip(*series["tier_hits"].values(), strict=True)]
        starts, windows = _windows(requests, total_hits, accesses)
        windows_or_zero = windows
        top.step(
            starts,
            windows,
            where="post",
            color="0.2",
            linewidth=1.2,
            label=f"chain hit ratio within each window of ~{max(1, requests[-1] // 20):,} requests",
        )
        top.plot(
            requests,
            _ratios(series["infinite_hits"], accesses),
            color="tab:red",
            linestyle=":",
            linewidth=2,
            label=f"infinite cache: {report['infinite_cache_hit_ratio']:.2%}",
        )
        top.set_xlim(0, max(requests))
    top.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
    top.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    highest = max([report["infinite_cache_hit_ratio"], report["hit_ratio"], *windows_or_zero])
    top.set_ylim(0, min(1.0, highest * 1.25 + 0.05))
    top.set_ylabel("block hit ratio")
    top.set_xlabel("requests served (trace order)")
    top.grid(True, alpha=0.3)
    top.legend(
        loc="upper right",
        title=f"running hit ratio by tier (top first); chain {report['hit_ratio']:.2%}",
        fontsize="small",
        title_fontsize="small",
        framealpha=0.95,
    )
    sizes = report["block_bytes"]
    size = f"{format_size(sizes['replayed'])} blocks"
    if sizes["scaled"]:
        size += f" (config: {format_size(sizes['config'])}, same block counts)"
    trace = report["trace"]
    partial = " (PARTIAL: interrupted)" if report["partial"] else ""
    top.set_title(
        f"kvtier replay: {trace['name']}, {report['requests']:,} requests, "
        f"{report['block_accesses']:,} block accesses{partial}\n"
        f"{size}; verified {report['verification']['verified']:,} "
        f"blocks, {report['verification']['mismatches']:,} mismatches"
    )

    pair_rows = {f"{p['source']}->{p['destination']}": p for p in report["pairs"]}
    pair_series: dict[str, list[int]] = series["pair_bytes"]
    largest = max((values[-1] for values in pair_series.values() if values), default=0)
    divisor, unit = _unit(largest)
    for name, values in pair_series.items():
        row = pair_rows.get(name)
        rate = row["gb_per_s"] if row else None
        total = values[-1] if values else 0
        label = f"{name.replace('->', ' → ')}: {total / divisor:,.2f} {unit}"
        if rate is not None:
            label += f" at {rate:.2f} GB/s"
        bottom.plot(requests, [v / divisor for v in values], linewidth=2, label=label)
    if requests:
        bottom.set_xlim(0, max(requests))
    bottom.set_ylim(bottom=0)
    bottom.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    decimals = 0 if largest / divisor >= 10 else 2
    bottom.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.{decimals}f}"))
    bottom.set_xlabel("requests served (trace order)")
    bottom.set_ylabel(f"bytes moved so far ({unit})")
    bottom.set_title("bytes moved per tier pair (caller = put / get)", fontsize="medium")
    bottom.grid(True, alpha=0.3)
    if series["pair_bytes"]:
        bottom.legend(
            loc="upper left",
            title="source → destination: total at achieved rate",
            fontsize="small",
            title_fontsize="small",
        )
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(destination, format="png")
    return destination
