"""The command line's consoles, progress bar and byte totals, shared by every command module.

Output goes to stdout (`out`), messages and progress to stderr (`err`). Neither wraps long
lines (an error stays one line when stderr is a file), and the progress bar is drawn only
when stderr is a terminal. A console whose stream is not a terminal (piped, redirected, CI)
is `UNCUT_WIDTH` columns wide, so a table is drawn at its natural width and never squeezed
into 80 columns with its figures cut off; on a terminal, the terminal's width applies.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

UNCUT_WIDTH = 10_000
"""Columns of a console that is not a terminal: wider than any table kvtier prints, so rich
lays each out at its natural width (a table is only as wide as its contents)."""


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def make_console(file: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A console writing to `file` (None: stdout, or stderr with `stderr`), `UNCUT_WIDTH`
    columns wide unless that stream is a terminal, with no highlighting and no wrapping of
    long lines."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    width = None if _is_terminal(stream) else UNCUT_WIDTH
    return Console(file=file, stderr=stderr, width=width, highlight=False, soft_wrap=True)


out = make_console()
err = make_console(stderr=True)


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
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
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


DECIMAL_UNITS: tuple[tuple[float, str], ...] = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
"""Decimal byte units, largest first: byte totals are shown in the units of the GB/s beside
them (GB = 10^9 bytes). Sizes people type (block sizes, capacities) are binary and shown
with `kvtier.config.format_size`, which `parse_size` reads back."""


def decimal_unit(largest: float) -> tuple[float, str]:
    """The decimal unit that fits `largest` bytes: (divisor, name), (1.0, "B") below 1 kB."""
    for divisor, name in DECIMAL_UNITS:
        if largest >= divisor:
            return divisor, name
    return 1.0, "B"


def format_bytes(value: float) -> str:
    """A byte total in decimal units: "3.03 GB", "721.7 MB", "512 B"."""
    divisor, unit = decimal_unit(value)
    if divisor == 1.0:
        return f"{value:,.0f} B"
    scaled = value / divisor
    return f"{scaled:,.{2 if scaled < 100 else 1}f} {unit}"
