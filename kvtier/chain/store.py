"""The put protocol: how blocks get into the top tier, and how a flush copies them down.

A put, part by part (a part is at most a quarter of the top tier, so a large batch spills
down the chain):

1. `reserve`: backpressure (counted) while the top tier's reserve is exhausted and
   background demotions are still giving slots back, then the bookkeeping's decision
   (`TieredManager.prepare_store`: the keys to store, their slots, the victims' demotion).
2. `wait_for_victims`: when the reserve did not cover the store, its victims are copied out
   first; the store waits for their snapshot only (a memory copy when they go to a slow
   tier), never for their writes below. `prepare_engine_store`, the hook of a serving engine
   that copies blocks into the top tier itself, shares steps 1 and 2.
3. The caller's rows are copied into the slots (`Chain.copy_in`), and the bookkeeping
   settled (`complete_store`) whatever happened, so a failed or cancelled put leaves no
   pending slot; the jobs it planned (cascades) start in the background. A refill of a
   reserve it made due is planned on the loop's next turn, once the put has returned
   (`Chain.plan_refills`): choosing its victims (~1.4 us a block, ~0.75 ms for a refill of
   ~512) is not the put's wait.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import numpy.typing as npt
import torch

from kvtier.chain.runtime import Chain
from kvtier.chain.stats import FlushReport
from kvtier.hints import HeldHint, ReuseHint
from kvtier.keys import OffloadKey
from kvtier.manager import TieredStoreOutput, TransferJob, slot_ids
from kvtier.sessions import SessionChanges

log = logging.getLogger("kvtier.chain")


async def put(
    chain: Chain,
    keys: list[OffloadKey],
    blocks: torch.Tensor,
    rows: npt.NDArray[np.int64],
    partial_last: bool,
    timeout_s: float | None,
    hint: ReuseHint | None = None,
) -> int:
    """Store block `keys[i]` from row `rows[i]` of `blocks` in the top tier; how many were
    newly stored. `partial_last`: the last key is a prompt's partial block, never stored.
    `timeout_s`: the longest backpressure wait of each part (None: as long as it takes).
    `hint`: given to every key of a part (`give_hint`), those held already included, once
    its slots are reserved and before its store completes, so that write-through does not
    cascade a block hinted "never"."""
    started = time.perf_counter()
    chain.calls.put_blocks += len(keys)
    held = chain_capacity(chain)
    if len(keys) > held:
        keys, rows, partial_last = _past_capacity(chain, keys, rows, partial_last, held)
    partial = keys[-1] if partial_last and keys else None
    chunk = max(1, chain.manager.top.num_blocks // 4)
    stored = 0
    for start in range(0, len(keys), chunk):
        chain.check_open()
        part = keys[start : start + chunk]
        last = partial if start + len(part) == len(keys) else None
        stored += await _put_part(
            chain, part, blocks, rows[start : start + len(part)], last, timeout_s, hint
        )
    chain.calls.put_latency.observe(time.perf_counter() - started)
    return stored


def chain_capacity(chain: Chain) -> int:
    """The most distinct blocks the chain holds at once: every tier's blocks (a block lives
    in one tier), or the largest tier's with write-through (every tier below the top keeps
    a copy)."""
    sizes = [tier.num_blocks for tier in chain.manager.tiers]
    return max(sizes) if chain.manager.write_policy == "write-through" else sum(sizes)


def _past_capacity(
    chain: Chain,
    keys: list[OffloadKey],
    rows: npt.NDArray[np.int64],
    partial_last: bool,
    held: int,
) -> tuple[list[OffloadKey], npt.NDArray[np.int64], bool]:
    """A put of more blocks than the whole chain holds keeps its first `held` (a prefix):
    storing the rest would only evict the put's own head (and everything else), leaving a
    tail no lookup reaches, since a prefix is served from its first block. The rest is
    refused at once (counted, logged), never churned through the chain."""
    dropped = len(keys) - held
    partial = int(partial_last)  # the partial block is the last, among those dropped
    chain.calls.put_partial += partial
    chain.calls.put_refused += dropped - partial
    log.warning(
        "put: %d blocks, more than the whole chain holds (%d): the first %d are stored and "
        "the other %d refused (they would evict the put's own first blocks); put a prefix "
        "of at most %d blocks, or give the chain more capacity",
        len(keys),
        held,
        held,
        dropped,
        held,
    )
    return keys[:held], rows[:held], False


def give_hint(chain: Chain, keys: list[OffloadKey], hint: ReuseHint) -> None:
    """Give every tier holding some of `keys` the application's reuse hint, its TTL turned
    into a deadline on the monotonic clock (the one the bookkeeping's tiers read)."""
    chain.check_open()
    expires_at = None if hint.ttl_s is None else time.monotonic() + hint.ttl_s
    chain.manager.hint(keys, HeldHint(hint.reuse, expires_at))


def give_session_changes(chain: Chain, changes: SessionChanges) -> None:
    """Give every tier what a session event asks (`kvtier.sessions`): the ranks, and the
    `"never"` hint on the keys of an ended session no live one read."""
    chain.check_open()
    if changes.ranks:
        chain.manager.rank(changes.ranks)
    if changes.never:
        chain.manager.hint(changes.never, HeldHint("never"))


async def _put_part(
    chain: Chain,
    keys: list[OffloadKey],
    blocks: torch.Tensor,
    rows: npt.NDArray[np.int64],
    partial: OffloadKey | None,
    timeout_s: float | None,
    hint: ReuseHint | None = None,
) -> int:
    """One part of a put: admission, reserve, hint, wait for the victims, copy, settle."""
    deadline = None if timeout_s is None else time.perf_counter() + timeout_s
    gate = chain.gate
    if not gate.open_now():
        chain.calls.put_admission_waits += 1
    if not await gate.enter(deadline):
        chain.calls.put_store_timeouts += 1
    try:
        return await _admitted_part(chain, keys, blocks, rows, partial, deadline, hint)
    finally:
        gate.leave()


async def _admitted_part(
    chain: Chain,
    keys: list[OffloadKey],
    blocks: torch.Tensor,
    rows: npt.NDArray[np.int64],
    partial: OffloadKey | None,
    deadline: float | None,
    hint: ReuseHint | None,
) -> int:
    """A part let in by the gate: reserve, hint, wait for the victims, copy, settle."""
    timeout_s = None if deadline is None else max(0.0, deadline - time.perf_counter())
    out = await reserve(chain, keys, timeout_s, partial=partial)
    if hint is not None:
        give_hint(chain, keys, hint)
    if out is None:
        chain.calls.put_refused += len(keys)
        chain.spawn_planned()
        return 0
    stored = out.keys_to_store
    _count_skipped(chain, keys, out, partial)
    if not stored:
        chain.spawn_planned()
        return 0
    failed: frozenset[OffloadKey] = frozenset(stored)
    try:
        if out.demotion is not None:
            await wait_for_victims(chain, out.demotion)
        row_of = {key: int(rows[i]) for i, key in enumerate(keys)}
        src_rows = np.asarray([row_of[key] for key in stored], dtype=np.int64)
        failed = (await chain.copy_in(stored, blocks, src_rows, slot_ids(out.store_spec))).failed
    finally:
        _settle_store(chain, stored, failed)
    return len(stored) - len(failed)


def _count_skipped(
    chain: Chain, keys: list[OffloadKey], out: TieredStoreOutput, partial: OffloadKey | None
) -> None:
    """Count the keys of a part that are not stored: partial, present, or refused."""
    calls = chain.calls
    skipped = int(partial is not None and partial in out.refused_keys)
    calls.put_partial += skipped
    calls.put_present += len(keys) - len(out.keys_to_store) - len(out.refused_keys)
    calls.put_refused += len(out.refused_keys) - skipped


def _settle_store(chain: Chain, stored: list[OffloadKey], failed: frozenset[OffloadKey]) -> None:
    """The store's bytes are in (or not): settle its slots, count, start what it planned."""
    manager = chain.manager
    ok = [key for key in stored if key not in failed]
    if ok:
        manager.complete_store(ok)
    if failed:
        manager.complete_store(list(failed), success=False)
    chain.calls.put_stored += len(ok)
    chain.calls.put_failed += len(failed)
    if failed:
        chain.notice_lost_tiers()
    chain.spawn_planned()
    chain.poke()


async def reserve(
    chain: Chain,
    keys: list[OffloadKey],
    timeout_s: float | None,
    *,
    partial: OffloadKey | None = None,
) -> TieredStoreOutput | None:
    """Wait for room (`wait_for_reserve`), then take the bookkeeping's decision: slots at
    the top for the keys no tier holds (pending until `complete_store`), and the demotion
    of the victims the reserve did not cover. None: no room (every block pinned)."""
    await wait_for_reserve(chain, len(keys), timeout_s)
    return chain.manager.prepare_store(keys, partial=() if partial is None else (partial,))


async def wait_for_victims(chain: Chain, demotion: TransferJob) -> None:
    """The reserve did not cover a store: its victims are copied out first, and the store
    waits until their snapshot is taken (only a memory copy when they go to a slow tier;
    their writes below run behind). Counted as a demotion wait."""
    chain.calls.put_demotion_waits += 1
    await chain.run_now(demotion)


async def wait_for_reserve(chain: Chain, wanted: int, timeout_s: float | None) -> None:
    """Backpressure (counted): wait while the top tier has fewer free slots than a store
    wants and background demotions are still giving slots back (so the store does not
    evict at once what they are about to free), or while a tier could not take that
    many blocks until the stores or demotions in flight into it land (so none is
    refused or dropped while the chain has room). Past `timeout_s` it stops waiting,
    counted: a stuck lower tier must not stop stores, which evict (or drop) as they must."""
    counted = False
    deadline = None if timeout_s is None else time.perf_counter() + timeout_s
    while _must_wait(chain, wanted):
        if not counted:
            chain.calls.put_backpressure_waits += 1
            counted = True
        if not await chain.wait_for_change(deadline):
            chain.calls.put_store_timeouts += 1
            return


def _must_wait(chain: Chain, wanted: int) -> bool:
    """Whether a store of `wanted` blocks should wait for the chain to move first."""
    manager = chain.manager
    if manager.top.num_free >= wanted:
        return False
    # A refill a store made due and the chain has not planned yet is planned now: its
    # slots then drain, and this store waits for them as it would have (not evict itself).
    chain.plan_refills()
    if any(tier.num_draining for tier in manager.tiers):
        return True
    for tier in manager.tiers:  # the top: other stores in flight; below: demotions
        stats = tier.stats()
        if stats.pending and stats.free + stats.evictable < wanted:
            return True
    return False


async def prepare_engine_store(
    chain: Chain, keys: list[OffloadKey], timeout_s: float | None
) -> TieredStoreOutput | None:
    """For a serving engine that copies blocks into the top tier itself: `reserve`, then
    `wait_for_victims`, so the engine may write `store_spec`'s slots at once and then call
    `complete_store`. None: no room at the top. Cancelled while the victims are copied out,
    the reserved slots are given back (nobody else knows of them). It does not pass the
    `PutGate`: the engine awaits it inside its step (why: `chain/gate.py`)."""
    manager = chain.manager
    out = await reserve(chain, keys, timeout_s)
    if out is not None and out.demotion is not None:
        try:
            await wait_for_victims(chain, out.demotion)
        except BaseException:
            if out.keys_to_store:
                manager.complete_store(out.keys_to_store, success=False)
            chain.spawn_planned()
            chain.poke()
            raise
    chain.spawn_planned()
    return out


async def flush(chain: Chain, timeout_s: float | None) -> FlushReport:
    """Copy every block held only by the upper tiers down to the bottom tier and wait for
    it (at most `timeout_s`; the copies in flight go on): what was copied, and what is still
    held only by volatile tiers (logged when any). Blocks hinted "never" stay where they are
    and are not counted as left."""
    manager = chain.manager
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    chain.plan_refills()  # a refill a put made due goes first, as it would have
    await chain.supervisor.drain(timeout_s)
    bottom = manager.tiers[-1]
    jobs = manager.plan_flush()
    last = len(manager.tiers) - 1
    sent = [key for job in jobs for step in job.steps if step.dst == last for key in step.keys]
    tasks = [chain.supervisor.spawn(job) for job in jobs]
    if tasks:
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        await asyncio.wait(tasks, timeout=remaining)
    chain.poke()
    copied = sum(1 for key in sent if bottom.has(key) is True)
    left = sum(  # blocks hinted "never" are not flushed on purpose (`plan_flush`)
        1
        for index, tier in enumerate(manager.tiers[:-1])
        for key in tier.idle_keys()
        if bottom.has(key) is not True and not manager.hinted_never(index, key)
    )
    if left:
        log.warning(
            "flush: %d blocks copied to %r, %d held only by volatile tiers remain",
            copied,
            bottom.name,
            left,
        )
    return FlushReport(copied=copied, left=left)


__all__ = [
    "flush",
    "prepare_engine_store",
    "put",
    "reserve",
    "wait_for_reserve",
    "wait_for_victims",
]
