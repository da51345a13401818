"""Argument checks of the public API (`Hierarchy`'s options and verbs).

Every check raises a `KvtierError` (`InvalidValueError`, `KeyFormatError`) naming the
argument and what was given, before anything changes, so one bad argument never costs the
good ones and a caller never sees Python's TypeError or OverflowError from deeper down.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvtier.arrays import has_duplicates
from kvtier.config import MAX_TIER_BYTES, physical_memory
from kvtier.errors import InvalidValueError, KeyFormatError
from kvtier.hints import ReuseHint, check_reuse, check_ttl
from kvtier.keys import OffloadKey, check_key, describe_key

Rows = Sequence[int] | npt.NDArray[np.integer[Any]]
"""Row numbers of a tensor of blocks, as a caller may give them."""


def check_keys(keys: Sequence[OffloadKey], what: str, *, distinct: bool = True) -> list[OffloadKey]:
    """`keys` as a list, every key checked (`check_key`) before anything changes, so one bad
    key never costs the good ones; with `distinct`, no key twice."""
    given: object = keys
    if isinstance(given, bytes | bytearray | str) or not isinstance(given, Sequence):
        raise KeyFormatError(
            f"{what}: keys must be a sequence of bytes keys, got {type(keys).__name__}"
        )
    checked = [check_key(key, f"{what}: keys[{i}]") for i, key in enumerate(given)]
    if distinct and len(set(checked)) != len(checked):
        seen: set[bytes] = set()
        for i, key in enumerate(checked):
            if key in seen:
                raise InvalidValueError(
                    f"{what}: duplicate key {describe_key(key)} at keys[{i}] in one call"
                )
            seen.add(key)
    return checked


def check_seconds(value: object, what: str, *, none_ok: bool = True) -> float | None:
    """A positive, finite number of seconds (None when `none_ok`), or InvalidValueError.
    Any real number is taken (a numpy scalar too); an int too large for a float is refused
    like infinity rather than raising OverflowError."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidValueError(f"{what} must be a number of seconds, got {shown(value)}")
    try:
        seconds = float(value)
    except (OverflowError, ValueError, TypeError):
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        hint = " (None waits without a deadline)" if none_ok else ""
        raise InvalidValueError(f"{what} must be a finite number > 0, got {shown(value)}{hint}")
    return seconds


def check_count(value: object, what: str, minimum: int) -> int:
    """An int (or an int-like numpy scalar, not a bool) >= minimum, or InvalidValueError
    naming `what`."""
    count: int | None = None
    if not isinstance(value, bool | float) and hasattr(value, "__index__"):
        try:
            count = operator.index(value)
        except TypeError:
            count = None
    if count is None or count < minimum:
        raise InvalidValueError(f"{what} must be an int >= {minimum}, got {shown(value)}")
    return count


def shown(value: object, limit: int = 48) -> str:
    """`repr(value)`, cut short for an error message (a 600-digit int is not helpful)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def check_staging_bytes(value: object) -> int:
    """A staging arena size: an int >= 1 and at most this machine's memory (1 PiB where the
    platform does not say), so a typo is an error here, not an OverflowError or ENOMEM at
    open."""
    staging_bytes = check_count(value, "staging_bytes", 1)
    memory = physical_memory()
    most = MAX_TIER_BYTES if memory is None else min(memory, MAX_TIER_BYTES)
    if staging_bytes > most:
        raise InvalidValueError(
            f"staging_bytes must be at most {most:,} (this machine's memory; "
            f"it is host memory), got {staging_bytes:,}"
        )
    return staging_bytes


def check_tier_options(
    tier_options: object,
    by_keyword: Mapping[str, object],
    media: Sequence[str],
    keywords: Mapping[str, str],
) -> dict[str, dict[str, Any]]:
    """Per medium, the options for its opener: `tier_options[medium]`, with the options
    given by a keyword of its own (`by_keyword`: keyword -> options; `keywords`: keyword ->
    medium, what the kinds declare, e.g. `disk_options`) merged over them. Mappings of
    identifiers, for registered media only (options for a medium no tier can have would be
    silently ignored)."""
    for name, options in (("tier_options", tier_options), *by_keyword.items()):
        if options is not None and not isinstance(options, Mapping):
            raise InvalidValueError(f"{name} must be a mapping, got {type(options).__name__}")
    by_medium: Mapping[Any, Any] = tier_options or {}  # type: ignore[assignment]
    for medium, options in by_medium.items():
        if not isinstance(medium, str) or medium not in media:
            raise InvalidValueError(
                f"tier_options: {medium!r} is not a tier medium; registered media: "
                f"{', '.join(media)}"
            )
        if not isinstance(options, Mapping):
            raise InvalidValueError(
                f"tier_options[{medium!r}] must be a mapping of options, got "
                f"{type(options).__name__}"
            )
        check_option_keys(options, f"tier_options[{medium!r}]")
    merged = {medium: dict(options) for medium, options in by_medium.items()}
    for keyword, given in by_keyword.items():
        extra: Mapping[Any, Any] = given or {}  # type: ignore[assignment]
        check_option_keys(extra, keyword)
        if not extra:
            continue
        medium = keywords.get(keyword)
        if medium is None:
            raise InvalidValueError(f"{keyword}: no registered tier medium takes these options")
        merged.setdefault(medium, {}).update(extra)
    return merged


def check_option_keys(options: Mapping[Any, Any], what: str) -> None:
    """An opener's options are keyword arguments: their names must be strings."""
    for name in options:
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidValueError(f"{what}: option names must be identifiers, got {name!r}")


