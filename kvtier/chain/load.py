"""The get protocol: blocks out of the chain into the caller's memory, by a deadline.

A get, batch by batch (a batch is at most a quarter of the top tier), head first:

- blocks ready at the top are pinned and copied out (`read_pinned`);
- blocks found below start a promotion (`TieredManager.lookup_many`); the reader claims them
  (`hold_promotion`), waits until the promotion gave its blocks to the top (not for its
  victims' writes below), and copies them out pinned; a block another get's promotion is
  bringing up is claimed and served the same way, and counted a hit of the tier that
  promotion reads from (`TieredManager.count_joined_hits`: the get keeps a ledger of the
  blocks its own look-ups counted);
- a block on its way to a slow tier (a demotion's snapshot in the staging arena) is copied
  out of that snapshot, and counted a hit of the tier it is being written to
  (`TieredManager.count_staged_hits`; `staged_reads` counts them apart);
- another block being written (by a put or a demotion) is waited for; an absent one ends
  the prefix.

Reads degrade, they never fail: a block that is absent, failed its checksum or did not
arrive by the deadline ends the prefix the caller gets (it recomputes the rest). The
deadline bounds every wait; a read into the caller's own memory (`get_into`) that has
started is always waited for, so nothing writes there once the get returned.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from kvtier.chain.runtime import Chain
from kvtier.engine import MoveResult, finish_even_if_cancelled
from kvtier.keys import OffloadKey
from kvtier.manager import PromotionHold, slot_ids


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a get's blocks go, and by when: row `rows[i]` of `out` for the i-th key asked,
    `deadline` a `time.perf_counter()` value (None: no deadline); `caller_memory`: `out`
    is the caller's, so a read that started is waited for whatever the deadline."""

    out: torch.Tensor
    rows: npt.NDArray[np.int64]
    deadline: float | None
    caller_memory: bool = False


def deadline_after(timeout_s: float | None) -> float | None:
    """The `time.perf_counter()` value `timeout_s` seconds from now (None: no deadline)."""
    return None if timeout_s is None else time.perf_counter() + timeout_s


