"""The `kvtier` command line.

Every command turns a kvtier error into one line on stderr and a non-zero exit status, never
a traceback. Progress bars appear only when stderr is a terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from kvtier.errors import KvtierError

EXIT_USAGE = 2

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


@contextmanager
def _progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal; a no-op advance callback elsewhere."""
    if not err.is_terminal:
        yield lambda _: None
        return
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


class _KvtierGroup(click.Group):
    """Turns KvtierError into one clear line and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KvtierError as exc:
            err.print(f"kvtier: error: {exc}", markup=False)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            err.print("kvtier: interrupted", markup=False)
            sys.exit(130)


@click.group(cls=_KvtierGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvtier")
def main() -> None:
    """kvtier: keep the KV cache of LLM serving engines in GPU, pinned-CPU and disk tiers."""


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Tier chain to load (TOML). Default: the embedded configs/default.toml.",
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Mooncake-format JSONL trace (plain or .zst). Default: the shipped conversation trace.",
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
    from kvtier.demo import policy_references, replay_config
    from kvtier.traces import block_accesses, read_mooncake, shipped_trace_path

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


@main.command()
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Mooncake JSONL trace, or a plain file of one key per line (either may be .zst). "
    "Default: the shipped conversation trace.",
)
@click.option(
    "--policy",
    "policy_list",
    default="lru,arc",
    show_default=True,
    help="Comma list of cache policies. Belady's OPT and the infinite-cache bound are "
    "always reported.",
)
@click.option(
    "--capacity",
    "capacity_list",
    default="1%,5%,10%,25%,50%",
    show_default=True,
    help="Comma list of cache sizes: percentages of the trace's unique blocks (floored) "
    "or block counts, e.g. 1%,5%,4096.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Use only the first N requests (of a key file: the first N keys).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("kvtier-out"),
    show_default=True,
    help="Directory for simulate.json and simulate.png.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report instead of tables.")
@click.option("--no-plot", is_flag=True, help="Skip the PNG chart (no matplotlib needed).")
def simulate(
    trace_path: Path | None,
    policy_list: str,
    capacity_list: str,
    limit: int | None,
    out_dir: Path,
    as_json: bool,
    no_plot: bool,
) -> None:
    """Hit ratios of cache policies on a trace, next to OPT and the infinite-cache bound.

    Bookkeeping only (no bytes move), so a whole trace takes seconds. Each block access is
    replayed through a fresh policy per capacity, as a tier drives it (cold start, every
    miss admitted). Two bounds are shown at each capacity: Belady's OPT (the best any cache
    of that size can do) and the infinite cache (every access hits but each block's first).
    On the shipped trace each figure is shown next to its independently computed reference.
    Writes simulate.json and a chart of hit ratio against capacity, simulate.png.

    \b
    Examples:
      kvtier simulate
      kvtier simulate --policy lru --capacity 2%,4096 --limit 2000
      kvtier simulate --trace keys.txt --out /tmp/sim --json
    """
    import json

    from kvtier.plots import require_matplotlib
    from kvtier.simulation import (
        INFINITE_NAME,
        OPT_NAME,
        load_trace,
        parse_capacities,
        parse_policies,
        run_sweep,
        write_sweep_outputs,
    )
    from kvtier.simulation.sweep import sweep_runs

    policies = parse_policies(policy_list)
    capacities = parse_capacities(capacity_list)
    if not no_plot:
        require_matplotlib()
    trace = load_trace(trace_path, limit)
    if not as_json:
        kind = "Mooncake JSONL" if trace.format == "mooncake" else "key file"
        out.print(
            f"[bold]Trace[/bold] {trace.name} ({kind}): {len(trace.requests):,} requests, "
            f"{len(trace.accesses):,} block accesses, {trace.unique_blocks:,} unique blocks"
        )
    runs = sweep_runs(policies, capacities, trace.unique_blocks)
    with _progress("simulating", runs) as advance:
        report = run_sweep(trace, policies, capacities, progress=advance)
    paths = write_sweep_outputs(report, out_dir, plot=not no_plot)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        for path in paths:
            err.print(f"wrote {path}", markup=False)
        return

    shipped = report.shipped
    table = Table(title="Block hit ratio by capacity (OPT: Belady's bound; infinite: any size)")
    columns = ["capacity", "blocks", "policy", "hits", "hit ratio"]
    if shipped:
        columns += ["reference", "diff (pp)"]
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    infinite = report.infinite
    for capacity in report.capacities:
        for policy in (*policies, OPT_NAME, INFINITE_NAME):
            if policy == INFINITE_NAME:
                label, hits, ratio = "infinite", infinite.hits, infinite.hit_ratio
                blocks, reference = "∞", report.infinite_reference
            else:
                row = report.row(policy, capacity.blocks)
                label = "OPT" if policy == OPT_NAME else policy
                hits, ratio = row.result.hits, row.result.hit_ratio
                blocks, reference = f"{capacity.blocks:,}", row.reference
            cells = [capacity.label, blocks, label, f"{hits:,}", f"{ratio:.6f}"]
            if shipped:
                cells += (
                    ["-", "-"]
                    if reference is None
                    else [f"{reference:.6f}", f"{round((ratio - reference) * 100, 4) + 0.0:+.4f}"]
                )
            table.add_row(*cells, end_section=policy == INFINITE_NAME)
    out.print(table)
    if shipped:
        worst = {name: report.worst_difference_pp(name) for name in (*policies, OPT_NAME)}
        shown = ", ".join(
            f"{'OPT' if name == OPT_NAME else name} {value:.4f} pp"
            for name, value in worst.items()
            if value is not None
        )
        if shown:
            out.print(f"largest difference from the reference figures: {shown}")
    for path in paths:
        out.print(f"wrote {path}", markup=False)


if __name__ == "__main__":  # pragma: no cover
    main()
