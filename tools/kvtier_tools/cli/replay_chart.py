"""The PNG chart of `kvtier replay`: hit ratio per tier over the replay, and bytes moved.

Drawn from the report's data (`report.json`), so a chart can be redrawn from a saved report.
Same conventions as `kvtier_tools.cli.charts`: matplotlib (the optional `plot` extra) is
imported only here and only when a chart is drawn, through its own `Figure` with an Agg canvas,
never pyplot; without matplotlib a kvtier error says how to install it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvtier.cli.console import decimal_unit
from kvtier.config import format_size
from kvtier_tools.cli.charts import TIER_COLORS, draw_running_hits, new_figure, title_lines

__all__ = ["plot_replay", "replay_figure"]


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


def _title(report: Mapping[str, Any]) -> str:
    """The chart's title, a line each for the trace, the requests (a partial or `--limit`ed
    run says so) and the blocks, wrapped so that none is cut off at the figure's edge."""
    trace = report["trace"]
    accesses = f"{report['block_accesses']:,} block accesses"
    if report["partial"]:
        done = trace.get("requests_replayed", report["requests"])
        planned = trace.get("requests_planned", report["requests"])
        why = "interrupted" if report.get("interrupted") else "stopped"
        requests = f"PARTIAL ({why}): {done:,} of {planned:,} requests, {accesses}"
    elif trace.get("limited"):
        requests = f"the first {report['requests']:,} requests (--limit), {accesses}"
    else:
        requests = f"{report['requests']:,} requests, {accesses}"
    sizes = report["block_bytes"]
    size = f"{format_size(sizes['replayed'])} blocks"
    if sizes["scaled"]:
        size += f" (config: {format_size(sizes['config'])}, same block counts)"
    verification = report["verification"]
    return title_lines(
        f"kvtier replay: {trace['name']}",
        requests,
        f"{size}; verified {verification['verified']:,} blocks, "
        f"{verification['mismatches']:,} mismatches",
    )


def _pair_style(name: str, tier_index: Mapping[str, int]) -> tuple[str, str, float, float, int]:
    """How the line of tier pair `name` ("source->destination") is drawn: (colour, line
    style, width, alpha, z-order).

    A pair takes the colour of its lower tier (the one further from the caller), as that
    tier's area has in the panel above: `caller->cpu` and `cpu->caller` are the cpu's link,
    `cpu->disk` and `disk->cpu` the disk's. Down (put, demotion, cascade) is solid, up (get,
    promotion) dashed. Pairs of deeper links are drawn wider and beneath, so two pairs moving
    the same bytes (every put at the top is later demoted below) both stay visible.
    """
    source, destination = name.split("->", 1)
    depth = max(tier_index.get(source, -1), tier_index.get(destination, -1), 0)
    down = tier_index.get(source, -1) < tier_index.get(destination, -1)
    return (
        TIER_COLORS[depth % len(TIER_COLORS)],
        "-" if down else "--",
        1.6 + 2.4 * depth,
        1.0 if depth == 0 else 0.55,
        10 - depth,
    )


def plot_replay(path: str | Path, report: Mapping[str, Any]) -> Path:
    """Write the replay chart of `report` (a `ReplayResult.to_dict()`) as a PNG at `path`
    and return the path (see `replay_figure`)."""
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    replay_figure(report).savefig(destination, format="png")
    return destination


def replay_figure(report: Mapping[str, Any]) -> Any:
    """The replay chart of `report` (a `ReplayResult.to_dict()`) as a matplotlib Figure.

    Top: each tier's running hit ratio (its hits over all block accesses so far), stacked top
    tier first, so the top edge is the chain's running hit ratio; the chain's hit ratio per
    window of requests as a thin line; the running infinite-cache bound as a thin line over
    the stack. Middle: the gap between the bound and the chain, on its own scale. Bottom:
    bytes moved per tier pair (cumulative), with each pair's total and achieved GB/s. A tier
    has one colour in every panel.
    """
    figure = new_figure(10.0, 11.0)
    top, gap, bottom = figure.subplots(3, 1, height_ratios=[3, 1, 2])
    top.sharex(gap)
    _draw_hit_ratios(top, gap, report)
    _draw_bytes_moved(bottom, report)
    return figure


