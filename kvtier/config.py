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
for its `medium` names (`kvtier.tiers.registry`); this module defines the `BaseTierConfig`
every tier model extends and the models of the built-in media (gpu, cpu, disk). It imports the
registry only when it validates, and never imports torch.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from kvtier.errors import ConfigError, InvalidValueError, UnknownPolicyError
from kvtier.namespaces import block_namespace
from kvtier.policies import get_policy_class
from kvtier.policies.admission import Admission
from kvtier.specs.base import Medium

if TYPE_CHECKING:
    from kvtier.tiers.registry import TierKind

__all__ = [
    "MAX_TIERS",
    "BaseTierConfig",
    "CPUTierConfig",
    "DiskTierConfig",
    "GPUTierConfig",
    "HierarchyConfig",
    "TierConfig",
    "default_cache_dir",
    "default_config_path",
    "format_size",
    "load_config",
    "load_default_config",
    "parse_config",
    "parse_size",
]

MAX_TIERS = 8
MAX_BLOCK_SIZE = 1 << 30
"""The largest block_size (1 GiB): a KV block is KiBs to MiBs; more is a typo."""
MAX_TIER_BLOCKS = 1 << 40
"""The most blocks one tier may hold (its bookkeeping needs memory per block)."""
MAX_TIER_BYTES = 1 << 50
"""The most bytes one tier may hold (1 PiB); a cpu tier is also bounded by this machine's
memory, a disk tier by its file system's free space when it opens."""


def physical_memory() -> int | None:
    """Bytes of this machine's memory, or None where the platform does not say."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


"""The most tiers one chain may have."""

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
_SIZE_EXAMPLE = 'expected a byte count or a size like "8GiB"'


class _SizeError(ValueError):
    """A size string or number was rejected; `reason` has no value in it (callers add it)."""

    def __init__(self, reason: str, *, malformed: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.malformed = malformed  # True: not shaped like a size at all


def _size_in_bytes(value: object) -> tuple[int, bool]:
    """Bytes of `value` and whether a unit was written; raises _SizeError."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _SizeError(_SIZE_EXAMPLE, malformed=True)
    if isinstance(value, int):
        if value < 1:
            raise _SizeError("must be at least 1 byte", malformed=False)
        return value, False
    match = _SIZE_PATTERN.fullmatch(value)
    if match is None:
        raise _SizeError(_SIZE_EXAMPLE, malformed=True)
    number, unit = match.groups()
    multiplier = _SIZE_UNITS.get(unit.lower())
    if multiplier is None:
        raise _SizeError(
            f"unknown size unit {json.dumps(unit)}; use B, KB, MB, GB, TB (powers of 1000) "
            "or KiB, MiB, GiB, TiB (powers of 1024)",
            malformed=False,
        )
    size = Fraction(number) * multiplier
    if size.denominator != 1:
        raise _SizeError("is not a whole number of bytes", malformed=False)
    if size < 1:
        raise _SizeError("must be at least 1 byte", malformed=False)
    return int(size), unit != ""


def format_size(size: int) -> str:
    """`size` bytes, readable, in binary units to one decimal, as `parse_size` reads them
    back: "16KiB", "1.5GiB", "1000B"."""
    for unit, multiplier in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1024)):
        if size >= multiplier:
            return f"{size / multiplier:.1f}".removesuffix(".0") + unit
    return f"{size}B"


def parse_size(value: int | str) -> int:
    """Bytes in `value`: an int, or a string like "8GiB", "512 KiB", "64KB", "1.5GiB", "4096".

    Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) powers
    of 1000, "B" or no unit means bytes; units are case-insensitive. The result must be a
    positive whole number of bytes. Raises InvalidValueError (a ValueError) otherwise.
    """
    try:
        size, _ = _size_in_bytes(value)
    except _SizeError as error:
        raise InvalidValueError(f"{error.reason}, got {_show(value)}") from None
    return size


