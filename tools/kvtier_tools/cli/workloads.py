"""`kvtier workloads`: generate request traces for `kvtier simulate` and `kvtier replay`.

The generators are in `kvtier_tools.workloads`; this module parses the options, writes the
trace and prints what it holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvtier.cli.console import out


@click.group()
def workloads() -> None:
    """Generate request traces (Mooncake JSONL, with session keys) to simulate or replay."""


@workloads.command()
@click.option(
    "--sessions",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Top-level agent sessions (their sub-agents come on top).",
)
@click.option(
    "--span",
    "span_s",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Sessions start uniformly within this many seconds.",
)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("agentic.jsonl.zst"),
    show_default=True,
    help="The trace to write (zstd-compressed when it ends in .zst).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
def agentic(sessions: int, span_s: float, seed: int, out_path: Path, as_json: bool) -> None:
    """Many concurrent agentic sessions: prefixes that grow by tool results, gaps of seconds
    to minutes, sub-agents sharing their parent's prefix, sessions that end.

    The figures and their sources are in `kvtier_tools.workloads.agentic`'s docstring.

    \b
    Examples:
      kvtier workloads agentic --out agentic.jsonl.zst
      kvtier simulate --trace agentic.jsonl.zst --policy lru,arc --capacity 0.5%,1%,5%
    """
    from kvtier_tools.workloads.agentic import AgenticParams, generate, trace_stats, write_trace

    requests = generate(AgenticParams(sessions=sessions, span_s=span_s, seed=seed))
    path = write_trace(requests, out_path)
    stats = trace_stats(requests)
    if as_json:
        click.echo(json.dumps({"path": str(path), **stats.to_dict()}, indent=2))
        return
    out.print(
        f"wrote {path}: {stats.requests:,} requests of {stats.sessions:,} sessions "
        f"({stats.subagents:,} sub-agents), {stats.block_accesses:,} block accesses, "
        f"{stats.unique_blocks:,} unique blocks; median {stats.turns_median:g} turns, gaps "
        f"median {stats.gap_median_s:.1f} s (p90 {stats.gap_p90_s:.0f} s), "
        f"at most {stats.peak_live_sessions} sessions live at once",
        markup=False,
    )
