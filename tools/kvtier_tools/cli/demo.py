"""`kvtier demo`: a tier chain printed, and a trace replayed through its bookkeeping.

The work is in `kvtier_tools.workloads.demo`; this module prints the chain and the tables.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from kvtier.cli.commands.options import config_option
from kvtier.cli.console import out
from kvtier.cli.console import progress as _progress
from kvtier_tools.cli.options import trace_option


@click.command()
@config_option("Tier chain to load (TOML). Default: the embedded configs/default.toml.")
@trace_option(
    "Mooncake-format JSONL trace (plain or .zst). Default: the shipped conversation trace."
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay only N requests.")
def demo(config_path: Path | None, trace_path: Path | None, limit: int | None) -> None:
    """Load a tier chain, print it, and replay a trace through its bookkeeping.

    Prints the configured chain, then for each active tier a standalone replay of the trace
    through that tier's manager (prefix hits, stores, evictions), then each policy's hit
    ratio at the reference capacities next to the published figures.

    \b
    Examples:
      kvtier demo
      kvtier demo --config configs/three-tier.toml --limit 2000
    """
    from kvtier.config import load_config, load_default_config
    from kvtier_tools.workloads.demo import policy_references, replay_config
    from kvtier_tools.workloads.traces import block_accesses, read_mooncake, shipped_trace_path

    config = load_config(config_path) if config_path else load_default_config()
    source = config_path if config_path else "embedded default"
    out.print(f"[bold]Tier chain[/bold] ({source})")
    out.print(config.describe(), markup=False)
    active = config.active_tiers()
    dropped = [tier.name for tier in config.tiers if tier not in active]
    if dropped:
        out.print(f"inactive here (no CUDA or disabled): {', '.join(dropped)}", markup=False)

    requests = list(read_mooncake(trace_path))
    if limit is not None:
        requests = requests[:limit]
    accesses = block_accesses(requests)
    trace_name = trace_path.name if trace_path else shipped_trace_path().name
    out.print(
        f"\n[bold]Trace[/bold] {trace_name}: {len(requests):,} requests, "
        f"{len(accesses):,} block accesses, {len(set(accesses)):,} unique blocks"
    )

    with _progress("tier bookkeeping replay", len(requests) * len(active)) as advance:
        replays = replay_config(config, requests, progress=advance)
    table = Table(title="Each active tier alone, driven request by request")
    for column in ("tier", "policy", "blocks", "prefix hit ratio", "stored", "evicted", "events"):
        table.add_column(column, justify="left" if column in ("tier", "policy") else "right")
    for replay in replays:
        table.add_row(
            f"{replay.tier} ({replay.medium})",
            replay.policy,
            f"{replay.num_blocks:,}",
            f"{replay.prefix_hit_ratio:.4f}",
            f"{replay.stored:,}",
            f"{replay.evicted:,}",
            f"{replay.events:,}",
        )
    out.print(table)

    shipped = trace_path is None and limit is None
    references = policy_references(accesses, compare_with_reference=shipped)
    table = Table(title="Policy hit ratios (simulate) at fractions of the unique blocks")
    for column in ("capacity", "blocks", "policy", "hit ratio", "reference", "diff (pp)"):
        table.add_column(column, justify="right")
    for ref in references:
        table.add_row(
            f"{ref.fraction:.0%}",
            f"{ref.result.capacity:,}",
            ref.result.policy,
            f"{ref.result.hit_ratio:.6f}",
            "-" if ref.reference is None else f"{ref.reference:.6f}",
            "-" if ref.difference_pp is None else f"{ref.difference_pp:+.4f}",
        )
    out.print(table)
    if shipped:
        worst = max(abs(ref.difference_pp or 0.0) for ref in references)
        out.print(f"largest difference from the reference figures: {worst:.4f} pp")
