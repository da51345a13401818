"""PNG charts for the command line (`kvtier simulate`; `replay_chart` draws `kvtier replay`'s).

matplotlib is the optional `plot` extra, so it is imported only when a chart is drawn and the
kvtier never needs it; without it, `require_matplotlib()` raises a kvtier error that says how to
install it. Charts render with the Agg canvas attached to their own `Figure`, never through
pyplot: no display is needed, and an embedding application's global matplotlib backend is
left alone.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtier.errors import KvtierError

if TYPE_CHECKING:
    from kvtier_tools.workloads.simulation.chain import ChainResult
    from kvtier_tools.workloads.simulation.sweep import SimTrace, SweepReport

INSTALL_HINT = "pip install matplotlib (kvtier-tools' `plot` extra: pip install -e 'tools/[plot]')"

INFINITE_COLOR = "tab:red"
"""The infinite-cache bound and the gap to it, in every chart; no tier or policy uses it."""

CHAIN_COLOR = "black"
"""The chain's running hit ratio (all tiers together), drawn as its own line on the stack."""

TIER_COLORS = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
)
"""One colour per tier, top first (a chain has at most 8 tiers); a tier pair takes its lower
tier's colour, so a colour means the same tier in every panel. Red is left to the bound."""

_POLICY_COLORS = {"lru": "tab:blue", "arc": "tab:orange", "opt": "tab:green", "lct": "tab:purple"}
_POLICY_LABELS = {
    "lru": "LRU",
    "arc": "ARC",
    "lct": "LCT (learned class thresholds)",
    "opt": "OPT (Belady, upper bound at this capacity)",
}
_SPARE_COLORS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
"""Colours of policies without one of their own, in order of appearance (never a known
policy's colour, never the bound's red)."""