async def serve(chain: Chain, keys: list[OffloadKey], into: Destination) -> int:
    """Read the keys' blocks into `into`; how many leading ones arrived."""
    started = time.perf_counter()
    chunk = max(1, chain.manager.top.num_blocks // 4)
    served = 0
    counted: set[OffloadKey] = set()  # blocks this get's look-ups counted (as hits below)
    chain.calls.get_blocks += len(keys)
    while served < len(keys):
        batch = keys[served : served + chunk]
        got, go_on = await _serve_batch(chain, batch, into, served, counted)
        served += got
        if not go_on:
            break
    chain.calls.get_served += served
    chain.calls.get_latency.observe(time.perf_counter() - started)
    return served


async def _serve_batch(
    chain: Chain,
    batch: list[OffloadKey],
    into: Destination,
    first: int,
    counted: set[OffloadKey],
) -> tuple[int, bool]:
    """Serve the head of `batch` (the keys from position `first` on): (blocks served,
    whether to go on with the next). `counted`: the get's ledger (see `_serve_promoted`)."""
    manager = chain.manager
    answers = manager.lookup_many(batch, counted=counted)
    chain.spawn_planned()
    ready = _leading(answers, [True] * len(answers))
    if ready:
        part = batch[:ready]
        slots = slot_ids(manager.prepare_load(part))
        release = functools.partial(chain.unpin, part)
        good = await read_pinned(chain, part, slots, into, first, release)
        manager.touch(part[:good])
        return good, good == ready
    if answers and answers[0] is False:
        if not chain.supervisor.busy or manager.locate(batch[0]) is None:
            return 0, False  # absent, or no room at the top and no transfer to free some
        with chain.gate.load_waiting():  # no new put takes the room this get waits for
            return 0, await _wait(chain, into.deadline)
    hold = manager.hold_promotion(batch)
    if hold is None:  # being written by a put or a demotion
        staged = await _serve_staged(chain, batch, into, first)
        if staged:  # on its way to a slow tier: served from its snapshot, not after it
            return staged, True
        return 0, await _wait(chain, into.deadline)
    return await _serve_promoted(chain, hold, into, first, counted)


async def _serve_staged(
    chain: Chain, batch: list[OffloadKey], into: Destination, first: int
) -> int:
    """Serve the leading keys of `batch` that have a snapshot in the staging arena (on their
    way to a slow tier) from it; how many. Each is a hit of the tier it is being written
    to, taken before the copy (`TieredManager.count_staged_hits`); `staged_reads` of the
    engine counts them apart."""
    engine = chain.engine
    tiers = chain.manager.writing_tiers(batch[: engine.staged_prefix(batch)])
    staged = await engine.read_staged(batch[: len(tiers)], into.out, into.rows[first:])
    chain.manager.count_staged_hits(tiers[:staged])
    return staged


async def _serve_promoted(
    chain: Chain,
    hold: PromotionHold,
    into: Destination,
    first: int,
    counted: set[OffloadKey],
) -> tuple[int, bool]:
    """Wait until the promotion `hold` claims gave its blocks to the top, then read the
    leading ones it brought (pinned for this reader): (blocks served, whether to go on).
    Those this get's look-ups did not count (`counted`: another get started the promotion)
    are counted hits of the tier it read them from, before the copy."""
    released = False
    try:
        staged = chain.staged_of(hold.job_id)
        if staged is not None and not staged.done():
            remaining = None if into.deadline is None else into.deadline - time.perf_counter()
            done, _ = await asyncio.wait([staged], timeout=remaining)
            if not done:
                chain.calls.get_timeouts += 1
                return 0, False
        granted = hold.granted or []
        lead = _leading(granted, hold.keys)
        if not lead:
            return 0, False  # the promotion brought none of them: a miss (recompute)
        joined = [key for key in granted[:lead] if key not in counted]
        chain.manager.count_joined_hits(hold, joined)
        counted.update(joined)
        chain.manager.touch(granted[:lead])
        assert hold.slots is not None  # set with `granted` by complete_job
        released = True  # the read gives the hold back when it is over
        release = functools.partial(chain.release_hold, hold)
        good = await read_pinned(chain, granted[:lead], hold.slots[:lead], into, first, release)
        return good, good == lead
    finally:
        if not released:
            chain.manager.release_hold(hold)


async def read_pinned(
    chain: Chain,
    part: list[OffloadKey],
    slots: npt.NDArray[np.int64],
    into: Destination,
    first: int,
    release: Callable[[], None],
) -> int:
    """Copy blocks pinned at the top (in `slots`) into `into`'s rows from position `first`
    on; how many leading blocks arrived by the deadline (0 if the read is still running
    then). `release` gives the pins back once the read is over, even if that is after this
    call returned (the late read only fills rows the caller no longer gets)."""
    rows = into.rows[first : first + len(part)]
    read = chain.read_top(part, slots, into.out, rows, release)
    if into.caller_memory:
        # The read writes into the caller's memory: never leave it running.
        return _arrived(part, await finish_even_if_cancelled(read))
    remaining = None if into.deadline is None else max(0.0, into.deadline - time.perf_counter())
    # Cancelled here, the read goes on; the chain releases its pins when it ends.
    done, _ = await asyncio.wait([read], timeout=remaining)
    if not done:
        chain.calls.get_timeouts += 1
        return 0
    return _arrived(part, read.result())


async def _wait(chain: Chain, deadline: float | None) -> bool:
    """Wait for the chain to change; False (a counted timeout) if the deadline passed."""
    if await chain.wait_for_change(deadline):
        return True
    chain.calls.get_timeouts += 1
    return False


def _arrived(part: list[OffloadKey], result: MoveResult) -> int:
    """How many leading blocks of `part` a read brought."""
    good = 0
    while good < len(part) and part[good] not in result.failed:
        good += 1
    return good


def _leading(got: Sequence[object], wanted: Sequence[object]) -> int:
    """How many leading items of `got` equal those of `wanted`."""
    lead = 0
    while lead < len(got) and lead < len(wanted) and got[lead] == wanted[lead]:
        lead += 1
    return lead


__all__ = ["Destination", "deadline_after", "read_pinned", "serve"]