def _format_size(size: int) -> str:
    """`size` bytes, human-readable in binary units: "256 KiB", "1.5 GiB", "100 B"."""
    for unit, multiplier in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= multiplier:
            return f"{size / multiplier:.4g} {unit}"
    return f"{size} B"


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """The per-user cache directory: `$XDG_CACHE_HOME/kvtier`, else `~/.cache/kvtier`."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "kvtier"


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
    import kvtier

    return Path(kvtier.__file__).parent.parent / "configs" / "default.toml"


_UNSET_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def _expand_path(value: str | Path) -> Path:
    """`value` with "~" and $VARS expanded; ValueError naming a variable that is not set
    (kept as written, it would make a directory literally named "$VAR")."""
    expanded = os.path.expandvars(os.path.expanduser(str(value)))
    unset = _UNSET_VARIABLE.search(expanded)
    if unset is not None:
        raise ValueError(f"${unset.group(1).strip('{}')} is not set in the environment")
    return Path(expanded)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scope:
    """The enclosing HierarchyConfig's block size (None: it is itself invalid)."""

    block_size: int | None


# Set while a HierarchyConfig validates its tiers, so that a tier can turn a byte capacity into
# blocks (and reject one smaller than a block at the right key path). Unset: a standalone tier.
_SCOPE: ContextVar[_Scope | None] = ContextVar("kvtier_config_scope", default=None)

_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
_DEVICE_PATTERN = re.compile(r"cuda(:\d+)?|cpu")
_CAPACITY_EXAMPLE = 'expected a block count or a size like "8GiB"'


def _error(kind: str, message: str) -> PydanticCustomError:
    """A validation error of our own; with no context given, `message` is shown as is."""
    return PydanticCustomError(kind, message)


def _check_tier_bytes(size: int, medium: object) -> None:
    """A tier's bytes within MAX_TIER_BYTES, and a host-memory tier's within this machine's
    memory (a pool larger than the memory would fail, or swap, when it is allocated)."""
    if size > MAX_TIER_BYTES:
        raise _error("capacity", f"{_format_size(size)} is more than a tier may hold (1 PiB)")
    memory = physical_memory()
    if medium == "cpu" and memory is not None and size > memory:
        raise _error(
            "capacity",
            f"{_format_size(size)} of host memory, but this machine has {_format_size(memory)}",
        )


def _true_false_or_auto(value: object) -> bool | Literal["auto"]:
    """`value` if it is true, false or "auto"; else a validation error."""
    if isinstance(value, bool):
        return value
    if value == "auto":
        return "auto"
    raise _error("true_false_auto", 'expected true, false or "auto"')


