"""`JobLedger`: what a chain's transfer jobs are doing, from planned to settled.

The planner (`planner.py`) decides jobs; the ledger tracks them: the outbox of jobs not yet
taken by the engine (`take_jobs`), every job emitted and not yet completed (in flight), the
keys each open PROMOTE job is bringing to the top and the readers waiting for them
(`PromotionHold`), and the settling of a job once the engine is done with it: its copies
that arrived become readable, those that failed (or read a failed source) leave no trace at
their destination, blocks found corrupt are dropped, and every pin and pending block is
released exactly once. `TieredManager` checks that it is open before calling in.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from kvtier.errors import BlockStateError
from kvtier.keys import OffloadKey
from kvtier.manager.chain_tier import ChainTier
from kvtier.manager.counters import ChainCounters
from kvtier.manager.events import ChainEvents
from kvtier.manager.jobs import JobKind, PromotionHold, TransferJob, failed_pairs_of, slot_ids


class JobLedger:
    """The jobs of one chain of tiers (top first): queued, in flight, and their settling."""

    def __init__(
        self,
        tiers: Sequence[ChainTier],
        counters: ChainCounters,
        events: ChainEvents | None = None,
    ) -> None:
        """`counters`: the chain's, where failed copies, dropped cascades and corrupt blocks
        are counted; `events`: the chain's event stream, told of every settled write (a
        removal held for a copy down passes once the copy settled; None: a stream of its
        own, with no consumer)."""
        self.tiers: tuple[ChainTier, ...] = tuple(tiers)
        self.events = ChainEvents([tier.name for tier in tiers]) if events is None else events
        self.top = self.tiers[0]
        self.counters = counters
        self._outbox: list[TransferJob] = []
        self._open_jobs: dict[int, TransferJob] = {}
        self._promoting: dict[OffloadKey, TransferJob] = {}
        self._holds: dict[int, list[PromotionHold]] = {}

    # -- emitting --------------------------------------------------------------------------

    def emit(self, job: TransferJob, *, queue: bool = True) -> TransferJob | None:
        """Open a job (None if it has nothing to do), optionally into the outbox; the keys a
        PROMOTE job brings to the top (`promoted`) are on their way up until it settles them."""
        if not job.steps and not job.pending and not job.pins:
            return None
        self._open_jobs[job.id] = job
        for key in job.promoted:
            self._promoting[key] = job
        if queue:
            self._outbox.append(job)
        return job

    def take_jobs(self) -> list[TransferJob]:
        """Jobs queued since the last call, oldest first."""
        jobs, self._outbox = self._outbox, []
        return jobs

    # -- in flight -------------------------------------------------------------------------

    def is_open(self, job: TransferJob) -> bool:
        """Whether `job` was emitted and is not completed yet."""
        return job.id in self._open_jobs

    def open_jobs(self) -> list[TransferJob]:
        """Jobs emitted and not yet completed."""
        return list(self._open_jobs.values())

    def promotion_of(self, key: OffloadKey) -> TransferJob | None:
        """The PROMOTE job bringing `key` to the top tier, while it is open."""
        return self._promoting.get(key)

    def check_job_open(self, job: TransferJob) -> None:
        """Raise BlockStateError unless `job` is open (a job is settled exactly once)."""
        if job.id not in self._open_jobs:
            raise BlockStateError(f"{job!r} is not open (completed already, or never emitted)")

    def hold_promotion(self, keys: Sequence[OffloadKey]) -> PromotionHold | None:
        """Claim the leading `keys` that one open PROMOTE job is bringing to the top (those of
        the job promoting `keys[0]`); None if `keys[0]` is not being promoted. See
        `PromotionHold`; give it back with `release_hold` if the reader stops waiting."""
        if not keys:
            return None
        job = self._promoting.get(keys[0])
        if job is None:
            return None
        claimed: list[OffloadKey] = []
        for key in keys:
            if self._promoting.get(key) is not job:
                break
            claimed.append(key)
        hold = PromotionHold(job.id, tuple(claimed), source=job.source)
        self._holds.setdefault(job.id, []).append(hold)
        return hold

    def release_hold(self, hold: PromotionHold) -> None:
        """The reader stopped waiting: drop the claim, or unpin what it was granted."""
        if hold.granted is None:
            holds = self._holds.get(hold.job_id, [])
            if hold in holds:
                holds.remove(hold)
            return
        if hold.granted:
            self.top.complete_load(hold.granted)
        hold.granted = []

    # -- settling --------------------------------------------------------------------------

    def release_sources(self, job: TransferJob) -> None:
        """The job no longer reads its sources (every copy is done or has its own snapshot of
        the bytes): unpin them and free the slots it drained, so a store may reuse them while
        the copies to slow tiers go on. Idempotent; `complete_job` calls it too."""
        self.check_job_open(job)
        if job.sources_released:
            return
        job.sources_released = True
        for index, keys in job.pins:
            self.tiers[index].complete_load(keys)
        for index, blocks in job.drain:
            self.tiers[index].release_drained(blocks)

    def settle_tiers(
        self,
        job: TransferJob,
        tiers: Collection[int],
        failed: Iterable[tuple[int, OffloadKey]] = (),
        corrupt: Iterable[tuple[int, OffloadKey]] = (),
    ) -> None:
        """Settle early the blocks `job` writes into `tiers`, whose copies are all done
        (`failed`: as in `complete_job`): they become readable (or are dropped) now, while
        the job's other copies (to slow tiers) go on. `complete_job` settles the rest.
        Settling the top tier of a promotion also hands its blocks to the waiting readers."""
        self.check_job_open(job)
        now = [(index, keys) for index, keys in job.pending if index in tiers]
        job.pending = [(index, keys) for index, keys in job.pending if index not in tiers]
        self._settle_pending(job, now, failed_pairs_of(job, set(failed)))
        self.discard_corrupt(corrupt)  # before any reader looks them up again
        if 0 in tiers:
            self._finish_promotion(job)

    def complete_job(
        self,
        job: TransferJob,
        failed: Iterable[tuple[int, OffloadKey]] = (),
        corrupt: Iterable[tuple[int, OffloadKey]] = (),
    ) -> None:
        """Settle a job's bookkeeping once the engine is done with it (or gave up on it).

        `failed`: (tier, key) copies that did not arrive intact; those blocks are dropped from
        that tier (and any copy that read from them is taken to have failed too). `corrupt`:
        (tier, key) sources whose stored bytes were bad; they are dropped from that tier once
        unpinned. Every pin and pending block of the job is released exactly once.
        """
        self.check_job_open(job)
        self.release_sources(job)
        del self._open_jobs[job.id]
        self._settle_pending(job, job.pending, failed_pairs_of(job, set(failed)))
        job.pending = []
        self.discard_corrupt(corrupt)
        self._finish_promotion(job)

    def discard_corrupt(self, corrupt: Iterable[tuple[int, OffloadKey]]) -> None:
        """Drop (tier, key) blocks whose stored bytes were found bad (once unpinned; counted
        in `corrupt_dropped`; idempotent)."""
        by_tier: dict[int, list[OffloadKey]] = {}
        for index, key in corrupt:
            by_tier.setdefault(index, []).append(key)
        for index, keys in by_tier.items():
            self.counters.corrupt_dropped += len(self.tiers[index].discard(keys))

    def _finish_promotion(self, job: TransferJob) -> None:
        """The job's blocks at the top are settled: it promotes them no more, and each
        reader holding a claim on them gets the ones that arrived, pinned. Idempotent."""
        for key in job.promoted:
            if self._promoting.get(key) is job:
                del self._promoting[key]
        for hold in self._holds.pop(job.id, []):
            hold.granted = [key for key in hold.keys if self.top.has(key) is True]
            if hold.granted:
                hold.slots = slot_ids(self.top.prepare_load(hold.granted))

    def _settle_pending(
        self,
        job: TransferJob,
        entries: Sequence[tuple[int, tuple[OffloadKey, ...]]],
        bad: set[tuple[int, OffloadKey]],
    ) -> None:
        for index, keys in entries:
            tier = self.tiers[index]
            lost = [key for key in keys if (index, key) in bad]
            kept = [key for key in keys if (index, key) not in bad]
            if kept:
                tier.complete_store(kept)
            if lost:
                tier.complete_store(lost, success=False)
                if job.kind is JobKind.CASCADE:
                    self.counters.cascades_dropped += len(lost)
                else:
                    self.counters.copy_failures += len(lost)
            if self.events.on:
                self.events.settled(index, keys)
