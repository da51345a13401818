"""PNG charts for the command line (`kvtier simulate`; `replay_chart` draws `kvtier replay`'s).

matplotlib is the optional `plot` extra, so it is imported only when a chart is drawn and the
core never needs it; without it, `require_matplotlib()` raises a kvtier error that says how to
install it. Charts render with the Agg canvas attached to their own `Figure`, never through
pyplot: no display is needed, and an embedding application's global matplotlib backend is
left alone.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtier.errors import KvtierError

if TYPE_CHECKING:
    from kvtier.workloads.simulation.chain import ChainResult
    from kvtier.workloads.simulation.sweep import SimTrace, SweepReport

INSTALL_HINT = "pip install 'kvtier[plot]'"

_COLORS = {"lru": "tab:blue", "arc": "tab:orange", "opt": "tab:green"}
_LABELS = {"lru": "LRU", "arc": "ARC", "opt": "OPT (Belady, upper bound at this capacity)"}


@dataclass(frozen=True, slots=True)
class Curve:
    """One line of a chart: y values at x values, under a legend label."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    color: str | None = None
    style: str = "-"
    marker: str = "o"


def require_matplotlib() -> None:
    """Raise a kvtier error naming the `plot` extra if matplotlib is not installed.

    Call it before long work whose end product includes a chart, so a missing extra is
    reported at once rather than after the work.
    """
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise KvtierError(f"charts need matplotlib, which is not installed: {INSTALL_HINT}")


def new_figure(width: float = 9.0, height: float = 5.5) -> Any:
    """A matplotlib Figure with an Agg canvas; a kvtier error if matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise KvtierError(
            f"charts need matplotlib, which is not installed: {INSTALL_HINT}"
        ) from error
    figure = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def plot_hit_ratio_vs_capacity(
    path: str | Path,
    *,
    title: str,
    unique_blocks: int,
    curves: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    infinite_bound: float | None = None,
    references: Mapping[str, tuple[Sequence[int], Sequence[float]]] | None = None,
) -> Path:
    """Write a PNG of hit ratio against cache capacity and return its path.

    `curves` maps a policy name ("lru", "arc", "opt", ...) to (capacities in blocks, hit
    ratios in [0, 1]). The x axis is the capacity as a percentage of the trace's
    `unique_blocks` (log scale when the capacities span more than a factor of 10), with the
    block counts on a top axis. `infinite_bound` is drawn as a horizontal line;
    `references` (same shape as `curves`) as black crosses over the computed points.
    """
    figure = new_figure()
    axes = figure.add_subplot()
    scale = 100 / unique_blocks
    all_x: list[float] = []
    for name, (blocks, ratios) in curves.items():
        x = [b * scale for b in blocks]
        all_x.extend(x)
        axes.plot(
            x,
            ratios,
            marker="o",
            linestyle="--" if name == "opt" else "-",
            color=_COLORS.get(name),
            label=_LABELS.get(name, name.upper()),
        )
    if references:
        first = True
        for blocks, ratios in references.values():
            axes.scatter(
                [b * scale for b in blocks],
                ratios,
                marker="x",
                s=70,
                color="black",
                zorder=5,
                label="reference figure (libCacheSim)" if first else None,
            )
            first = False
    if infinite_bound is not None:
        axes.axhline(
            infinite_bound,
            color="tab:red",
            linestyle=":",
            linewidth=2,
            label=f"infinite cache (any capacity): {infinite_bound:.1%}",
        )
    if all_x and max(all_x) > 10 * min(all_x):
        axes.set_xscale("log")
        axes.set_xlabel("cache capacity (% of the trace's unique blocks, log scale)")
    else:
        axes.set_xlabel("cache capacity (% of the trace's unique blocks)")
    if all_x:
        ticks = sorted(set(all_x))
        axes.set_xticks(ticks, [f"{t:.3g}%" for t in ticks])
        axes.minorticks_off()
        top = axes.secondary_xaxis("top", functions=(lambda v: v / scale, lambda v: v * scale))
        top.set_xticks([t / scale for t in ticks], [f"{round(t / scale):,}" for t in ticks])
        top.minorticks_off()
        top.set_xlabel("cache capacity (blocks)")
    from matplotlib.ticker import PercentFormatter

    axes.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    axes.set_ylabel("block hit ratio (hits / block accesses)")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.set_title(title)
    axes.legend(loc="lower right")
    return _save(figure, Path(path))


def plot_tier_hits_over_replay(
    path: str | Path,
    *,
    title: str,
    requests: Sequence[int],
    tiers: Sequence[str],
    tier_hit_ratios: Sequence[Sequence[float]],
    infinite: Sequence[float] | None = None,
) -> Path:
    """Write a PNG of each tier's running hit ratio over a replay, stacked, and return its
    path.

    `requests` are the x values (requests served so far); `tier_hit_ratios[i][j]` is tier i's
    hits over all block accesses after `requests[j]` requests, tiers top first, so the top of
    the stack is the chain's running hit ratio. `infinite` (same x) is the running
    infinite-cache bound, drawn as a line.
    """
    figure = new_figure(9.0, 5.5)
    axes = figure.add_subplot()
    axes.stackplot(requests, *tier_hit_ratios, labels=list(tiers), alpha=0.85)
    if infinite is not None:
        axes.plot(
            requests,
            infinite,
            color="tab:red",
            linestyle=":",
            linewidth=2,
            label=f"infinite cache: {infinite[-1]:.2%}" if infinite else "infinite cache",
        )
    from matplotlib.ticker import PercentFormatter, StrMethodFormatter

    axes.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    axes.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    axes.set_xlabel("requests served (trace order)")
    axes.set_ylabel("running block hit ratio (hits / block accesses so far)")
    axes.set_xlim(left=0, right=max(requests) if requests else 1)
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.set_title(title)
    axes.legend(
        loc="lower right", title="tier (top first): final share of accesses", framealpha=0.95
    )
    return _save(figure, Path(path))


def chart_sweep(report: SweepReport, path: Path) -> Path:
    """Draw `kvtier simulate`'s sweep (hit ratio against capacity per policy) into `path`."""
    curves: dict[str, tuple[list[int], list[float]]] = {}
    references: dict[str, tuple[list[int], list[float]]] = {}
    for row in report.rows:
        blocks, ratios = curves.setdefault(row.policy, ([], []))
        blocks.append(row.capacity.blocks)
        ratios.append(row.result.hit_ratio)
        if row.reference is not None:
            ref_blocks, ref_ratios = references.setdefault(row.policy, ([], []))
            ref_blocks.append(row.capacity.blocks)
            ref_ratios.append(row.reference)
    trace = report.trace
    title = (
        f"kvtier simulate: {trace.name}\n{len(trace.requests):,} requests, "
        f"{len(trace.accesses):,} block accesses, {trace.unique_blocks:,} unique blocks"
    )
    return plot_hit_ratio_vs_capacity(
        path,
        title=title,
        unique_blocks=trace.unique_blocks,
        curves=curves,
        infinite_bound=report.infinite.hit_ratio,
        references=references,
    )


