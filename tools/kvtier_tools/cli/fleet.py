"""`kvtier fleet simulate`: a trace through N simulated kvtier nodes, routed four ways.

It joins kvtier's own `kvtier fleet` group (`kvtier fleet index`) through the
`kvtier.fleet.commands` entry point of tools/pyproject.toml. The work is in
`kvtier_tools.workloads.fleet`; this module parses and checks the options, runs the fleet
and prints the figures or the JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvtier.cli.commands.options import config_option
from kvtier.cli.console import err, out
from kvtier.cli.console import progress as _progress
from kvtier_tools.cli.options import json_option, trace_option

if TYPE_CHECKING:
    from kvtier_tools.workloads.fleet import FleetResult, SharedStore
    from kvtier_tools.workloads.simulation import ChainTier, SimTrace

ROUTER_NAMES = ("random", "round-robin", "prefix", "kvtier")
"""`kvtier_tools.workloads.fleet.ROUTERS`, named here so --help needs no import of it."""


@click.command("simulate")
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Simulated nodes, each with the whole chain.",
)
@click.option(
    "--router",
    type=click.Choice(ROUTER_NAMES),
    default="kvtier",
    show_default=True,
    help="random (seeded), round-robin, prefix (consistent hash of the first block key) or "
    "kvtier (the fleet's prefix index fed by the nodes' events, under a load bound).",
)
@click.option(
    "--shared-tier",
    "shared_text",
    default=None,
    metavar="CAPACITY",
    help="Add a fleet-shared tier below every node (LRU, written with every block a node "
    "computes): a percentage of the trace's unique blocks or a block count, e.g. 25%.",
)
@config_option(
    "The chain of every node (TOML) [default: the embedded default, GPU -> CPU -> disk]. "
    'Nodes are GPU nodes: tiers enabled = "auto" are active.'
)
@trace_option("Mooncake JSONL trace or key file [default: the shipped conversation trace].")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="First N requests only.")
@click.option(
    "--capacity-scale",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Multiply every tier's capacity (the reference: --nodes 1 --capacity-scale 8).",
)
@click.option(
    "--max-imbalance",
    type=click.FloatRange(min=1.0),
    default=1.2,
    show_default=True,
    help="kvtier router: a node takes a request only while its requests stay within this "
    "many times the mean.",
)
@click.option(
    "--load-weight",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="kvtier router: score lost per unit of relative excess load (requests / mean - 1), "
    "in weighted blocks.",
)
@click.option(
    "--prefix-blocks",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="prefix router: hash this many leading block keys.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="random router's seed.")
@json_option()
def simulate(
    nodes: int,
    router: str,
    shared_text: str | None,
    config_path: Path | None,
    trace_path: Path | None,
    limit: int | None,
    capacity_scale: int,
    max_imbalance: float,
    load_weight: float,
    prefix_blocks: int,
    seed: int,
    as_json: bool,
) -> None:
    """Fleet hit ratio, per-tier hits, load imbalance and the index's memory, of a trace
    served by N simulated kvtier nodes behind a router.

    Bookkeeping only: each node is the product's simulator of its chain (kvtier simulate
    --config), copies instant. The kvtier router asks the fleet's prefix index, which
    applies the nodes' own events (vLLM's wire format) as the kvtier fleet index daemon
    does. A block is a hit when every block before it in its request hit.

    \b
    Examples:
      kvtier fleet simulate --nodes 8 --router kvtier
      kvtier fleet simulate --nodes 8 --router random --json
      kvtier fleet simulate --nodes 1 --capacity-scale 8      # one node, 8x the capacity
      kvtier fleet simulate --nodes 8 --router round-robin --shared-tier 25%
    """
    import json

    from kvtier.config import load_config, load_default_config
    from kvtier_tools.workloads.fleet import make_router, scale_tiers, simulate_fleet
    from kvtier_tools.workloads.simulation import chain_tiers_from_config, load_trace
    from kvtier_tools.workloads.simulation.bounds import infinite_cache_hits

    config = load_default_config() if config_path is None else load_config(config_path)
    tiers = scale_tiers(chain_tiers_from_config(config, cuda_available=True), capacity_scale)
    names = [f"node{i}" for i in range(nodes)]
    chosen = make_router(
        router,
        names,
        seed=seed,
        max_imbalance=max_imbalance,
        load_weight=load_weight,
        prefix_blocks=prefix_blocks,
    )
    trace = load_trace(trace_path, limit)
    shared = _shared_store(shared_text, trace.unique_blocks)
    with _progress(f"{nodes} nodes, router {router}", len(trace.requests)) as advance:
        result = simulate_fleet(
            trace,
            tiers,
            chosen,
            nodes,
            write_policy=config.write_policy,
            shared=shared,
            progress=advance,
        )
    infinite = infinite_cache_hits(trace.accesses).hit_ratio
    document = _document(trace, tiers, result, shared, infinite, config_path, capacity_scale)
    document["router"] = {
        "name": router,
        "max_imbalance": max_imbalance if router == "kvtier" else None,
        "load_weight": load_weight if router == "kvtier" else None,
        "prefix_blocks": prefix_blocks if router == "prefix" else None,
        "seed": seed if router == "random" else None,
    }
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    _print_report(trace, tiers, result, infinite, nodes, router)


def _shared_store(text: str | None, unique_blocks: int) -> SharedStore | None:
    """The --shared-tier store (None without the option); one capacity only."""
    if text is None:
        return None
    from kvtier.errors import InvalidValueError
    from kvtier_tools.workloads.fleet import SharedStore
    from kvtier_tools.workloads.simulation import parse_capacities

    specs = parse_capacities(text, option="--shared-tier")
    if len(specs) != 1:
        raise InvalidValueError(f"--shared-tier: one capacity, got {text!r}")
    return SharedStore(specs[0].resolve(unique_blocks))


def _document(
    trace: SimTrace,
    tiers: tuple[ChainTier, ...],
    result: FleetResult,
    shared: SharedStore | None,
    infinite: float,
    config_path: Path | None,
    capacity_scale: int,
) -> dict[str, Any]:
    """The --json report."""
    return {
        "trace": trace.summary(),
        "chain": {
            "config": str(config_path) if config_path is not None else "embedded default",
            "capacity_scale": capacity_scale,
            "tiers": [
                {
                    "name": tier.name,
                    "medium": tier.medium,
                    "policy": tier.policy,
                    "blocks": tier.capacity.blocks,
                }
                for tier in tiers
            ],
        },
        "shared_tier": (
            None
            if shared is None
            else {
                "blocks": shared.capacity,
                "policy": shared.policy_name,
                "written": shared.written,
            }
        ),
        "fleet": result.to_dict(),
        "infinite_cache_hit_ratio": infinite,
    }


def _shared_dict(shared: SharedStore) -> dict[str, Any]:
    return {"blocks": shared.capacity, "policy": shared.policy_name, "written": shared.written}


def _print_report(
    trace: SimTrace,
    tiers: tuple[ChainTier, ...],
    result: FleetResult,
    infinite: float,
    nodes: int,
    router: str,
) -> None:
    """The human-readable figures."""
    chain = " -> ".join(f"{tier.name} {tier.capacity.blocks:,} {tier.policy}" for tier in tiers)
    out.print(
        f"Trace {trace.name}: {len(trace.requests):,} requests, {len(trace.accesses):,} block "
        f"accesses, {trace.unique_blocks:,} unique blocks",
        markup=False,
    )
    out.print(f"Fleet: {nodes} node(s) x [{chain}], router {router}", markup=False)
    out.print(
        f"fleet hit ratio {result.hit_ratio:.4f} (infinite cache {infinite:.4f})", markup=False
    )
    per_tier = "  ".join(
        f"{name} {hits / result.accesses:.4f}" for name, hits in result.tier_hits.items()
    )
    out.print(f"per tier: {per_tier}", markup=False)
    mean = result.requests / nodes
    out.print(
        f"load imbalance {result.imbalance:.3f} (max {max(result.node_requests):,} / mean "
        f"{mean:,.1f} requests per node)",
        markup=False,
    )
    if result.index is not None:
        rate = result.events_per_s
        out.print(
            f"index: {result.index['keys']:,} keys, {result.index['entries']:,} entries, "
            f"{result.index['memory_bytes'] / 2**20:.1f} MiB; {result.events:,} events "
            f"({result.event_blocks:,} blocks) in {result.batches:,} batches, "
            + (
                f"{rate:,.0f} events/s ({result.event_blocks_per_s:,.0f} blocks/s) applied"
                if rate is not None
                else "none applied"
            ),
            markup=False,
        )
    err.print(f"simulated in {result.wall_s:.1f}s", markup=False)
