"""`Hierarchy`: the standalone async API: open a tier chain, put / lookup / get blocks by key.

```python
async with Hierarchy.from_toml("configs/default.toml") as h:
    await h.put(keys, blocks)       # blocks: uint8 tensor [n, block_bytes], any device
    n = h.lookup(keys)              # leading keys held by some tier
    out = await h.get(keys[:n])     # uint8 tensor [m, block_bytes] on the top tier's device
    h.where(keys[0]); h.stats(); h.take_events()
```

A hierarchy runs in the caller's event loop. Its background transfers (promotions,
demotions, cascades) are tasks of its own `JobSupervisor`, never of the caller's task: an
error of any class in a tier becomes a miss or a failed store, counted and logged, and
never reaches or cancels the caller. `SyncHierarchy` runs one on a loop thread of its own,
for an embedder that is not async.

A `put` returns once its blocks are in the top tier: a tier with a tier below keeps a
reserve of free slots (its `low_watermark` / `high_watermark`), refilled by background
demotion, and a demotion to a slow tier gives its slots back after a memory copy into a
staging arena. A put waits only when the reserve is exhausted (counted as backpressure).

Reads degrade, they never fail: a block that disappeared, failed its checksum or did not
arrive by the deadline (`load_timeout_s`, 5 s by default) ends the prefix `get` returns
(recompute the rest). Bad input (wrong dtype or block size, duplicate keys, a closed
hierarchy) raises a `KvtierError`.

Closing waits for the transfers in flight; with `flush_on_close` (the default when the chain
has a persistent tier) it first copies what only volatile tiers hold down to the bottom
tier, within `flush_timeout_s`.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import logging
import math
import numbers
import operator
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from kvtier.config import (
    MAX_TIER_BYTES,
    BaseTierConfig,
    HierarchyConfig,
    load_config,
    parse_config,
    physical_memory,
)
from kvtier.engine import CALLER, MoveResult, Priority, TensorCopier, TransferEngine
from kvtier.engine.engine import finish_even_if_cancelled
from kvtier.engine.staging import DEFAULT_STAGING_BYTES, StagingArena
from kvtier.engine.supervisor import JobSupervisor, SupervisorCounters
from kvtier.errors import InvalidValueError, KeyFormatError, KvtierError, ManagerClosedError
from kvtier.keys import OffloadKey, check_key, describe_key
from kvtier.manager import (
    ChainCounters,
    OffloadingEvent,
    TieredManager,
    TierStats,
    TransferJob,
    make_tier_manager,
)
from kvtier.manager.chain_tier import ChainTier
from kvtier.manager.jobs import PromotionHold
from kvtier.manager.keyed import KeyedTierManager
from kvtier.manager.tiered import TieredStoreOutput, slot_ids
from kvtier.metrics import LatencyHistogram, register_metrics, unregister_metrics
from kvtier.tiers.keyed import KeyedStorage
from kvtier.tiers.registry import TierAccess, TierContext, open_storage, registered_media
from kvtier.tiers.storage import BlockStorage, TensorStorage

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("kvtier.hierarchy")

WAIT_SLICE_S = 0.05
"""Longest single wait of a `get` for a transfer before it looks again (a safety net: it is
normally woken by the transfer's completion)."""

DEFAULT_LOAD_TIMEOUT_S = 5.0
"""Default deadline of a `get`: past it, what has not arrived is a miss (recompute)."""

DEFAULT_STORE_TIMEOUT_S = 60.0
"""Default bound of a `put`'s wait for room in the top tier (backpressure): past it the put
goes on and evicts (or refuses) as it must, and the expiry is counted
(`stats().calls.put_store_timeouts`). Separate from `get`'s deadline: a busy machine slows
demotions, and a store that gives up early loses offloads exactly when the engine is busiest."""

DEFAULT_FLUSH_TIMEOUT_S = 30.0
"""Default time budget of the flush on close; what did not reach the bottom tier by then is
reported (logged and in `last_flush`) and stays volatile."""

DEFAULT_METRICS_NAME = "default"
"""The `hierarchy` label of a hierarchy's metrics when `metrics_name` is not given."""

DISABLED_LOG_INTERVAL_S = 60.0
"""While tiers are disabled, `stats()` logs them (which, and why) at most once per this many
seconds: a dashboard polling `stats()` every second gets one line a minute, not sixty."""


@dataclass(frozen=True, slots=True)
class TierInfo:
    """One tier of an open hierarchy: its config'd name and medium, and where it really is."""

    name: str
    medium: str
    policy: str
    num_blocks: int
    where: str


@dataclass(slots=True)
class HierarchyCounters:
    """What the API calls did (blocks)."""

    put_blocks: int = 0
    put_stored: int = 0
    put_present: int = 0
    """Blocks a tier already held (not stored again)."""
    put_refused: int = 0
    """Blocks not stored: the top tier had no room (every block pinned) or its policy did not
    admit them (`CachePolicy.admit`)."""
    put_partial: int = 0
    """Partial blocks (`put(partial_last=True)`) not stored."""
    put_failed: int = 0
    put_backpressure_waits: int = 0
    """Puts that found the top tier's reserve exhausted and waited for background demotions
    to give slots back."""
    put_demotion_waits: int = 0
    """Puts that had to evict at once and waited for their victims' snapshot (a memory copy)."""
    put_store_timeouts: int = 0
    """Puts whose wait for room passed `store_timeout_s` (they went on and evicted or
    refused as they had to)."""
    get_blocks: int = 0
    get_served: int = 0
    get_timeouts: int = 0
    get_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Latency of `get` / `get_into` calls, in fixed buckets (see `LatencyHistogram`)."""
    put_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Latency of `put` calls, backpressure included."""


@dataclass(frozen=True, slots=True)
class TierActivity:
    """What one tier did since the hierarchy opened (blocks), for `stats()` and the metrics.

    `hits`: lookups it answered; `misses`: lookups it could not (hits of the tiers below it
    and misses of the chain); `stored`: blocks stored into it; `refused`: blocks it did not
    take (its policy did not admit them, or no room); `evicted`: blocks its policy evicted;
    `demoted` / `promoted`: blocks copied from it to a tier below / into it from a tier below;
    `corrupt`: blocks read from it that failed their checksum; `events_dropped`: blocks of
    events dropped because nobody took them (`take_events`) before its event log was full."""

    name: str
    hits: int
    misses: int
    stored: int
    refused: int
    evicted: int
    demoted: int
    promoted: int
    corrupt: int
    events_dropped: int


@dataclass(frozen=True, slots=True)
class TransferStats:
    """Copies from `source` to `target` (tier names, or "caller" for the embedder's
    tensors): blocks and bytes moved, seconds during which a copy was in flight, copies
    made, blocks whose copy failed (a failed store into `target`, or a failed load when it
    is the caller) and blocks found corrupt at `source`."""

    source: str
    target: str
    blocks: int
    bytes: int
    seconds: float
    copies: int
    failed: int
    corrupt: int


@dataclass(frozen=True, slots=True)
class HierarchyStats:
    """A snapshot: occupancy per tier, the chain's decisions, traffic per tier pair."""

    tiers: list[TierStats]
    info: list[TierInfo]
    chain: ChainCounters
    calls: HierarchyCounters
    pairs: dict[tuple[str, str], tuple[int, int, float]]
    """(source, destination) -> (blocks, bytes, seconds during which a copy of the pair was
    in flight: concurrent copies are counted once, so bytes / seconds is its throughput)."""
    jobs: dict[str, int]
    cascades_dropped: int
    corrupt_blocks: int
    failed_blocks: int
    gone_blocks: int = 0
    """Reads of blocks a shared store (Redis, shared-fs) no longer held or could not be
    asked for: misses, not damage."""
    errors: dict[str, int] = field(default_factory=dict)
    """Copies that raised, by exception class (each is a miss or a failed store)."""
    supervisor: SupervisorCounters = field(default_factory=SupervisorCounters)
    staging_waits: int = 0
    """Demotions and cascades that waited for room in the staging arena (backpressure)."""
    queue_depths: dict[str, int] = field(default_factory=dict)
    """Copies waiting at each tier's queue when the snapshot was taken."""
    disabled_tiers: dict[str, str] = field(default_factory=dict)
    """Disabled tiers, name -> why: tiers of the config left out because they could not be
    opened (`strict = false`), and tiers that disabled themselves while open (a disk tier
    whose files were removed or replaced under it: its stores fail, its reads are misses)."""
    activity: list[TierActivity] = field(default_factory=list)
    """Per tier, top first (as `tiers`): what it did (hits, stores, evictions, ...)."""
    transfers: list[TransferStats] = field(default_factory=list)
    """Per tier pair, in the order the engine first moved bytes between them (`pairs`,
    with copies, failures and corrupt blocks)."""
    events_dropped: int = 0
    """Blocks of events dropped, every tier together (see `TierActivity.events_dropped`)."""

    def latency_percentile(self, q: float) -> float:
        """The q-th percentile (0..100) of `get` latencies, in seconds (0 if none),
        estimated from `calls.get_latency`'s buckets (within a bucket's width: 25 %)."""
        return self.calls.get_latency.percentile(q)


def _describe(storage: BlockStorage) -> str:
    """Where a tier's bytes live, for `tiers` and reports (fixed for the tier's lifetime)."""
    describe = getattr(storage, "describe", None)
    if callable(describe):
        return str(describe())
    path = getattr(storage, "path", None)
    direct = getattr(storage, "direct_io_active", False)
    compression = getattr(storage, "compression", "none")
    mode = "O_DIRECT" if direct else "buffered"
    codec = "" if compression == "none" else f", {compression}"
    return f"files in {path} ({mode}{codec})" if path is not None else type(storage).__name__


@dataclass(frozen=True, slots=True)
class FlushReport:
    """What a flush did: blocks copied to the bottom tier, and blocks still held only by
    volatile tiers when it ended (0: everything readable is in the bottom tier)."""

    copied: int
    left: int


def _check_keys(
    keys: Sequence[OffloadKey], what: str, *, distinct: bool = True
) -> list[OffloadKey]:
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


def _check_seconds(value: object, what: str, *, none_ok: bool = True) -> float | None:
    """A positive, finite number of seconds (None when `none_ok`), or InvalidValueError.
    Any real number is taken (a numpy scalar too); an int too large for a float is refused
    like infinity rather than raising OverflowError."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidValueError(f"{what} must be a number of seconds, got {_shown(value)}")
    try:
        seconds = float(value)
    except (OverflowError, ValueError, TypeError):
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        hint = " (None waits without a deadline)" if none_ok else ""
        raise InvalidValueError(f"{what} must be a finite number > 0, got {_shown(value)}{hint}")
    return seconds


def _check_count(value: object, what: str, minimum: int) -> int:
    """An int (or an int-like numpy scalar, not a bool) >= minimum, or InvalidValueError
    naming `what`."""
    count: int | None = None
    if not isinstance(value, bool | float) and hasattr(value, "__index__"):
        try:
            count = operator.index(value)
        except TypeError:
            count = None
    if count is None or count < minimum:
        raise InvalidValueError(f"{what} must be an int >= {minimum}, got {_shown(value)}")
    return count


def _shown(value: object, limit: int = 48) -> str:
    """`repr(value)`, cut short for an error message (a 600-digit int is not helpful)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _max_staging_bytes() -> int:
    """The most host memory a staging arena may ask for: this machine's memory (1 PiB where
    the platform does not say), so a typo is an error here, not an OverflowError or ENOMEM
    at open."""
    memory = physical_memory()
    return MAX_TIER_BYTES if memory is None else min(memory, MAX_TIER_BYTES)


def _check_option_keys(options: Mapping[Any, Any], what: str) -> None:
    """An opener's options are keyword arguments: their names must be strings."""
    for name in options:
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidValueError(f"{what}: option names must be identifiers, got {name!r}")


def _check_option_names(options: Mapping[str, Any], what: str) -> None:
    """Every name in `options` is a keyword option of `Hierarchy(...)`, or an
    InvalidValueError listing them (rather than Python's TypeError from the call)."""
    known = sorted(
        name
        for name, parameter in inspect.signature(Hierarchy.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    )
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidValueError(
            f"{what}: unknown option {', '.join(unknown)}; the options are {', '.join(known)}"
        )


def _config_path(path: str | os.PathLike[str], what: str) -> Path:
    """`path` as a Path; a bytes path (or a PathLike that gives bytes) is an
    InvalidValueError rather than Path's TypeError."""
    try:
        return Path(path)
    except TypeError as error:
        raise InvalidValueError(f"{what}: a config path must be a str path: {error}") from None


async def _close_all(storages: Sequence[BlockStorage], *, reraise: bool = False) -> None:
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


def _open_failure(tier: BaseTierConfig, error: Exception) -> KvtierError:
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


def _safe_describe(storage: BlockStorage) -> str:
    """`_describe` for a log line about a storage that may be broken."""
    try:
        return _describe(storage)
    except Exception:
        return type(storage).__name__


class Hierarchy:
    """An open tier chain: bookkeeping, storages and the transfer engine, in one event loop."""

    def __init__(
        self,
        config: HierarchyConfig,
        *,
        load_timeout_s: float | None = DEFAULT_LOAD_TIMEOUT_S,
        store_timeout_s: float | None = DEFAULT_STORE_TIMEOUT_S,
        max_concurrency: int = 4,
        max_pending_cascades: int = 64,
        disk_options: Mapping[str, Any] | None = None,
        tier_options: Mapping[str, Mapping[str, Any]] | None = None,
        flush_on_close: bool | None = None,
        flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        metrics: CollectorRegistry | None = None,
        metrics_name: str = DEFAULT_METRICS_NAME,
    ) -> None:
        """`load_timeout_s`: default deadline of `get` (None: wait as long as it takes).
        `store_timeout_s`: longest wait of a `put` for room in the top tier while background
        demotions free it (backpressure; None: as long as it takes); past it the put evicts
        or refuses as it must, counted in `stats().calls.put_store_timeouts`.
        `flush_on_close`: copy what only volatile tiers hold down to the bottom tier when
        closing; None (default) means yes when the chain has a persistent tier.
        `flush_timeout_s`: time budget of that flush. `staging_bytes`: host memory for
        snapshots of blocks on their way to slow tiers (see `StagingArena`).
        `tier_options`: per medium, options for its opener (e.g. `{"disk": {"io": ...}}`);
        `disk_options` is the same for the disk medium.
        `metrics`: a `prometheus_client.CollectorRegistry` to export the hierarchy's metrics
        on (read at scrape time from the counters `stats()` reports; needs the `metrics`
        extra), with the label `hierarchy=metrics_name`: hierarchies sharing a registry need
        distinct names (the same name twice is an InvalidValueError)."""
        if not isinstance(config, HierarchyConfig):
            raise InvalidValueError(
                f"config must be a HierarchyConfig (see Hierarchy.from_config for a dict or a "
                f"file), got {type(config).__name__}"
            )
        load_timeout_s = _check_seconds(load_timeout_s, "load_timeout_s")
        store_timeout_s = _check_seconds(store_timeout_s, "store_timeout_s")
        flush_timeout_s = _check_seconds(flush_timeout_s, "flush_timeout_s", none_ok=False) or 0.0
        max_concurrency = _check_count(max_concurrency, "max_concurrency", 1)
        max_pending_cascades = _check_count(max_pending_cascades, "max_pending_cascades", 0)
        staging_bytes = _check_count(staging_bytes, "staging_bytes", 1)
        if staging_bytes > _max_staging_bytes():
            raise InvalidValueError(
                f"staging_bytes must be at most {_max_staging_bytes():,} (this machine's memory; "
                f"it is host memory), got {staging_bytes:,}"
            )
        if flush_on_close is not None and not isinstance(flush_on_close, bool):
            raise InvalidValueError(
                f"flush_on_close must be a bool or None, got {flush_on_close!r}"
            )
        for name, options in (("tier_options", tier_options), ("disk_options", disk_options)):
            if options is not None and not isinstance(options, Mapping):
                raise InvalidValueError(f"{name} must be a mapping, got {type(options).__name__}")
        media = registered_media()
        for medium, options in (tier_options or {}).items():
            if not isinstance(medium, str) or medium not in media:
                # Options for a medium no tier can have would be silently ignored.
                raise InvalidValueError(
                    f"tier_options: {medium!r} is not a tier medium; registered media: "
                    f"{', '.join(media)}"
                )
            if not isinstance(options, Mapping):
                raise InvalidValueError(
                    f"tier_options[{medium!r}] must be a mapping of options, got "
                    f"{type(options).__name__}"
                )
            _check_option_keys(options, f"tier_options[{medium!r}]")
        _check_option_keys(disk_options or {}, "disk_options")
        self.config = config
        self.load_timeout_s = load_timeout_s
        self.store_timeout_s = store_timeout_s
        self.block_size = config.block_size
        self._max_concurrency = max_concurrency
        self._max_pending_cascades = max_pending_cascades
        self._tier_options = {medium: dict(opts) for medium, opts in (tier_options or {}).items()}
        if disk_options:
            self._tier_options.setdefault("disk", {}).update(disk_options)
        self.flush_on_close = flush_on_close
        self.flush_timeout_s = flush_timeout_s
        self._staging_bytes = staging_bytes
        self.last_flush: FlushReport | None = None
        """What the last flush copied down and what it left (None until one ran)."""
        self._manager: TieredManager | None = None
        self._engine: TransferEngine | None = None
        self._supervisor: JobSupervisor | None = None
        self._storages: list[BlockStorage] = []
        self._changed: asyncio.Event | None = None
        self._staged: dict[int, asyncio.Future[None]] = {}  # job id -> sources released
        self._reads: set[asyncio.Task[MoveResult]] = set()  # reads outliving their get
        self._calls = HierarchyCounters()
        self._info: list[TierInfo] = []
        self._disabled: dict[str, str] = {}
        self._lost: set[int] = set()  # positions of the tiers that disabled themselves
        self._disabled_logged_at: float | None = None  # when stats() last logged them
        self._state = "new"
        if not isinstance(metrics_name, str) or not metrics_name:
            raise InvalidValueError(f"metrics_name must be a non-empty str, got {metrics_name!r}")
        self._metrics = metrics
        if metrics is not None:
            register_metrics(metrics, self, metrics_name)

    # -- opening and closing ----------------------------------------------------------------

    @classmethod
    def from_config(
        cls, config: HierarchyConfig | Mapping[str, Any] | str | os.PathLike[str], **options: Any
    ) -> Hierarchy:
        """A hierarchy for a validated config, a config dict, or a TOML file path.
        `options` are `Hierarchy(...)`'s keyword options; an unknown one is an
        InvalidValueError that lists them."""
        _check_option_names(options, "Hierarchy.from_config")
        if isinstance(config, HierarchyConfig):
            return cls(config, **options)
        if isinstance(config, Mapping):
            return cls(parse_config(config), **options)
        if isinstance(config, str | os.PathLike):
            return cls(load_config(_config_path(config, "Hierarchy.from_config")), **options)
        raise InvalidValueError(
            "Hierarchy.from_config takes a HierarchyConfig, a config dict or a TOML file "
            f"path, got {type(config).__name__}"
        )

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **options: Any) -> Hierarchy:
        """A hierarchy for a TOML config file (`options` as for `from_config`)."""
        _check_option_names(options, "Hierarchy.from_toml")
        if not isinstance(path, str | os.PathLike):
            raise InvalidValueError(
                f"Hierarchy.from_toml takes a file path, got {type(path).__name__}"
            )
        return cls(load_config(_config_path(path, "Hierarchy.from_toml")), **options)

    async def __aenter__(self) -> Hierarchy:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Allocate the pools, open the disk tiers (restoring what they hold) and start.

        A tier that cannot be opened (its storage or its bookkeeping raises a KvtierError,
        OSError, MemoryError or RuntimeError: a damaged or locked store, a mistyped path, a
        full disk, no memory) stops the open when the config is `strict` (the default): a
        KvtierError naming the tier and why, of the class of the tier's own error where it
        is a KvtierError. With `strict = false` it is left out of the chain, logged, listed
        in `disabled_tiers` and logged again by `stats()` (at most once a minute); dropping
        tiers keeps a valid chain valid (their order is kept). If the open fails (strict, no
        tier left, bad options, cancelled), everything it opened is closed again, so a disk
        store's lock is free for the next try."""
        if self._state != "new":
            raise ManagerClosedError(f"a hierarchy opens once; this one is {self._state}")
        self._state = "opening"
        copier = TensorCopier()
        tiers: list[ChainTier] = []
        active: list[BaseTierConfig] = []
        try:
            for tier in self.config.active_tiers():
                opened = await self._open_tier(tier, copier)
                if opened is None:
                    continue
                storage, bookkeeping = opened
                active.append(tier)
                self._storages.append(storage)
                tiers.append(bookkeeping)
                where = _describe(storage)
                policy = "own" if tier.kind.owns_index else tier.policy
                self._info.append(
                    TierInfo(tier.name, str(tier.medium), policy, tier.num_blocks, where)
                )
            if not active and self._disabled:
                raise KvtierError(
                    "no tier of the chain could be opened: "
                    + "; ".join(f"{name}: {why}" for name, why in self._disabled.items())
                )
            if not active:
                raise KvtierError(
                    'the config has no active tier here (only "auto" GPU tiers, and no CUDA?)'
                )
            self._start(active, tiers, copier)
        except BaseException:
            if self._manager is not None:
                self._manager.shutdown()
            self._manager = None
            self._engine = None
            self._supervisor = None
            await _close_all(self._storages)
            self._state = "closed"
            raise
        self._state = "open"

    async def _open_tier(
        self, tier: BaseTierConfig, copier: TensorCopier
    ) -> tuple[BlockStorage, ChainTier] | None:
        """One tier's storage and bookkeeping, or None when it cannot be opened and is
        disabled (see `open`). Bad `tier_options` for its medium are an InvalidValueError,
        never a disabled tier: they are the caller's mistake, not the store's state."""
        storage: BlockStorage | None = None
        try:
            storage = await self._open_storage(tier, copier)
            return storage, self._bookkeeping(tier, storage)
        except TypeError as error:
            await _close_all([] if storage is None else [storage])
            options = self._tier_options.get(tier.kind.medium)
            if storage is not None or not options:
                raise
            raise InvalidValueError(
                f"tier {tier.name!r}: the {tier.kind.medium} tier does not take the options "
                f"given in tier_options[{tier.kind.medium!r}] ({', '.join(sorted(options))}): "
                f"{error}"
            ) from error
        except (KvtierError, OSError, MemoryError, RuntimeError) as error:
            await _close_all([] if storage is None else [storage])
            if self.config.strict:
                raise _open_failure(tier, error) from error
            # One tier that cannot open (a damaged or locked store, a full disk, no memory)
            # must not keep the serving engine from starting: it is left out.
            reason = f"{type(error).__name__}: {error}"
            log.error("tier %r disabled: it could not be opened: %s", tier.name, reason)
            self._disabled[tier.name] = reason
            return None
        except BaseException:
            await _close_all([] if storage is None else [storage])
            raise

    def _start(
        self, active: list[BaseTierConfig], tiers: list[ChainTier], copier: TensorCopier
    ) -> None:
        """The chain's bookkeeping, staging arena, transfer engine and supervisor over the
        open tiers."""
        self._manager = TieredManager(
            tiers,
            write_policy=self.config.write_policy,
            watermarks=[(tier.low_watermark, tier.high_watermark) for tier in active],
        )
        tensor = [tier.kind.access is TierAccess.TENSOR for tier in active]
        slow = not all(tensor)
        staging: StagingArena | None = None
        if slow:
            try:
                staging = StagingArena.sized(self._staging_bytes, self.block_size)
            except (OSError, MemoryError, RuntimeError, OverflowError) as error:
                raise KvtierError(
                    f"cannot allocate the staging arena ({self._staging_bytes:,} bytes asked "
                    f"by staging_bytes, at least 64 blocks of {self.block_size:,} bytes): "
                    f"{type(error).__name__}: {error}"
                ) from error
        self._engine = TransferEngine(
            self._manager,
            self._storages,
            copier=copier,
            max_concurrency=self._max_concurrency,
            max_pending_cascades=self._max_pending_cascades,
            staging=staging,
            tensor_tiers=tensor,
        )
        self._supervisor = JobSupervisor(self._engine, self._job_done)
        self._changed = asyncio.Event()
        if self.flush_on_close is None:
            self.flush_on_close = any(storage.persistent for storage in self._storages)

    def _bookkeeping(self, tier: BaseTierConfig, storage: BlockStorage) -> ChainTier:
        """The chain's bookkeeping of one open tier: a slot pool with its policy (restored
        from what a persistent tier holds), or, for a tier that owns its index, a memory of
        what it holds that asks the store about the rest."""
        if tier.kind.owns_index:
            if not isinstance(storage, KeyedStorage):
                raise InvalidValueError(
                    f"tier {tier.name!r}: a {tier.kind.medium} tier owns its index, so its "
                    f"storage must be a KeyedStorage, got {type(storage).__name__}"
                )
            storage.set_listener(self._poke)
            return KeyedTierManager(
                storage,
                tier.num_blocks,
                self.block_size,
                name=tier.name,
                medium=str(tier.medium),
            )
        manager = make_tier_manager(
            tier.num_blocks,
            self.block_size,
            tier.medium,
            tier.policy,
            name=tier.name,
            admission=tier.admission,
        )
        restored = storage.restore()
        if restored:
            manager.restore([(block.key, block.slot) for block in restored])
        return manager

    async def _open_storage(self, tier: BaseTierConfig, copier: TensorCopier) -> BlockStorage:
        """The tier's storage, opened by its kind's opener (see `kvtier.tiers.registry`).
        Cancelled meanwhile, it lets the opener finish (a disk store opens in a thread that
        cannot be stopped) and closes what it opened, so no lock is left held."""
        options = self._tier_options.get(tier.kind.medium, {})
        context = TierContext(
            self.block_size, self.config.model_id, copier, options, tenant=self.config.tenant
        )
        opening = asyncio.ensure_future(open_storage(tier, context))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            await asyncio.wait([opening])
            if not opening.cancelled() and opening.exception() is None:
                await _close_all([opening.result()])
            raise

    async def close(self) -> None:
        """Flush (see `flush_on_close`), wait for transfers in flight (at most
        `flush_timeout_s`, then they are cancelled: what they did not copy is lost, nothing
        is left half-written), then close the tiers. Idempotent."""
        if self._state in ("closed", "closing", "new"):
            self._state = "closed"
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.flush_timeout_s
        try:
            if self.flush_on_close and len(self._storages) > 1:
                await self.flush(timeout_s=self.flush_timeout_s)
        except Exception as error:  # a broken tier must not keep the others open
            log.error("flush on close failed: %r", error)
        self._state = "closing"
        try:
            supervisor = self._supervisor
            budget = max(0.0, deadline - loop.time())
            if self._reads:
                await asyncio.wait(list(self._reads), timeout=budget)
                budget = max(0.0, deadline - loop.time())
            if supervisor is not None and not await supervisor.drain(budget):
                log.warning(
                    "closing: %d transfers still running after %.1f s; cancelling them",
                    len(supervisor),
                    self.flush_timeout_s,
                )
                await supervisor.cancel_all()
        finally:
            try:
                await _close_all(self._storages, reraise=True)
            finally:
                if self._manager is not None:
                    self._manager.shutdown()
                self._state = "closed"
                if self._metrics is not None:
                    unregister_metrics(self._metrics, self)

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    def _open(self) -> tuple[TieredManager, TransferEngine]:
        if self._state != "open" or self._manager is None or self._engine is None:
            raise ManagerClosedError(f"the hierarchy is {self._state}, not open")
        return self._manager, self._engine

    # -- the five verbs ----------------------------------------------------------------------

    async def put(
        self,
        keys: Sequence[OffloadKey],
        blocks: torch.Tensor,
        *,
        rows: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
        partial_last: bool = False,
    ) -> int:
        """Store blocks (row i is block `keys[i]`; with `rows`, row `rows[i]`, so blocks can
        be taken straight from an engine's buffer) in the top tier, demoting what it evicts.
        Returns how many were newly stored: keys already held by a tier are skipped, and a
        store that cannot get room (every block pinned) or fails to write stores nothing.
        A batch larger than the top tier is stored in parts, so it spills down the chain.

        `partial_last`: the last key is a prompt's partial block (fewer tokens than a block
        holds). No later prompt repeats its tokens exactly, so it is never stored (counted
        in `stats().calls.put_partial`); the engine knows, kvtier cannot."""
        started = time.perf_counter()
        manager, _ = self._open()
        keys = _check_keys(keys, "put")
        row_ids = self._check_rows(rows, blocks, len(keys), "put")
        if not isinstance(partial_last, bool):
            raise InvalidValueError(f"put: partial_last must be a bool, got {partial_last!r}")
        self._calls.put_blocks += len(keys)
        partial = keys[-1] if partial_last and keys else None
        chunk = max(1, manager.top.num_blocks // 4)
        stored = 0
        for start in range(0, len(keys), chunk):
            part = keys[start : start + chunk]
            stored += await self._put_part(
                part,
                blocks,
                row_ids[start : start + len(part)],
                partial if start + len(part) == len(keys) else None,
            )
        self._calls.put_latency.observe(time.perf_counter() - started)
        return stored

    async def _put_part(
        self,
        keys: list[OffloadKey],
        blocks: torch.Tensor,
        row_ids: npt.NDArray[np.int64],
        partial: OffloadKey | None = None,
    ) -> int:
        manager, engine = self._open()
        await self._wait_for_reserve(manager, len(keys))
        out = manager.prepare_store(keys, partial=() if partial is None else (partial,))
        if out is None:
            self._calls.put_refused += len(keys)
            self._spawn(manager.take_jobs())
            return 0
        stored = out.keys_to_store
        skipped = int(partial is not None and partial in out.refused_keys)
        self._calls.put_partial += skipped
        self._calls.put_present += len(keys) - len(stored) - len(out.refused_keys)
        self._calls.put_refused += len(out.refused_keys) - skipped
        if not stored:
            self._spawn(manager.take_jobs())
            return 0
        failed: frozenset[OffloadKey] = frozenset(stored)
        try:
            if out.demotion is not None:
                # The reserve did not cover this store: its victims are copied out first
                # (only a memory copy when they go to a slow tier; the rest runs behind).
                self._calls.put_demotion_waits += 1
                staged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._supervisor_of().spawn(out.demotion, staged)
                await finish_even_if_cancelled(staged)
            row = {key: int(row_ids[i]) for i, key in enumerate(keys)}
            src_ids = np.asarray([row[key] for key in stored], dtype=np.int64)
            result = await engine.transfer(
                stored,
                CALLER,
                blocks,
                src_ids,
                0,
                engine.endpoint(0),
                slot_ids(out.store_spec),
                Priority.LOAD,
            )
            failed = result.failed
        finally:
            ok = [key for key in stored if key not in failed]
            if ok:
                manager.complete_store(ok)
            if failed:
                manager.complete_store(list(failed), success=False)
            self._calls.put_stored += len(ok)
            self._calls.put_failed += len(failed)
            if failed:
                self._notice_lost_tiers()
            self._spawn(manager.take_jobs())
            self._poke()
        return len(stored) - len(failed)

    async def _wait_for_reserve(self, manager: TieredManager, wanted: int) -> None:
        """Backpressure (counted): wait while the top tier has fewer free slots than a store
        wants and background demotions are still giving slots back (so the store does not
        evict at once what they are about to free), or while a tier could not take that
        many blocks until the stores or demotions in flight into it land (so none is
        refused or dropped while the chain has room)."""
        counted = False
        timeout = self.store_timeout_s
        deadline = None if timeout is None else time.perf_counter() + timeout
        while self._must_wait(manager, wanted):
            if not counted:
                self._calls.put_backpressure_waits += 1
                counted = True
            if not await self._wait_for_change(deadline):
                # A stuck lower tier: go on, the store evicts (or drops) as it must.
                self._calls.put_store_timeouts += 1
                return

    @staticmethod
    def _must_wait(manager: TieredManager, wanted: int) -> bool:
        if manager.top.num_free >= wanted:
            return False
        for tier in manager.tiers:
            if tier.num_draining:
                return True
        for tier in manager.tiers:  # the top: other stores in flight; below: demotions
            stats = tier.stats()
            if stats.pending and stats.free + stats.evictable < wanted:
                return True
        return False

    async def _read_pinned(
        self,
        part: list[OffloadKey],
        slots: npt.NDArray[np.int64],
        out: torch.Tensor,
        dst_rows: npt.NDArray[np.int64],
        deadline: float | None,
        release: Callable[[], None],
        caller_memory: bool = False,
    ) -> int:
        """Copy blocks pinned at the top (in `slots`) into `out[first_row:]`; how many
        leading blocks arrived by the deadline (0 if the read is still running then).
        `release` gives the pins back once the read is over, even if that is after this
        call returned (the late read only fills rows the caller no longer gets)."""
        _, engine = self._open()
        read = asyncio.get_running_loop().create_task(
            engine.transfer(
                part,
                0,
                engine.endpoint(0),
                slots,
                CALLER,
                out,
                dst_rows,
                Priority.LOAD,
            )
        )
        self._reads.add(read)

        def finished(task: asyncio.Task[MoveResult]) -> None:
            self._reads.discard(task)
            release()
            if not task.cancelled() and task.exception() is None and task.result().corrupt:
                # Bad bytes at the top (e.g. a disk-only chain): drop the block, so the
                # next get is a plain miss instead of another failed read.
                manager = self._manager
                if manager is not None and not self.closed:
                    manager.discard_corrupt(0, task.result().corrupt)

        read.add_done_callback(finished)
        if caller_memory:
            # The read writes into the caller's memory: never leave it running.
            result = await finish_even_if_cancelled(read)
            good = 0
            while good < len(part) and part[good] not in result.failed:
                good += 1
            return good
        remaining = None if deadline is None else max(0.0, deadline - time.perf_counter())
        # Cancelled here, the read goes on; `finished` releases its pins when it ends.
        done, _ = await asyncio.wait([read], timeout=remaining)
        if not done:
            self._calls.get_timeouts += 1
            return 0
        result = read.result()
        good = 0
        while good < len(part) and part[good] not in result.failed:
            good += 1
        return good

    def lookup(self, keys: Sequence[OffloadKey]) -> int:
        """How many leading keys some tier holds (or is receiving). Starts nothing."""
        manager, _ = self._open()
        count = 0
        for key in _check_keys(keys, "lookup", distinct=False):
            if manager.locate(key) is None:
                break
            count += 1
        return count

    async def get(
        self, keys: Sequence[OffloadKey], *, timeout_s: float | None = None
    ) -> torch.Tensor:
        """The blocks of `keys`, promoted to the top tier, as a uint8 tensor
        `[m, block_size]` on the top tier's device; m < len(keys) when block m is missing,
        failed verification or did not arrive within the deadline (`timeout_s`, default the
        hierarchy's `load_timeout_s`): recompute from there."""
        self._open()
        keys = _check_keys(keys, "get")
        deadline = self._deadline(timeout_s, "get")
        top = self._storages[0]
        device = top.device if isinstance(top, TensorStorage) else torch.device("cpu")
        out = torch.empty((len(keys), self.block_size), dtype=torch.uint8, device=device)
        served = await self._serve(keys, out, np.arange(len(keys), dtype=np.int64), deadline)
        return out[:served]

    async def get_into(
        self,
        keys: Sequence[OffloadKey],
        into: torch.Tensor,
        rows: Sequence[int] | npt.NDArray[np.integer[Any]],
        *,
        timeout_s: float | None = None,
    ) -> int:
        """Copy the blocks of `keys` into rows `rows[i]` of `into` (uint8 `[n, block_size]`,
        e.g. an engine's host buffer), promoted as `get` does; how many leading keys arrived
        (recompute from there). The deadline bounds the wait for promotions, but a copy into
        `into` that has started is always waited for: when this returns (or is cancelled),
        nothing writes into `into` any more."""
        self._open()
        keys = _check_keys(keys, "get_into")
        row_ids = self._check_rows(rows, into, len(keys), "get_into")
        deadline = self._deadline(timeout_s, "get_into")
        return await self._serve(keys, into, row_ids, deadline, caller_memory=True)

    def _deadline(self, timeout_s: float | None, what: str) -> float | None:
        timeout = (
            self.load_timeout_s
            if timeout_s is None
            else _check_seconds(timeout_s, f"{what}: timeout_s")
        )
        return None if timeout is None else time.perf_counter() + timeout

    async def _serve(
        self,
        keys: list[OffloadKey],
        out: torch.Tensor,
        dst_rows: npt.NDArray[np.int64],
        deadline: float | None,
        *,
        caller_memory: bool = False,
    ) -> int:
        """Read the keys' blocks into `out[dst_rows[i]]`; how many leading ones arrived.
        With `caller_memory`, every read that started is waited for (see `get_into`)."""
        manager, _ = self._open()
        started = time.perf_counter()
        chunk = max(1, manager.top.num_blocks // 4)
        served = 0
        self._calls.get_blocks += len(keys)
        while served < len(keys):
            batch = keys[served : served + chunk]
            answers = manager.lookup_many(batch)
            self._spawn(manager.take_jobs())
            ready = 0
            while ready < len(answers) and answers[ready] is True:
                ready += 1
            if ready:
                part = batch[:ready]
                slots = slot_ids(manager.prepare_load(part))
                good = await self._read_pinned(
                    part,
                    slots,
                    out,
                    dst_rows[served : served + len(part)],
                    deadline,
                    functools.partial(self._unpin, part),
                    caller_memory,
                )
                manager.touch(part[:good])
                served += good
                if good < ready:
                    break
                continue
            if answers and answers[0] is False:
                busy = self._supervisor_of().busy
                if not busy or manager.locate(batch[0]) is None:
                    break  # absent, or no room at the top and no transfer that will free some
                if not await self._wait_for_change(deadline):
                    self._calls.get_timeouts += 1
                    break
                continue
            hold = manager.hold_promotion(batch)
            released = False
            if hold is None:  # being written by a put or a demotion: wait for it
                if not await self._wait_for_change(deadline):
                    self._calls.get_timeouts += 1
                    break
                continue
            try:
                staged = self._staged.get(hold.job_id)
                if staged is not None and not staged.done():
                    remaining = None if deadline is None else deadline - time.perf_counter()
                    done, _ = await asyncio.wait([staged], timeout=remaining)
                    if not done:
                        self._calls.get_timeouts += 1
                        break
                granted = hold.granted or []
                lead = 0
                while lead < len(granted) and granted[lead] == hold.keys[lead]:
                    lead += 1
                if not lead:
                    break  # the promotion brought none of them: a miss (recompute)
                manager.touch(granted[:lead])
                assert hold.slots is not None  # set with `granted` by complete_job
                released = True  # the read gives the hold back when it is over
                good = await self._read_pinned(
                    granted[:lead],
                    hold.slots[:lead],
                    out,
                    dst_rows[served : served + lead],
                    deadline,
                    functools.partial(self._release_hold, hold),
                    caller_memory,
                )
                served += good
                if good < lead:
                    break
            finally:
                if not released:
                    manager.release_hold(hold)
        self._calls.get_served += served
        self._calls.get_latency.observe(time.perf_counter() - started)
        return served

    def where(self, key: OffloadKey) -> str | None:
        """Name of the highest tier holding `key` (readable or being written), or None."""
        manager, _ = self._open()
        found = manager.locate(check_key(key, "where: key"))
        return None if found is None else manager.tiers[found[0]].name

    def stats(self) -> HierarchyStats:
        """One snapshot of every counter: occupancy and activity per tier, the chain's
        decisions, the API calls (latency histograms included) and the traffic per tier
        pair. O(tiers + latency buckets), whatever the number of calls so far.

        It only reads, and copies each mutable container in one step, so a Prometheus
        scrape may take it from another thread (see `kvtier.metrics`); counters read
        while the loop updates them may be one operation apart. While tiers are disabled
        it logs them, which and why, at most once per `DISABLED_LOG_INTERVAL_S`."""
        manager, engine = self._open()
        chain = copy.copy(manager.counters)
        chain.hits = list(chain.hits)
        calls = copy.copy(self._calls)
        calls.get_latency = calls.get_latency.copy()
        calls.put_latency = calls.put_latency.copy()
        supervisor = copy.copy(self._supervisor_of().counters)
        supervisor.error_types = dict(supervisor.error_types)
        tiers = manager.tiers
        index = {tier.name: position for position, tier in enumerate(tiers)}
        demoted = [0] * len(tiers)
        promoted = [0] * len(tiers)
        corrupt = [0] * len(tiers)
        pairs: dict[tuple[str, str], tuple[int, int, float]] = {}
        transfers: list[TransferStats] = []
        for (source, target), counter in list(engine.counters.pairs.items()):
            pairs[source, target] = (counter.blocks, counter.bytes, counter.seconds)
            transfers.append(
                TransferStats(
                    source,
                    target,
                    counter.blocks,
                    counter.bytes,
                    counter.seconds,
                    counter.copies,
                    counter.failed,
                    counter.corrupt,
                )
            )
            src, dst = index.get(source), index.get(target)
            if src is not None:
                corrupt[src] += counter.corrupt
                if dst is not None and src < dst:
                    demoted[src] += counter.blocks
                elif dst is not None and dst < src:
                    promoted[dst] += counter.blocks
        activity = []
        below = chain.misses + sum(chain.hits)  # lookups that got past the tiers above
        for position, tier in enumerate(tiers):
            below -= chain.hits[position]
            activity.append(
                TierActivity(
                    tier.name,
                    chain.hits[position],
                    below,
                    tier.blocks_written,
                    tier.blocks_refused,
                    tier.blocks_evicted,
                    demoted[position],
                    promoted[position],
                    corrupt[position],
                    tier.events_dropped,
                )
            )
        return HierarchyStats(
            tiers=manager.stats(),
            info=list(self._info),
            chain=chain,
            calls=calls,
            pairs=pairs,
            jobs=dict(engine.counters.jobs),
            cascades_dropped=chain.cascades_dropped,
            corrupt_blocks=engine.counters.corrupt_blocks,
            gone_blocks=engine.counters.gone_blocks,
            failed_blocks=engine.counters.failed_blocks,
            errors=dict(engine.counters.error_types),
            supervisor=supervisor,
            staging_waits=0 if engine.staging is None else engine.staging.waits,
            queue_depths=engine.queue_depths(),
            disabled_tiers=self._log_disabled(self._disabled_now()),
            activity=activity,
            transfers=transfers,
            events_dropped=sum(tier.events_dropped for tier in activity),
        )

    def take_events(self) -> list[OffloadingEvent]:
        """Stored / removed batches of every tier since the last call."""
        manager, _ = self._open()
        return manager.take_events()

    # -- more --------------------------------------------------------------------------------

    @property
    def disabled_tiers(self) -> dict[str, str]:
        """Disabled tiers, name -> why: those left out at open because they could not be
        opened (the config's `strict = false`) and those that disabled themselves while open
        (see `HierarchyStats.disabled_tiers`); empty when every tier serves."""
        return self._disabled_now()

    @property
    def tiers(self) -> list[TierInfo]:
        """The open tiers, top first, with where each really lives (e.g. a GPU tier's CPU
        fallback)."""
        return list(self._info)

    @property
    def manager(self) -> TieredManager:
        """The chain's bookkeeping (for inspection and tests)."""
        return self._open()[0]

    @property
    def storages(self) -> list[BlockStorage]:
        """Each tier's byte store, top first (for inspection and tests)."""
        return list(self._storages)

    async def flush(self, timeout_s: float | None = None) -> int:
        """Copy every block held only by the upper tiers down to the bottom tier and wait
        for it, so a persistent bottom tier keeps them across a restart (a write-back chain
        otherwise keeps only what was demoted or cascaded). Returns the blocks copied; with
        `timeout_s`, stops waiting then (the copies in flight go on) and reports what did
        not make it in `last_flush` and the log."""
        manager, _ = self._open()
        timeout_s = _check_seconds(timeout_s, "flush: timeout_s")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        supervisor = self._supervisor_of()
        await supervisor.drain(timeout_s)
        bottom = len(manager.tiers) - 1
        jobs = manager.plan_flush()
        sent = [
            key for job in jobs for step in job.steps if step.dst == bottom for key in step.keys
        ]
        tasks = [supervisor.spawn(job) for job in jobs]
        if tasks:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            await asyncio.wait(tasks, timeout=remaining)
        self._poke()
        copied = sum(1 for key in sent if manager.tiers[bottom].has(key) is True)
        left = sum(
            1
            for tier in manager.tiers[:-1]
            for key in tier.idle_keys()
            if manager.tiers[bottom].has(key) is not True
        )
        self.last_flush = FlushReport(copied=copied, left=left)
        if left:
            log.warning(
                "flush: %d blocks copied to %r, %d held only by volatile tiers remain",
                copied,
                manager.tiers[bottom].name,
                left,
            )
        return copied

    async def drain(self) -> None:
        """Wait until no transfer job (promotion, demotion, cascade) and no read a `get`
        gave up on at its deadline is in flight. ManagerClosedError unless open."""
        self._open()
        supervisor = self._supervisor_of()
        while supervisor.busy or self._reads:
            await supervisor.drain()
            if self._reads:
                await asyncio.wait(list(self._reads))

    def check(self) -> None:
        """Verify the bookkeeping of every tier (raises BlockStateError)."""
        self._open()[0].check()

    # -- internals ---------------------------------------------------------------------------

    def _disabled_now(self) -> dict[str, str]:
        """`disabled_tiers`: those noted so far, and a tier whose storage disabled itself
        since (read only, so it is safe from another thread, as `stats()` is)."""
        disabled = dict(self._disabled)
        for info, storage in zip(self._info, list(self._storages), strict=False):
            if info.name not in disabled:
                reason = storage.disabled_reason
                if reason is not None:
                    disabled[info.name] = f"disabled while open: {reason}"
        return disabled

    def _log_disabled(self, disabled: dict[str, str]) -> dict[str, str]:
        """Log the disabled tiers (which, and why), at most once per
        `DISABLED_LOG_INTERVAL_S`, so an embedder polling `stats()` sees them without being
        flooded; returns `disabled`."""
        if not disabled:
            return disabled
        now = time.monotonic()
        last = self._disabled_logged_at
        if last is not None and now - last < DISABLED_LOG_INTERVAL_S:
            return disabled
        self._disabled_logged_at = now
        log.warning(
            "serving without %d disabled tier%s: %s",
            len(disabled),
            "" if len(disabled) == 1 else "s",
            "; ".join(f"{name!r}: {why}" for name, why in disabled.items()),
        )
        return disabled

    def _notice_lost_tiers(self) -> None:
        """Act on tiers whose storage disabled itself while open (a disk tier whose files
        were removed or replaced: its writes fail, its reads are misses): list it in
        `disabled_tiers`, and drop its blocks from the bookkeeping, so no lookup claims a
        block that is gone (their removed events tell the embedder). Blocks pinned now are
        dropped at a later call, once unpinned; the tier stays in the chain, and every
        store into it fails (counted). Called on the loop when a job ends or a put fails."""
        manager = self._manager
        if manager is None or manager.closed:
            return
        for position, storage in enumerate(self._storages):
            if position not in self._lost:
                reason = storage.disabled_reason
                if reason is None:
                    continue
                self._lost.add(position)
                self._disabled[manager.tiers[position].name] = f"disabled while open: {reason}"
            tier = manager.tiers[position]
            idle = tier.idle_keys()
            if idle:
                tier.discard(idle)

    def _job_done(self) -> None:
        """A transfer job ended (the supervisor's callback): note tiers that disabled
        themselves during it, then wake the waiters."""
        self._notice_lost_tiers()
        self._poke()

    def _check_rows(
        self,
        rows: Sequence[int] | npt.NDArray[np.integer[Any]] | None,
        blocks: torch.Tensor,
        count: int,
        what: str,
    ) -> npt.NDArray[np.int64]:
        """The row of `blocks` of each of `count` keys (0..count-1 without `rows`), after
        checking `blocks` (uint8 [n, block_size], contiguous) and that every row exists and
        none is given twice."""
        self._check_blocks(blocks, count if rows is None else None, what)
        if rows is None:
            return np.arange(count, dtype=np.int64)
        try:
            row_ids = np.asarray(rows)
        except (TypeError, ValueError) as error:
            raise InvalidValueError(f"{what}: rows must be a sequence of ints ({error})") from None
        if row_ids.dtype == np.bool_ or not np.issubdtype(row_ids.dtype, np.integer):
            raise InvalidValueError(f"{what}: rows must be ints, got {row_ids.dtype}")
        if row_ids.shape != (count,):
            raise InvalidValueError(
                f"{what}: {count} keys but rows has shape {list(row_ids.shape)}"
            )
        if count and (row_ids.min() < 0 or row_ids.max() >= blocks.shape[0]):
            bad = int(row_ids[(row_ids < 0) | (row_ids >= blocks.shape[0])][0])
            raise InvalidValueError(
                f"{what}: row {bad} is not one of the {blocks.shape[0]} rows of the tensor"
            )
        if len(np.unique(row_ids)) != count:
            raise InvalidValueError(f"{what}: a row is given twice")
        return row_ids.astype(np.int64)

    def _check_blocks(self, blocks: torch.Tensor, count: int | None, what: str = "put") -> None:
        if not isinstance(blocks, torch.Tensor):
            raise InvalidValueError(
                f"{what}: blocks must be a torch.Tensor, got {type(blocks).__name__}"
            )
        if blocks.device.type == "meta":
            raise InvalidValueError(f"{what}: blocks are on the meta device, which holds no bytes")
        if blocks.dtype != torch.uint8:
            raise InvalidValueError(
                f"{what}: blocks must be uint8 bytes, got {blocks.dtype}; to store another "
                f"dtype's bytes pass blocks.view(torch.uint8) (shape [n, {self.block_size}])"
            )
        if blocks.dim() != 2 or blocks.shape[1] != self.block_size:
            raise InvalidValueError(
                f"{what}: blocks must have shape [n, {self.block_size}] (block_size), "
                f"got {list(blocks.shape)}"
            )
        if count is not None and blocks.shape[0] != count:
            raise InvalidValueError(f"put: {count} keys but {blocks.shape[0]} blocks")
        if not blocks.is_contiguous():
            raise InvalidValueError(f"{what}: blocks must be a contiguous tensor")

    def _unpin(self, keys: list[OffloadKey]) -> None:
        manager = self._manager
        if manager is not None and not manager.closed:
            manager.complete_load(keys)
        self._poke()

    def _release_hold(self, hold: PromotionHold) -> None:
        manager = self._manager
        if manager is not None and not manager.closed:
            manager.release_hold(hold)
        self._poke()

    def _supervisor_of(self) -> JobSupervisor:
        supervisor = self._supervisor
        if supervisor is None:
            raise ManagerClosedError(f"the hierarchy is {self._state}, not open")
        return supervisor

    async def prepare_engine_store(self, keys: Sequence[OffloadKey]) -> TieredStoreOutput | None:
        """For an engine that copies blocks into the top tier itself (see
        `engine.offloading_spec`): reserve top-tier slots for the keys no tier holds, with
        `put`'s backpressure, and copy out the victims the reserve did not cover before
        returning, so the engine may write `store_spec`'s slots at once; then
        `manager.complete_store`. None: no room at the top (every block pinned)."""
        manager, _ = self._open()
        keys = _check_keys(keys, "prepare_engine_store")
        await self._wait_for_reserve(manager, len(keys))
        out = manager.prepare_store(keys)
        if out is not None and out.demotion is not None:
            self._calls.put_demotion_waits += 1
            staged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._supervisor_of().spawn(out.demotion, staged)
            await finish_even_if_cancelled(staged)
        self._spawn(manager.take_jobs())
        return out

    def start_planned_jobs(self) -> None:
        """Start the transfer jobs the chain's bookkeeping planned (demotions, promotions,
        cascades), for an engine that drives `manager` directly (`engine.offloading_spec`);
        the verbs start their own. Call it on the hierarchy's event loop."""
        manager, _ = self._open()
        self._spawn(manager.take_jobs())
        self._poke()

    def _spawn(self, jobs: list[TransferJob]) -> None:
        """Start jobs in the background. Each pokes the waiters once it no longer reads its
        sources (a demotion gave its slots back; a promotion's blocks reached the top and its
        readers got them), which may be long before its writes to slow tiers are done."""
        if not jobs:
            return
        _, engine = self._open()
        supervisor = self._supervisor_of()
        loop = asyncio.get_running_loop()
        for job in jobs:
            if not engine.admit(job):
                continue
            staged: asyncio.Future[None] = loop.create_future()
            self._staged[job.id] = staged
            staged.add_done_callback(functools.partial(self._job_staged, job.id))
            supervisor.spawn(job, staged)

    def _job_staged(self, job_id: int, _: asyncio.Future[None]) -> None:
        """A job gave its sources back (and a promotion its blocks to its readers)."""
        self._staged.pop(job_id, None)
        self._poke()

    def _poke(self) -> None:
        """Wake everything waiting for a change (a job done, slots given back, a store)."""
        changed = self._changed
        if changed is not None:
            self._changed = asyncio.Event()
            changed.set()

    async def _wait_for_change(self, deadline: float | None) -> bool:
        """Wait until a job or store completes (or WAIT_SLICE_S passes); False if the
        deadline passed first."""
        changed = self._changed
        if changed is None:
            return False
        remaining = WAIT_SLICE_S
        if deadline is not None:
            remaining = min(remaining, deadline - time.perf_counter())
            if remaining <= 0:
                return False
        try:
            await asyncio.wait_for(changed.wait(), remaining)
        except TimeoutError:
            return deadline is None or time.perf_counter() < deadline
        return True

    def __repr__(self) -> str:
        chain = " -> ".join(f"{t.name}[{t.medium}, {t.num_blocks}, {t.where}]" for t in self._info)
        disabled = f", disabled: {', '.join(self._disabled)}" if self._disabled else ""
        return f"Hierarchy({chain or 'not open'}, {self._state}{disabled})"


__all__ = [
    "DEFAULT_FLUSH_TIMEOUT_S",
    "DEFAULT_LOAD_TIMEOUT_S",
    "FlushReport",
    "Hierarchy",
    "HierarchyCounters",
    "HierarchyStats",
    "TierActivity",
    "TierInfo",
    "TransferStats",
]
