"""`kvtier bench`: how fast the data path is on this machine, next to what the machine can do.

The measurements are in `kvtier_tools.bench.datapath` and, with `--write-path`, in
`kvtier_tools.bench.writepath` (see their docstrings for the method); this module parses options,
shows progress, prints the tables or the JSON, and turns the outcome into an exit status: 0,
1 when some pair moved wrong bytes (or a get returned them), 2 for bad input (one line).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from kvtier.cli.console import out, progress
from kvtier.errors import InvalidValueError
from kvtier_tools.cli.options import json_option

EXIT_WRONG_BYTES = 1

DATAPATH_ONLY = ("block_sizes", "repeats", "copy_size", "disk_size", "gpu_size", "pairs")
"""Options (parameter names) of the data-path measurement, refused with --write-path."""
WRITEPATH_ONLY = ("write_block_size", "puts", "put_rate", "gets", "cpu_size", "cpu_load")
"""Options of the write-path measurement, refused without --write-path."""


def parse_sizes(text: str, option: str) -> tuple[int, ...]:
    """A comma list of sizes ("64KiB,2MiB,4096") as bytes; InvalidValueError naming
    `option` otherwise."""
    from kvtier.config import parse_size

    sizes: list[int] = []
    for item in text.split(","):
        try:
            sizes.append(parse_size(item.strip()))
        except InvalidValueError as error:
            raise InvalidValueError(f"{option}: {error}") from None
    return tuple(dict.fromkeys(sizes))


def parse_size_option(text: str, option: str) -> int:
    """One size ("128MiB") as bytes; InvalidValueError naming `option` otherwise."""
    sizes = parse_sizes(text, option)
    if len(sizes) != 1:
        raise InvalidValueError(f"{option}: expected one size, got {text!r}")
    return sizes[0]


def parse_parts(text: str) -> tuple[str, ...]:
    """`--pairs` as a tuple of `PARTS` names, in the given order."""
    from kvtier_tools.bench.datapath import PARTS

    parts = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    unknown = [part for part in parts if part not in PARTS]
    if unknown or not parts:
        raise InvalidValueError(
            f"--pairs: unknown {', '.join(repr(p) for p in unknown) or 'empty list'}; "
            f"choose from {','.join(PARTS)}"
        )
    return parts


@click.command()
@click.option(
    "--block-sizes",
    "block_sizes",
    default="64KiB,256KiB,2MiB",
    show_default=True,
    help="Comma list of block sizes (byte counts or sizes like 256KiB).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=None,
    help="Timed runs per figure, after one discarded warm-up run [default: 5; --quick: 3].",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Smaller measurements and 3 repeats: about 35 s on a 2-core VM (the default run "
    "takes from 1 to a few minutes, depending on the disk).",
)
@click.option(
    "--copy-size",
    default=None,
    help="Bytes per CPU copy measurement [default: 256MiB; --quick: 64MiB].",
)
@click.option(
    "--disk-size",
    default=None,
    help="Bytes per disk measurement [default: 128MiB; --quick: 32MiB].",
)
@click.option(
    "--gpu-size",
    default=None,
    help="Bytes per GPU copy measurement [default: 1GiB; --quick: 256MiB].",
)
@click.option(
    "--pairs",
    "pairs",
    default="cpu,disk,gpu,bookkeeping",
    show_default=True,
    help="What to measure: cpu (CPU-tier copies), disk (writes and reads), gpu (GPU <-> "
    "pinned CPU, when CUDA is available), bookkeeping.",
)
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to put the disk files (a temporary directory is made inside and removed "
    "afterwards) [default: the disk tier's default directory ~/.cache/kvtier, or its nearest "
    "existing parent, so the same filesystem; --write-path: the current directory, or the "
    "temporary directory ($TMPDIR) when it is not writable].",
)
@click.option(
    "--write-path",
    "write_path",
    is_flag=True,
    help="Measure the write path instead: put latency into a full CPU tier (CPU only, and over "
    "a disk tier, write-back and write-through), get latency of disk-resident blocks idle and "
    "under a write stream, cpu -> disk demotion GB/s next to raw O_DIRECT writes.",
)
@click.option(
    "--write-block-size",
    default=None,
    help="--write-path: block size [default: 256KiB]; each put or get is 16 blocks.",
)
@click.option(
    "--puts",
    type=click.IntRange(min=1),
    default=None,
    help="--write-path: timed puts per chain [default: 400; --quick: 100].",
)
@click.option(
    "--put-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="--write-path: puts per second [default: 25% of the raw disk write bandwidth "
    "measured at the start, in puts].",
)
@click.option(
    "--gets",
    type=click.IntRange(min=1),
    default=None,
    help="--write-path: timed gets per phase (idle, under a write stream) [default: 200; "
    "--quick: 50].",
)
@click.option(
    "--cpu-size",
    default=None,
    help="--write-path: capacity of the CPU tier [default: 256MiB; --quick: 64MiB].",
)
@click.option(
    "--cpu-load",
    type=click.IntRange(min=0, max=64),
    default=None,
    help="--write-path: CPU-bound processes (one core each) running through the "
    "measurement, to see the put ratios while other work shares the machine [default: 0].",
)
@json_option("Print the JSON report only.")
def bench(
    block_sizes: str,
    repeats: int | None,
    quick: bool,
    copy_size: str | None,
    disk_size: str | None,
    gpu_size: str | None,
    pairs: str,
    directory: Path | None,
    write_path: bool,
    write_block_size: str | None,
    puts: int | None,
    put_rate: float | None,
    gets: int | None,
    cpu_size: str | None,
    cpu_load: int | None,
    as_json: bool,
) -> None:
    """Data-path throughput on this machine, next to the machine's own limit.

    For each tier pair and block size: kvtier's achieved GB/s (10^9 B/s) and a baseline
    measured in the same run on the same bytes, and the ratio (target: 80 %):

    \b
      cpu -> cpu   TensorCopier.copy between host pools, scattered slots and one
                   contiguous run | one torch copy_ of the whole pool
      cpu -> disk  DiskStore.write (fsync, O_DIRECT where possible) of one batch
                   | one O_DIRECT os.pwrite + os.fdatasync;
                   serial / concurrent: 20-block batches, 1 / 16 in flight
                   | O_DIRECT os.pwritev + os.fdatasync per batch, 1 / 16 threads
      disk -> cpu  DiskStore.read (checksums verified) of one batch | one O_DIRECT
                   os.preadv; serial / concurrent: 16-block reads, 1 / 16 in flight
                   | O_DIRECT os.preadv of 16-block runs, 1 / 16 threads
      cpu <-> gpu  TensorCopier.copy, pinned host pool and GPU pool (only with CUDA)
                   | one pinned copy_(non_blocking=True) + synchronize
      device       the raw disk alone (with the disk rows): sequential O_DIRECT
                   writes of 1 MiB + fdatasync, random O_DIRECT reads of one block,
                   16 in flight; each disk row shows its share of it (of device)

    with kvtier's blocks/s, the queue depth (qd) of both sides, the disk store's
    batches per fsync, and the bookkeeping's block-operations per second. Each figure is
    the median of --repeats runs after a warm-up run; the ratio pairs kvtier with the
    baseline run right next to it. After timing, every pair's bytes are checked block by
    block. Nothing here is a pass/fail test of speed: the VM or disk you run on may be
    noisy.

    With --write-path, what a serving engine waits for instead (puts and gets of 16 blocks,
    chains taking turns in interleaved rounds; files in a temporary directory inside --dir,
    default the current directory):

    \b
      puts    p50/p99 of paced puts into a full CPU tier over a disk tier (write-back,
              write-through), ratio to a CPU-only chain (targets 1.25x, 2x)
      gets    p50/p99 of gets of blocks on the disk only, with the disk idle and under a
              paced put stream, ratio (target 1.5x); every byte checked
      demote  cpu -> disk GB/s during the puts | raw O_DIRECT pwrite + fdatasync, same bytes

    Exit status: 0 measured; 1 some pair moved wrong bytes (or a get returned wrong bytes);
    2 bad options.

    \b
    Examples:
      kvtier bench
      kvtier bench --quick
      kvtier bench --block-sizes 256KiB --repeats 9 --pairs cpu,disk
      kvtier bench --dir /mnt/nvme --json > bench.json
      kvtier bench --write-path --quick
      kvtier bench --write-path --put-rate 50 --dir /mnt/nvme
    """
    _check_mode(write_path)
    if write_path:
        _bench_write_path(
            quick, directory, write_block_size, puts, put_rate, gets, cpu_size, cpu_load, as_json
        )
        return
    from kvtier_tools.bench.datapath import Settings, render, run_datapath_benchmark, step_count

    sizes = parse_sizes(block_sizes, "--block-sizes")
    values: dict[str, Any] = {"block_sizes": sizes, "parts": parse_parts(pairs)}
    for option, name, text in (
        ("--copy-size", "copy_bytes", copy_size),
        ("--disk-size", "disk_bytes", disk_size),
        ("--gpu-size", "gpu_bytes", gpu_size),
    ):
        if text is not None:
            values[name] = parse_size_option(text, option)
    if repeats is not None:
        values["repeats"] = repeats
    if directory is not None:
        values["directory"] = directory
    settings = Settings.quick(**values) if quick else Settings(**values)
    settings.validate()

    with progress("measuring the data path", step_count(settings)) as advance:
        report = run_datapath_benchmark(settings, progress=lambda _: advance(1))
    _show(report.to_json() if as_json else render(report))
    if report.wrong_bytes:
        sys.exit(EXIT_WRONG_BYTES)


def _check_mode(write_path: bool) -> None:
    """Refuse (one line) an option that the chosen measurement does not use."""
    ctx = click.get_current_context()
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    foreign = DATAPATH_ONLY if write_path else WRITEPATH_ONLY
    for param in ctx.command.params:
        if param.name in foreign and ctx.get_parameter_source(param.name) in given:
            option = param.opts[0]
            if write_path:
                raise click.UsageError(f"{option} does not apply to --write-path", ctx)
            raise click.UsageError(f"{option} needs --write-path", ctx)


def _bench_write_path(
    quick: bool,
    directory: Path | None,
    write_block_size: str | None,
    puts: int | None,
    put_rate: float | None,
    gets: int | None,
    cpu_size: str | None,
    cpu_load: int | None,
    as_json: bool,
) -> None:
    from kvtier_tools.bench.writepath import Settings, render, run_writepath_benchmark, step_count

    values: dict[str, Any] = {}
    for option, name, text in (
        ("--write-block-size", "block_size", write_block_size),
        ("--cpu-size", "cpu_bytes", cpu_size),
    ):
        if text is not None:
            values[name] = parse_size_option(text, option)
    for name, value in (
        ("puts", puts),
        ("gets", gets),
        ("put_rate", put_rate),
        ("cpu_load", cpu_load),
    ):
        if value is not None:
            values[name] = value
    if directory is not None:
        values["directory"] = directory
    settings = (Settings.quick(**values) if quick else Settings(**values)).fitted()
    settings.validate()

    with progress("measuring the write path", step_count(settings)) as advance:
        report = run_writepath_benchmark(settings, progress=lambda _: advance(1))
    _show(report.to_json() if as_json else render(report))
    if report.mismatches:
        sys.exit(EXIT_WRONG_BYTES)


def _show(shown: str | list[Any]) -> None:
    """Print a JSON document as is, or rich renderables (at their natural width when piped:
    see `kvtier.cli.console`)."""
    if isinstance(shown, str):
        click.echo(shown)
        return
    for renderable in shown:
        out.print(renderable)
