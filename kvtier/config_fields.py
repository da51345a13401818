"""The pieces kvtier's config models are made of: sizes, paths, strict frozen models, errors
in kvtier's own words, and the scope of a chain being validated.

Both the chain's model (`kvtier.config.HierarchyConfig`) and every tier's model (the
`BaseTierConfig` of `kvtier.tiers.registry` and the models of each tier package) build on
this module, which imports neither: the config imports the registry, the registry and the
tier packages import this, and nothing here imports torch or a client library.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from kvtier.errors import InvalidValueError

__all__ = [
    "CHAIN_SCOPE",
    "MAX_TIER_BLOCKS",
    "MAX_TIER_BYTES",
    "SIZE_EXAMPLE",
    "ChainScope",
    "FrozenModel",
    "SizeError",
    "config_error",
    "default_cache_dir",
    "expand_path",
    "hide_userinfo",
    "is_secret_field",
    "looks_like_key",
    "parse_size",
    "physical_memory",
    "readable_size",
    "show_value",
    "size_in_bytes",
    "toml_key",
    "true_false_or_auto",
]

MAX_TIER_BLOCKS = 1 << 40
"""The most blocks one tier may hold (its bookkeeping needs memory per block)."""
MAX_TIER_BYTES = 1 << 50
"""The most bytes one tier may hold (1 PiB); a tier kind may bound it further (a host-memory
tier by this machine's memory, a disk tier by its file system's free space when it opens)."""


def physical_memory() -> int | None:
    """Bytes of this machine's memory, or None where the platform does not say."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


# --------------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------------

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_PATTERN = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
SIZE_EXAMPLE = 'expected a byte count or a size like "8GiB"'


class SizeError(ValueError):
    """A size string or number was rejected; `reason` has no value in it (callers add it)."""

    def __init__(self, reason: str, *, malformed: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.malformed = malformed  # True: not shaped like a size at all


def size_in_bytes(value: object) -> tuple[int, bool]:
    """Bytes of `value` and whether a unit was written; raises SizeError."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise SizeError(SIZE_EXAMPLE, malformed=True)
    if isinstance(value, int):
        if value < 1:
            raise SizeError("must be at least 1 byte", malformed=False)
        return value, False
    match = _SIZE_PATTERN.fullmatch(value)
    if match is None:
        raise SizeError(SIZE_EXAMPLE, malformed=True)
    number, unit = match.groups()
    multiplier = _SIZE_UNITS.get(unit.lower())
    if multiplier is None:
        raise SizeError(
            f"unknown size unit {json.dumps(unit)}; use B, KB, MB, GB, TB (powers of 1000) "
            "or KiB, MiB, GiB, TiB (powers of 1024)",
            malformed=False,
        )
    size = Fraction(number) * multiplier
    if size.denominator != 1:
        raise SizeError("is not a whole number of bytes", malformed=False)
    if size < 1:
        raise SizeError("must be at least 1 byte", malformed=False)
    return int(size), unit != ""


def parse_size(value: int | str) -> int:
    """Bytes in `value`: an int, or a string like "8GiB", "512 KiB", "64KB", "1.5GiB", "4096".

    Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) powers
    of 1000, "B" or no unit means bytes; units are case-insensitive. The result must be a
    positive whole number of bytes. Raises InvalidValueError (a ValueError) otherwise.
    """
    try:
        size, _ = size_in_bytes(value)
    except SizeError as error:
        raise InvalidValueError(f"{error.reason}, got {show_value(value)}") from None
    return size


def readable_size(size: int) -> str:
    """`size` bytes, human-readable in binary units for messages: "256 KiB", "1.5 GiB",
    "100 B"."""
    for unit, multiplier in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= multiplier:
            return f"{size / multiplier:.4g} {unit}"
    return f"{size} B"


# --------------------------------------------------------------------------------------------
# Paths and secrets
# --------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """The per-user cache directory: `$XDG_CACHE_HOME/kvtier`, else `~/.cache/kvtier`."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "kvtier"


_UNSET_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_path(value: str | Path) -> Path:
    """`value` with "~" and $VARS expanded; ValueError naming a variable that is not set
    (kept as written, it would make a directory literally named "$VAR")."""
    expanded = os.path.expandvars(os.path.expanduser(str(value)))
    unset = _UNSET_VARIABLE.search(expanded)
    if unset is not None:
        raise ValueError(f"${unset.group(1).strip('{}')} is not set in the environment")
    return Path(expanded)


