"""`Chain`: the running tier chain, the one object that drives both the bookkeeping and the
transfer engine.

It holds the chain's bookkeeping (`TieredManager`), the transfer engine (with its staging
arena), the `JobSupervisor` that owns every background job, the tiers' storages and the
change signal that wakes whatever waits for the chain to move. The put and get protocols
(`store.py`, `load.py`) are written in its terms: they ask the bookkeeping for decisions and
hand the moves to the chain (`copy_in`, `read_top`, `spawn`), never to the engine directly.
`assembly.py` builds one from a config and closes it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import torch

from kvtier.chain.gate import PutGate
from kvtier.chain.stats import HierarchyCounters, HierarchyStats, TierInfo, snapshot
from kvtier.engine import (
    CALLER,
    JobSupervisor,
    MoveResult,
    Priority,
    StagingArena,
    TransferEngine,
    finish_even_if_cancelled,
)
from kvtier.errors import ManagerClosedError
from kvtier.keys import OffloadKey
from kvtier.manager import PromotionHold, TieredManager, TransferJob
from kvtier.tiers.storage import BlockStorage

log = logging.getLogger("kvtier.chain")

WAIT_SLICE_S = 0.05
"""Longest single wait for the chain to change before a waiter looks again (a safety net:
it is normally woken by the change itself)."""


class ChangeSignal:
    """Wakes every waiter when the chain changes (a job done, slots given back, a store
    settled, a shared store's answer): each `poke` resolves the current event and starts a
    new one, so a waiter never misses a change that happens after it started waiting."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def poke(self) -> None:
        """Wake everything waiting now."""
        event = self._event
        self._event = asyncio.Event()
        event.set()

    async def wait(self, deadline: float | None) -> bool:
        """Wait for the next change (or `WAIT_SLICE_S`, whichever is first); False if the
        deadline (a `time.perf_counter()` value) passed first."""
        event = self._event
        remaining = WAIT_SLICE_S
        if deadline is not None:
            remaining = min(remaining, deadline - time.perf_counter())
            if remaining <= 0:
                return False
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
        # arrives as the event is set (the caller's Ctrl-C then never reaches it).
        try:
            async with asyncio.timeout(remaining):
                await event.wait()
        except TimeoutError:
            return deadline is None or time.perf_counter() < deadline
        return True


def _nothing() -> None:
    """A release with nothing to release."""


class Chain:
    """An open chain of tiers: bookkeeping, storages, transfer engine and supervisor, in
    one event loop. Built by `assembly.open_chain`, closed by `assembly.close_chain`."""

    def __init__(
        self,
        manager: TieredManager,
        engine: TransferEngine,
        storages: list[BlockStorage],
        info: list[TierInfo],
        disabled: dict[str, str],
        signal: ChangeSignal,
    ) -> None:
        """`info`: the open tiers, top first; `disabled`: tiers of the config left out at
        open, name -> why; `signal`: the change signal the tiers' listeners already poke."""
        self.manager = manager
        self.engine = engine
        self.storages = storages
        """Each tier's byte store, top first (the engine keeps its own list of them)."""
        self.info = info
        self.disabled = disabled
        """Disabled tiers, name -> why: left out at open, or disabled themselves since."""
        self.signal = signal
        self.supervisor = JobSupervisor(engine, self.job_done)
        self.calls = HierarchyCounters()
        self.gate = PutGate()
        """Admission of puts: a bounded number inside the chain at once, none while a get
        waits for room at the top (loads first, end to end)."""
        """What the API calls did (the put and get protocols count here)."""
        self.state = "open"
        """"open", then "closing" while `assembly.close_chain` settles it, then "closed"."""
        self._lost: set[int] = set()  # positions of the tiers that disabled themselves
        self._staged: dict[int, asyncio.Future[None]] = {}  # job id -> sources released
        self._reads: set[asyncio.Task[MoveResult]] = set()  # reads outliving their get
        self._refill: asyncio.Handle | None = None  # `plan_refills` on the loop's next turn
        self.release_switch_interval: Callable[[], None] = _nothing
        """Ends the chain's hold on the switch interval (`switch_interval.acquire`), at close."""

    @property
    def staging(self) -> StagingArena | None:
        """The arena of snapshots on their way to slow tiers (None: every tier is a pool)."""
        return self.engine.staging

    @property
    def persistent(self) -> bool:
        """Whether a tier keeps its blocks across a restart (what a flush copies down to)."""
        return any(storage.persistent for storage in self.storages)

    def check_open(self) -> None:
        """ManagerClosedError once the chain started closing."""
        if self.state != "open":
            raise ManagerClosedError(f"the hierarchy is {self.state}, not open")

    # -- the change signal ----------------------------------------------------------------

    def poke(self) -> None:
        """Wake everything waiting for a change (a job done, slots given back, a store)."""
        self.signal.poke()

    async def wait_for_change(self, deadline: float | None) -> bool:
        """Wait until a job or store completes (or a short slice passes); False if the
        deadline passed first."""
        return await self.signal.wait(deadline)

    # -- background jobs ------------------------------------------------------------------

    def spawn(self, jobs: list[TransferJob]) -> None:
        """Start jobs in the background. Each pokes the waiters once it no longer reads its
        sources (a demotion gave its slots back; a promotion's blocks reached the top and its
        readers got them), which may be long before its writes to slow tiers are done."""
        if not jobs:
            return
        loop = asyncio.get_running_loop()
        for job in jobs:
            if not self.engine.admit(job):
                continue
            staged: asyncio.Future[None] = loop.create_future()
            self._staged[job.id] = staged
            staged.add_done_callback(functools.partial(self._job_staged, job.id))
            self.supervisor.spawn(job, staged)

    def spawn_planned(self) -> None:
        """Start the jobs the bookkeeping planned since it was last asked. A refill a store
        made due is planned on the loop's next turn (`plan_refills`), so the put that made it
        due returns first."""
        manager = self.manager
        self.spawn(manager.take_jobs())
        if manager.refill_due and self._refill is None and not manager.closed:
            self._refill = asyncio.get_running_loop().call_soon(self._refill_soon)

    def plan_refills(self) -> None:
        """Plan the refill of a reserve a store made due (`TieredManager.plan_refills`: its
        victims chosen now, among the blocks ready and unpinned, never a slot a put still
        writes) and start it. `spawn_planned` calls it on the loop's next turn after the
        put; so does, at once, whatever must not go on without it: a store short of room
        (`store.wait_for_reserve`), `drain`, `store.flush` and closing (`settle`). A refill
        is the store's work, moved off its caller's path, not a new kind of job: planned
        later, it decides as the store would have on the tiers as they are then."""
        manager = self.manager
        if manager.closed or not manager.refill_due:
            return
        manager.plan_refills()
        self.spawn(manager.take_jobs())
        self.poke()

    def _refill_soon(self) -> None:
        """`plan_refills` on the loop's next turn (a callback: nothing awaits it, so an error
        is logged and counted as a job's, never raised into a caller)."""
        self._refill = None
        try:
            self.plan_refills()
        except Exception as error:
            self.supervisor.count_error(error)
            log.error("planning a refill failed: %r", error, exc_info=error)

    def staged_of(self, job_id: int) -> asyncio.Future[None] | None:
        """The future resolved once job `job_id` gave its sources back (and a promotion its
        blocks to its readers); None when that happened already (or it never ran here)."""
        return self._staged.get(job_id)

    async def run_now(self, job: TransferJob) -> None:
        """Run `job` (a store's demotion of its victims) and wait until it no longer reads
        its sources: the snapshot of the victims, not their writes to a slow tier. Cancelled
        meanwhile, it still waits for that, so no slot is reused under a copy."""
        staged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.supervisor.spawn(job, staged)
        await finish_even_if_cancelled(staged)

    def _job_staged(self, job_id: int, _: asyncio.Future[None]) -> None:
        """A job gave its sources back (and a promotion its blocks to its readers)."""
        self._staged.pop(job_id, None)
        self.poke()

    def job_done(self) -> None:
        """A transfer job ended (the supervisor's callback): note tiers that disabled
        themselves during it, then wake the waiters."""
        self.notice_lost_tiers()
        self.poke()

    @property
    def busy(self) -> bool:
        """Whether a transfer job, or a read a `get` gave up on, is in flight, or a refill
        is due and not planned yet (`plan_refills`)."""
        manager = self.manager
        refill = manager.refill_due and not manager.closed
        return self.supervisor.busy or bool(self._reads) or refill

    async def drain(self) -> None:
        """Wait until no transfer job and no read a `get` gave up on is in flight (a refill
        due is planned first, and waited for too)."""
        self.plan_refills()
        while self.busy:
            await self.supervisor.drain()
            if self._reads:
                await asyncio.wait(list(self._reads))
            self.plan_refills()

    async def settle(self, deadline: float) -> None:
        """Closing: wait for the reads and jobs in flight until `deadline` (the loop's
        clock), then cancel the jobs left (what they did not copy is lost, nothing is left
        half-written). A refill due is planned first, as the store that made it due would
        have planned it before the close began."""
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        self.plan_refills()
        loop = asyncio.get_running_loop()
        budget = max(0.0, deadline - loop.time())
        if self._reads:
            await asyncio.wait(list(self._reads), timeout=budget)
            budget = max(0.0, deadline - loop.time())
        if not await self.supervisor.drain(budget):
            log.warning(
                "closing: %d transfers still running after the flush budget; cancelling them",
                len(self.supervisor),
            )
            await self.supervisor.cancel_all()

    # -- moves between the caller and the top tier ------------------------------------------

    async def copy_in(
        self,
        keys: Sequence[OffloadKey],
        blocks: torch.Tensor,
        rows: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
    ) -> MoveResult:
        """Copy the caller's rows `rows[i]` of `blocks` into the top tier's slots `slots[i]`
        (a store's bytes), at load priority: the caller waits for it."""
        engine = self.engine
        return await engine.transfer(
            keys, CALLER, blocks, rows, 0, engine.endpoint(0), slots, Priority.LOAD
        )

    def read_top(
        self,
        keys: list[OffloadKey],
        slots: npt.NDArray[np.int64],
        out: torch.Tensor,
        rows: npt.NDArray[np.int64],
        release: Callable[[], None],
    ) -> asyncio.Task[MoveResult]:
        """Start copying blocks pinned at the top (in `slots`) into `out[rows[i]]`. The read
        is the chain's: it goes on if its caller stops waiting, and `release` gives the pins
        back once it is over. A block found bad at the top is dropped from the bookkeeping,
        so the next get is a plain miss instead of another failed read."""
        engine = self.engine
        read = asyncio.get_running_loop().create_task(
            engine.transfer(keys, 0, engine.endpoint(0), slots, CALLER, out, rows, Priority.LOAD)
        )
        self._reads.add(read)
        read.add_done_callback(functools.partial(self._read_done, release))
        return read

    def _read_done(self, release: Callable[[], None], read: asyncio.Task[MoveResult]) -> None:
        self._reads.discard(read)
        release()
        if read.cancelled() or read.exception() is not None or not read.result().corrupt:
            return
        if not self.manager.closed:
            self.manager.discard_corrupt(0, read.result().corrupt)

    def unpin(self, keys: list[OffloadKey]) -> None:
        """A read of the top tier's `keys` is over: give their pins back."""
        if not self.manager.closed:
            self.manager.complete_load(keys)
        self.poke()

    def release_hold(self, hold: PromotionHold) -> None:
        """A read of a promotion's blocks is over (or never started): give the hold back."""
        if not self.manager.closed:
            self.manager.release_hold(hold)
        self.poke()

    # -- tiers that disable themselves --------------------------------------------------------

    def disabled_now(self) -> dict[str, str]:
        """The disabled tiers: those noted so far, and a tier whose storage disabled itself
        since (read only, so it is safe from another thread, as `stats` is)."""
        disabled = dict(self.disabled)
        for info, storage in zip(self.info, list(self.storages), strict=False):
            if info.name not in disabled:
                reason = storage.disabled_reason
                if reason is not None:
                    disabled[info.name] = f"disabled while open: {reason}"
        return disabled

    def notice_lost_tiers(self) -> None:
        """Act on tiers whose storage disabled itself while open (a disk tier whose files
        were removed or replaced: its writes fail, its reads are misses): list it in
        `disabled`, and drop its blocks from the bookkeeping, so no lookup claims a block
        that is gone (their removed events tell the embedder). Blocks pinned now are dropped
        at a later call, once unpinned; the tier stays in the chain, and every store into it
        fails (counted). Called on the loop when a job ends or a put fails."""
        manager = self.manager
        if manager.closed:
            return
        for position, storage in enumerate(self.storages):
            if position not in self._lost:
                reason = storage.disabled_reason
                if reason is None:
                    continue
                self._lost.add(position)
                self.disabled[manager.tiers[position].name] = f"disabled while open: {reason}"
            tier = manager.tiers[position]
            idle = tier.idle_keys()
            if idle:
                tier.discard(idle)

    # -- inspection ---------------------------------------------------------------------------

    def stats(self) -> HierarchyStats:
        """One snapshot of every counter (see `kvtier.chain.stats`); it only reads, so it may
        be taken from another thread."""
        return snapshot(
            self.manager,
            self.engine,
            self.supervisor.counters,
            self.calls,
            self.info,
            self.disabled_now(),
            self.storages,
        )

    def __repr__(self) -> str:
        tiers = " -> ".join(f"{t.name}[{t.medium}, {t.num_blocks}, {t.where}]" for t in self.info)
        return f"Chain({tiers}, {self.state})"


__all__ = ["WAIT_SLICE_S", "Chain", "ChangeSignal"]