def _draw_hit_ratios(top: Any, gap: Any, report: Mapping[str, Any]) -> None:
    """The top panel (each tier's running hit ratio stacked, the chain's per window, the
    infinite-cache bound) and the gap panel under it (the bound minus the chain)."""
    from matplotlib.ticker import PercentFormatter, StrMethodFormatter

    series = report["series"]
    requests: list[int] = series["requests"]
    accesses: list[int] = series["block_accesses"]
    tiers = report["tiers"]
    running = [_ratios(series["tier_hits"][tier["name"]], accesses) for tier in tiers]
    labels = [
        f"{tier['name']} ({tier['medium']}, {tier['policy']}, {tier['blocks']:,} blocks): "
        f"{tier['hit_ratio']:.2%}"
        for tier in tiers
    ]
    windows_or_zero: list[float] = [0.0]
    if requests:
        draw_running_hits(
            top, gap, requests, running, labels, _ratios(series["infinite_hits"], accesses)
        )
        total_hits = [sum(column) for column in zip(*series["tier_hits"].values(), strict=True)]
        starts, windows = _windows(requests, total_hits, accesses)
        windows_or_zero = windows
        top.step(
            starts,
            windows,
            where="post",
            color="0.55",
            linewidth=1.0,
            label=f"chain hit ratio within each window of ~{max(1, requests[-1] // 20):,} requests",
        )
        top.set_xlim(0, max(requests))
    top.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
    top.tick_params(labelbottom=False)
    gap.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    gap.set_xlabel("requests served (trace order)")
    highest = max([report["infinite_cache_hit_ratio"], report["hit_ratio"], *windows_or_zero])
    top.set_ylim(0, min(1.0, highest * 1.25 + 0.05))
    top.set_ylabel("block hit ratio")
    top.grid(True, alpha=0.3)
    top.legend(
        loc="upper right",
        title=f"running hit ratio by tier (top first); chain {report['hit_ratio']:.2%}",
        fontsize="small",
        title_fontsize="small",
        framealpha=0.95,
    )
    top.set_title(_title(report))


def _draw_bytes_moved(bottom: Any, report: Mapping[str, Any]) -> None:
    """The bottom panel: bytes moved per tier pair so far, each pair's line labelled with its
    total and achieved GB/s."""
    from matplotlib.ticker import FuncFormatter, StrMethodFormatter

    series = report["series"]
    requests: list[int] = series["requests"]
    tier_index = {tier["name"]: index for index, tier in enumerate(report["tiers"])}
    pair_rows = {f"{p['source']}->{p['destination']}": p for p in report["pairs"]}
    pair_series: dict[str, list[int]] = series["pair_bytes"]
    largest = max((values[-1] for values in pair_series.values() if values), default=0)
    divisor, unit = decimal_unit(largest)
    for name, values in pair_series.items():
        row = pair_rows.get(name)
        rate = row["gb_per_s"] if row else None
        total = values[-1] if values else 0
        label = f"{name.replace('->', ' → ')}: {total / divisor:,.2f} {unit}"
        if rate is not None:
            label += f" at {rate:.2f} GB/s"
        color, style, width, alpha, order = _pair_style(name, tier_index)
        bottom.plot(
            requests,
            [v / divisor for v in values],
            color=color,
            linestyle=style,
            linewidth=width,
            alpha=alpha,
            zorder=order,
            label=label,
        )
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
            title="source → destination: total at achieved rate\n"
            "(colour: the lower tier; solid: down, dashed: up)",
            fontsize="small",
            title_fontsize="small",
        )