_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^\s?#]*@")
_QUERY_SECRET = re.compile(r"(?i)([?&;](?:password|username)=)[^&;#\s]*")


def hide_userinfo(text: str) -> str:
    """`text` with the user and password of every URL in it (`redis://user:pass@host`, and a
    `?password=` query) replaced by `***`: what may reach a log line, an error or a repr."""
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


_SECRET_FIELD = re.compile(r"(_env|_file)$|password|secret|token|auth_key")
_KEY_TEXT = re.compile(r"\s*[0-9A-Fa-f]{32,}\s*")


def is_secret_field(name: object) -> bool:
    """Whether a config key names where a secret is, or might hold one by a slip: a `*_env`
    (a variable's name), a `*_file`, or a password-ish key. A report never shows the value
    given for such a key: a key or password pasted into the wrong field would be printed."""
    return isinstance(name, str) and _SECRET_FIELD.search(name) is not None


def looks_like_key(text: str) -> bool:
    """Whether `text` looks like key material rather than a name or a path: 32 or more hex
    digits and nothing else (`kvtier keys new` writes 64). No variable or file is named so."""
    return _KEY_TEXT.fullmatch(text) is not None


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def show_value(value: object, limit: int | None = 80) -> str:
    """`value` as TOML would write it (strings in double quotes, a URL's credentials hidden,
    the values of a table's secret fields (`is_secret_field`) as ***), cut to `limit`
    characters: how a config's report shows what it got."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(hide_userinfo(value), ensure_ascii=False)
    elif isinstance(value, Path):
        text = json.dumps(str(value), ensure_ascii=False)
    elif isinstance(value, Mapping):
        items = ", ".join(
            f"{toml_key(str(key))} = {'***' if is_secret_field(key) else show_value(item)}"
            for key, item in value.items()
        )
        text = "{ " + items + " }" if items else "{}"
    elif isinstance(value, list | tuple):
        text = "[" + ", ".join(show_value(item) for item in value) + "]"
    else:
        text = str(value)
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def toml_key(key: str) -> str:
    """A TOML key: bare when it can be, else quoted."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


# --------------------------------------------------------------------------------------------
# Models and their errors
# --------------------------------------------------------------------------------------------


def config_error(kind: str, message: str) -> PydanticCustomError:
    """A validation error of our own; with no context given, `message` is shown as is (the
    config's report adds the key path and, unless `kind` says not to, the value)."""
    return PydanticCustomError(kind, message)


MIN_SWITCH_INTERVAL_MS = 0.01
MAX_SWITCH_INTERVAL_MS = 100.0
"""The range of `switch_interval_ms`."""
DEFAULT_SWITCH_INTERVAL_MS = 0.25
"""`switch_interval_ms` left out: vLLM's CPU engine loaded a 2,048-token prefix from kvtier's
cpu tier in 17-18 ms against 59-72 at the interpreter's 5 ms, from its disk tier after a
restart in 30-38 ms against 132-165 (docs/BENCHMARKS.md, "The disk tier beside a busy
Python thread")."""


def switch_interval_or_keep(value: object) -> float | Literal["keep"]:
    """`switch_interval_ms`: a number of ms in range (as a float), or "keep"; else a
    ConfigError's detail naming the key (the config's report adds the value)."""
    if value == "keep":
        return "keep"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise config_error(
            "switch_interval_ms",
            'expected a number of ms like 0.25, or "keep"',
        )
    if not MIN_SWITCH_INTERVAL_MS <= value <= MAX_SWITCH_INTERVAL_MS:
        raise config_error(
            "switch_interval_ms",
            f"expected {MIN_SWITCH_INTERVAL_MS} to {MAX_SWITCH_INTERVAL_MS} ms",
        )
    return float(value)


def true_false_or_auto(value: object) -> bool | Literal["auto"]:
    """`value` if it is true, false or "auto"; else a validation error."""
    if isinstance(value, bool):
        return value
    if value == "auto":
        return "auto"
    raise config_error("true_false_auto", 'expected true, false or "auto"')


class FrozenModel(BaseModel):
    """Common pydantic settings: unknown keys rejected, immutable, no type coercion."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@dataclass(frozen=True)
class ChainScope:
    """The enclosing chain's block size (None: it is itself invalid)."""

    block_size: int | None


CHAIN_SCOPE: ContextVar[ChainScope | None] = ContextVar("kvtier_config_scope", default=None)
"""Set while a `HierarchyConfig` validates its tiers, so that a tier can turn a byte capacity
into blocks (and reject one smaller than a block at the right key path). Unset: a tier
validated on its own."""
