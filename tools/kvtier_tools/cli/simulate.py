"""`kvtier simulate`: hit ratios of cache policies (or of a tier chain) on a trace.

The work is in `kvtier_tools.workloads.simulation`; this module parses and checks the options,
runs the sweep or the chain, prints the tables or the JSON, and writes the outputs and chart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvtier.cli.commands.options import config_option
from kvtier.cli.console import err, out
from kvtier.cli.console import progress as _progress
from kvtier_tools.cli.options import (
    check_out_dir,
    json_option,
    no_plot_option,
    out_option,
    trace_option,
)

if TYPE_CHECKING:
    from kvtier.config import HierarchyConfig
    from kvtier.manager.planner import WritePolicy
    from kvtier_tools.workloads.simulation import CapacitySpec, ChainTier, SimTrace
    from kvtier_tools.workloads.simulation.hints import HintNoise


@click.command()
@trace_option(
    "Mooncake JSONL trace, or a plain file of one key per line (either may be .zst). "
    "Default: the shipped conversation trace."
)
@click.option(
    "--policy",
    "policy_list",
    default=None,
    help="Comma list of cache policies [default: lru,arc]. Belady's OPT and the "
    "infinite-cache bound are always reported. With --tiers: one policy for every tier, "
    "or one per tier [default: lru].",
)
@click.option(
    "--capacity",
    "capacity_list",
    default=None,
    help="Comma list of cache sizes: percentages of the trace's unique blocks (floored) "
    "or block counts, e.g. 1%,5%,4096 [default: 1%,5%,10%,25%,50%, the reference fractions].",
)
@click.option(
    "--tiers",
    "tier_list",
    default=None,
    help="Chained form: the capacities of a tier chain, top to bottom (same syntax as "
    "--capacity), e.g. 1%,5%,20%. Reports each tier's hits.",
)
@config_option(
    "Chained form: take the chain (active tiers, block counts, policies, write policy) "
    "from a TOML config, as kvtier replay would build it."
)
@click.option(
    "--write-policy",
    type=click.Choice(["write-back", "write-through"]),
    default=None,
    help="Chained form with --tiers: how lower tiers are written [default: write-back].",
)
@click.option(
    "--admission",
    "admission_list",
    default=None,
    metavar="NAMES",
    help="Chained form with --tiers: which blocks each tier stores at all, one for every tier "
    "or one per tier: all (every one its policy admits) or second-sighting (a block seen "
    "for the second time) [default: all].",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Use only the first N requests (of a key file: the first N keys).",
)
@click.option(
    "--skip-partial-blocks",
    is_flag=True,
    help="Mooncake traces: never store a prompt's last block when it holds "
    "fewer than 512 tokens (its hash repeats in no later prompt); figures are then not "
    "comparable with the references, which store every miss.",
)
@click.option(
    "--hints",
    "hint_text",
    default=None,
    metavar="recall=R,fpr=F",
    help="Policy sweep: run each policy again with reuse hints derived from the trace's "
    "future, made noisy: 'likely' for a block read again within the horizon, 'never' for "
    "one never read again, each given with probability R where true and F where false "
    "(optional horizon=H x the capacity [1], seed=S [0]); reports the hit ratio with and "
    "without them. On a trace whose requests name their session (kvtier workloads "
    "agentic): session hints instead, every block ranked by its session, and 'the "
    "session ends' / 'its next request comes within T' said with those rates.",
)
@out_option("Directory for simulate.json and simulate.png.")
@json_option()
@no_plot_option()
def simulate(
    trace_path: Path | None,
    policy_list: str | None,
    capacity_list: str | None,
    tier_list: str | None,
    config_path: Path | None,
    write_policy: str | None,
    admission_list: str | None,
    limit: int | None,
    skip_partial_blocks: bool,
    hint_text: str | None,
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

    The chained form (--tiers or --config) serves the trace's requests through kvtier's own
    chained manager with instant copies and reports each tier's prefix hits: the per-tier
    hit ratios that kvtier replay of the same chain reports.

    \b
    Examples:
      kvtier simulate
      kvtier simulate --policy lru --capacity 2%,4096 --limit 2000
      kvtier simulate --trace keys.txt --out /tmp/sim --json
      kvtier simulate --tiers 1%,5%,20% --policy lru,arc,lru
      kvtier simulate --config configs/default.toml
      kvtier simulate --policy lru,arc,lct --capacity 1%,5%,10% --hints recall=0.9,fpr=0.1
    """
    from kvtier.errors import InvalidValueError
    from kvtier_tools.cli.charts import require_matplotlib
    from kvtier_tools.workloads.simulation import load_trace, parse_capacities, parse_policies
    from kvtier_tools.workloads.simulation.hints import parse_hint_noise
    from kvtier_tools.workloads.simulation.sweep import DEFAULT_CAPACITIES, DEFAULT_POLICIES

    _check_simulate_options(
        policy_list, capacity_list, tier_list, config_path, write_policy, admission_list
    )
    chain = None
    hints = None
    if tier_list is not None or config_path is not None:
        if hint_text is not None:
            raise InvalidValueError("--hints is for the policy sweep, not a chain (--tiers)")
        chain = _SimulatedChain.parse(
            tier_list, config_path, policy_list, write_policy, admission_list
        )
    else:
        policies = parse_policies(policy_list or DEFAULT_POLICIES)
        capacities = parse_capacities(capacity_list or DEFAULT_CAPACITIES)
        if hint_text is not None:
            hints = parse_hint_noise(hint_text)
    if not no_plot:
        require_matplotlib()
    check_out_dir(out_dir)  # before the run: a run whose results cannot be written is wasted
    trace = load_trace(trace_path, limit)
    partial = _partial_block_flags(trace, trace_path) if skip_partial_blocks else None
    if not as_json:
        kind = "Mooncake JSONL" if trace.format == "mooncake" else "key file"
        out.print(
            f"[bold]Trace[/bold] {trace.name} ({kind}): {len(trace.requests):,} requests, "
            f"{len(trace.accesses):,} block accesses, {trace.unique_blocks:,} unique blocks"
        )
    if chain is not None:
        paths = _simulate_chain(chain, trace, partial, out_dir, as_json=as_json, no_plot=no_plot)
    else:
        paths = _simulate_sweep(
            policies, capacities, trace, partial, out_dir, hints, as_json=as_json, no_plot=no_plot
        )
    for path in paths:
        (err if as_json else out).print(f"wrote {path}", markup=False)


