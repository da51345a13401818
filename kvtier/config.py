"""Configuration of a tier chain: TOML in, frozen validated objects out.

A config names the block size and an ordered chain of tiers, top (first looked up, first
written) to bottom. `load_config` reads a TOML file, `parse_config` validates an
already-parsed mapping; both return a frozen `HierarchyConfig` or raise one `ConfigError` that
lists every problem found, one line each, as `<key path>: <message>, got <value>`:

    tiers[1].capacity: expected a block count or a size like "8GiB", got "lots"

Validation is done by pydantic models (`extra="forbid"`, `frozen=True`, strict types); this
module translates pydantic's errors into those lines so users never see pydantic's own
wording, and checks the rules that span tiers (unique names, no volatile tier below a
persistent one, one enabled tier).

The chain is open: each `[[tiers]]` table is validated by the model that the kind registered
for its `medium` names (`kvtier.tiers.registry`, where `BaseTierConfig`, the model every tier
extends, lives); this module names no medium, and the cross-tier rules read the kinds'
declarations. It imports the registry (never the other way round), and validating a config
never imports torch or a client library: the registry loads the tier packages' kinds, not
their storages.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    PlainValidator,
    SerializeAsAny,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from kvtier.config_events import EventsConfig
from kvtier.config_fields import (
    CHAIN_SCOPE,
    DEFAULT_SWITCH_INTERVAL_MS,
    MAX_TIER_BLOCKS,
    MAX_TIER_BYTES,
    ChainScope,
    FrozenModel,
    SizeError,
    config_error,
    default_cache_dir,
    hide_userinfo,
    is_secret_field,
    parse_size,
    physical_memory,
    readable_size,
    show_value,
    size_in_bytes,
    switch_interval_or_keep,
    toml_key,
)
from kvtier.errors import ConfigError
from kvtier.namespaces import block_namespace
from kvtier.tiers.registry import BaseTierConfig, registered_media, tier_kind

__all__ = [
    "MAX_BLOCK_SIZE",
    "MAX_TIERS",
    "MAX_TIER_BLOCKS",
    "MAX_TIER_BYTES",
    "MIN_BLOCK_SIZE",
    "BaseTierConfig",
    "HierarchyConfig",
    "TierConfig",
    "default_cache_dir",
    "default_config_path",
    "format_size",
    "hide_userinfo",
    "load_config",
    "load_default_config",
    "parse_config",
    "parse_size",
    "physical_memory",
    "read_config_file",
]

MAX_TIERS = 8
"""The most tiers one chain may have."""
MAX_BLOCK_SIZE = 1 << 30
"""The largest block_size (1 GiB): a KV block is KiBs to MiBs; more is a typo."""
MIN_BLOCK_SIZE = 512
"""The smallest block_size (512 bytes). A block holds K and V of every layer for the tokens
of one block: even one layer of one 64-wide fp8 KV head is 128 bytes a token, and engines
page 16 tokens or more, so a real block is KiBs; 512 is also the sector a disk tier's
O_DIRECT I/O is done in. Less is a typo (a token count given for bytes), and each byte of
`staging_bytes` would become a row of the staging arena (block_size 1: 10 GiB to open a
16-block chain)."""


# --------------------------------------------------------------------------------------------
# Sizes and paths
# --------------------------------------------------------------------------------------------


def format_size(size: int) -> str:
    """`size` bytes, readable, in binary units to one decimal, as `parse_size` reads them
    back: "16KiB", "1.5GiB", "1000B"."""
    for unit, multiplier in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1024)):
        if size >= multiplier:
            return f"{size / multiplier:.1f}".removesuffix(".0") + unit
    return f"{size}B"


def default_config_path() -> Path:
    """The embedded default config file.

    An installed wheel carries it as `kvtier/configs/default.toml` (pyproject force-includes
    the repository's `configs/` there); a source or editable checkout has it at
    `<repo>/configs/default.toml`.
    """
    with contextlib.suppress(ModuleNotFoundError, NotADirectoryError):
        packaged = importlib.resources.files("kvtier") / "configs" / "default.toml"
        if isinstance(packaged, Path) and packaged.is_file():
            return packaged
    return Path(__file__).parent.parent / "configs" / "default.toml"  # <repo>/kvtier/config.py


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


TierConfig = BaseTierConfig
"""One tier's config: an instance of the model its medium's kind registers."""


def _validate_tier(value: object) -> BaseTierConfig:
    """One `[[tiers]]` table, validated by the model of the kind its `medium` names (a tier
    config built in code is taken as it is, if its medium is registered)."""

    media = registered_media()
    expected = "expected one of " + ", ".join(json.dumps(medium) for medium in media)
    if isinstance(value, BaseTierConfig):
        if value.medium not in media:
            raise config_error("unknown_medium", expected)
        return value
    if not isinstance(value, Mapping):
        raise config_error("tier_table", "expected a table")
    if "medium" not in value:
        raise config_error("missing_medium", "required key is missing: medium")
    medium = value["medium"]
    if not isinstance(medium, str) or medium not in media:
        raise config_error("unknown_medium", expected)
    return tier_kind(medium).config_class.model_validate(dict(value))


_Tier = Annotated[SerializeAsAny[BaseTierConfig], PlainValidator(_validate_tier)]


class HierarchyConfig(FrozenModel):
    """A validated tier chain: the block size and the tiers, top to bottom."""

    block_size: int
    """Bytes per block (given as an int or a size string such as "256KiB")."""
    model_id: str = ""
    """The model whose KV the blocks are (include what changes the KV bytes: revision or
    fine-tune, KV dtype, layout); part of every block's namespace (`kvtier.namespaces`).
    Required when a tier is shared (Redis, shared-fs)."""
    tenant: str = ""
    """Who owns the blocks: nodes of one tenant share blocks only with each other (part of
    the namespace, and of a shared tier's key derivation). Default: none."""
    write_policy: Literal["write-back", "write-through"] = "write-back"
    strict: bool = True
    """true (default): a tier that cannot be opened fails `Hierarchy.open` with an error
    naming the tier and why, so a mistyped disk path never silently leaves a memory-only
    chain; false: that tier is disabled (logged at open and by every `stats()` snapshot, at
    most once a minute; listed in `stats().disabled_tiers`) and the hierarchy starts
    without it."""
    switch_interval_ms: float | Literal["keep"] = DEFAULT_SWITCH_INTERVAL_MS
    """The interpreter's thread switch interval (`sys.setswitchinterval`), in ms, while the
    chain is open: at most how long a tier's thread waits for the GIL while a thread of the
    process runs Python (0.01 to 100; only ever lowered, put back at close:
    `kvtier.chain.switch_interval`; kvtier's vLLM worker holds it too). "keep": the
    interpreter's own (5 ms unless the process set another)."""
    tiers: tuple[_Tier, ...]
    """Each tier's config, in the order of the `[[tiers]]` tables."""
    events: EventsConfig = EventsConfig()
    """The `[events]` table: the node's KV events for a fleet (off by default)."""

    @model_validator(mode="wrap")
    @classmethod
    def _validate_chain(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Validates fields with the block size in scope, then the rules across tiers."""
        token = CHAIN_SCOPE.set(ChainScope(_peek_block_size(data)))
        try:
            config = handler(data)
        finally:
            CHAIN_SCOPE.reset(token)
        if isinstance(config, HierarchyConfig):
            problems = _chain_problems(
                [
                    _TierSummary(index, tier.name, tier.medium, tier.enabled)
                    for index, tier in enumerate(config.tiers)
                ]
            )
            shared = [
                tier for tier in config.tiers if tier.enabled is not False and tier.kind.shared
            ]
            if shared and not config.model_id:
                problems.append(
                    f"model_id: required when a tier is shared (tier {json.dumps(shared[0].name)} "
                    f"is {shared[0].medium}): name the model whose KV the blocks are, or "
                    "other models' nodes would serve each other's KV"
                )
            names = {tier.name for tier in config.tiers}
            problems.extend(
                f"events.tiers: no tier is named {json.dumps(name)} "
                f"(the tiers: {', '.join(sorted(names))})"
                for name in config.events.tiers
                if name not in names
            )
            if problems:
                raise config_error("tier_chain", "\n".join(problems))
        return config

    @property
    def namespace(self) -> str:
        """The namespace of every block of this chain (`kvtier.namespaces.block_namespace`)."""
        return block_namespace(self.model_id, self.block_size, self.tenant)

    @field_validator("block_size", mode="before")
    @classmethod
    def _parse_block_size(cls, value: object) -> int:
        try:
            size, _ = size_in_bytes(value)
        except SizeError as error:
            raise config_error("block_size", error.reason) from None
        if size > MAX_BLOCK_SIZE:
            raise config_error("block_size", f"at most {readable_size(MAX_BLOCK_SIZE)}")
        if size < MIN_BLOCK_SIZE:
            raise config_error(
                "block_size",
                f"must be at least {MIN_BLOCK_SIZE} bytes (all layers' K and V of one block "
                "of tokens; a token count is not a block size)",
            )
        return size

    @field_validator("switch_interval_ms", mode="before")
    @classmethod
    def _check_switch_interval(cls, value: object) -> object:
        return switch_interval_or_keep(value)

    @field_validator("tiers", mode="before")
    @classmethod
    def _check_tier_count(cls, value: object) -> object:
        if isinstance(value, list | tuple) and not 1 <= len(value) <= MAX_TIERS:
            raise config_error("tier_count", f"expected 1 to {MAX_TIERS} tiers, got {len(value)}")
        if isinstance(value, list):
            return tuple(value)  # strict mode takes only a tuple for a tuple field
        return value

    def active_tiers(self, cuda_available: bool | None = None) -> tuple[TierConfig, ...]:
        """The tiers to build: enabled ones, and "auto" ones only when CUDA is available.

        `cuda_available=None` asks torch (only if some tier is "auto"); no torch means no CUDA.
        The result may be empty, e.g. a chain of only "auto" tiers on a host without CUDA.
        """
        if cuda_available is None and any(tier.enabled == "auto" for tier in self.tiers):
            cuda_available = _cuda_available()
        return tuple(
            tier
            for tier in self.tiers
            if tier.enabled is True or (tier.enabled == "auto" and bool(cuda_available))
        )

    def describe(self) -> str:
        """The chain, readable: a header line, then one line per tier, top to bottom."""
        header = (
            f"block_size {readable_size(self.block_size)} ({self.block_size} bytes), "
            f"write_policy {self.write_policy}"
        )
        if self.model_id:
            header += f", model_id {json.dumps(self.model_id)}"
        if self.tenant:
            header += f", tenant {json.dumps(self.tenant)}"
        interval = self.switch_interval_ms
        header += f", switch_interval {'keep' if interval == 'keep' else f'{interval:g} ms'}"
        width = max(len(tier.name) for tier in self.tiers)
        media_width = max(4, *(len(tier.medium) for tier in self.tiers))
        defaults = BaseTierConfig.model_fields
        lines = [header]
        for index, tier in enumerate(self.tiers):
            capacity = tier.num_blocks * self.block_size
            options = [f"{key}={show_value(value, None)}" for key, value in tier.options().items()]
            for key in ("min_refill", "low_watermark", "high_watermark"):
                value = getattr(tier, key)
                if value != defaults[key].default:
                    options.insert(0, f"{key}={show_value(value)}")
            if tier.enabled is not True:
                options.insert(0, f"enabled={show_value(tier.enabled)}")
            lines.append(
                f"  {index}. {tier.name:<{width}}  {tier.medium:<{media_width}}  "
                f"{tier.num_blocks:>9} blocks  {readable_size(capacity):>10}  "
                f"{tier.policy:<4}  {' '.join(options)}".rstrip()
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device; False when torch is not installed."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _peek_block_size(data: object) -> int | None:
    """The block size in raw config data, or None when it is missing or invalid."""
    if not isinstance(data, Mapping):
        return None
    try:
        size, _ = size_in_bytes(data.get("block_size"))
    except SizeError:
        return None
    return size if MIN_BLOCK_SIZE <= size <= MAX_BLOCK_SIZE else None


# --------------------------------------------------------------------------------------------
# Rules across tiers
# --------------------------------------------------------------------------------------------


class _TierSummary(NamedTuple):
    """The parts of one tier that the cross-tier rules look at (None: missing or invalid;
    a medium is given only when it is registered)."""

    position: int
    name: str | None
    medium: str | None
    enabled: object


def _summaries_of_raw(data: Mapping[str, Any]) -> list[_TierSummary]:
    """Summaries of the raw tier tables that can be read; used when validation failed, so
    that cross-tier problems are reported together with the others."""

    tiers = data.get("tiers")
    if not isinstance(tiers, list | tuple):
        return []
    media = registered_media()
    summaries = []
    for index, raw in enumerate(tiers):
        if not isinstance(raw, Mapping):
            summaries.append(_TierSummary(index, None, None, None))
            continue
        name = raw.get("name")
        medium = raw.get("medium")
        summaries.append(
            _TierSummary(
                index,
                name if isinstance(name, str) else None,
                medium if isinstance(medium, str) and medium in media else None,
                raw.get("enabled", True),
            )
        )
    return summaries


def _chain_problems(tiers: Sequence[_TierSummary]) -> list[str]:
    """Problem lines for the rules across tiers: unique names, no volatile tier below a
    persistent one (what a persistent tier demotes would be lost on a restart while the
    tiers above keep theirs), and at least one enabled tier."""

    problems = []
    where: dict[str, list[int]] = {}
    for tier in tiers:
        if tier.name is not None:
            where.setdefault(tier.name, []).append(tier.position)
    for name, indices in where.items():
        if len(indices) > 1:
            places = [f"tiers[{index}]" for index in indices]
            listed = ", ".join(places[:-1]) + " and " + places[-1]
            problems.append(
                f"tiers: tier names must be unique; {json.dumps(name)} appears at {listed}"
            )
    persistent: _TierSummary | None = None  # the lowest persistent tier so far
    for tier in tiers:
        if tier.medium is None:
            continue
        if not tier_kind(tier.medium).volatile:
            persistent = tier
        elif persistent is not None:
            problems.append(
                f"tiers[{tier.position}].medium: a volatile {tier.medium} tier cannot be below "
                f"the persistent {persistent.medium} tier tiers[{persistent.position}] (it "
                "would lose on a restart what that tier demoted to it); put volatile tiers "
                f"above persistent ones, got {show_value(tier.medium)}"
            )
    enabled = [tier.enabled for tier in tiers]
    readable = all(value is True or value is False or value == "auto" for value in enabled)
    if enabled and readable and all(value is False for value in enabled):
        problems.append("tiers: at least one tier must be enabled; every tier has enabled = false")
    return problems


# --------------------------------------------------------------------------------------------
# Error translation
# --------------------------------------------------------------------------------------------

_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")
# Error types whose message already says all there is; no ", got <value>" is added.
_NO_VALUE_SHOWN = {
    "missing",
    "url_credentials",  # the value holds a password: never echoed
    "missing_medium",
    "extra_forbidden",
    "unknown_policy",
    "tier_count",
    "tier_chain",
}
_MESSAGES = {
    "missing": "required key is missing",
    "int_type": "expected an integer",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "dict_type": "expected a table",
    "tuple_type": "expected an array of tables",
    "list_type": "expected an array of tables",
}


def _path(loc: Sequence[int | str]) -> str:
    """A TOML-style key path: `tiers[1].capacity`; the top level is `(top level)`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + toml_key(part)
    return text or "(top level)"


def _medium_at(data: Mapping[str, Any], loc: tuple[int | str, ...]) -> str | None:
    """The medium of the tier table a key path `tiers[i].<key>` is in (None: not in a tier,
    or the table has no readable medium)."""
    tiers = data.get("tiers")
    if len(loc) != 3 or loc[0] != "tiers" or not isinstance(tiers, list | tuple):
        return None
    index = loc[1]
    if not isinstance(index, int) or not 0 <= index < len(tiers):
        return None
    table = tiers[index]
    medium = table.get("medium") if isinstance(table, Mapping) else None
    return medium if isinstance(medium, str) else None


def _unknown_key_message(key: object, loc: tuple[int | str, ...], data: Mapping[str, Any]) -> str:
    """The message for an unknown key, naming the keys that are allowed where it was found
    and, in a tier, the kinds of tier that take it."""

    if len(loc) == 1:
        allowed = ", ".join(HierarchyConfig.model_fields)
        return f"unknown key; allowed keys at the top level: {allowed}"
    medium = _medium_at(data, loc)
    if medium is None or medium not in registered_media():
        return "unknown key"
    allowed = ", ".join(tier_kind(medium).config_class.model_fields)
    owners = [
        other
        for other in registered_media()
        if other != medium and key in tier_kind(other).config_class.model_fields
    ]
    message = "unknown key"
    if owners:
        message += f" for a {medium} tier ({show_value(key)} is an option of a {owners[0]} tier)"
    return f"{message}; a {medium} tier takes: {allowed}"


def _problem_lines(detail: ErrorDetails, data: Mapping[str, Any]) -> list[str]:
    """One pydantic error (in validating `data`) as problem lines (a cross-tier error carries
    several)."""
    kind = detail["type"]
    value = detail["input"]
    ctx = detail.get("ctx") or {}
    loc = tuple(detail["loc"])
    if kind == "tier_chain":
        return detail["msg"].splitlines()
    if kind == "unknown_medium":
        loc += ("medium",)
        value = value.get("medium") if isinstance(value, Mapping) else value
        message = detail["msg"]
    elif kind == "missing_medium":
        loc += ("medium",)
        message = _MESSAGES["missing"]
    elif kind == "extra_forbidden":
        message = _unknown_key_message(loc[-1], loc, data)
    elif kind == "literal_error":
        expected = _QUOTED.findall(str(ctx.get("expected", "")))
        message = "expected one of " + ", ".join(json.dumps(item) for item in expected)
    elif kind == "greater_than_equal":
        message = f"must be at least {ctx.get('ge')}"
    elif kind == "less_than_equal":
        message = f"must be at most {ctx.get('le')}"
    else:
        message = _MESSAGES.get(kind, detail["msg"])
    line = f"{_path(loc)}: {message}"
    if kind not in _NO_VALUE_SHOWN and not is_secret_field(loc[-1] if loc else None):
        line += f", got {show_value(value)}"
    return [line]


def _problems_from(error: ValidationError, data: Mapping[str, Any]) -> list[str]:
    """Every problem in `error` (from validating `data`), one line each, in the order
    pydantic found them."""
    problems: list[str] = []
    for detail in error.errors(include_url=False):
        for line in _problem_lines(detail, data):
            if line not in problems:
                problems.append(line)
    return problems


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def parse_config(data: Mapping[str, Any], source: str | None = None) -> HierarchyConfig:
    """Validates already-parsed config data (e.g. from `tomllib`) into a HierarchyConfig.

    All or nothing: every problem found is reported in one ConfigError, whose `source` is
    `source` (a file name, or None for data built in code).
    """
    if isinstance(data, Mapping):
        data = dict(data)  # strict validation takes a dict, not any mapping
    try:
        return HierarchyConfig.model_validate(data)
    except ValidationError as error:
        problems = _problems_from(error, data if isinstance(data, Mapping) else {})
    if isinstance(data, Mapping):
        # Cross-tier rules only run once every field is valid; check them on the raw data
        # too, so that a duplicate name is reported along with a bad capacity.
        for line in _chain_problems(_summaries_of_raw(data)):
            if line not in problems:
                problems.append(line)
    raise ConfigError(problems, source=source)


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw data of a TOML config file, not yet validated; a file that cannot be read or
    parsed raises ConfigError naming it."""
    file = Path(path)
    source = str(file)
    try:
        with file.open("rb") as stream:
            data = tomllib.load(stream)
    except FileNotFoundError:
        raise ConfigError(["config file not found"], source=source) from None
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError([f"cannot read config file: {reason}"], source=source) from None
    except UnicodeDecodeError as error:
        raise ConfigError([f"config file is not UTF-8 text: {error}"], source=source) from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError([f"invalid TOML: {error}"], source=source) from None
    return data


def load_config(path: str | os.PathLike[str]) -> HierarchyConfig:
    """Reads and validates a TOML config file; any problem raises ConfigError naming it."""
    return parse_config(read_config_file(path), source=str(Path(path)))


def load_default_config() -> HierarchyConfig:
    """The embedded default config (see `default_config_path`)."""
    return load_config(default_config_path())
