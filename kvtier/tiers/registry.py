"""The tier registry: which kinds of tier exist, and what each one declares.

A `TierKind` is everything kvtier needs to know about one `medium`: the pydantic model of its
`[[tiers]]` table, whether its blocks are lost on a restart, whether it answers lookups (and
evicts) by itself, how bytes reach it, whether `enabled = "auto"` is allowed, and how to open
its storage. The config validates each tier table with the model its medium's kind names, the
rules across tiers read the declarations, and a hierarchy opens storages with `open_storage`.
Nothing else in config, chain, engine or hierarchy names a medium.

A new tier is one module: its config model, its storage, and one `register_tier` call:

    class RedisTierConfig(BaseTierConfig):
        medium: Literal["redis"]
        url: str = "redis://localhost:6379"

    async def open_redis_tier(config: RedisTierConfig, context: TierContext) -> BlockStorage:
        ...

    register_tier(
        TierKind(
            "redis",
            RedisTierConfig,
            volatile=False,
            owns_index=True,
            access=TierAccess.CLIENT,
            opener="my_package.redis_tier:open_redis_tier",
        )
    )

Importing that module registers the kind, so import it before validating a config that names
its medium. The opener is an import path, resolved only when a storage is opened: validating a
config never imports torch or a client library. Where a tier's bytes live (for `tiers` and
reports) is the storage's own business: its `describe()`, where it has one.

gpu, cpu and disk are registered when this module is imported; their openers are in
`kvtier.tiers.builtin`.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from kvtier.config import BaseTierConfig, CPUTierConfig, DiskTierConfig, GPUTierConfig
from kvtier.errors import InvalidValueError
from kvtier.namespaces import block_namespace
from kvtier.specs.base import Medium
from kvtier.tiers.remote.config import RedisTierConfig, SharedFSTierConfig
from kvtier.tiers.storage import BlockStorage, TierAccess

if TYPE_CHECKING:
    from kvtier.tiers.tensor_copy import TensorCopier

__all__ = [
    "TierAccess",
    "TierContext",
    "TierKind",
    "open_storage",
    "register_tier",
    "registered_media",
    "tier_kind",
    "unregister_tier",
]

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


_KINDS: dict[str, TierKind] = {}


def register_tier(kind: TierKind, *, replace: bool = False) -> None:
    """Make `kind.medium` a medium that configs may name. A medium already registered raises
    InvalidValueError, unless `replace` (the new kind then takes its place)."""
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
    kind = _KINDS.get(medium) if isinstance(medium, str) else None
    if kind is None:
        listed = ", ".join(f'"{name}"' for name in _KINDS)
        shown = repr(str(medium)) if isinstance(medium, str) else repr(medium)
        raise InvalidValueError(f"unknown tier medium {shown}; registered media: {listed}")
    return kind


def registered_media() -> list[str]:
    """The registered media, in registration order (the built-ins first)."""
    return list(_KINDS)


async def open_storage(config: BaseTierConfig, context: TierContext) -> BlockStorage:
    """The storage of one tier: imports its kind's opener and awaits it.

    Raises InvalidValueError when the medium is not registered, `config` is not an instance of
    its kind's model, the opener does not exist, or it returns something that is not a
    `BlockStorage`; ImportError when the opener's module (or a library it needs) is missing.
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
    return storage


def _opener(kind: TierKind) -> Opener:
    """The function `kind.opener` names, imported now."""
    module_name, _, function_name = kind.opener.partition(":")
    module = importlib.import_module(module_name)
    opener = getattr(module, function_name, None)
    if not callable(opener):
        raise InvalidValueError(
            f"the opener of the {kind.medium} tier does not exist: module {module_name} has "
            f"no function {function_name}"
        )
    return opener  # type: ignore[no-any-return]


register_tier(
    TierKind(
        Medium.GPU,
        GPUTierConfig,
        volatile=True,
        access=TierAccess.TENSOR,
        auto_enable=True,
        opener="kvtier.tiers.builtin:open_gpu_tier",
    )
)
register_tier(
    TierKind(
        Medium.CPU,
        CPUTierConfig,
        volatile=True,
        access=TierAccess.TENSOR,
        opener="kvtier.tiers.builtin:open_cpu_tier",
    )
)
register_tier(
    TierKind(
        Medium.DISK,
        DiskTierConfig,
        volatile=False,
        access=TierAccess.HOST_BUFFERS,
        opener="kvtier.tiers.builtin:open_disk_tier",
    )
)
register_tier(
    TierKind(
        "redis",
        RedisTierConfig,
        volatile=False,
        owns_index=True,
        shared=True,
        access=TierAccess.CLIENT,
        opener="kvtier.tiers.remote.redis:open_redis_tier",
    )
)
register_tier(
    TierKind(
        "shared-fs",
        SharedFSTierConfig,
        volatile=False,
        owns_index=True,
        shared=True,
        access=TierAccess.CLIENT,
        opener="kvtier.tiers.remote.sharedfs:open_sharedfs_tier",
    )
)
