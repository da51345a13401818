"""`Hierarchy`: the standalone async API: open a tier chain, put / lookup / get blocks by key.

```python
async with Hierarchy.from_toml("configs/default.toml") as h:
    await h.put(keys, blocks)       # blocks: uint8 tensor [n, block_bytes], any device
    n = h.lookup(keys)              # leading keys held by some tier
    out = await h.get(keys[:n])     # uint8 tensor [m, block_bytes] on the top tier's device
    h.where(keys[0]); h.stats(); h.take_events()
```

A hierarchy runs in the caller's event loop: its transfers are tasks of a TaskGroup it owns
for as long as it is open, and closing it waits for them. `SyncHierarchy` runs one on a loop
thread of its own, for an embedder that is not async.

Reads degrade, they never fail: a block that disappeared, failed its checksum or did not
arrive by the deadline ends the prefix `get` returns (recompute the rest). Bad input (wrong
dtype or block size, duplicate keys, a closed hierarchy) raises a `KvtierError`.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvtier.config import (
    CPUTierConfig,
    DiskTierConfig,
    GPUTierConfig,
    HierarchyConfig,
    load_config,
    parse_config,
)
from kvtier.engine import CALLER, Priority, TensorCopier, TransferEngine
from kvtier.errors import InvalidValueError, KeyFormatError, ManagerClosedError
from kvtier.keys import OffloadKey
from kvtier.manager import (
    ChainCounters,
    OffloadingEvent,
    TieredManager,
    TierManager,
    TierStats,
    TransferJob,
    make_tier_manager,
)
from kvtier.manager.tiered import slot_ids
from kvtier.tiers.pool import TorchPool, cuda_available
from kvtier.tiers.storage import BlockStorage

WAIT_SLICE_S = 0.05
"""Longest single wait of a `get` for a transfer before it looks again (a safety net: it is
normally woken by the transfer's completion)."""

LATENCY_SAMPLES = 100_000
"""Most recent `get` latencies kept for the percentiles in `stats()`."""


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
    put_refused: int = 0
    put_failed: int = 0
    get_blocks: int = 0
    get_served: int = 0
    get_timeouts: int = 0
    get_latency_s: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class HierarchyStats:
    """A snapshot: occupancy per tier, the chain's decisions, traffic per tier pair."""

    tiers: list[TierStats]
    info: list[TierInfo]
    chain: ChainCounters
    calls: HierarchyCounters
    pairs: dict[tuple[str, str], tuple[int, int, float]]
    """(source, destination) -> (blocks, bytes, seconds spent copying)."""
    jobs: dict[str, int]
    cascades_dropped: int
    corrupt_blocks: int
    failed_blocks: int

    def latency_percentile(self, q: float) -> float:
        """The q-th percentile (0..100) of recent `get` latencies, in seconds (0 if none)."""
        samples = self.calls.get_latency_s
        return float(np.percentile(samples, q)) if samples else 0.0


def _describe(storage: BlockStorage) -> str:
    """Where a tier's bytes live, for `tiers` and reports (fixed for the tier's lifetime)."""
    if isinstance(storage, TorchPool):
        return storage.describe()
    path = getattr(storage, "path", None)
    direct = getattr(storage, "direct_io_active", False)
    compression = getattr(storage, "compression", "none")
    mode = "O_DIRECT" if direct else "buffered"
    codec = "" if compression == "none" else f", {compression}"
    return f"files in {path} ({mode}{codec})" if path is not None else type(storage).__name__


def _check_keys(keys: Sequence[OffloadKey], what: str) -> list[OffloadKey]:
    given: object = keys
    if isinstance(given, bytes | str) or not isinstance(given, Sequence):
        raise KeyFormatError(f"{what}: keys must be a sequence of bytes keys, got {type(keys)}")
    checked = list(keys)
    for key in checked:
        if not isinstance(key, bytes):
            raise KeyFormatError(f"{what}: every key must be bytes, got {type(key).__name__}")
    seen: set[bytes] = set()
    for key in checked:
        if key in seen:
            raise InvalidValueError(f"{what}: duplicate key {key!r} in one call")
        seen.add(key)
    return checked


class Hierarchy:
    """An open tier chain: bookkeeping, storages and the transfer engine, in one event loop."""

    def __init__(
        self,
        config: HierarchyConfig,
        *,
        load_timeout_s: float | None = None,
        max_concurrency: int = 4,
        max_pending_cascades: int = 64,
        disk_options: Mapping[str, Any] | None = None,
        flush_on_close: bool = False,
    ) -> None:
        if load_timeout_s is not None and load_timeout_s <= 0:
            raise InvalidValueError(f"load_timeout_s must be > 0, got {load_timeout_s}")
        self.config = config
        self.load_timeout_s = load_timeout_s
        self.block_size = config.block_size
        self._max_concurrency = max_concurrency
        self._max_pending_cascades = max_pending_cascades
        self._disk_options = dict(disk_options or {})
        self.flush_on_close = flush_on_close
        self._manager: TieredManager | None = None
        self._engine: TransferEngine | None = None
        self._storages: list[BlockStorage] = []
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._job_tasks: dict[int, asyncio.Task[Any]] = {}
        self._changed: asyncio.Condition | None = None
        self._calls = HierarchyCounters()
        self._info: list[TierInfo] = []
        self._state = "new"

    # -- opening and closing ----------------------------------------------------------------

    @classmethod
    def from_config(
        cls, config: HierarchyConfig | Mapping[str, Any] | str | os.PathLike[str], **options: Any
    ) -> Hierarchy:
        """A hierarchy for a validated config, a config dict, or a TOML file path."""
        if isinstance(config, HierarchyConfig):
            return cls(config, **options)
        if isinstance(config, Mapping):
            return cls(parse_config(config), **options)
        return cls(load_config(config), **options)

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **options: Any) -> Hierarchy:
        """A hierarchy for a TOML config file."""
        return cls(load_config(Path(path)), **options)

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
        """Allocate the pools, open the disk tiers (restoring what they hold) and start."""
        if self._state != "new":
            raise ManagerClosedError(f"a hierarchy opens once; this one is {self._state}")
        self._state = "opening"
        copier = TensorCopier()
        tiers: list[TierManager] = []
        try:
            for tier in self.config.active_tiers():
                storage = await self._open_storage(tier, copier)
                self._storages.append(storage)
                manager = make_tier_manager(
                    tier.num_blocks, self.block_size, tier.medium, tier.policy, name=tier.name
                )
                restored = storage.restore()
                if restored:
                    manager.restore([(block.key, block.slot) for block in restored])
                tiers.append(manager)
                where = _describe(storage)
                self._info.append(
                    TierInfo(tier.name, tier.medium.value, tier.policy, tier.num_blocks, where)
                )
        except BaseException:
            for storage in self._storages:
                await storage.aclose()
            self._state = "closed"
            raise
        self._manager = TieredManager(tiers, write_policy=self.config.write_policy)
        self._engine = TransferEngine(
            self._manager,
            self._storages,
            copier=copier,
            max_concurrency=self._max_concurrency,
            max_pending_cascades=self._max_pending_cascades,
        )
        self._changed = asyncio.Condition()
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        self._state = "open"

    async def _open_storage(
        self, tier: GPUTierConfig | CPUTierConfig | DiskTierConfig, copier: TensorCopier
    ) -> BlockStorage:
        if isinstance(tier, DiskTierConfig):
            from kvtier.tiers.disk import DiskStore

            return await asyncio.to_thread(
                lambda: DiskStore.from_config(
                    tier, self.block_size, self.config.model_id, **self._disk_options
                )
            )
        if isinstance(tier, GPUTierConfig):
            return TorchPool(tier.num_blocks, self.block_size, tier.device, copier=copier)
        return TorchPool(
            tier.num_blocks,
            self.block_size,
            "cpu",
            pin_memory=tier.pin_memory and cuda_available(),
            copier=copier,
        )

    async def close(self) -> None:
        """Wait for transfers in flight, then close the tiers. Idempotent."""
        if self._state in ("closed", "closing", "new"):
            self._state = "closed"
            return
        if self.flush_on_close:
            await self.flush()
        self._state = "closing"
        try:
            await self.drain()
            if self._group is not None:
                await self._group.__aexit__(None, None, None)
        finally:
            for storage in self._storages:
                await storage.aclose()
            if self._manager is not None:
                self._manager.shutdown()
            self._state = "closed"

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    def _open(self) -> tuple[TieredManager, TransferEngine]:
        if self._state != "open" or self._manager is None or self._engine is None:
            raise ManagerClosedError(f"the hierarchy is {self._state}, not open")
        return self._manager, self._engine

    # -- the five verbs ----------------------------------------------------------------------

    async def put(self, keys: Sequence[OffloadKey], blocks: torch.Tensor) -> int:
        """Store blocks (row i is block `keys[i]`) in the top tier, demoting what it evicts.
        Returns how many were newly stored: keys already held by a tier are skipped, and a
        store that cannot get room (every block pinned) or fails to write stores nothing.
        A batch larger than the top tier is stored in parts, so it spills down the chain."""
        manager, _ = self._open()
        keys = _check_keys(keys, "put")
        self._check_blocks(blocks, len(keys))
        self._calls.put_blocks += len(keys)
        chunk = max(1, manager.top.backend.num_blocks // 4)
        stored = 0
        for start in range(0, len(keys), chunk):
            stored += await self._put_part(keys[start : start + chunk], blocks, start)
        return stored

    async def _put_part(self, keys: list[OffloadKey], blocks: torch.Tensor, first_row: int) -> int:
        manager, engine = self._open()
        out = manager.prepare_store(keys)
        if out is None:
            self._calls.put_refused += len(keys)
            return 0
        stored = out.keys_to_store
        self._calls.put_present += len(keys) - len(stored)
        if not stored:
            return 0
        failed: frozenset[OffloadKey] = frozenset(stored)
        try:
            if out.demotion is not None:
                await engine.run(out.demotion)
            row = {key: first_row + i for i, key in enumerate(keys)}
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
            self._spawn(manager.take_jobs())
            await self._notify()
        return len(stored) - len(failed)

    async def _read_pinned(
        self,
        part: list[OffloadKey],
        slots: npt.NDArray[np.int64],
        out: torch.Tensor,
        first_row: int,
        *,
        unpin: bool = True,
    ) -> int:
        """Copy blocks pinned at the top (in `slots`) into `out[first_row:]`; unpin them
        (unless the caller owns the pins); how many leading blocks arrived."""
        manager, engine = self._open()
        try:
            result = await engine.transfer(
                part,
                0,
                engine.endpoint(0),
                slots,
                CALLER,
                out,
                np.arange(first_row, first_row + len(part), dtype=np.int64),
                Priority.LOAD,
            )
        finally:
            if unpin:
                manager.complete_load(part)
        if unpin:
            manager.touch(part)
        good = 0
        while good < len(part) and part[good] not in result.failed:
            good += 1
        return good

    def lookup(self, keys: Sequence[OffloadKey]) -> int:
        """How many leading keys some tier holds (or is receiving). Starts nothing."""
        manager, _ = self._open()
        count = 0
        for key in keys:
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
        manager, _ = self._open()
        keys = _check_keys(keys, "get")
        started = time.perf_counter()
        timeout = self.load_timeout_s if timeout_s is None else timeout_s
        deadline = None if timeout is None else started + timeout
        top = self._storages[0]
        device = top.device if isinstance(top, TorchPool) else torch.device("cpu")
        out = torch.empty((len(keys), self.block_size), dtype=torch.uint8, device=device)
        chunk = max(1, manager.top.backend.num_blocks // 4)
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
                good = await self._read_pinned(part, slots, out, served)
                served += good
                if good < ready:
                    break
                continue
            if answers and answers[0] is False:
                if not self._tasks or manager.locate(batch[0]) is None:
                    break  # absent, or no room at the top and no transfer that will free some
                if not await self._wait_for_change(deadline):
                    self._calls.get_timeouts += 1
                    break
                continue
            hold = manager.hold_promotion(batch)
            if hold is None:  # being written by a put or a demotion: wait for it
                if not await self._wait_for_change(deadline):
                    self._calls.get_timeouts += 1
                    break
                continue
            try:
                task = self._job_tasks.get(hold.job_id)
                if task is not None and not task.done():
                    remaining = None if deadline is None else deadline - time.perf_counter()
                    done, _ = await asyncio.wait([task], timeout=remaining)
                    if not done:
                        self._calls.get_timeouts += 1
                        break
                granted = hold.granted or []
                lead = 0
                while lead < len(granted) and granted[lead] == hold.keys[lead]:
                    lead += 1
                if lead:
                    manager.touch(granted[:lead])
                    assert hold.slots is not None  # set with `granted` by complete_job
                    good = await self._read_pinned(
                        granted[:lead], hold.slots[:lead], out, served, unpin=False
                    )
                    served += good
                    if good < lead:
                        break
            finally:
                manager.release_hold(hold)
        self._calls.get_served += served
        latencies = self._calls.get_latency_s
        latencies.append(time.perf_counter() - started)
        if len(latencies) > LATENCY_SAMPLES:
            del latencies[: len(latencies) - LATENCY_SAMPLES]
        return out[:served]

    def where(self, key: OffloadKey) -> str | None:
        """Name of the highest tier holding `key` (readable or being written), or None."""
        manager, _ = self._open()
        found = manager.locate(key)
        return None if found is None else manager.tiers[found[0]].name

    def stats(self) -> HierarchyStats:
        """Occupancy per tier, the chain's counters and the traffic per tier pair."""
        manager, engine = self._open()
        pairs = {
            pair: (counter.blocks, counter.bytes, counter.seconds)
            for pair, counter in engine.counters.pairs.items()
        }
        return HierarchyStats(
            tiers=manager.stats(),
            info=list(self._info),
            chain=copy.deepcopy(manager.counters),
            calls=copy.deepcopy(self._calls),
            pairs=pairs,
            jobs=dict(engine.counters.jobs),
            cascades_dropped=engine.counters.cascades_dropped + manager.counters.cascades_dropped,
            corrupt_blocks=engine.counters.corrupt_blocks,
            failed_blocks=engine.counters.failed_blocks,
        )

    def take_events(self) -> list[OffloadingEvent]:
        """Stored / removed batches of every tier since the last call."""
        manager, _ = self._open()
        return manager.take_events()

    # -- more --------------------------------------------------------------------------------

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

    async def flush(self) -> int:
        """Copy every block held only by the upper tiers down to the bottom tier and wait
        for it, so a persistent bottom tier keeps them across a restart (a write-back chain
        otherwise keeps only what was demoted or cascaded). Returns the blocks copied."""
        manager, engine = self._open()
        await self.drain()
        bottom = len(manager.tiers) - 1
        jobs = manager.plan_flush()
        sent = [
            key for job in jobs for step in job.steps if step.dst == bottom for key in step.keys
        ]
        for job in jobs:
            await engine.run(job)
        await self._notify()
        return sum(1 for key in sent if manager.tiers[bottom].lookup(key) is True)

    async def drain(self) -> None:
        """Wait until no transfer job (promotion, cascade) is in flight."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def check(self) -> None:
        """Verify the bookkeeping of every tier (raises BlockStateError)."""
        self._open()[0].check()

    # -- internals ---------------------------------------------------------------------------

    def _check_blocks(self, blocks: torch.Tensor, count: int) -> None:
        if not isinstance(blocks, torch.Tensor):
            raise InvalidValueError(f"put: blocks must be a torch.Tensor, got {type(blocks)}")
        if blocks.dtype != torch.uint8:
            raise InvalidValueError(f"put: blocks must be uint8, got {blocks.dtype}")
        if blocks.dim() != 2 or blocks.shape[1] != self.block_size:
            raise InvalidValueError(
                f"put: blocks must have shape [n, {self.block_size}] (block_size), "
                f"got {list(blocks.shape)}"
            )
        if blocks.shape[0] != count:
            raise InvalidValueError(f"put: {count} keys but {blocks.shape[0]} blocks")
        if not blocks.is_contiguous():
            raise InvalidValueError("put: blocks must be a contiguous tensor")

    def _spawn(self, jobs: list[TransferJob]) -> None:
        if not jobs:
            return
        _, engine = self._open()
        group = self._group
        if group is None:
            raise ManagerClosedError("the hierarchy is not open")
        for job in jobs:
            if not engine.admit(job):
                continue
            task = group.create_task(self._run_job(job))
            self._tasks.add(task)
            self._job_tasks[job.id] = task
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(functools.partial(self._forget_task, job.id))

    def _forget_task(self, job_id: int, _task: asyncio.Task[Any]) -> None:
        self._job_tasks.pop(job_id, None)

    async def _run_job(self, job: TransferJob) -> None:
        engine = self._engine
        if engine is None:
            return
        try:
            await engine.run(job)
        finally:
            await self._notify()

    async def _notify(self) -> None:
        changed = self._changed
        if changed is not None:
            async with changed:
                changed.notify_all()

    async def _wait_for_change(self, deadline: float | None) -> bool:
        """Wait until a job or store completes; False if the deadline passed first."""
        changed = self._changed
        if changed is None:
            return False
        remaining = WAIT_SLICE_S
        if deadline is not None:
            remaining = min(remaining, deadline - time.perf_counter())
            if remaining <= 0:
                return False
        async with changed:
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return deadline is None or time.perf_counter() < deadline
        return True

    def __repr__(self) -> str:
        chain = " -> ".join(f"{t.name}[{t.medium}, {t.num_blocks}, {t.where}]" for t in self._info)
        return f"Hierarchy({chain or 'not open'}, {self._state})"


__all__ = [
    "Hierarchy",
    "HierarchyCounters",
    "HierarchyStats",
    "TierInfo",
]
