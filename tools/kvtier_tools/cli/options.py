"""Options the tools' commands share (replay, simulate, bench, demo), declared once: each
command words its own help. `--config` is the product's (`kvtier.cli.commands.options`)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_OUT = Path("kvtier-out")


def trace_option(help_text: str) -> Callable[[F], F]:
    """`--trace FILE`: a request trace, passed as `trace_path`."""
    return click.option(
        "--trace",
        "trace_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=help_text,
    )


def out_option(help_text: str) -> Callable[[F], F]:
    """`--out DIR` (default ./kvtier-out), passed as `out_dir`."""
    return click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_OUT,
        show_default=True,
        help=help_text,
    )


def json_option(help_text: str = "Print the JSON report instead of tables.") -> Callable[[F], F]:
    """`--json`, passed as `as_json`."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def no_plot_option() -> Callable[[F], F]:
    """`--no-plot`: skip the PNG chart (so matplotlib is not needed)."""
    return click.option(
        "--no-plot", is_flag=True, help="Skip the PNG chart (no matplotlib needed)."
    )


def check_out_dir(out_dir: Path) -> None:
    """Create `out_dir` (0700, with its missing parents) and make sure files can be written
    there, before a replay spends minutes that it could not report: InvalidValueError, one
    line, otherwise."""
    from kvtier.errors import InvalidValueError, KvtierError
    from kvtier.tiers.trusted import make_dirs

    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidValueError(f"--out {out_dir} exists and is not a directory")
    try:
        make_dirs(out_dir, create_parents=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".kvtier-write-test-"):
            pass
    except (OSError, KvtierError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise InvalidValueError(f"--out {out_dir}: cannot write there ({reason})") from None
