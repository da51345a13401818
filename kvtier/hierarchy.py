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
staging arena. A put waits when the reserve is exhausted (backpressure, bounded by
`store_timeout_s`) and for its victims' demotion (`put_demotion_waits`): only a snapshot
when they go from memory to a slow tier, the whole copy otherwise.

Reads degrade, they never fail: a block that disappeared, failed its checksum or did not
arrive by the deadline (`load_timeout_s`, 5 s by default) ends the prefix `get` returns
(recompute the rest). Bad input (wrong dtype or block size, duplicate keys, a closed
hierarchy) raises a `KvtierError`.

Closing waits for the transfers in flight; with `flush_on_close` (the default when the chain
has a persistent tier) it first copies what only volatile tiers hold down to the bottom
tier, within `flush_timeout_s`.

This module is the facade: it checks arguments (`kvtier.checks`), keeps the lifecycle, and
each verb is one call into the running chain (`kvtier.chain`: `assembly` opens and closes
it, `store` and `load` are the put and get protocols, `stats` the snapshot).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvtier import checks
from kvtier.chain import load, store
from kvtier.chain.assembly import ChainOptions, close_chain, open_chain
from kvtier.chain.runtime import Chain
from kvtier.chain.stats import (
    FlushReport,
    HierarchyCounters,
    HierarchyStats,
    TierActivity,
    TierInfo,
    TransferStats,
)
from kvtier.config import HierarchyConfig, load_config, parse_config
from kvtier.engine import DEFAULT_STAGING_BYTES, TransferEngine
from kvtier.errors import InvalidValueError, ManagerClosedError
from kvtier.hints import Reuse, ReuseHint
from kvtier.keys import OffloadKey, check_key
from kvtier.manager import OffloadingEvent, TieredManager, TieredStoreOutput
from kvtier.manager.events import TierContents
from kvtier.metrics import register_metrics, unregister_metrics
from kvtier.sessions import SessionTable, check_session_id, check_within_s
from kvtier.tiers.registry import options_keywords, registered_media
from kvtier.tiers.storage import BlockStorage, TensorStorage

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from kvtier.fleet.publisher import EventPublisher