def chart_chain(result: ChainResult, trace: SimTrace, path: Path, *, source: str) -> Path:
    """Draw `kvtier simulate --tiers/--config`'s chain (each tier's running share of the hits)
    into `path`; `source` names the chain in the title ("--tiers lru,arc", "--config x")."""
    points = result.timeline
    return plot_tier_hits_over_replay(
        path,
        title=(
            f"kvtier simulate {source} ({result.write_policy}): {trace.name}\n"
            f"{result.requests:,} requests, {result.accesses:,} block accesses; "
            f"chain hit ratio {result.hit_ratio:.2%}"
        ),
        requests=[p.requests for p in points],
        tiers=[
            f"{tier.name} ({tier.medium}, {tier.policy}, {tier.capacity.blocks:,} "
            f"blocks): {result.tier_hit_ratio(index):.2%}"
            for index, tier in enumerate(result.tiers)
        ],
        tier_hit_ratios=[
            [p.tier_hits[index] / p.accesses for p in points] for index in range(len(result.tiers))
        ],
        infinite=[p.infinite_hits / p.accesses for p in points],
    )


def draw_or_remove(path: Path, draw: Callable[[Path], Path] | None) -> list[Path]:
    """Draw the chart at `path` with `draw`, or, when `draw` is None (`--no-plot`), remove a
    chart an earlier run left there, so a directory never pairs new figures with an old
    picture. Returns the paths written."""
    if draw is None:
        path.unlink(missing_ok=True)
        return []
    return [draw(path)]
