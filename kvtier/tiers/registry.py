"""The tier registry: which kinds of tier exist, what each one declares, and the config model
every tier table extends.

A `TierKind` is everything kvtier needs to know about one `medium`: the pydantic model of its
`[[tiers]]` table (a `BaseTierConfig` subclass), whether its blocks are lost on a restart,
whether it answers lookups (and evicts) by itself, how bytes reach it, whether many nodes
write it, whether `enabled = "auto"` is allowed, and how to open its storage. The config
(`kvtier.config`) validates each tier table with the model its medium's kind names, the rules
across tiers read the declarations, and a hierarchy opens storages with `open_storage`. No
medium is named here, in the config, the chain, the engine or the bookkeeping
(`tests/test_registry.py` checks; only the slot specs of `kvtier.specs` keep vLLM's names for
the built-in media): each tier's package (`kvtier.tiers.pool`, `.disk`, `.redis`,
`.sharedfs`) declares its own kinds in its `kind` module, and `BUILTIN_TIERS` lists them.

A new tier is one module: its config model, its storage, and one `register_tier` call:

    class MemcachedTierConfig(BaseTierConfig):
        medium: Literal["memcached"]
        servers: tuple[str, ...] = ("localhost:11211",)

    async def open_memcached_tier(config: MemcachedTierConfig, context: TierContext) -> Storage:
        ...

    KIND = TierKind(
        "memcached",
        MemcachedTierConfig,
        volatile=True,
        owns_index=True,
        access=TierAccess.CLIENT,
        opener="my_package.memcached_tier:open_memcached_tier",
    )
    register_tier(KIND)

Importing that module registers the kind, so import it before validating a config that names
its medium; or let an installed package name its `TierKind` in the `kvtier.tiers` entry-point
group (`[project.entry-points."kvtier.tiers"] memcached = "my_package.memcached_tier:KIND"`),
and kvtier registers it on first use, after the built-in kinds. The opener is an import path,
resolved only when a storage is opened: validating a config never imports torch or a client
library. The storage the opener returns must declare the kind's `access` (the engine routes
its bytes by the declaration). Where a tier's bytes live (for reports) is the storage's own
business: its `describe()`, where it has one.
"""

from __future__ import annotations

import importlib
import json
import re
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from kvtier.config_fields import (
    CHAIN_SCOPE,
    MAX_TIER_BLOCKS,
    MAX_TIER_BYTES,
    FrozenModel,
    SizeError,
    config_error,
    parse_size,
    readable_size,
    size_in_bytes,
    true_false_or_auto,
)
from kvtier.errors import InvalidValueError, UnknownPolicyError
from kvtier.namespaces import block_namespace
from kvtier.policies import get_policy_class
from kvtier.policies.admission import Admission
from kvtier.tiers.refill import check_min_refill
from kvtier.tiers.storage import BlockStorage, TierAccess

if TYPE_CHECKING:
    from kvtier.tiers.tensor_copy import TensorCopier

__all__ = [
    "BUILTIN_TIERS",
    "ENTRY_POINT_GROUP",
    "BaseTierConfig",
    "TierAccess",
    "TierContext",
    "TierKind",
    "open_storage",
    "options_keywords",
    "register_tier",
    "registered_media",
    "tier_kind",
    "unregister_tier",
]

BUILTIN_TIERS: tuple[str, ...] = (
    "kvtier.tiers.pool.kind:GPU_KIND",
    "kvtier.tiers.pool.kind:CPU_KIND",
    "kvtier.tiers.disk.kind:KIND",
    "kvtier.tiers.redis.kind:KIND",
    "kvtier.tiers.sharedfs.kind:KIND",
)
"""The built-in kinds, as `"module:attribute"` of each `TierKind`, in the order configs and
messages list them. They are imported and registered on the registry's first use, as the
plug-ins of `ENTRY_POINT_GROUP` are after them; this is the one list that knows them."""

ENTRY_POINT_GROUP = "kvtier.tiers"
"""The entry-point group in which an installed package names its `TierKind`s."""

_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
_CAPACITY_EXAMPLE = 'expected a block count or a size like "8GiB"'


# --------------------------------------------------------------------------------------------
# What every tier table has
# --------------------------------------------------------------------------------------------