class _Frozen(BaseModel):
    """Common pydantic settings: unknown keys rejected, immutable, no type coercion."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class BaseTierConfig(_Frozen):
    """What every tier has; the model of each medium extends it with that medium's options
    and narrows `medium` to `Literal["<medium>"]` (see `kvtier.tiers.registry`).

    `capacity` is kept as written (a block count, or a byte size string); `num_blocks` is it
    converted with the enclosing config's block size.
    """

    name: str
    medium: str
    capacity: int | str
    policy: str = "lru"
    admission: Admission = "all"
    """Which absent blocks the tier stores at all: every one its policy admits ("all"), or
    only those seen for the second time ("second-sighting": spares a disk or remote tier the
    writes of blocks that are never read again; see `kvtier.policies.admission`)."""
    enabled: bool | Literal["auto"] = True
    high_watermark: float = 0.98
    """Occupancy fraction (0 < x <= 1) above which kvtier starts demoting blocks of this tier
    to the tier below in the background (a tier with none below never does), so that a put
    finds free slots at once instead of waiting for an eviction's copy."""
    low_watermark: float = Field(default=0.95, validate_default=True)
    """Occupancy fraction that background demotion brings the tier down to; must be below
    `high_watermark`."""

    _num_blocks: int = PrivateAttr(default=0)

    @property
    def num_blocks(self) -> int:
        """How many blocks the tier holds."""
        return self._num_blocks

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if _NAME_PATTERN.fullmatch(value) is None:
            raise _error("tier_name", 'expected a non-empty name of letters, digits, "_" or "-"')
        return value

    @field_validator("capacity", mode="before")
    @classmethod
    def _check_capacity(cls, value: object, info: ValidationInfo) -> int | str:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise _error("capacity", _CAPACITY_EXAMPLE)
        if isinstance(value, int):
            if value < 1:
                raise _error("capacity", "a block count must be at least 1")
            if value > MAX_TIER_BLOCKS:
                raise _error("capacity", f"at most {MAX_TIER_BLOCKS:,} blocks (2**40)")
            scope = _SCOPE.get()
            if scope is not None and scope.block_size is not None:
                _check_tier_bytes(value * scope.block_size, info.data.get("medium"))
            return value
        try:
            size, has_unit = _size_in_bytes(value)
        except _SizeError as error:
            reason = _CAPACITY_EXAMPLE if error.malformed else error.reason
            raise _error("capacity", reason) from None
        if not has_unit:
            raise _error(
                "capacity",
                'a size string needs a unit, like "8GiB"; write a block count as a bare integer',
            )
        scope = _SCOPE.get()
        if scope is None:
            raise _error(
                "capacity",
                "a byte size needs the block_size of a whole config; "
                "give a block count to build a tier on its own",
            )
        if scope.block_size is not None and size < scope.block_size:
            raise _error(
                "capacity",
                f"must hold at least one block of {_format_size(scope.block_size)}",
            )
        if scope.block_size is not None and size // scope.block_size > MAX_TIER_BLOCKS:
            raise _error("capacity", f"at most {MAX_TIER_BLOCKS:,} blocks (2**40)")
        _check_tier_bytes(size, info.data.get("medium"))
        return value

    @field_validator("policy")
    @classmethod
    def _check_policy(cls, value: str) -> str:
        try:
            get_policy_class(value)
        except UnknownPolicyError as error:
            raise _error(
                "unknown_policy",
                f"unknown cache policy {json.dumps(value)}; "
                f"valid policies: {', '.join(error.valid)}",
            ) from None
        return value

    @field_validator("admission")
    @classmethod
    def _check_admission(cls, value: str, info: ValidationInfo) -> str:
        from kvtier.tiers.registry import registered_media, tier_kind

        medium = info.data.get("medium")
        if value != "all" and medium in registered_media() and tier_kind(medium).owns_index:
            raise _error(
                "admission",
                f"a {medium} tier keeps its own index (kvtier does not choose what it holds), "
                'so its admission must be "all"',
            )
        return value

    @field_validator("enabled", mode="before")
    @classmethod
    def _check_enabled(cls, value: object, info: ValidationInfo) -> bool | Literal["auto"]:
        from kvtier.tiers.registry import registered_media, tier_kind

        enabled = _true_false_or_auto(value)
        medium = info.data.get("medium")
        if enabled == "auto" and medium is not None and not tier_kind(medium).auto_enable:
            allowed = [name for name in registered_media() if tier_kind(name).auto_enable]
            if not allowed:
                raise _error("auto_not_allowed", '"auto" is not allowed on any kind of tier')
            raise _error(
                "auto_not_allowed",
                '"auto" (enabled when CUDA is available) is only allowed on a '
                f"{' or '.join(allowed)} tier",
            )
        return enabled

    @field_validator("high_watermark", "low_watermark", mode="before")
    @classmethod
    def _check_watermark(cls, value: object, info: ValidationInfo) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _error("watermark", "expected a number")
        if not 0 < value <= 1:
            raise _error("watermark", "must be a fraction above 0 and at most 1")
        high = info.data.get("high_watermark")
        if info.field_name == "low_watermark" and high is not None and value >= high:
            raise _error("watermark", f"must be below high_watermark ({high})")
        return float(value)

    @model_validator(mode="after")
    def _resolve_blocks(self) -> BaseTierConfig:
        if isinstance(self.capacity, int):
            self._num_blocks = self.capacity
        else:
            scope = _SCOPE.get()
            if scope is not None and scope.block_size is not None:
                self._num_blocks = parse_size(self.capacity) // scope.block_size
        return self

    @property
    def kind(self) -> TierKind:
        """The declarations registered for this tier's medium (volatile, access, ...)."""
        from kvtier.tiers.registry import tier_kind

        return tier_kind(self.medium)

    def options(self) -> dict[str, object]:
        """The medium-specific settings, by key (for display)."""
        common = set(BaseTierConfig.model_fields)
        return {key: getattr(self, key) for key in type(self).model_fields if key not in common}


