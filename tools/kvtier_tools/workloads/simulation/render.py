"""Rich tables of `kvtier simulate` results, kept out of the CLI module so they can be tested
and reused (the command only prints them)."""

from __future__ import annotations

from rich.table import Table

from kvtier.config import format_size
from kvtier_tools.workloads.simulation.bounds import INFINITE_NAME, OPT_NAME
from kvtier_tools.workloads.simulation.chain import ChainResult
from kvtier_tools.workloads.simulation.hints import HintedRow, HintNoise
from kvtier_tools.workloads.simulation.sweep import SweepReport


def _pp(value: float) -> str:
    """A difference in percentage points, 4 decimals, never "-0.0000"."""
    return f"{round(value, 4) + 0.0:+.4f}"


def sweep_table(report: SweepReport) -> Table:
    """One section per capacity: each policy, OPT and the infinite cache; on the shipped
    trace, each figure's reference and the difference from it."""
    table = Table(title="Block hit ratio by capacity (OPT: Belady's bound; infinite: any size)")
    columns = ["capacity", "blocks", "policy", "hits", "hit ratio"]
    if report.shipped:
        columns += ["reference", "diff (pp)"]
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    infinite = report.infinite
    for capacity in report.capacities:
        for policy in (*report.policies, OPT_NAME, INFINITE_NAME):
            if policy == INFINITE_NAME:
                label, hits, ratio = "infinite", infinite.hits, infinite.hit_ratio
                blocks, reference = "∞", report.infinite_reference
            else:
                row = report.row(policy, capacity.blocks)
                label = "OPT" if policy == OPT_NAME else policy
                hits, ratio = row.result.hits, row.result.hit_ratio
                blocks, reference = f"{capacity.blocks:,}", row.reference
            cells = [capacity.label, blocks, label, f"{hits:,}", f"{ratio:.6f}"]
            if report.shipped:
                if reference is None:
                    cells += ["-", "-"]
                else:
                    cells += [f"{reference:.6f}", _pp((ratio - reference) * 100)]
            table.add_row(*cells, end_section=policy == INFINITE_NAME)
    return table


def hinted_table(noise: HintNoise, rows: list[HintedRow], sessions: bool = False) -> Table:
    """Each policy at each capacity without and with the noisy hints of `--hints` (session
    hints when `sessions`)."""
    title = (
        f"With session hints (recall {noise.recall:g}, fpr {noise.fpr:g}, seed {noise.seed})"
        if sessions
        else f"With reuse hints from the trace's future (recall {noise.recall:g}, "
        f"fpr {noise.fpr:g}, horizon {noise.horizon:g} x capacity, seed {noise.seed})"
    )
    table = Table(title=title)
    for column in ("capacity", "blocks", "policy", "hit ratio", "with hints", "gain"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in rows:
        table.add_row(
            row.capacity_label,
            f"{row.blocks:,}",
            row.policy,
            f"{row.without:.6f}",
            f"{row.hinted:.6f}",
            f"{round(row.gain, 6) + 0.0:+.6f}",
        )
    return table


def sweep_footer(report: SweepReport) -> str | None:
    """The largest difference from the reference figures per policy, on the shipped trace."""
    if not report.shipped:
        return None
    parts = []
    for name in (*report.policies, OPT_NAME):
        worst = report.worst_difference_pp(name)
        if worst is not None:
            parts.append(f"{'OPT' if name == OPT_NAME else name} {worst:.4f} pp")
    if not parts:
        return None
    return "largest difference from the reference figures: " + ", ".join(parts)


def chain_table(result: ChainResult, infinite_hit_ratio: float) -> Table:
    """One row per tier, top first (its hits over all block accesses), then the whole chain
    and the infinite-cache bound."""
    table = Table(title=f"Per-tier prefix hits through the chain ({result.write_policy})")
    columns = ["tier", "policy", "capacity", "blocks", "hits", "hit ratio", "blocks written"]
    if result.block_bytes is not None:
        columns.append("bytes written")
    for column in columns:
        table.add_column(
            column,
            justify="left" if column in ("tier", "policy") else "right",
            no_wrap=column in ("policy", "bytes written"),
        )
    for index, tier in enumerate(result.tiers):
        written = result.tier_written[index] if index < len(result.tier_written) else None
        table.add_row(
            tier.name if tier.name == tier.medium else f"{tier.name} ({tier.medium})",
            tier.policy if tier.admission == "all" else f"{tier.policy}, {tier.admission}",
            tier.capacity.label,
            f"{tier.capacity.blocks:,}",
            f"{result.tier_hits[index]:,}",
            f"{result.tier_hit_ratio(index):.6f}",
            "" if written is None else f"{written:,}",
            *_bytes_cell(result.bytes_written(index), result),
            end_section=index == len(result.tiers) - 1,
        )
    total = None if result.block_bytes is None else sum(result.tier_written) * result.block_bytes
    table.add_row(
        "chain",
        "",
        "",
        "",
        f"{result.hits:,}",
        f"{result.hit_ratio:.6f}",
        f"{sum(result.tier_written):,}",
        *_bytes_cell(total, result),
    )
    table.add_row(
        "infinite", "", "", "∞", "", f"{infinite_hit_ratio:.6f}", "", *_bytes_cell(None, result)
    )
    return table


def _bytes_cell(size: int | None, result: ChainResult) -> list[str]:
    """The "bytes written" cell of a row (no cell when the table has no such column)."""
    if result.block_bytes is None:
        return []
    return [""] if size is None else [format_size(size)]


def chain_footer(result: ChainResult) -> str:
    """What the chain did: promotions, demotions, drops, cascades, refused stores."""
    c = result.counters
    line = (
        f"promoted {c['promotions']:,} blocks, demoted {c['demoted']:,}, "
        f"dropped at the bottom {c['dropped_at_bottom']:,}"
    )
    if result.write_policy == "write-through":
        line += f", cascaded {c['cascaded']:,}"
    refused = c["promotions_refused"] + c["demotions_dropped"] + result.store_refusals
    if refused:
        line += (
            f"; refused: {c['promotions_refused']:,} promotions, "
            f"{c['demotions_dropped']:,} demotions, {result.store_refusals:,} stores"
        )
    if c.get("demotions_refused"):
        line += f"; not admitted below: {c['demotions_refused']:,} demotions"
    if c.get("partial_refused"):
        line += f"; partial blocks not stored: {c['partial_refused']:,}"
    if c["lost_at_top"]:
        line += (
            f"; {c['lost_at_top']:,} blocks answered ready at the top were gone before they "
            "could be loaded (counted as misses)"
        )
    return line