def _check_simulate_options(
    policy_list: str | None,
    capacity_list: str | None,
    tier_list: str | None,
    config_path: Path | None,
    write_policy: str | None,
    admission_list: str | None,
) -> None:
    """Refuse the option combinations of `kvtier simulate` that mix its two forms (the policy
    sweep and the chain) or name a chain twice."""
    from kvtier.errors import InvalidValueError

    is_chain = tier_list is not None or config_path is not None
    if tier_list is not None and config_path is not None:
        raise InvalidValueError("give the chain as --tiers or as --config, not both")
    if is_chain and capacity_list is not None:
        raise InvalidValueError("--capacity is for the policy sweep; a chain takes --tiers")
    if not is_chain and write_policy is not None:
        raise InvalidValueError("--write-policy needs a chain (--tiers)")
    if tier_list is None and admission_list is not None:
        raise InvalidValueError(
            "--admission needs a chain given as --tiers (a --config names each tier's)"
        )
    if config_path is not None and (policy_list is not None or write_policy is not None):
        raise InvalidValueError("with --config, the policies and write policy come from the file")


@dataclass(frozen=True)
class _SimulatedChain:
    """The chain of a chained `kvtier simulate`, read from its options before the trace is:
    a config file's active tiers, or the --tiers capacities with a policy and an admission
    per tier."""

    source: str
    """The options that named it, for the chart: `--config PATH` or `--tiers LIST`."""
    config: HierarchyConfig | None = None
    capacities: tuple[CapacitySpec, ...] = ()
    policies: tuple[str, ...] = ()
    admissions: tuple[str, ...] = ()
    write_policy: WritePolicy = "write-back"

    @classmethod
    def parse(
        cls,
        tier_list: str | None,
        config_path: Path | None,
        policy_list: str | None,
        write_policy: str | None,
        admission_list: str | None,
    ) -> _SimulatedChain:
        """The chain --config or --tiers names (the other options already checked)."""
        from kvtier_tools.workloads.simulation import chain as chained
        from kvtier_tools.workloads.simulation import parse_capacities

        if config_path is not None:
            from kvtier.config import load_config

            config = load_config(config_path)
            return cls(f"--config {config_path}", config, write_policy=config.write_policy)
        assert tier_list is not None
        capacities = parse_capacities(tier_list, option="--tiers")
        return cls(
            f"--tiers {tier_list}",
            capacities=capacities,
            policies=chained.parse_chain_policies(policy_list or "lru", len(capacities)),
            admissions=chained.parse_chain_admissions(admission_list or "all", len(capacities)),
            write_policy="write-through" if write_policy == "write-through" else "write-back",
        )

    def tiers(self, unique_blocks: int) -> tuple[ChainTier, ...]:
        """The tiers, top first, sized for a trace of `unique_blocks` blocks."""
        from kvtier_tools.workloads.simulation import chain as chained

        if self.config is not None:
            return chained.chain_tiers_from_config(self.config)
        return chained.chain_tiers(
            self.capacities, self.policies, unique_blocks, admissions=self.admissions
        )