class GPUTierConfig(BaseTierConfig):
    """A tier in GPU memory."""

    medium: Literal[Medium.GPU]
    device: str = "cuda"
    """A torch device: "cuda", "cuda:N", or "cpu" (for testing without a GPU)."""

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if _DEVICE_PATTERN.fullmatch(value) is None:
            raise _error("device", 'expected "cuda", "cuda:N" or "cpu"')
        return value


class CPUTierConfig(BaseTierConfig):
    """A tier in host memory."""

    medium: Literal[Medium.CPU]
    pin_memory: bool = True
    """Page-lock the pool (only done when CUDA is present) for fast asynchronous copies."""


class DiskTierConfig(BaseTierConfig):
    """A tier of files on a local disk."""

    medium: Literal[Medium.DISK]
    path: Path = Field(default_factory=default_cache_dir)
    """Directory of the tier's files; "~" and $VARS are expanded at load."""
    compression: Literal["none", "zstd"] = "none"
    zstd_level: int = Field(default=3, ge=1, le=22)
    direct_io: bool | Literal["auto"] = "auto"
    """O_DIRECT: true, false, or "auto" (used where the filesystem supports it)."""
    fsync: bool = True
    """fsync files before a stored block counts as ready (survives a crash)."""

    @field_validator("path", mode="before")
    @classmethod
    def _expand(cls, value: object) -> Path:
        if not isinstance(value, str | Path):
            raise _error("path", "expected a directory path string")
        if str(value) == "":
            raise _error("path", "must not be empty")
        if "\0" in str(value):
            raise _error("path", "must not contain a NUL character")
        try:
            return _expand_path(value)
        except ValueError as error:
            raise _error("path", str(error)) from None

    @field_validator("direct_io", mode="before")
    @classmethod
    def _check_direct_io(cls, value: object) -> bool | Literal["auto"]:
        return _true_false_or_auto(value)


TierConfig = BaseTierConfig
"""One tier's config: an instance of the model its medium's kind registers."""


def _validate_tier(value: object) -> BaseTierConfig:
    """One `[[tiers]]` table, validated by the model of the kind its `medium` names (a tier
    config built in code is taken as it is, if its medium is registered)."""
    from kvtier.tiers.registry import registered_media, tier_kind

    media = registered_media()
    expected = "expected one of " + ", ".join(json.dumps(medium) for medium in media)
    if isinstance(value, BaseTierConfig):
        if value.medium not in media:
            raise _error("unknown_medium", expected)
        return value
    if not isinstance(value, Mapping):
        raise _error("tier_table", "expected a table")
    if "medium" not in value:
        raise _error("missing_medium", "required key is missing: medium")
    medium = value["medium"]
    if not isinstance(medium, str) or medium not in media:
        raise _error("unknown_medium", expected)
    return tier_kind(medium).config_class.model_validate(dict(value))


_Tier = Annotated[SerializeAsAny[BaseTierConfig], PlainValidator(_validate_tier)]