log = logging.getLogger("kvtier.hierarchy")

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
        session_clock: Callable[[], float] = time.monotonic,
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
        distinct names (the same name twice is an InvalidValueError). `session_clock`:
        the seconds session hints' deadlines are read on (a trace replay passes its trace's)."""
        if not isinstance(config, HierarchyConfig):
            raise InvalidValueError(
                f"config must be a HierarchyConfig (see Hierarchy.from_config for a dict or a "
                f"file), got {type(config).__name__}"
            )
        self.load_timeout_s = checks.check_seconds(load_timeout_s, "load_timeout_s")
        self.store_timeout_s = checks.check_seconds(store_timeout_s, "store_timeout_s")
        flush_s = checks.check_seconds(flush_timeout_s, "flush_timeout_s", none_ok=False)
        concurrency = checks.check_count(max_concurrency, "max_concurrency", 1)
        cascades = checks.check_count(max_pending_cascades, "max_pending_cascades", 0)
        staging = checks.check_staging_bytes(staging_bytes)
        if flush_on_close is not None and not isinstance(flush_on_close, bool):
            raise InvalidValueError(
                f"flush_on_close must be a bool or None, got {flush_on_close!r}"
            )
        options = checks.check_tier_options(
            tier_options, {"disk_options": disk_options}, registered_media(), options_keywords()
        )
        self.config = config
        self.block_size = config.block_size
        self.flush_on_close = flush_on_close
        self.flush_timeout_s = flush_s or 0.0
        self._options = ChainOptions(concurrency, cascades, staging, options)
        self.last_flush: FlushReport | None = None
        """What the last flush copied down and what it left (None until one ran)."""
        self._chain: Chain | None = None
        self._sessions = SessionTable()
        if not callable(session_clock):
            raise InvalidValueError(f"session_clock must be callable, got {session_clock!r}")
        self._session_clock = session_clock
        self._publisher: EventPublisher | None = None
        """The `[events]` publisher while open (None when the table is off)."""
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
        checks.check_option_names(options, _keyword_options(), "Hierarchy.from_config")
        if isinstance(config, HierarchyConfig):
            return cls(config, **options)
        if isinstance(config, Mapping):
            return cls(parse_config(config), **options)
        if isinstance(config, str | os.PathLike):
            path = checks.config_path(config, "Hierarchy.from_config")
            return cls(load_config(path), **options)
        raise InvalidValueError(
            "Hierarchy.from_config takes a HierarchyConfig, a config dict or a TOML file "
            f"path, got {type(config).__name__}"
        )

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **options: Any) -> Hierarchy:
        """A hierarchy for a TOML config file (`options` as for `from_config`)."""
        checks.check_option_names(options, _keyword_options(), "Hierarchy.from_toml")
        if not isinstance(path, str | os.PathLike):
            raise InvalidValueError(
                f"Hierarchy.from_toml takes a file path, got {type(path).__name__}"
            )
        return cls(load_config(checks.config_path(path, "Hierarchy.from_toml")), **options)

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
        try:
            self._chain = await open_chain(self.config, self._options)
        except BaseException:
            self._state = "closed"
            raise
        if self.config.events.enabled:
            try:
                self._publisher = _start_publisher(self.config, self._chain)
            except BaseException:
                await close_chain(self._chain, asyncio.get_running_loop().time())
                self._state = "closed"
                raise
        if self.flush_on_close is None:
            self.flush_on_close = self._chain.persistent
        self._state = "open"

    async def close(self) -> None:
        """Flush (see `flush_on_close`), wait for transfers in flight (at most
        `flush_timeout_s`, then they are cancelled: what they did not copy is lost, nothing
        is left half-written), then close the tiers. Idempotent."""
        chain = self._chain
        if self._state in ("closed", "closing", "new") or chain is None:
            self._state = "closed"
            return
        deadline = asyncio.get_running_loop().time() + self.flush_timeout_s
        try:
            if self.flush_on_close and len(chain.storages) > 1:
                await self.flush(timeout_s=self.flush_timeout_s)
        except Exception as error:  # a broken tier must not keep the others open
            log.error("flush on close failed: %r", error)
        self._state = "closing"
        try:
            await close_chain(chain, deadline)
        finally:
            self._state = "closed"
            publisher, self._publisher = self._publisher, None
            if publisher is not None:
                chain.manager.events.cleared()
                await asyncio.to_thread(publisher.close)
            if self._metrics is not None:
                unregister_metrics(self._metrics, self)

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    def _open(self) -> Chain:
        """The running chain, or ManagerClosedError unless the hierarchy is open."""
        chain = self._chain
        if self._state != "open" or chain is None:
            raise ManagerClosedError(f"the hierarchy is {self._state}, not open")
        return chain

    # -- the five verbs ----------------------------------------------------------------------

    async def put(
        self,
        keys: Sequence[OffloadKey],
        blocks: torch.Tensor,
        *,
        rows: checks.Rows | None = None,
        partial_last: bool = False,
        hint: ReuseHint | Reuse | None = None,
        session: str | None = None,
        expect_within_s: float | None = None,
    ) -> int:
        """Store blocks (row i is block `keys[i]`; with `rows`, row `rows[i]`, so blocks can
        be taken straight from an engine's buffer) in the top tier, demoting what it evicts.
        Returns how many were newly stored: keys already held by a tier are skipped, and a
        store that cannot get room (every block pinned) or fails to write stores nothing.
        A batch larger than the top tier is stored in parts, so it spills down the chain;
        one larger than the whole chain keeps its first blocks, as many as the chain holds,
        and refuses the rest at once (counted and logged).

        `partial_last`: the last key is a prompt's partial block (fewer tokens than a block
        holds). No later prompt repeats its tokens exactly, so it is never stored (counted
        in `stats().calls.put_partial`); the engine knows, kvtier cannot. `hint`: a reuse
        hint for every key, as `hint()` gives it once the put is done. `session`: the
        agentic session (a string) whose request these blocks are, for the session hints
        of `kvtier.sessions` (blocks evicted by session, the least recently active first);
        `expect_within_s`: its next request comes within that many seconds
        (`expect_session`)."""
        chain = self._open()
        keys = checks.check_keys(keys, "put")
        row_ids = checks.check_rows(rows, blocks, self.block_size, len(keys), "put")
        if not isinstance(partial_last, bool):
            raise InvalidValueError(f"put: partial_last must be a bool, got {partial_last!r}")
        checked = checks.check_hint(hint, "put")
        if session is not None or expect_within_s is not None:
            check_session_id(session, "put")
        if expect_within_s is not None:
            check_within_s(expect_within_s, "put: expect_within_s")
        timeout_s = self.store_timeout_s
        stored = await store.put(chain, keys, blocks, row_ids, partial_last, timeout_s, checked)
        if session is not None:
            changes = self._sessions.read(session, keys, self._session_clock())
            if expect_within_s is not None:
                changes.merge(
                    self._sessions.expect(session, expect_within_s, self._session_clock())
                )
            store.give_session_changes(chain, changes)
        return stored

    def end_session(self, session: str) -> None:
        """`session` ended (`kvtier.sessions`): the blocks its puts named and no live
        session shares become `"never"` (evicted first, not demoted). UnknownSessionError
        for a session no put named or one that ended; nothing changes then."""
        chain = self._open()
        changes = self._sessions.end(session, self._session_clock())
        store.give_session_changes(chain, changes)

    def expect_session(self, session: str, within_s: float) -> None:
        """`session`'s next request comes within `within_s` seconds (0 < T <= a week):
        until then its blocks are evicted only after every idle session's."""
        chain = self._open()
        changes = self._sessions.expect(session, within_s, self._session_clock())
        store.give_session_changes(chain, changes)

    def hint(self, keys: Sequence[OffloadKey], reuse: Reuse, ttl_s: float | None = None) -> None:
        """Say whether blocks will be read again (`kvtier.hints`): each tier holding one
        gives its policy the hint ("never": evicted first and not demoted; "unlikely":
        before unhinted blocks; "likely": kept while others can go) for `ttl_s` seconds
        (None: while the block stays). Keys no tier holds are ignored."""
        checked = checks.check_reuse_hint(reuse, ttl_s, "hint")
        store.give_hint(self._open(), checks.check_keys(keys, "hint", distinct=False), checked)

    def lookup(self, keys: Sequence[OffloadKey]) -> int:
        """How many leading keys some tier holds (or is receiving). Starts nothing; the first
        key no tier holds is counted as a miss of every tier, and every key in
        `stats().calls.lookup_blocks` (the held ones in `lookup_held`). A key given twice is
        an InvalidValueError, as in `get`: `lookup([k, k])` counting 2 would promise a `get`
        of those keys that refuses them."""
        chain = self._open()
        keys = checks.check_keys(keys, "lookup")
        held = chain.manager.held_prefix(keys)
        chain.calls.lookup_blocks += len(keys)
        chain.calls.lookup_held += held
        return held

    async def get(
        self, keys: Sequence[OffloadKey], *, timeout_s: float | None = None
    ) -> torch.Tensor:
        """The blocks of `keys`, promoted to the top tier, as a uint8 tensor
        `[m, block_size]` on the top tier's device; m < len(keys) when block m is missing,
        failed verification or did not arrive within the deadline (`timeout_s`, default the
        hierarchy's `load_timeout_s`): recompute from there."""
        chain = self._open()
        keys = checks.check_keys(keys, "get")
        deadline = self._deadline(timeout_s, "get")
        top = chain.storages[0]
        device = top.device if isinstance(top, TensorStorage) else torch.device("cpu")
        out = torch.empty((len(keys), self.block_size), dtype=torch.uint8, device=device)
        rows = np.arange(len(keys), dtype=np.int64)
        served = await load.serve(chain, keys, load.Destination(out, rows, deadline))
        return out[:served]

    async def get_into(
        self,
        keys: Sequence[OffloadKey],
        into: torch.Tensor,
        rows: checks.Rows,
        *,
        timeout_s: float | None = None,
    ) -> int:
        """Copy the blocks of `keys` into rows `rows[i]` of `into` (uint8 `[n, block_size]`,
        e.g. an engine's host buffer), promoted as `get` does; how many leading keys arrived
        (recompute from there). The deadline bounds the wait for promotions, but a copy into
        `into` that has started is always waited for: when this returns (or is cancelled),
        nothing writes into `into` any more."""
        chain = self._open()
        keys = checks.check_keys(keys, "get_into")
        row_ids = checks.check_rows(rows, into, self.block_size, len(keys), "get_into")
        deadline = self._deadline(timeout_s, "get_into")
        into_rows = load.Destination(into, row_ids, deadline, caller_memory=True)
        return await load.serve(chain, keys, into_rows)

    def _deadline(self, timeout_s: float | None, what: str) -> float | None:
        """When a read must be done: `timeout_s` (checked) or `load_timeout_s` from now."""
        if timeout_s is None:
            return load.deadline_after(self.load_timeout_s)
        return load.deadline_after(checks.check_seconds(timeout_s, f"{what}: timeout_s"))

    def where(self, key: OffloadKey) -> str | None:
        """Name of the highest tier holding `key` (readable or being written), or None."""
        manager = self._open().manager
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
        stats = self._open().stats()
        self._log_disabled(stats.disabled_tiers)
        if self._publisher is not None:
            published = self._publisher.stats()
            stats = dataclasses.replace(
                stats, fleet_events_sent=published.events, fleet_events_dropped=published.dropped
            )
        return stats

    def take_events(self) -> list[OffloadingEvent]:
        """Stored / removed batches of every tier since the last call."""
        return self._open().manager.take_events()

    # -- more --------------------------------------------------------------------------------

    @property
    def disabled_tiers(self) -> dict[str, str]:
        """Disabled tiers, name -> why: those left out at open because they could not be
        opened (the config's `strict = false`) and those that disabled themselves while open
        (see `HierarchyStats.disabled_tiers`); empty when every tier serves."""
        return {} if self._chain is None else self._chain.disabled_now()

    @property
    def tiers(self) -> list[TierInfo]:
        """The open tiers, top first, with where each really lives (e.g. a GPU tier's CPU
        fallback)."""
        return [] if self._chain is None else list(self._chain.info)

    @property
    def chain(self) -> Chain:
        """The running chain (for inspection and tests); ManagerClosedError unless open."""
        return self._open()

    @property
    def manager(self) -> TieredManager:
        """The chain's bookkeeping (for inspection and tests)."""
        return self._open().manager

    @property
    def _engine(self) -> TransferEngine | None:
        """The chain's transfer engine while one runs (tests reach it here)."""
        return None if self._chain is None else self._chain.engine

    @property
    def storages(self) -> list[BlockStorage]:
        """Each tier's byte store, top first (for inspection and tests)."""
        return [] if self._chain is None else list(self._chain.storages)

    async def flush(self, timeout_s: float | None = None) -> int:
        """Copy every block held only by the upper tiers down to the bottom tier and wait
        for it, so a persistent bottom tier keeps them across a restart (a write-back chain
        otherwise keeps only what was demoted or cascaded). Returns the blocks copied; with
        `timeout_s`, stops waiting then (the copies in flight go on) and reports what did
        not make it in `last_flush` and the log."""
        chain = self._open()
        self.last_flush = await store.flush(
            chain, checks.check_seconds(timeout_s, "flush: timeout_s")
        )
        return self.last_flush.copied

    async def drain(self) -> None:
        """Wait until no transfer job (promotion, demotion, cascade) and no read a `get`
        gave up on at its deadline is in flight. ManagerClosedError unless open."""
        await self._open().drain()

    def check(self) -> None:
        """Verify the bookkeeping of every tier (raises BlockStateError)."""
        self._open().manager.check()

    async def prepare_engine_store(self, keys: Sequence[OffloadKey]) -> TieredStoreOutput | None:
        """For a serving engine that copies blocks into the top tier itself (see
        `kvtier.embed.offloading_spec`): reserve top-tier slots for the keys no tier holds,
        with `put`'s backpressure, and copy out the victims the reserve did not cover before
        returning, so the engine may write `store_spec`'s slots at once; then
        `manager.complete_store`. None: no room at the top (every block pinned)."""
        chain = self._open()
        keys = checks.check_keys(keys, "prepare_engine_store")
        return await store.prepare_engine_store(chain, keys, self.store_timeout_s)

    def start_planned_jobs(self) -> None:
        """Start the transfer jobs the chain's bookkeeping planned (demotions, promotions,
        cascades), for a serving engine that drives `manager` directly
        (`kvtier.embed.offloading_spec`); the verbs start their own. Call it on the
        hierarchy's event loop."""
        chain = self._open()
        chain.spawn_planned()
        chain.poke()

    # -- internals ---------------------------------------------------------------------------

    def _log_disabled(self, disabled: dict[str, str]) -> None:
        """Log the disabled tiers (which, and why), at most once per
        `DISABLED_LOG_INTERVAL_S`, so an embedder polling `stats()` sees them without being
        flooded."""
        if not disabled:
            return
        now = time.monotonic()
        last = self._disabled_logged_at
        if last is not None and now - last < DISABLED_LOG_INTERVAL_S:
            return
        self._disabled_logged_at = now
        log.warning(
            "serving without %d disabled tier%s: %s",
            len(disabled),
            "" if len(disabled) == 1 else "s",
            "; ".join(f"{name!r}: {why}" for name, why in disabled.items()),
        )

    def __repr__(self) -> str:
        info = self.tiers
        chain = " -> ".join(f"{t.name}[{t.medium}, {t.num_blocks}, {t.where}]" for t in info)
        disabled = self._chain.disabled if self._chain is not None else {}
        shown = f", disabled: {', '.join(disabled)}" if disabled else ""
        return f"Hierarchy({chain or 'not open'}, {self._state}{shown})"