class BaseTierConfig(FrozenModel):
    """What every tier has; the model of each medium extends it with that medium's options
    and narrows `medium` to `Literal["<medium>"]`.

    `capacity` is kept as written (a block count, or a byte size string); `num_blocks` is it
    converted with the enclosing config's block size. The checks that depend on the medium
    (is "auto" allowed, may kvtier choose what the tier admits) read its registered kind.
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
    min_refill: int | str = "auto"
    """The least a background refill demotes at once, in bytes (an integer, or a size like
    "8MiB"; rounded up to whole blocks), at most 1/8 of the tier: a slow tier below is handed
    large writes, not a small one per refill. "auto": 8 MiB when the tier below is a disk
    store, else 0; 0: off, the watermarks alone decide (`kvtier.tiers.refill`)."""

    _num_blocks: int = PrivateAttr(default=0)

    @property
    def num_blocks(self) -> int:
        """How many blocks the tier holds."""
        return self._num_blocks

    @property
    def kind(self) -> TierKind:
        """The declarations registered for this tier's medium (volatile, access, ...)."""
        return tier_kind(self.medium)

    def options(self) -> dict[str, object]:
        """The medium-specific settings worth showing, by key (for display: a tier's line of
        `HierarchyConfig.describe`): those the config sets or that differ from their
        defaults, and those whose default is computed where the config is loaded (a disk
        tier's path); never one left unset (None). A tier with many optional settings
        (redis) would otherwise fill its line with `=None` and defaults."""
        common = set(BaseTierConfig.model_fields)
        shown: dict[str, object] = {}
        for key, info in type(self).model_fields.items():
            value = getattr(self, key)
            if key in common or value is None:
                continue
            computed = info.default_factory is not None
            if key in self.model_fields_set or computed or value != info.default:
                shown[key] = value
        return shown

    @classmethod
    def check_capacity_bytes(cls, size: int) -> None:
        """Raises a validation error when a tier of this model may not hold `size` bytes: more
        than MAX_TIER_BYTES here; a model bounds it further where its medium is (host memory
        by this machine's memory)."""
        if size > MAX_TIER_BYTES:
            raise config_error(
                "capacity", f"{readable_size(size)} is more than a tier may hold (1 PiB)"
            )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if _NAME_PATTERN.fullmatch(value) is None:
            raise config_error(
                "tier_name", 'expected a non-empty name of letters, digits, "_" or "-"'
            )
        return value

    @field_validator("capacity", mode="before")
    @classmethod
    def _check_capacity(cls, value: object) -> int | str:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise config_error("capacity", _CAPACITY_EXAMPLE)
        if isinstance(value, int):
            cls._check_block_count(value)
        else:
            cls._check_size_string(value)
        return value

    @classmethod
    def _check_block_count(cls, count: int) -> None:
        """A capacity given as a block count."""
        if count < 1:
            raise config_error("capacity", "a block count must be at least 1")
        if count > MAX_TIER_BLOCKS:
            raise config_error("capacity", f"at most {MAX_TIER_BLOCKS:,} blocks (2**40)")
        scope = CHAIN_SCOPE.get()
        if scope is not None and scope.block_size is not None:
            cls.check_capacity_bytes(count * scope.block_size)

    @classmethod
    def _check_size_string(cls, value: str) -> None:
        """A capacity given as a size: it needs the chain's block size to mean blocks."""
        try:
            size, has_unit = size_in_bytes(value)
        except SizeError as error:
            reason = _CAPACITY_EXAMPLE if error.malformed else error.reason
            raise config_error("capacity", reason) from None
        if not has_unit:
            raise config_error(
                "capacity",
                'a size string needs a unit, like "8GiB"; write a block count as a bare integer',
            )
        scope = CHAIN_SCOPE.get()
        if scope is None:
            raise config_error(
                "capacity",
                "a byte size needs the block_size of a whole config; "
                "give a block count to build a tier on its own",
            )
        if scope.block_size is not None and size < scope.block_size:
            raise config_error(
                "capacity",
                f"must hold at least one block of {readable_size(scope.block_size)}",
            )
        if scope.block_size is not None and size // scope.block_size > MAX_TIER_BLOCKS:
            raise config_error("capacity", f"at most {MAX_TIER_BLOCKS:,} blocks (2**40)")
        cls.check_capacity_bytes(size)

    @field_validator("policy")
    @classmethod
    def _check_policy(cls, value: str) -> str:
        try:
            get_policy_class(value)
        except UnknownPolicyError as error:
            raise config_error(
                "unknown_policy",
                f"unknown cache policy {json.dumps(value)}; "
                f"valid policies: {', '.join(error.valid)}",
            ) from None
        return value

    @field_validator("admission")
    @classmethod
    def _check_admission(cls, value: str, info: ValidationInfo) -> str:
        medium = info.data.get("medium")
        if value != "all" and medium in registered_media() and tier_kind(medium).owns_index:
            raise config_error(
                "admission",
                f"a {medium} tier keeps its own index (kvtier does not choose what it holds), "
                'so its admission must be "all"',
            )
        return value

    @field_validator("enabled", mode="before")
    @classmethod
    def _check_enabled(cls, value: object, info: ValidationInfo) -> bool | Literal["auto"]:
        enabled = true_false_or_auto(value)
        medium = info.data.get("medium")
        if enabled == "auto" and medium is not None and not tier_kind(medium).auto_enable:
            allowed = [name for name in registered_media() if tier_kind(name).auto_enable]
            if not allowed:
                raise config_error("auto_not_allowed", '"auto" is not allowed on any kind of tier')
            raise config_error(
                "auto_not_allowed",
                '"auto" (enabled when CUDA is available) is only allowed on a '
                f"{' or '.join(allowed)} tier",
            )
        return enabled

    @field_validator("high_watermark", "low_watermark", mode="before")
    @classmethod
    def _check_watermark(cls, value: object, info: ValidationInfo) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise config_error("watermark", "expected a number")
        if not 0 < value <= 1:
            raise config_error("watermark", "must be a fraction above 0 and at most 1")
        high = info.data.get("high_watermark")
        if info.field_name == "low_watermark" and high is not None and value >= high:
            raise config_error("watermark", f"must be below high_watermark ({high})")
        return float(value)

    @field_validator("min_refill", mode="before")
    @classmethod
    def _check_min_refill(cls, value: object, info: ValidationInfo) -> int | str:
        return check_min_refill(value, info.data.get("capacity"))

    @model_validator(mode="after")
    def _resolve_blocks(self) -> BaseTierConfig:
        if isinstance(self.capacity, int):
            self._num_blocks = self.capacity
        else:
            scope = CHAIN_SCOPE.get()
            if scope is not None and scope.block_size is not None:
                self._num_blocks = parse_size(self.capacity) // scope.block_size
        return self