class HierarchyConfig(_Frozen):
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
    tiers: tuple[_Tier, ...]
    """Each tier's config, in the order of the `[[tiers]]` tables."""

    @model_validator(mode="wrap")
    @classmethod
    def _validate_chain(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Validates fields with the block size in scope, then the rules across tiers."""
        token = _SCOPE.set(_Scope(_peek_block_size(data)))
        try:
            config = handler(data)
        finally:
            _SCOPE.reset(token)
        if isinstance(config, HierarchyConfig):
            problems = _chain_problems(
                [
                    _TierSummary(index, tier.name, tier.medium, tier.enabled)
                    for index, tier in enumerate(config.tiers)
                ]
            )
            shared = [
                tier
                for tier in config.tiers
                if tier.enabled is not False and tier.kind.shared
            ]
            if shared and not config.model_id:
                problems.append(
                    f"model_id: required when a tier is shared (tier {json.dumps(shared[0].name)} "
                    f"is {shared[0].medium}): name the model whose KV the blocks are, or "
                    "other models' nodes would serve each other's KV"
                )
            if problems:
                raise _error("tier_chain", "\n".join(problems))
        return config

    @property
    def namespace(self) -> str:
        """The namespace of every block of this chain (`kvtier.namespaces.block_namespace`)."""
        return block_namespace(self.model_id, self.block_size, self.tenant)

    @field_validator("block_size", mode="before")
    @classmethod
    def _parse_block_size(cls, value: object) -> int:
        try:
            size, _ = _size_in_bytes(value)
        except _SizeError as error:
            raise _error("block_size", error.reason) from None
        if size > MAX_BLOCK_SIZE:
            raise _error("block_size", f"at most {_format_size(MAX_BLOCK_SIZE)}")
        return size

    @field_validator("tiers", mode="before")
    @classmethod
    def _check_tier_count(cls, value: object) -> object:
        if isinstance(value, list | tuple) and not 1 <= len(value) <= MAX_TIERS:
            raise _error("tier_count", f"expected 1 to {MAX_TIERS} tiers, got {len(value)}")
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
            f"block_size {_format_size(self.block_size)} ({self.block_size} bytes), "
            f"write_policy {self.write_policy}"
        )
        if self.model_id:
            header += f", model_id {json.dumps(self.model_id)}"
        if self.tenant:
            header += f", tenant {json.dumps(self.tenant)}"
        width = max(len(tier.name) for tier in self.tiers)
        media_width = max(4, *(len(tier.medium) for tier in self.tiers))
        defaults = BaseTierConfig.model_fields
        lines = [header]
        for index, tier in enumerate(self.tiers):
            capacity = tier.num_blocks * self.block_size
            options = [f"{key}={_show(value, None)}" for key, value in tier.options().items()]
            for key in ("low_watermark", "high_watermark"):
                value = getattr(tier, key)
                if value != defaults[key].default:
                    options.insert(0, f"{key}={_show(value)}")
            if tier.enabled is not True:
                options.insert(0, f"enabled={_show(tier.enabled)}")
            lines.append(
                f"  {index}. {tier.name:<{width}}  {tier.medium:<{media_width}}  "
                f"{tier.num_blocks:>9} blocks  {_format_size(capacity):>10}  "
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
        size, _ = _size_in_bytes(data.get("block_size"))
    except _SizeError:
        return None
    return size if size <= MAX_BLOCK_SIZE else None


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
    from kvtier.tiers.registry import registered_media

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
    from kvtier.tiers.registry import tier_kind

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
                f"above persistent ones, got {_show(tier.medium)}"
            )
    enabled = [tier.enabled for tier in tiers]
    readable = all(value is True or value is False or value == "auto" for value in enabled)
    if enabled and readable and all(value is False for value in enabled):
        problems.append("tiers: at least one tier must be enabled; every tier has enabled = false")
    return problems


# --------------------------------------------------------------------------------------------
# Error translation
# --------------------------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
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


_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^\s?#]*@")
_QUERY_SECRET = re.compile(r"(?i)([?&;](?:password|username)=)[^&;#\s]*")


def hide_userinfo(text: str) -> str:
    """`text` with the user and password of every URL in it (`redis://user:pass@host`, and a
    `?password=` query) replaced by `***`: what may reach a log line, an error or a repr."""
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def _show(value: object, limit: int | None = 80) -> str:
    """`value` as TOML would write it (strings in double quotes, a URL's credentials hidden),
    cut to `limit` characters."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(hide_userinfo(value), ensure_ascii=False)
    elif isinstance(value, Path):
        text = json.dumps(str(value), ensure_ascii=False)
    elif isinstance(value, Mapping):
        items = ", ".join(f"{_key(str(key))} = {_show(item)}" for key, item in value.items())
        text = "{ " + items + " }" if items else "{}"
    elif isinstance(value, list | tuple):
        text = "[" + ", ".join(_show(item) for item in value) + "]"
    else:
        text = str(value)
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def _key(key: str) -> str:
    """A TOML key: bare when it can be, else quoted."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def _path(loc: Sequence[int | str]) -> str:
    """A TOML-style key path: `tiers[1].capacity`; the top level is `(top level)`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + _key(part)
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
    from kvtier.tiers.registry import registered_media, tier_kind

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
        message += f" for a {medium} tier ({_show(key)} is an option of a {owners[0]} tier)"
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
    if kind not in _NO_VALUE_SHOWN:
        line += f", got {_show(value)}"
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
