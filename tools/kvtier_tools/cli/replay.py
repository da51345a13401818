"""`kvtier replay`: the main job. A trace served through the real hierarchy, bytes verified.

The work is in `kvtier_tools.workloads.replay`; this module parses options, prints the chain and
the tables, writes the report and the chart, and turns the outcome into an exit status: 0,
1 when any loaded block did not match its content, 2 for bad input (a kvtier error, one
line), 130 when interrupted (after writing a partial report).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from kvtier.cli.commands.options import config_option
from kvtier.cli.console import err, format_bytes, out, progress
from kvtier.errors import InvalidValueError
from kvtier_tools.cli.options import (
    json_option,
    no_plot_option,
    out_option,
    trace_option,
)

if TYPE_CHECKING:
    from kvtier.config import HierarchyConfig
    from kvtier.metrics import MetricsServer
    from kvtier_tools.workloads.replay import ReplayResult, ReplayTrace

EXIT_MISMATCH = 1
EXIT_INTERRUPTED = 130


def parse_block_bytes(text: str | None) -> int | None:
    """`--block-bytes` as bytes (a byte count or a size like "256KiB"); None if not given."""
    if text is None:
        return None
    from kvtier.config import MAX_BLOCK_SIZE, parse_size

    value: int | str = int(text) if text.strip().isdigit() else text
    try:
        size = parse_size(value)
    except InvalidValueError as error:
        raise InvalidValueError(f"--block-bytes: {error}") from None
    if size > MAX_BLOCK_SIZE:
        raise InvalidValueError(f"--block-bytes: at most 1 GiB, got {text}")
    return size


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def _count(value: float) -> str:
    """A large count, short: 53.1M, 147,712 stays as is below a million."""
    if value >= 1e9:
        return f"{value / 1e9:,.2f}G"
    if value >= 1e6:
        return f"{value / 1e6:,.2f}M"
    return f"{value:,.0f}"


def _where(medium: str, where: str) -> str:
    """Where a tier lives, short: a pool's device, or a disk tier's I/O mode."""
    if medium != "disk":
        return where
    # `Hierarchy.tiers` describes a disk tier as "files in DIR (O_DIRECT|buffered[, codec])".
    mode = re.search(r"\(([^)]*)\)\s*$", where)
    return f"files, {mode.group(1)}" if mode else "files"


def summary_table(report: dict[str, object]) -> Table:
    """The headline figures of a replay report (`ReplayResult.to_dict()`)."""
    r: dict[str, object] = report
    prefill = r["prefill"]
    verification = r["verification"]
    latency = r["load_latency"]
    events = r["events"]
    timings = r["timings"]
    assert isinstance(prefill, dict) and isinstance(verification, dict)
    assert isinstance(latency, dict) and isinstance(events, dict) and isinstance(timings, dict)
    title = "kvtier replay" + (" (PARTIAL: interrupted)" if r["partial"] else "")
    table = Table(title=title, show_header=False)
    table.add_column("figure", justify="left")
    table.add_column("value", justify="right")
    mismatches = int(verification["mismatches"])
    tokens = (
        f"{_count(prefill['tokens_reused'])} of {_count(prefill['input_tokens'])} "
        f"({prefill['fraction_saved']:.2%})"
    )
    rows = [
        ("requests", f"{r['requests']:,}"),
        ("block accesses", f"{r['block_accesses']:,}"),
        ("hits, all tiers (hit ratio)", f"{r['hits']:,} ({r['hit_ratio']:.2%})"),
        ("infinite-cache bound", f"{r['infinite_cache_hit_ratio']:.2%}"),
        ("prefix tokens reused (prefill saved)", tokens),
        ("bytes moved, all tier pairs", format_bytes(int(str(r["bytes_moved"])))),
        ("load latency (get) p50 / p99", f"{_ms(latency['p50_s'])} / {_ms(latency['p99_s'])}"),
        ("blocks verified", f"{verification['verified']:,}"),
        (
            "mismatches (must be 0)",
            f"[bold red]{mismatches:,}[/bold red]" if mismatches else "0",
        ),
        (
            "corrupt / failed / gone blocks",
            f"{r['corrupt_blocks']:,} / {r['failed_blocks']:,} / {r['gone_blocks']:,}",
        ),
        (
            "tier events: stored / removed blocks",
            f"{events['stored_blocks']:,} / {events['removed_blocks']:,}",
        ),
        ("wall time (replay alone)", f"{timings['total_s']:.1f} s ({timings['replay_s']:.1f} s)"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def tier_table(report: dict[str, object]) -> Table:
    """Per tier, top first: where it lives, its block count, its hits and hit ratio, and the
    bytes written into it (what a disk or a remote store pays for)."""
    tiers = report["tiers"]
    assert isinstance(tiers, list)
    table = Table(title="Prefix hits per tier (hits / all block accesses)")
    for column in ("tier", "lives in", "policy", "blocks", "hits", "hit ratio", "written"):
        table.add_column(column, justify="left" if column in ("tier", "lives in") else "right")
    for index, tier in enumerate(tiers):
        name = (
            tier["name"] if tier["name"] == tier["medium"] else f"{tier['name']} ({tier['medium']})"
        )
        table.add_row(
            name,
            _where(tier["medium"], tier["where"]),
            tier["policy"],
            f"{tier['blocks']:,}",
            f"{tier['hits']:,}",
            f"{tier['hit_ratio']:.4f}",
            format_bytes(tier["bytes_written"]),
            end_section=index == len(tiers) - 1,
        )
    written = sum(tier["bytes_written"] for tier in tiers)
    table.add_row(
        "chain",
        "",
        "",
        "",
        f"{report['hits']:,}",
        f"{report['hit_ratio']:.4f}",
        format_bytes(written),
    )
    return table


def pair_table(report: dict[str, object]) -> Table:
    """Per tier pair: blocks and bytes moved, time spent copying, achieved GB/s."""
    pairs = report["pairs"]
    assert isinstance(pairs, list)
    table = Table(title="Bytes moved per tier pair (caller = put / get)")
    for column in ("source → destination", "blocks", "bytes", "copy time", "GB/s"):
        table.add_column(column, justify="left" if column.startswith("source") else "right")
    for pair in pairs:
        rate = pair["gb_per_s"]
        table.add_row(
            f"{pair['source']} → {pair['destination']}",
            f"{pair['blocks']:,}",
            format_bytes(pair["bytes"]),
            f"{pair['seconds']:.2f} s",
            "-" if rate is None else f"{rate:.2f}",
        )
    return table


def _metrics_server(port: int | None, console: Console) -> tuple[Any, MetricsServer | None]:
    """A fresh registry served on 127.0.0.1:port, or (None, None) without --metrics-port.
    A clear error names the extra without prometheus_client, and the port when it is taken."""
    if port is None:
        return None, None
    from kvtier.metrics import require_prometheus, serve_metrics

    require_prometheus()
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    server = serve_metrics(registry, port)
    console.print(f"serving metrics on {server.url} while the replay runs", markup=False)
    return registry, server


@click.command()
@config_option("Tier chain to replay (TOML). Default: the embedded configs/default.toml.")
@trace_option(
    "Mooncake JSONL trace, or a plain file of one key per line (either may be .zst). "
    "Default: the shipped Mooncake conversation trace."
)
@click.option(
    "--limit",
    type=int,
    default=None,
    help="Replay only the first N requests (of a key file: the first N keys).",
)
@click.option(
    "--block-bytes",
    "block_bytes_text",
    default=None,
    metavar="SIZE",
    help="Bytes per replayed block, e.g. 256KiB (a model's real size) or 4096. Default: "
    "16KiB (or the config's block size if smaller); each tier keeps its block count.",
)
@out_option("Directory for report.json, replay.png and the disk tiers' files (disk/<tier>).")
@click.option(
    "--clean",
    is_flag=True,
    help="Remove the disk tiers' files under --out after the run (the report stays).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    metavar="PORT",
    help="Serve the hierarchy's Prometheus metrics on http://127.0.0.1:PORT/metrics while "
    "the replay runs (needs pip install 'kvtier[metrics]').",
)
@click.option(
    "--sessions",
    "with_sessions",
    is_flag=True,
    help="Session hints: each put carries its request's session, a session_end request "
    "ends it (a trace of kvtier workloads agentic).",
)
@click.option(
    "--expect-within",
    "expect_slack_s",
    type=float,
    default=None,
    metavar="S",
    help="With --sessions, an ORACLE: expect each session's next request within the "
    "trace's gap to it plus S seconds (reads the trace's future).",
)
@click.option(
    "--hint-noise",
    "hint_noise",
    default=None,
    metavar="recall=R,fpr=F",
    help="With --expect-within, the oracle's predictions (the session ends; its next "
    "request comes within T) made noisy as simulate --hints makes them.",
)
@json_option()
@no_plot_option()
def replay(
    config_path: Path | None,
    trace_path: Path | None,
    limit: int | None,
    block_bytes_text: str | None,
    out_dir: Path,
    clean: bool,
    metrics_port: int | None,
    with_sessions: bool,
    expect_slack_s: float | None,
    hint_noise: str | None,
    as_json: bool,
    no_plot: bool,
) -> None:
    """Replay a trace through the real tier hierarchy, moving and verifying real bytes.

    For each request: look up its prefix of blocks, load the blocks some tier holds
    (promoting them up the chain) and check each one bit for bit against its expected
    content, then store the blocks that missed. Ends with hit ratios per tier, prefill
    tokens saved, bytes moved and GB/s per tier pair, load latency, and the number of
    blocks verified and mismatched (must be 0; otherwise the exit status is 1).

    Each tier keeps its configured block count, so the hit ratios are the config's (but
    for a tier's min_refill, a size, which spans more of smaller blocks); the
    blocks are 16KiB by default (not the config's size) so that the whole shipped trace
    replays in under a minute on a 2-core machine. --block-bytes 256KiB replays a real
    model's block size. Disk tiers live in fresh directories under --out (emptied first),
    so every replay starts cold. The per-tier hits equal those of `kvtier simulate
    --config` on the same config (replayed at its own block size where a min_refill
    binds).

    Writes report.json (every figure, per-interval series) and replay.png into --out.
    Says how much disk the disk tiers allocate first; --clean removes their files after
    the run. A second replay into an --out whose disk tier a running replay holds is
    refused (exit 2), never allowed to delete it. An --out that cannot be written is a
    one-line error before the run. Ctrl-C stops cleanly and writes a partial report (exit
    status 130). --metrics-port serves the metrics of the hierarchy being replayed (see the
    README's Metrics section) on 127.0.0.1 until the replay ends.

    \b
    Examples:
      kvtier replay
      kvtier replay --limit 2000 --out /tmp/replay
      kvtier replay --config configs/three-tier.toml --block-bytes 64KiB --limit 500
      kvtier replay --trace keys.txt --json --no-plot
      kvtier replay --metrics-port 9400 --limit 5000
      kvtier replay --trace agentic.jsonl.zst --config chain.toml --sessions
    """
    from kvtier.config import load_config, load_default_config
    from kvtier_tools.cli.charts import draw_or_remove, require_matplotlib
    from kvtier_tools.cli.options import check_out_dir
    from kvtier_tools.cli.replay_chart import plot_replay
    from kvtier_tools.workloads.replay import (
        clean_disk_dirs,
        describe_block_bytes,
        load_replay_trace,
        prepare_disk_dirs,
        replay_block_bytes,
        replay_config,
        write_report,
    )
    from kvtier_tools.workloads.replay import replay as replay_trace

    started = time.perf_counter()
    requested_bytes = parse_block_bytes(block_bytes_text)
    if limit is not None and limit < 1:
        raise InvalidValueError(f"--limit must be at least 1, got {limit}")
    given = load_config(config_path) if config_path else load_default_config()
    source = str(config_path) if config_path else "embedded default"
    if not no_plot:
        require_matplotlib()
    block_bytes = replay_block_bytes(given, requested_bytes)
    config = replay_config(given, block_bytes, out_dir / "disk")
    active = config.active_tiers()
    if not active:
        raise InvalidValueError("the configuration has no active tier here (no CUDA?)")
    if metrics_port is not None:
        from kvtier.metrics import require_prometheus

        require_prometheus()  # a missing extra fails before the trace is read
    trace = load_replay_trace(trace_path, limit)
    sessions = None
    if with_sessions:
        from kvtier_tools.workloads.replay_sessions import load_session_plan
        from kvtier_tools.workloads.simulation.hints import parse_hint_noise

        noise = None if hint_noise is None else parse_hint_noise(hint_noise, "--hint-noise")
        sessions = load_session_plan(trace_path, len(trace.requests), expect_slack_s, noise)
    elif expect_slack_s is not None or hint_noise is not None:
        raise InvalidValueError("--expect-within and --hint-noise need --sessions")
    load_trace_s = time.perf_counter() - started
    check_out_dir(out_dir)
    disk_dirs = prepare_disk_dirs(config)

    if not as_json:
        _print_plan(source, given, config, trace, block_bytes, disk_dirs, out_dir)

    registry, server = _metrics_server(metrics_port, err if as_json else out)
    try:
        with progress("replaying requests", len(trace.requests)) as advance:
            result = asyncio.run(
                replay_trace(
                    config,
                    trace,
                    config_source=source,
                    given=given,
                    progress=advance,
                    disk_dirs=disk_dirs,
                    load_trace_s=load_trace_s,
                    metrics=registry,
                    freeze_gc=True,  # this process is the replay's: see `replay`
                    sessions=sessions,
                )
            )
    finally:
        if server is not None:
            server.close()
        if clean:
            clean_disk_dirs(disk_dirs)

    report = result.to_dict()
    paths = [write_report(result, out_dir)]
    paths += draw_or_remove(
        out_dir / "replay.png", None if no_plot else lambda path: plot_replay(path, report)
    )
    if as_json:
        click.echo(paths[0].read_text(), nl=False)
    else:
        out.print(summary_table(report))
        out.print(tier_table(report))
        out.print(pair_table(report))
        out.print(describe_block_bytes(result), markup=False)
    for path in paths:
        (err if as_json else out).print(f"wrote {path}", markup=False)
    _exit_on_bad_outcome(result, report_path=paths[0])


def _print_plan(
    source: str,
    given: HierarchyConfig,
    config: HierarchyConfig,
    trace: ReplayTrace,
    block_bytes: int,
    disk_dirs: list[Path],
    out_dir: Path,
) -> None:
    """What the replay is about to do: the chain as given and its inactive tiers, the trace,
    the replayed block size (and how it differs from the config's), the disk tiers' places."""
    from kvtier.config import format_size
    from kvtier_tools.workloads.replay import disk_usage_line, size_argument

    active = config.active_tiers()
    sim = trace.trace
    kind = "Mooncake JSONL" if sim.format == "mooncake" else "key file"
    out.print(f"[bold]Tier chain[/bold] ({source})")
    out.print(given.describe(), markup=False)
    dropped = [tier.name for tier in config.tiers if tier not in active]
    if dropped:
        out.print(f"inactive here (no CUDA or disabled): {', '.join(dropped)}", markup=False)
    out.print(
        f"[bold]Trace[/bold] {sim.name} ({kind}): {len(sim.requests):,} requests, "
        f"{len(sim.accesses):,} block accesses, {sim.unique_blocks:,} unique blocks"
    )
    size = sum(t.num_blocks for t in active) * block_bytes
    out.print(
        f"[bold]Replay[/bold] with {format_size(block_bytes)} blocks "
        f"({format_size(size)} across the active tiers)",
    )
    if block_bytes != given.block_size:
        out.print(
            f"  block size scaled: config {format_size(given.block_size)} per block, "
            f"replayed {format_size(block_bytes)}; each tier keeps its block count, so hit "
            "ratios are the config's but for min_refill, a size (use --block-bytes "
            f"{size_argument(given.block_size)} for the real size)",
            markup=False,
        )
    for path in disk_dirs:
        out.print(f"  disk tier in {path} (emptied: the replay starts cold)", markup=False)
    usage = disk_usage_line(config, out_dir)
    if usage is not None:
        out.print(usage, markup=False)


def _exit_on_bad_outcome(result: ReplayResult, report_path: Path) -> None:
    """Exit 130 after an interrupted replay, 1 when a loaded block did not match its
    content (after one line on stderr); return when the replay completed clean."""
    c = result.counters
    if result.interrupted:
        err.print(
            f"kvtier: interrupted after {c.requests:,} of {result.requests_planned:,} requests; "
            "the report is partial",
            markup=False,
        )
        sys.exit(EXIT_INTERRUPTED)
    if c.mismatches:
        err.print(
            f"kvtier: error: {c.mismatches:,} of {c.verified:,} loaded blocks did not match "
            f"the bytes stored for their keys (first: {c.mismatch_examples[0].tier} tier, "
            f"request {c.mismatch_examples[0].request}); see {report_path}",
            markup=False,
        )
        sys.exit(EXIT_MISMATCH)