# --------------------------------------------------------------------------------------------
# Kinds
# --------------------------------------------------------------------------------------------

_MEDIUM_PATTERN = re.compile(r"[a-z][a-z0-9_-]*")
_OPENER_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class TierContext:
    """What an opener gets besides its tier's config: the chain's block size, model id and
    tenant (together its `namespace`), the hierarchy's tensor copier, and the options an
    embedder gave for this tier's medium (the disk tier's `max_workers` and `io`, ...)."""

    block_size: int
    model_id: str = ""
    copier: TensorCopier | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    tenant: str = ""
    """Who owns the blocks (`HierarchyConfig.tenant`): part of the namespace, and of a shared
    tier's key derivation."""

    @property
    def namespace(self) -> str:
        """What a block's bytes mean (`block_namespace`): blocks of another namespace are
        foreign, never data."""
        return block_namespace(self.model_id, self.block_size, self.tenant)


Opener = Callable[[Any, TierContext], Awaitable[BlockStorage]]
"""`async def open_tier(config, context) -> BlockStorage`, config being the kind's model."""


@dataclass(frozen=True)
class TierKind:
    """The declarations of one medium (see the module docstring)."""

    medium: str
    """The `medium` value of the tier tables of this kind: lower-case letters, digits, "_"
    and "-", starting with a letter."""
    config_class: type[BaseTierConfig]
    """The pydantic model of a tier table; its `medium` field is `Literal[<medium>]`."""
    _: KW_ONLY
    volatile: bool
    """Blocks are lost on a restart (gpu, cpu); a persistent tier (disk) keeps them."""
    access: TierAccess
    """How bytes reach the tier."""
    opener: str
    """`"package.module:function"` of the tier's `async def open_tier(config, context)`,
    imported only when a storage is opened."""
    owns_index: bool = False
    """The store answers lookups itself (possibly later: "ask again") and evicts by its own
    rules; False for a local slot pool that kvtier manages with a `CachePolicy`."""
    auto_enable: bool = False
    """`enabled = "auto"` is allowed: the tier is built when CUDA is available."""
    shared: bool = False
    """Many nodes (and possibly other tenants) write the store: the chain must name its model
    (`model_id`), so blocks of models whose KV differs never meet, and what is read back is
    authenticated with a secret key (a node that can write the store is not trusted)."""
    options_keyword: str | None = None
    """A keyword argument of `Hierarchy` whose options also go to this medium's opener,
    merged over `tier_options[<medium>]` (the disk's `disk_options`, older than
    `tier_options`), or None."""

    def __post_init__(self) -> None:
        if isinstance(self.medium, str):
            # A plain name, also for a `Medium` member: messages show "gpu", not the member.
            object.__setattr__(self, "medium", str(self.medium))
        if not isinstance(self.medium, str) or _MEDIUM_PATTERN.fullmatch(self.medium) is None:
            raise InvalidValueError(
                "a tier medium must be lower-case letters, digits, '_' or '-', starting with "
                f"a letter, got {self.medium!r}"
            )
        if not isinstance(self.config_class, type) or not issubclass(
            self.config_class, BaseTierConfig
        ):
            raise InvalidValueError(
                f"tier medium {self.medium!r}: config_class must be a BaseTierConfig subclass, "
                f"got {self.config_class!r}"
            )
        annotation = self.config_class.model_fields["medium"].annotation
        if get_origin(annotation) is not Literal or list(get_args(annotation)) != [self.medium]:
            raise InvalidValueError(
                f"tier medium {self.medium!r}: {self.config_class.__name__}.medium must be "
                f'declared Literal["{self.medium}"], got {annotation!r}'
            )
        if not isinstance(self.access, TierAccess):
            raise InvalidValueError(
                f"tier medium {self.medium!r}: access must be a TierAccess, got {self.access!r}"
            )
        if not isinstance(self.opener, str) or _OPENER_PATTERN.fullmatch(self.opener) is None:
            raise InvalidValueError(
                f"tier medium {self.medium!r}: opener must be an import path like "
                f'"package.module:function", got {self.opener!r}'
            )
        keyword = self.options_keyword
        if keyword is not None and (not isinstance(keyword, str) or not keyword.isidentifier()):
            raise InvalidValueError(
                f"tier medium {self.medium!r}: options_keyword must be an identifier or None, "
                f"got {keyword!r}"
            )