def policy_colors(names: Sequence[str]) -> dict[str, str]:
    """A distinct colour for each policy name: its own when it has one, else a spare."""
    spare = iter(_SPARE_COLORS * (1 + len(names) // len(_SPARE_COLORS)))
    return {name: _POLICY_COLORS.get(name) or next(spare) for name in names}


def title_lines(*lines: str, width: int = 90) -> str:
    """A chart title of `lines`, each wrapped at `width` characters so none runs off the
    figure (a long trace name or config path, a partial run's note)."""
    import textwrap

    return "\n".join(
        "\n".join(textwrap.wrap(line, width, break_on_hyphens=False)) for line in lines if line
    )


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
    colors = policy_colors(list(curves))
    for name, (blocks, ratios) in curves.items():
        x = [b * scale for b in blocks]
        all_x.extend(x)
        axes.plot(
            x,
            ratios,
            marker="o",
            linestyle="--" if name == "opt" else "-",
            color=colors[name],
            label=_POLICY_LABELS.get(name, name.upper()),
            zorder=3,
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
    if infinite_bound is not None:  # beneath the curves, so a curve at the bound stays seen
        axes.axhline(
            infinite_bound,
            color=INFINITE_COLOR,
            linestyle=(0, (3, 2)),
            linewidth=1.2,
            label=f"infinite cache (any capacity): {infinite_bound:.2%}",
            zorder=1,
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


def draw_running_hits(
    axes: Any,
    gap_axes: Any,
    requests: Sequence[int],
    tier_hit_ratios: Sequence[Sequence[float]],
    labels: Sequence[str],
    infinite: Sequence[float],
) -> None:
    """Draw each tier's running hit ratio stacked on `axes` (tiers top first, coloured by
    `TIER_COLORS`), the chain's total as a line on the stack's top edge, the infinite-cache
    bound over it, and the gap between them on `gap_axes`.

    The gap is the point of the bound, and on a good chain it is a fraction of a percentage
    point: a line drawn on the stack's edge would hide it. So the bound is a thin dashed line
    over the chain's solid one, the band between them is hatched, and `gap_axes` plots the
    gap in percentage points on its own scale.
    """
    chain = [sum(column) for column in zip(*tier_hit_ratios, strict=True)]
    axes.stackplot(
        requests,
        *tier_hit_ratios,
        labels=list(labels),
        colors=TIER_COLORS[: len(tier_hit_ratios)],
        alpha=0.85,
    )
    gap = [max(0.0, bound - held) for bound, held in zip(infinite, chain, strict=True)]
    final = gap[-1] if gap else 0.0
    axes.fill_between(
        requests,
        chain,
        infinite,
        facecolor="none",
        edgecolor=INFINITE_COLOR,
        hatch="//////",
        linewidth=0,
    )
    axes.plot(  # the chain's total as a line of its own, beneath the bound
        requests,
        chain,
        color=CHAIN_COLOR,
        linewidth=1.8,
        label=f"chain (all tiers): {chain[-1]:.2%}" if chain else "chain (all tiers)",
    )
    axes.plot(  # dashed: where it meets the chain, the chain's line shows between the dashes
        requests,
        infinite,
        color=INFINITE_COLOR,
        linewidth=1.0,
        linestyle=(0, (4, 2)),
        label=(
            f"infinite cache: {infinite[-1]:.2%} (gap to the chain: {final * 100:.2f} pp, "
            "hatched, and below)"
            if infinite
            else "infinite cache"
        ),
    )
    gap_pp = [g * 100 for g in gap]
    gap_axes.fill_between(requests, 0, gap_pp, color=INFINITE_COLOR, alpha=0.25, linewidth=0)
    gap_axes.plot(requests, gap_pp, color=INFINITE_COLOR, linewidth=1.2)
    gap_axes.set_ylim(0, max([0.1, *gap_pp]) * 1.15)
    gap_axes.set_ylabel("gap (pp)")
    gap_axes.set_title(
        "infinite cache minus chain: the hits a cache of unlimited size would add "
        f"({final * 100:.2f} pp of block accesses at the end)",
        fontsize="medium",
    )
    gap_axes.grid(True, alpha=0.3)


def plot_tier_hits_over_replay(
    path: str | Path,
    *,
    title: str,
    requests: Sequence[int],
    tiers: Sequence[str],
    tier_hit_ratios: Sequence[Sequence[float]],
    infinite: Sequence[float],
) -> Path:
    """Write a PNG of each tier's running hit ratio over a replay, stacked, and return its
    path.

    `requests` are the x values (requests served so far); `tier_hit_ratios[i][j]` is tier i's
    hits over all block accesses after `requests[j]` requests, tiers top first, so the top of
    the stack is the chain's running hit ratio. `infinite` (same x) is the running
    infinite-cache bound, drawn over the stack, with the gap to it in a panel below.
    """
    figure = new_figure(9.0, 7.5)
    axes, gap_axes = figure.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    draw_running_hits(axes, gap_axes, requests, tier_hit_ratios, tiers, infinite)
    from matplotlib.ticker import PercentFormatter, StrMethodFormatter

    axes.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    gap_axes.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    gap_axes.set_xlabel("requests served (trace order)")
    axes.set_ylabel("running block hit ratio (hits / block accesses so far)")
    axes.set_xlim(left=0, right=max(requests) if requests else 1)
    highest = max([*infinite, *(sum(column) for column in zip(*tier_hit_ratios, strict=True))])
    axes.set_ylim(0, min(1.0, highest * 1.25 + 0.05))  # room above the stack for the legend
    axes.grid(True, alpha=0.3)
    axes.set_title(title)
    axes.legend(
        loc="upper right",
        title="tier (top first): final share of accesses",
        fontsize="small",
        title_fontsize="small",
        framealpha=0.95,
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
    title = title_lines(
        f"kvtier simulate: {trace.name}",
        f"{len(trace.requests):,} requests, {len(trace.accesses):,} block accesses, "
        f"{trace.unique_blocks:,} unique blocks",
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
        title=title_lines(
            f"kvtier simulate {source} ({result.write_policy})",
            f"{trace.name}: {result.requests:,} requests, {result.accesses:,} block accesses",
            f"chain hit ratio {result.hit_ratio:.2%}",
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