def _partial_block_flags(trace: SimTrace, trace_path: Path | None) -> list[bool]:
    """--skip-partial-blocks: for each access of a Mooncake trace, whether it is a prompt's
    last block holding fewer than 512 tokens."""
    import itertools

    from kvtier.errors import InvalidValueError
    from kvtier.policies import partial_block_flags
    from kvtier_tools.workloads.traces import read_mooncake

    if trace.format != "mooncake":
        raise InvalidValueError("--skip-partial-blocks needs a Mooncake trace (input lengths)")
    lengths = [
        r.input_length for r in itertools.islice(read_mooncake(trace_path), len(trace.requests))
    ]
    return partial_block_flags(trace.requests, lengths, 512)


def _simulate_chain(
    chain: _SimulatedChain,
    trace: SimTrace,
    partial: list[bool] | None,
    out_dir: Path,
    *,
    as_json: bool,
    no_plot: bool,
) -> list[Path]:
    """Serve the trace through the chain, write simulate.json (and the chart), print the
    per-tier table or the JSON; return the paths written."""
    from dataclasses import replace

    from kvtier_tools.cli.charts import chart_chain, draw_or_remove
    from kvtier_tools.workloads.simulation import chain as chained
    from kvtier_tools.workloads.simulation import render
    from kvtier_tools.workloads.simulation.bounds import infinite_cache_hits

    tiers = chain.tiers(trace.unique_blocks)
    with _progress("serving requests through the chain", len(trace.requests)) as advance:
        result = chained.simulate_chain(
            trace, tiers, chain.write_policy, progress=advance, partial=partial
        )
    if chain.config is not None:
        result = replace(result, block_bytes=chain.config.block_size)
    paths = [chained.write_chain_outputs(result, trace, out_dir)]
    paths += draw_or_remove(
        out_dir / "simulate.png",
        None if no_plot else lambda path: chart_chain(result, trace, path, source=chain.source),
    )
    if as_json:
        click.echo(paths[0].read_text(), nl=False)
    else:
        out.print(render.chain_table(result, infinite_cache_hits(trace.accesses).hit_ratio))
        out.print(render.chain_footer(result), markup=False)
    return paths


def _simulate_sweep(
    policies: tuple[str, ...],
    capacities: tuple[CapacitySpec, ...],
    trace: SimTrace,
    partial: list[bool] | None,
    out_dir: Path,
    hints: HintNoise | None = None,
    *,
    as_json: bool,
    no_plot: bool,
) -> list[Path]:
    """Run each policy at each capacity (and again with `hints`), write simulate.json (and
    the chart), print the table or the JSON; return the paths written."""
    import json

    from kvtier_tools.cli.charts import chart_sweep, draw_or_remove
    from kvtier_tools.workloads.simulation import render, run_sweep
    from kvtier_tools.workloads.simulation.hints import run_hinted
    from kvtier_tools.workloads.simulation.sessions import run_session_hinted
    from kvtier_tools.workloads.simulation.sweep import (
        resolve_capacities,
        sweep_runs,
        write_sweep_outputs,
    )

    runs = sweep_runs(policies, capacities, trace.unique_blocks)
    if hints is not None:
        runs += len(resolve_capacities(capacities, trace.unique_blocks)) * len(policies)
    hinted = None
    with _progress("simulating", runs) as advance:
        report = run_sweep(trace, policies, capacities, progress=advance, partial=partial)
        if hints is not None and trace.sessions is not None:
            hinted = run_session_hinted(report, hints, partial=partial, progress=advance)
        elif hints is not None:
            hinted = run_hinted(report, hints, partial=partial, progress=advance)
        if hints is not None and hinted is not None:
            report.extra["hints"] = {
                "kind": "session" if trace.sessions is not None else "block",
                **hints.to_dict(),
                "results": [row.to_dict() for row in hinted],
            }
    paths = [write_sweep_outputs(report, out_dir)]
    paths += draw_or_remove(
        out_dir / "simulate.png", None if no_plot else lambda path: chart_sweep(report, path)
    )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        out.print(render.sweep_table(report))
        footer = render.sweep_footer(report)
        if footer:
            out.print(footer, markup=False)
        if hints is not None and hinted is not None:
            out.print(render.hinted_table(hints, hinted, sessions=trace.sessions is not None))
    return paths