_KINDS: dict[str, TierKind] = {}
_LOAD_LOCK = threading.RLock()
_load_state: Literal["not loaded", "loading", "loaded"] = "not loaded"
"""Where the loading of the built-in and plug-in kinds is (see `_load_kinds`)."""


def _load_kinds() -> None:
    """Registers the built-in kinds (`BUILTIN_TIERS`), then the plug-ins' (`ENTRY_POINT_GROUP`),
    on the registry's first use; every function of the registry calls it first, so the
    built-ins are always listed first. A kind's module that registers itself while it is
    loaded (a plug-in also usable by import) finds the load under way and goes on."""
    global _load_state
    with _LOAD_LOCK:
        if _load_state != "not loaded":
            return
        _load_state = "loading"
        try:
            for path in BUILTIN_TIERS:
                _register_loaded(_import_attribute(path))
            for entry in entry_points(group=ENTRY_POINT_GROUP):
                _register_loaded(_plugin_kind(entry))
        except BaseException:
            _load_state = "not loaded"  # asked again, the load is tried again
            raise
        _load_state = "loaded"


def _register_loaded(kind: object) -> None:
    """Registers a kind found by `_load_kinds` (one its module registered already is kept)."""
    if not isinstance(kind, TierKind):
        raise InvalidValueError(f"a tier kind must be a TierKind, got {kind!r}")
    if _KINDS.get(kind.medium) is not kind:
        register_tier(kind)


