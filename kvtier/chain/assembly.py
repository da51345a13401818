"""Opening and closing a chain from a config: the one place that reads the tiers'
declarations (`TierKind`: `owns_index`, `access`, the opener of its medium).

`open_chain` opens each active tier of the config, top first (its storage by its kind's
opener, then its bookkeeping: a slot pool restored from what a persistent tier holds, or
for a tier that owns its index, a memory of what it holds that asks the store about the
rest), then builds the chain's bookkeeping, staging arena, transfer engine and supervisor
over them (`Chain`). A tier that cannot be opened stops the open when the config is strict,
else it is left out (listed in `Chain.disabled`). A failed open closes what it opened, so a
disk store's lock is free for the next try. `close_chain` settles the jobs in flight and
closes every storage, also when one of them fails to close. A config's
`switch_interval_ms` is held from the end of `open_chain` to the end of `close_chain`
(`switch_interval.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.chain import switch_interval
from kvtier.chain.runtime import Chain, ChangeSignal
from kvtier.chain.stats import TierInfo
from kvtier.config import BaseTierConfig, HierarchyConfig
from kvtier.engine import DEFAULT_STAGING_BYTES, StagingArena, TensorCopier, TransferEngine
from kvtier.errors import InvalidValueError, KvtierError
from kvtier.manager import ChainTier, KeyedTierManager, TieredManager, make_tier_manager
from kvtier.tiers.keyed import KeyedStorage
from kvtier.tiers.refill import refill_floors
from kvtier.tiers.registry import TierAccess, TierContext, open_storage
from kvtier.tiers.storage import BlockStorage

log = logging.getLogger("kvtier.chain")


@dataclass(frozen=True, slots=True)
class ChainOptions:
    """How to run a chain (the hierarchy's keyword options, already checked):
    `max_concurrency` copies at once per tier, `max_pending_cascades` write-through cascades
    queued before new ones are dropped, `staging_bytes` of host memory for snapshots on
    their way to slow tiers, and per medium, options for its opener."""

    max_concurrency: int = 4
    max_pending_cascades: int = 64
    staging_bytes: int = DEFAULT_STAGING_BYTES
    tier_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class _Opened:
    """The tiers opened so far, top first, and those left out."""

    configs: list[BaseTierConfig] = field(default_factory=list)
    storages: list[BlockStorage] = field(default_factory=list)
    tiers: list[ChainTier] = field(default_factory=list)
    info: list[TierInfo] = field(default_factory=list)
    disabled: dict[str, str] = field(default_factory=dict)


async def open_chain(config: HierarchyConfig, options: ChainOptions) -> Chain:
    """Open every active tier of `config` and start the chain over them (see the module
    docstring). Raises a KvtierError naming the tier when a strict open fails, and when
    no tier is left."""
    signal = ChangeSignal()
    copier = TensorCopier()
    opened = _Opened()
    manager: TieredManager | None = None
    try:
        for tier in config.active_tiers():
            await _open_tier(config, tier, options, copier, signal, opened)
        _check_some_opened(opened)
        tensor = [tier.kind.access is TierAccess.TENSOR for tier in opened.configs]
        staging = None if all(tensor) else _staging_arena(options, config.block_size)
        manager = TieredManager(
            opened.tiers,
            write_policy=config.write_policy,
            watermarks=[(tier.low_watermark, tier.high_watermark) for tier in opened.configs],
            # a merged refill copy still fits the arena (so it is snapshotted, not waited for)
            merge_demotions_up_to=0 if staging is None else staging.num_blocks,
            # each refill hands a disk below one large write (`BaseTierConfig.min_refill`)
            min_refills=refill_floors(opened.configs, config.block_size),
            # a refill is planned once the put that made it due returned (`Chain.plan_refills`)
            defer_refills=True,
        )
        engine = TransferEngine(
            manager,
            opened.storages,
            copier=copier,
            max_concurrency=options.max_concurrency,
            max_pending_cascades=options.max_pending_cascades,
            staging=staging,
            tensor_tiers=tensor,
        )
        chain = Chain(manager, engine, opened.storages, opened.info, opened.disabled, signal)
        # (the process's interval: held while the chain is open)
        chain.release_switch_interval = switch_interval.hold(config.switch_interval_ms)
        return chain
    except BaseException:
        if manager is not None:
            manager.shutdown()
        await close_storages(opened.storages)
        raise


async def close_chain(chain: Chain, deadline: float) -> None:
    """Wait for the reads and transfers in flight until `deadline` (the loop's clock), then
    cancel the rest, and close every storage (the first failure to close is raised once all
    are closed). Idempotent."""
    if chain.state == "closed":
        return
    chain.state = "closing"
    try:
        await chain.settle(deadline)
    finally:
        try:
            await close_storages(chain.storages, reraise=True)
        finally:
            chain.manager.shutdown()
            chain.state = "closed"
            chain.release_switch_interval()


def _check_some_opened(opened: _Opened) -> None:
    """A KvtierError saying why when no tier of the chain is open."""
    if opened.configs:
        return
    if opened.disabled:
        raise KvtierError(
            "no tier of the chain could be opened: "
            + "; ".join(f"{name}: {why}" for name, why in opened.disabled.items())
        )
    raise KvtierError('the config has no active tier here (only "auto" GPU tiers, and no CUDA?)')


def _staging_arena(options: ChainOptions, block_size: int) -> StagingArena:
    """The arena of snapshots to slow tiers; a KvtierError saying what was asked when the
    host memory cannot be had."""
    try:
        return StagingArena.sized(options.staging_bytes, block_size)
    except (OSError, MemoryError, RuntimeError, OverflowError) as error:
        raise KvtierError(
            f"cannot allocate the staging arena ({options.staging_bytes:,} bytes asked "
            f"by staging_bytes, at least 64 blocks of {block_size:,} bytes): "
            f"{type(error).__name__}: {error}"
        ) from error


async def _open_tier(
    config: HierarchyConfig,
    tier: BaseTierConfig,
    options: ChainOptions,
    copier: TensorCopier,
    signal: ChangeSignal,
    opened: _Opened,
) -> None:
    """Open one tier's storage and bookkeeping into `opened`, or note it disabled when it
    cannot be opened and the config is not strict. Bad `tier_options` for its medium are an
    InvalidValueError, never a disabled tier: they are the caller's mistake, not the store's
    state."""
    storage: BlockStorage | None = None
    try:
        storage = await _open_storage(config, tier, options, copier)
        bookkeeping = _bookkeeping(config, tier, storage, signal)
    except TypeError as error:
        await close_storages([] if storage is None else [storage])
        given = options.tier_options.get(tier.kind.medium)
        if storage is not None or not given:
            raise
        raise InvalidValueError(
            f"tier {tier.name!r}: the {tier.kind.medium} tier does not take the options "
            f"given in tier_options[{tier.kind.medium!r}] ({', '.join(sorted(given))}): "
            f"{error}"
        ) from error
    except (KvtierError, OSError, MemoryError, RuntimeError) as error:
        await close_storages([] if storage is None else [storage])
        if config.strict:
            raise open_failure(tier, error) from error
        # One tier that cannot open (a damaged or locked store, a full disk, no memory)
        # must not keep the serving engine from starting: it is left out.
        reason = f"{type(error).__name__}: {error}"
        log.error("tier %r disabled: it could not be opened: %s", tier.name, reason)
        opened.disabled[tier.name] = reason
        return
    except BaseException:
        await close_storages([] if storage is None else [storage])
        raise
    opened.configs.append(tier)
    opened.storages.append(storage)
    opened.tiers.append(bookkeeping)
    policy = "own" if tier.kind.owns_index else tier.policy
    where = storage.describe()
    opened.info.append(TierInfo(tier.name, str(tier.medium), policy, tier.num_blocks, where))


async def _open_storage(
    config: HierarchyConfig, tier: BaseTierConfig, options: ChainOptions, copier: TensorCopier
) -> BlockStorage:
    """The tier's storage, opened by its kind's opener (see `kvtier.tiers.registry`).
    Cancelled meanwhile, it lets the opener finish (a disk store opens in a thread that
    cannot be stopped) and closes what it opened, so no lock is left held."""
    context = TierContext(
        config.block_size,
        config.model_id,
        copier,
        dict(options.tier_options.get(tier.kind.medium, {})),
        tenant=config.tenant,
    )
    opening = asyncio.ensure_future(open_storage(tier, context))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        await asyncio.wait([opening])
        if not opening.cancelled() and opening.exception() is None:
            await close_storages([opening.result()])
        raise


def _bookkeeping(
    config: HierarchyConfig, tier: BaseTierConfig, storage: BlockStorage, signal: ChangeSignal
) -> ChainTier:
    """The chain's bookkeeping of one open tier: a slot pool with its policy (restored
    from what a persistent tier holds), or, for a tier that owns its index (its kind
    declares it, and its storage is a `KeyedStorage`), a memory of what it holds that asks
    the store about the rest; the store's answers poke the chain's change signal."""
    if tier.kind.owns_index:
        if not isinstance(storage, KeyedStorage):
            raise InvalidValueError(
                f"tier {tier.name!r}: a {tier.kind.medium} tier owns its index, so its "
                f"storage must be a KeyedStorage, got {type(storage).__name__}"
            )
        storage.set_listener(signal.poke)
        return KeyedTierManager(
            storage, tier.num_blocks, config.block_size, name=tier.name, medium=str(tier.medium)
        )
    manager = make_tier_manager(
        tier.num_blocks,
        config.block_size,
        tier.medium,
        tier.policy,
        name=tier.name,
        admission=tier.admission,
    )
    cold = storage.restore_cold()
    if cold is not None:  # held compactly, outside the policy (kvtier.manager.cold)
        manager.restore_cold(cold)
        return manager
    restored = storage.restore()
    if restored:
        manager.restore([(block.key, block.slot) for block in restored])
    return manager


def open_failure(tier: BaseTierConfig, error: Exception) -> KvtierError:
    """The error that stops a strict open because `tier` could not be opened: its message
    names the tier, its medium and why (and what `strict` means). It is of the class of
    `error` when that is a KvtierError built from a message alone (`except DiskLockedError`
    still catches it), else a plain KvtierError; the caller chains `error` to it."""
    what = f"tier {tier.name!r} ({tier.medium}) could not be opened"
    hint = (
        "strict = true: a tier that cannot be opened stops the open; fix it, or set "
        "strict = false to start without it"
    )
    if isinstance(error, KvtierError):
        kind = type(error)
        if kind.__init__ in (Exception.__init__, OSError.__init__):
            return kind(f"{what}: {error} ({hint})")
    return KvtierError(f"{what}: {type(error).__name__}: {error} ({hint})")


async def close_storages(storages: Sequence[BlockStorage], *, reraise: bool = False) -> None:
    """Close every storage, also when one of them fails to close (a broken tier must not
    keep the others, or their locks, open). Failures are logged; with `reraise`, the first
    is raised once all are closed."""
    first: Exception | None = None
    for storage in storages:
        try:
            await storage.aclose()
        except Exception as error:
            log.error("closing %s failed: %r", _safe_describe(storage), error)
            first = first or error
    if reraise and first is not None:
        raise first


def _safe_describe(storage: BlockStorage) -> str:
    """`storage.describe()` for a log line about a storage that may be broken."""
    try:
        return storage.describe()
    except Exception:
        return type(storage).__name__


__all__ = [
    "ChainOptions",
    "close_chain",
    "close_storages",
    "open_chain",
    "open_failure",
]