def check_option_names(options: Mapping[str, Any], known: Iterable[str], what: str) -> None:
    """Every name in `options` is one of `known` (keyword options), or an
    InvalidValueError listing them (rather than Python's TypeError from the call)."""
    names = sorted(known)
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise InvalidValueError(
            f"{what}: unknown option {', '.join(unknown)}; the options are {', '.join(names)}"
        )


def config_path(path: str | os.PathLike[str], what: str) -> Path:
    """`path` as a Path; a bytes path (or a PathLike that gives bytes) is an
    InvalidValueError rather than Path's TypeError."""
    try:
        return Path(path)
    except TypeError as error:
        raise InvalidValueError(f"{what}: a config path must be a str path: {error}") from None


def check_rows(
    rows: Rows | None, blocks: torch.Tensor, block_size: int, count: int, what: str
) -> npt.NDArray[np.int64]:
    """The row of `blocks` of each of `count` keys (0..count-1 without `rows`), after
    checking `blocks` (uint8 [n, block_size], contiguous) and that every row exists and
    none is given twice."""
    check_blocks(blocks, block_size, count if rows is None else None, what)
    if rows is None:
        return np.arange(count, dtype=np.int64)
    try:
        row_ids = np.asarray(rows)
    except (TypeError, ValueError) as error:
        raise InvalidValueError(f"{what}: rows must be a sequence of ints ({error})") from None
    if row_ids.dtype == np.bool_ or not np.issubdtype(row_ids.dtype, np.integer):
        raise InvalidValueError(f"{what}: rows must be ints, got {row_ids.dtype}")
    if row_ids.shape != (count,):
        raise InvalidValueError(f"{what}: {count} keys but rows has shape {list(row_ids.shape)}")
    if count and (row_ids.min() < 0 or row_ids.max() >= blocks.shape[0]):
        bad = int(row_ids[(row_ids < 0) | (row_ids >= blocks.shape[0])][0])
        raise InvalidValueError(
            f"{what}: row {bad} is not one of the {blocks.shape[0]} rows of the tensor"
        )
    if has_duplicates(row_ids):
        raise InvalidValueError(f"{what}: a row is given twice")
    return row_ids.astype(np.int64)


def check_blocks(
    blocks: torch.Tensor, block_size: int, count: int | None, what: str = "put"
) -> None:
    """`blocks` is a contiguous uint8 tensor `[count, block_size]` holding bytes (any
    number of rows when `count` is None)."""
    if not isinstance(blocks, torch.Tensor):
        raise InvalidValueError(
            f"{what}: blocks must be a torch.Tensor, got {type(blocks).__name__}"
        )
    if blocks.device.type == "meta":
        raise InvalidValueError(f"{what}: blocks are on the meta device, which holds no bytes")
    if blocks.dtype != torch.uint8:
        raise InvalidValueError(
            f"{what}: blocks must be uint8 bytes, got {blocks.dtype}; to store another "
            f"dtype's bytes pass blocks.view(torch.uint8) (shape [n, {block_size}])"
        )
    if blocks.dim() != 2 or blocks.shape[1] != block_size:
        raise InvalidValueError(
            f"{what}: blocks must have shape [n, {block_size}] (block_size), "
            f"got {list(blocks.shape)}"
        )
    if count is not None and blocks.shape[0] != count:
        raise InvalidValueError(f"put: {count} keys but {blocks.shape[0]} blocks")
    if not blocks.is_contiguous():
        raise InvalidValueError(f"{what}: blocks must be a contiguous tensor")


__all__ = [
    "Rows",
    "check_blocks",
    "check_count",
    "check_keys",
    "check_option_keys",
    "check_option_names",
    "check_rows",
    "check_seconds",
    "check_staging_bytes",
    "check_tier_options",
    "config_path",
    "shown",
]


def check_hint(hint: object, what: str) -> ReuseHint | None:
    """`hint` as a `ReuseHint` (a bare `"likely"` / `"unlikely"` / `"never"` is one with no
    TTL), or None; raises InvalidValueError naming the argument otherwise."""
    if hint is None or isinstance(hint, ReuseHint):
        return hint
    try:
        return ReuseHint(check_reuse(hint))
    except InvalidValueError as error:
        raise InvalidValueError(f"{what}: hint: {error}") from None


def check_reuse_hint(reuse: object, ttl_s: object, what: str) -> ReuseHint:
    """The hint of `reuse` and `ttl_s`; raises InvalidValueError naming the bad one."""
    try:
        return ReuseHint(check_reuse(reuse), check_ttl(ttl_s))
    except InvalidValueError as error:
        raise InvalidValueError(f"{what}: {error}") from None