def _keyword_options() -> list[str]:
    """The keyword options of `Hierarchy(...)`, what `from_config` and `from_toml` take."""
    return [
        name
        for name, parameter in inspect.signature(Hierarchy.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    ]


__all__ = [
    "DEFAULT_FLUSH_TIMEOUT_S",
    "DEFAULT_LOAD_TIMEOUT_S",
    "DEFAULT_STORE_TIMEOUT_S",
    "FlushReport",
    "Hierarchy",
    "HierarchyCounters",
    "HierarchyStats",
    "TierActivity",
    "TierInfo",
    "TransferStats",
]


def _start_publisher(config: HierarchyConfig, chain: Chain) -> EventPublisher:
    """The `[events]` publisher, bound and started, the chain's events connected to it
    (imported here: the events extra is needed only when the table is on)."""
    from kvtier.fleet.auth import auth_from_config
    from kvtier.fleet.publisher import EventPublisher

    auth = auth_from_config(config.events, config.namespace)
    loop = asyncio.get_running_loop()

    def contents(deliver: Callable[[list[TierContents] | None], None]) -> None:
        """The publisher's `ContentsSource`: the chain's contents read on its loop, where
        its events are recorded, so the two agree (a snapshot's consistency)."""

        def on_loop() -> None:
            manager = chain.manager
            deliver(None if manager.closed else manager.contents())

        loop.call_soon_threadsafe(on_loop)

    publisher = EventPublisher(config.events, auth=auth, contents=contents)
    publisher.start()
    chain.manager.connect_events(publisher.offer)
    return publisher
