"""Options that several commands share, declared once: each command words its own help.

`--config` only: the tools' options (`--trace`, `--out`, `--json`, `--no-plot`) are
kvtier-tools' (`kvtier_tools.cli.options`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def config_option(help_text: str, *, required: bool = False) -> Callable[[F], F]:
    """`--config FILE`: a tier chain in TOML, passed as `config_path`."""
    # A required option gets no default at all: click takes even default=None as a value.
    extra: dict[str, Any] = {"required": True} if required else {"default": None}
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help=help_text,
        **extra,
    )
