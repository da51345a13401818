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


if __name__ == "__main__":  # pragma: no cover
    main()