def _plugin_kind(entry: EntryPoint) -> TierKind:
    """The `TierKind` a `kvtier.tiers` entry point names, loaded now."""
    named = f"the tier plug-in {entry.name} = {entry.value!r} (entry-point group {entry.group})"
    try:
        kind = entry.load()
    except Exception as error:
        raise InvalidValueError(f"{named} cannot be loaded: {error}") from error
    if not isinstance(kind, TierKind):
        raise InvalidValueError(f"{named} is not a TierKind, got {kind!r}")
    return kind


def register_tier(kind: TierKind, *, replace: bool = False) -> None:
    """Make `kind.medium` a medium that configs may name. A medium already registered raises
    InvalidValueError, unless `replace` (the new kind then takes its place)."""
    _load_kinds()
    if not isinstance(kind, TierKind):
        raise InvalidValueError(f"register_tier takes a TierKind, got {kind!r}")
    if kind.medium in _KINDS and not replace:
        raise InvalidValueError(
            f"tier medium {kind.medium!r} is already registered "
            f"(by {_KINDS[kind.medium].config_class.__qualname__}); pass replace=True to "
            "replace it"
        )
    _KINDS[kind.medium] = kind


def unregister_tier(medium: str) -> TierKind:
    """Forget a medium (for tests, and for an embedder that swaps a kind out); returns its
    kind. An unknown medium raises as `tier_kind` does."""
    kind = tier_kind(medium)
    del _KINDS[kind.medium]
    return kind


def tier_kind(medium: str) -> TierKind:
    """The kind registered for `medium`; InvalidValueError, listing the registered media, if
    there is none."""
    _load_kinds()
    kind = _KINDS.get(medium) if isinstance(medium, str) else None
    if kind is None:
        listed = ", ".join(f'"{name}"' for name in _KINDS)
        shown = repr(str(medium)) if isinstance(medium, str) else repr(medium)
        raise InvalidValueError(f"unknown tier medium {shown}; registered media: {listed}")
    return kind


def registered_media() -> list[str]:
    """The registered media, in registration order (the built-ins first)."""
    _load_kinds()
    return list(_KINDS)


def options_keywords() -> dict[str, str]:
    """The `options_keyword` of each kind that declares one, to its medium."""
    _load_kinds()
    return {kind.options_keyword: kind.medium for kind in _KINDS.values() if kind.options_keyword}


async def open_storage(config: BaseTierConfig, context: TierContext) -> BlockStorage:
    """The storage of one tier: imports its kind's opener and awaits it.

    Raises InvalidValueError when the medium is not registered, `config` is not an instance of
    its kind's model, the opener does not exist, or it returns something that is not a
    `BlockStorage` or whose `access` is not the kind's (that storage is closed first: the
    engine would route its bytes by the kind's declaration); ImportError when the opener's
    module (or a library it needs) is missing.
    """
    kind = tier_kind(config.medium)
    if not isinstance(config, kind.config_class):
        raise InvalidValueError(
            f"a {kind.medium} tier is configured by {kind.config_class.__name__}, "
            f"got {type(config).__name__}"
        )
    storage = await _opener(kind)(config, context)
    if not isinstance(storage, BlockStorage):
        raise InvalidValueError(
            f"the opener {kind.opener} of the {kind.medium} tier returned "
            f"{type(storage).__name__}, not a BlockStorage"
        )
    if storage.access is not kind.access:
        mismatch = InvalidValueError(
            f"tier {config.name!r}: the {kind.medium} kind declares access "
            f"{kind.access.value!r}, but its opener {kind.opener} returned a "
            f"{type(storage).__name__}, whose access is {storage.access.value!r}"
        )
        try:
            await storage.aclose()
        except Exception as error:
            raise mismatch from error
        raise mismatch
    return storage


def _opener(kind: TierKind) -> Opener:
    """The function `kind.opener` names, imported now."""
    opener = _import_attribute(kind.opener)
    if not callable(opener):
        module_name, _, function_name = kind.opener.partition(":")
        raise InvalidValueError(
            f"the opener of the {kind.medium} tier does not exist: module {module_name} has "
            f"no function {function_name}"
        )
    return opener


def _import_attribute(path: str) -> object:
    """What `"package.module:name"` names (None when the module has no such name), its
    module imported now."""
    module_name, _, name = path.partition(":")
    return getattr(importlib.import_module(module_name), name, None)
