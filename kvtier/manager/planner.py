"""`ChainPlanner`: what a chain of tiers decides, as transfer jobs (`TieredManager` asks it).

- **Stores** go to the top tier. A block that is already in some tier is not stored again.
- **Demotion**: when a tier must evict, each victim that the next tier down does not hold yet
  is copied there (write-back); the bottom tier drops its victims. The copy is a DEMOTE job
  that must run before the evicted slots are rewritten (`TieredStoreOutput.demotion`).
- **Write-through** (`write_policy="write-through"`): when a store completes, the new blocks
  are cascaded down the whole chain (a CASCADE job), so a later eviction finds them below and
  costs no copy. Cascades are the one kind of job the engine may drop under load.
- **Promotion**: `lookup` of a block that only a lower tier holds starts a PROMOTE job that
  copies it up through every tier above (each of which may demote its own victims on the way)
  and answers None ("ask again"); once the job completes, `lookup` answers True. Promotion
  that cannot get space is a miss (False), not an error.
- **Reuse hints** (`kvtier.hints`, `hint`): each tier holding a block gives its policy the
  hint. A demoted block carries its hint to the tier below, except a `"never"` block, which
  is dropped instead of demoted (the application said it will not be read again: copying it
  down would cost a slow tier a write for nothing; counted `hint_dropped`). With
  write-through, a block hinted "never" when its store completes is not cascaded either,
  nor copied down by a flush (`plan_flush`; both counted `hint_not_cascaded`), and a
  cascaded block's copies hold the hint it holds.
- **Ranks** (`rank`, what session hints become: `kvtier.sessions`) travel the same way: a
  demoted block is ranked below as it was above, a promoted or cascaded block's copies as
  their source. A lower tier that received blocks unranked would evict them after every
  ranked one, so it would evict first the sessions heard of last, the likeliest to come
  back: with a rank that travels, session hints order every tier alike.

Deciding is all it does: each job it plans is opened in the chain's `JobLedger` (`ledger.py`),
which hands it to the engine and settles it. It keeps the write policy and each tier's reserve.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.hints import HeldHint
from kvtier.keys import OffloadKey
from kvtier.manager.base import PrepareStoreOutput
from kvtier.manager.chain_tier import ChainTier
from kvtier.manager.counters import ChainCounters
from kvtier.manager.jobs import CopyStep, JobKind, TransferJob, slot_ids
from kvtier.manager.ledger import JobLedger

WritePolicy = Literal["write-back", "write-through"]

Watermarks = tuple[float, float]
"""(low, high) occupancy fractions of a tier: fuller than `high`, it is demoted in the
background down to `low`, so that a store finds free slots at once."""


RESERVE_GROWTH_DIVISOR = 8
"""A top tier's reserve grows (`TieredManager.reserve_for`) to at most 1/8 of the tier."""


def reserve_slots(num_blocks: int, watermarks: Watermarks, min_refill: int = 0) -> tuple[int, int]:
    """(free slots below which a refill starts, free slots a refill aims for) of a tier of
    `num_blocks` with these watermarks; (0, 0) when they keep no reserve. `min_refill`: the
    least a refill frees, in blocks (`refill_target`)."""
    low, high = watermarks
    if not 0 < low < high <= 1:
        raise InvalidValueError(
            f"watermarks must satisfy 0 < low < high <= 1, got low={low}, high={high}"
        )
    trigger = num_blocks - int(high * num_blocks)
    target = num_blocks - int(low * num_blocks)
    if trigger <= 0:
        return (0, 0)
    return trigger, refill_target(num_blocks, trigger, max(trigger, target), min_refill)


def refill_target(num_blocks: int, trigger: int, target: int, min_refill: int) -> int:
    """`target` raised so that a refill, which starts below `trigger` free slots, frees at
    least `min_refill` blocks: to `trigger + min_refill`, at most 1/8 of the tier (as
    `reserve_for` grows a reserve), so a small tier is never emptied for it. A slow tier
    below is then handed one large write per refill instead of many small ones, each paying
    its fixed costs (the disk store: ~1.2-2 ms a call). 0: `target` unchanged."""
    if min_refill <= 0:
        return target
    return max(target, min(trigger + min_refill, num_blocks // RESERVE_GROWTH_DIVISOR))


@dataclass(frozen=True, slots=True)
class TieredStoreOutput(PrepareStoreOutput):
    """`PrepareStoreOutput` of the top tier, plus the DEMOTE job (None if no victim needs a
    copy) that must complete before anything is written into `store_spec`."""

    demotion: TransferJob | None = None


def _copy_step(
    stored: Sequence[OffloadKey],
    source_slot: dict[OffloadKey, Any],
    src: int,
    dst: int,
    dst_ids: np.ndarray,
) -> CopyStep:
    """The copy of `stored` (a tier's keys_to_store, in call order) from their slots in tier
    `src` to the slots `dst_ids` that tier `dst` gave them."""
    src_ids = np.asarray([source_slot[key] for key in stored], dtype=np.int64)
    return CopyStep(tuple(stored), src, src_ids, dst, dst_ids)


class ChainPlanner:
    """The decisions of an ordered chain of tiers, top (fastest) first, as jobs opened in
    its ledger."""

    def __init__(
        self,
        tiers: Sequence[ChainTier],
        counters: ChainCounters,
        ledger: JobLedger,
        *,
        write_policy: WritePolicy,
        watermarks: Sequence[Watermarks | None] | None,
        merge_demotions_up_to: int = 0,
        min_refills: Sequence[int] | None = None,
        defer_refills: bool = False,
    ) -> None:
        """`tiers`, `write_policy` and the number of `watermarks` and `min_refills` as
        `TieredManager` checked them; `counters`: the chain's; `ledger`: where the jobs go;
        `merge_demotions_up_to`: see `_fold` (0: never); `min_refills`: per tier, the least
        its refill frees, in blocks (`refill_target`; None: 0 everywhere);
        `defer_refills`: a store only notes that a refill is due (`refill_due`), planned
        by the next `plan_refills` (False: by the store itself)."""
        self.tiers: tuple[ChainTier, ...] = tuple(tiers)
        self.top = self.tiers[0]
        self.counters = counters
        self.ledger = ledger
        self.events = ledger.events
        self.write_policy: WritePolicy = write_policy
        self.merge_demotions_up_to = merge_demotions_up_to
        self._min_refills = tuple(min_refills) if min_refills is not None else (0,) * len(tiers)
        self.defer_refills = defer_refills
        self.refill_due = False
        """A store left some tier below its reserve's trigger and its refill is not planned
        yet (`defer_refills` only): `plan_refills` plans it."""
        self._reserves: list[tuple[int, int]] = [
            (0, 0)
            if watermarks is None or watermarks[index] is None or index + 1 == len(tiers)
            else reserve_slots(
                tier.num_blocks,
                watermarks[index],  # type: ignore[arg-type]
                self._min_refills[index],
            )
            for index, tier in enumerate(tiers)
        ]

    # -- stores ----------------------------------------------------------------------------

    def plan_store(
        self, keys: Collection[OffloadKey], partial: Collection[OffloadKey] = ()
    ) -> TieredStoreOutput | None:
        """Top-tier slots for the keys no tier holds, and the DEMOTE job of the victims that
        makes room (opened, not queued: the caller runs it); then the reserve refills, queued
        (with `defer_refills`, only noted as due: `plan_refills`). None: no room at the top.
        `partial`: see `TieredManager.prepare_store`."""
        self.reserve_for(len(keys))  # the next store of this size finds its room free
        unique = list(dict.fromkeys(keys))
        skipped: list[OffloadKey] = []
        if partial:
            absent = {key for key in partial if all(tier.has(key) is False for tier in self.tiers)}
            skipped = [key for key in unique if key in absent]
            if skipped:
                unique = [key for key in unique if key not in absent]
                self.counters.partial_refused += len(skipped)
        below = self.tiers[1:]
        # Keys held only by a lower tier are not stored again; keys at the top stay protected.
        candidates = [
            key
            for key in unique
            if self.top.has(key) is not False or all(tier.has(key) is False for tier in below)
        ]
        job = TransferJob(JobKind.DEMOTE)
        out = self._store_into(0, candidates, job)
        if out is None:
            return None
        demotion = self.ledger.emit(job, queue=False)
        if not self.defer_refills:
            self._plan_reserves()
        elif not self.refill_due:
            self.refill_due = self._below_trigger()
        return TieredStoreOutput(
            out.keys_to_store,
            out.store_spec,
            out.evicted_keys,
            out.evicted_spec,
            refused_keys=[*out.refused_keys, *skipped],
            demotion=demotion,
        )

    def on_stored(self, keys: Sequence[OffloadKey]) -> None:
        """`keys` became ready at the top (a store completed): with write-through, cascade
        them down the chain (a CASCADE job, queued)."""
        if self.write_policy == "write-through":
            self._plan_cascade(keys)

    def _store_into(
        self, index: int, keys: Sequence[OffloadKey], job: TransferJob, *, moved: bool = False
    ) -> PrepareStoreOutput | None:
        """prepare_store on one tier; its victims are demoted by steps added to `job` (the
        deeper demotions first), and its new keys recorded as pending in `job`. `moved`: see
        `TierManager.prepare_store`."""
        events = self.events
        events.begin(index)  # its victims' removals wait for what `_demote` decides
        moved_down: list[OffloadKey] = []
        try:
            out = self.tiers[index].prepare_store(keys, moved=moved)
            if out is None:
                return None
            if out.keys_to_store and index > 0:
                job.pending.append((index, tuple(out.keys_to_store)))
            if out.evicted_keys:
                if out.evicted_spec is None:
                    raise BlockStateError(f"tier {self.tiers[index].name!r} evicted without slots")
                moved_down = self._demote(index, out.evicted_keys, slot_ids(out.evicted_spec), job)
            return out
        finally:
            events.end(index, moved_down)

    # -- reserves --------------------------------------------------------------------------

    def reserve_for(self, count: int) -> None:
        """Grow the top tier's reserve to cover stores of `count` blocks (`plan_store`
        calls it): its refill then starts below `count` free slots and aims for twice that
        (and for its floor above the new trigger: `refill_target`), at most 1/8 of the tier.
        Only a reserve the watermarks keep grows. So a stream of
        stores larger than the watermarks' reserve finds its slots freed in the background
        instead of evicting, and waiting for its victims' snapshot, on the store's path."""
        trigger, target = self._reserves[0]
        if trigger == 0 or count <= trigger:
            return
        num_blocks = self.top.num_blocks
        cap = num_blocks // RESERVE_GROWTH_DIVISOR
        trigger = max(trigger, min(count, cap))
        target = max(target, min(2 * count, cap))
        self._reserves[0] = (
            trigger,
            refill_target(num_blocks, trigger, target, self._min_refills[0]),
        )

    def plan_refills(self) -> bool:
        """Plan the refills a store left due (`refill_due`), queued as `_plan_reserves`
        queues them; whether one was due. With `defer_refills` the chain calls it once the
        put that made it due has returned, so that put does not pay for choosing the victims
        (~1.4 us a block). The decisions are those the store would have made, for the tiers
        as they are now: their victims are chosen among the blocks ready and unpinned then,
        so never a slot a store still writes (pending) or a read holds (pinned)."""
        if not self.refill_due:
            return False
        self.refill_due = False
        self._plan_reserves()
        return True

    def _below_trigger(self) -> bool:
        """Whether some tier's free slots (counting those draining) are below its reserve's
        trigger: what makes `_plan_reserves` plan a refill."""
        for tier, (trigger, _) in zip(self.tiers, self._reserves, strict=True):
            if trigger and tier.num_free + tier.num_draining < trigger:
                return True
        return False

    def _plan_reserves(self) -> None:
        """Queue background DEMOTE jobs for every tier whose free slots (counting those
        already draining) fell below its reserve: the policy's victims are evicted at once
        (their slots drain until the job has read them) and copied to the tier below where it
        lacks them. Top first, so a tier's refill can use the reserve of the tier below. A
        refill whose copy goes where an earlier refill of the same pass copies too (the
        victims an upper tier's refill evicted from it) is folded into that job (`_fold`)."""
        planned: list[TransferJob] = []
        for index, (trigger, target) in enumerate(self._reserves):
            if trigger == 0:
                continue
            tier = self.tiers[index]
            eventual = tier.num_free + tier.num_draining
            if eventual >= trigger:
                continue
            self.events.begin(index)
            moved_down: list[OffloadKey] = []
            job = TransferJob(JobKind.DEMOTE, background=True)
            try:
                keys, blocks = tier.evict_to_drain(target - eventual)
                if not keys:
                    continue
                self.counters.reserve_evicted += len(keys)
                slots = np.fromiter((block.block_id for block in blocks), np.int64, len(blocks))
                moved_down = self._demote(index, keys, slots, job)
            finally:
                self.events.end(index, moved_down)
            if not job.steps:  # every victim is held below already (or dropped): nothing to read
                tier.release_drained(blocks)
                continue
            job.drain.append((index, blocks))
            if not any(self._fold(earlier, job, index) for earlier in planned):
                planned.append(job)
        for job in planned:
            self.ledger.emit(job)

    def _fold(self, into: TransferJob, job: TransferJob, index: int) -> bool:
        """Fold the refill `job` of tier `index` into `into`, an earlier refill of the same
        pass that copies from tier `index` to the tier below too (the victims the upper
        tier's refill evicted from it), when both copies together hold at most
        `merge_demotions_up_to` blocks: one copy, so a slow tier below is handed one call,
        not two that each pay its fixed costs (docs/BENCHMARKS.md, "The replay's pair on a
        fast device"). Its deeper steps go first (they read slots the copy overwrites);
        the decisions are unchanged, only their copies grouped. Whether it was folded."""
        own = job.steps[-1]
        if (own.src, own.dst) != (index, index + 1):  # the tier below took none of them
            return False
        at = next(
            (i for i, step in enumerate(into.steps) if (step.src, step.dst) == (index, index + 1)),
            None,
        )
        if at is None or len(into.steps[at]) + len(own) > self.merge_demotions_up_to:
            return False
        step = into.steps[at]
        into.steps[at] = CopyStep(
            step.keys + own.keys,
            index,
            np.concatenate([step.src_ids, own.src_ids]),
            index + 1,
            np.concatenate([step.dst_ids, own.dst_ids]),
        )
        into.steps[:at] = [*job.steps[:-1], *into.steps[:at]]
        into.pending.extend(job.pending)
        into.drain.extend(job.drain)
        return True

    # -- demotions -------------------------------------------------------------------------

    def _demote(
        self, index: int, victims: Sequence[OffloadKey], slots: np.ndarray, job: TransferJob
    ) -> list[OffloadKey]:
        """Copy victims of tier `index` that the tier below lacks down to it, with their
        reuse hints; a victim hinted "never" is dropped instead. Returns the victims copied
        down or being written there already (their removal events wait for that write to
        settle: `ChainEvents`)."""
        hints = self.tiers[index].take_evicted_hints()
        ranks = self.tiers[index].take_evicted_ranks()
        if hints:
            victims, slots = self._drop_never(victims, slots, hints)
        if index + 1 == len(self.tiers):
            self.counters.dropped_at_bottom += len(victims)
            return []
        below = self.tiers[index + 1]
        states = [below.has(key) for key in victims]
        held = [key for key, state in zip(victims, states, strict=True) if state is True]
        if held:
            below.touch(held)
        if hints:
            self._carry_hints(below, held, hints)
        if ranks:
            self._carry_ranks(below, held, ranks)
        # Being written below (a cascade): the removal waits for that write to settle too.
        on_the_way = [key for key, state in zip(victims, states, strict=True) if state is None]
        missing = [
            (key, slot)
            for key, slot, state in zip(victims, slots, states, strict=True)
            if state is False
        ]
        if not missing:
            return on_the_way
        keys = [key for key, _ in missing]
        deeper = TransferJob(job.kind)
        # Write-through told the tier below of these blocks when they missed (the cascade);
        # their eviction from this tier is not another access. Write-back's demotion is the
        # first the tier below hears of them, so it stands for their accesses up here.
        out = self._store_into(index + 1, keys, deeper, moved=self.write_policy == "write-through")
        if out is None:
            self.counters.demotions_dropped += len(keys)
            return on_the_way
        job.steps.extend(deeper.steps)
        job.pending.extend(deeper.pending)
        # The tier below may admit fewer than it was offered (its admission, its policy):
        # copy exactly the blocks it took, each into the slot it gave that block.
        stored = out.keys_to_store
        self.counters.demotions_refused += len(keys) - len(stored)
        if stored:
            job.steps.append(
                _copy_step(stored, dict(missing), index, index + 1, slot_ids(out.store_spec))
            )
            if hints:
                self._carry_hints(below, stored, hints)
            if ranks:
                self._carry_ranks(below, stored, ranks)
        self.counters.demoted += len(stored)
        return [*on_the_way, *stored]

    def _drop_never(
        self, victims: Sequence[OffloadKey], slots: np.ndarray, hints: dict[OffloadKey, HeldHint]
    ) -> tuple[list[OffloadKey], np.ndarray]:
        """The victims (and their slots) not hinted "never"; the others are dropped."""
        kept = [
            i
            for i, key in enumerate(victims)
            if (h := hints.get(key)) is None or h.reuse != "never"
        ]
        self.counters.hint_dropped += len(victims) - len(kept)
        return [victims[i] for i in kept], slots[kept]

    @staticmethod
    def _carry_hints(
        below: ChainTier, keys: Sequence[OffloadKey], hints: dict[OffloadKey, HeldHint]
    ) -> None:
        """Give the tier below the hints its new (or already held) blocks had above."""
        by_hint: dict[HeldHint, list[OffloadKey]] = {}
        for key in keys:
            hint = hints.get(key)
            if hint is not None:
                by_hint.setdefault(hint, []).append(key)
        for hint, hinted in by_hint.items():
            below.hint(hinted, hint)

    @staticmethod
    def _carry_ranks(
        tier: ChainTier, keys: Sequence[OffloadKey], ranks: dict[OffloadKey, Any]
    ) -> None:
        """Give `tier` the ranks its new (or already held) blocks had where they came from."""
        carried = {key: rank for key in keys if (rank := ranks.get(key)) is not None}
        if carried:
            tier.rank(carried)

    def _ranks_of(self, index: int, keys: Sequence[OffloadKey]) -> dict[OffloadKey, Any]:
        """The ranks tier `index` holds of `keys` (what their copies elsewhere take)."""
        rank_of = self.tiers[index].rank_of
        return {key: rank for key in keys if (rank := rank_of(key)) is not None}

    # -- promotions ------------------------------------------------------------------------

    def start_promotion(self, keys: Sequence[OffloadKey], source: int) -> set[OffloadKey]:
        """Plan one PROMOTE job for `keys` (pinned in tier `source` by the caller; the job
        takes over the pins) up to the top; returns the keys that will reach it. The climb
        stops at a tier that cannot make room (the job still brings the blocks as high as they
        got, and they are misses for now)."""
        job = TransferJob(JobKind.PROMOTE, source=source)
        spec = self.tiers[source].spec_of(keys)
        job.pins.append((source, tuple(keys)))
        ranks = self._ranks_of(source, keys)
        climbing, src, src_ids = list(keys), source, slot_ids(spec)
        for index in range(source - 1, -1, -1):
            out = self._store_into(index, climbing, job)
            if out is None or not out.keys_to_store:
                break
            stored = out.keys_to_store  # call order, minus keys this tier already had
            dst_ids = slot_ids(out.store_spec)
            job.steps.append(
                _copy_step(stored, dict(zip(climbing, src_ids, strict=True)), src, index, dst_ids)
            )
            if ranks:  # the copies above are ranked as their source
                self._carry_ranks(self.tiers[index], stored, ranks)
            if index == 0:
                job.pending.append((0, tuple(stored)))
            climbing, src, src_ids = list(stored), index, dst_ids
        promoted = set(climbing) if src == 0 else set()
        if promoted:
            job.promoted = tuple(climbing)  # on their way up once the ledger opens the job
            self.counters.promotions += len(promoted)
        self.counters.promotions_refused += len(keys) - len(promoted)
        if job.steps:
            self.ledger.emit(job)
        else:
            self.tiers[source].complete_load(keys)
        return promoted

    # -- cascades --------------------------------------------------------------------------

    def _plan_cascade(
        self, keys: Sequence[OffloadKey], start: int = 0, *, queue: bool = True
    ) -> TransferJob | None:
        """Copy ready blocks of tier `start` down every tier below that lacks them (a CASCADE
        job, into the outbox unless `queue` is False). Blocks hinted "never" there are left
        out (`_not_never`): no path copies such a block down."""
        if start + 1 >= len(self.tiers) or not keys:
            return None
        keys = self._not_never(start, keys)
        if not keys:
            return None
        job = TransferJob(JobKind.CASCADE)
        spec = self.tiers[start].prepare_load(keys)
        job.pins.append((start, tuple(keys)))
        hint_of = self.tiers[start].hint_of
        hints = {key: hint for key in keys if (hint := hint_of(key)) is not None}
        ranks = self._ranks_of(start, keys)
        src_keys, src_ids, src = list(keys), slot_ids(spec), start
        for index in range(start + 1, len(self.tiers)):
            tier = self.tiers[index]
            wanted = [
                (k, s) for k, s in zip(src_keys, src_ids, strict=True) if tier.has(k) is False
            ]
            if not wanted:
                break
            out = self._store_into(index, [k for k, _ in wanted], job)
            if out is None:
                self.counters.cascades_dropped += len(wanted)
                break
            stored = out.keys_to_store
            dst_ids = slot_ids(out.store_spec)
            job.steps.append(_copy_step(stored, dict(wanted), src, index, dst_ids))
            if hints:  # the copies below hold the hints their source holds
                self._carry_hints(tier, stored, hints)
            if ranks:
                self._carry_ranks(tier, stored, ranks)
            self.counters.cascaded += len(stored)
            src_keys, src_ids, src = list(stored), dst_ids, index
        if not job.steps:
            self.tiers[start].complete_load(keys)
            return None
        return self.ledger.emit(job, queue=queue)

    def plan_flush(self) -> list[TransferJob]:
        """Copy every readable block that only the tiers above the bottom hold down to the
        bottom tier (e.g. before a clean shutdown, so that a persistent bottom tier keeps
        them), as CASCADE jobs, top tier first, returned (not queued for `take_jobs`).
        Blocks may evict older ones below, as any store does; blocks pinned or being written
        are skipped, and so are blocks hinted "never" (counted `hint_not_cascaded`, as
        write-through counts those it does not cascade)."""
        bottom = self.tiers[-1]
        jobs: list[TransferJob] = []
        for start in range(len(self.tiers) - 1):
            tier = self.tiers[start]
            keys = [key for key in tier.idle_keys() if bottom.has(key) is False]
            if keys:
                job = self._plan_cascade(keys, start, queue=False)
                if job is not None:
                    jobs.append(job)
        return jobs

    def hinted_never(self, index: int, key: OffloadKey) -> bool:
        """Whether tier `index` holds `key` hinted "never" (it is not copied down: see
        `_not_never`)."""
        held = self.tiers[index].hint_of(key)
        return held is not None and held.reuse == "never"

    def _not_never(self, index: int, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """The keys tier `index` does not hold hinted "never". Those are never copied down by
        a cascade (write-through, flush): evicted first and dropped, they would cost the
        tiers below a write nobody reads. Counted `hint_not_cascaded`."""
        kept = [key for key in keys if not self.hinted_never(index, key)]
        self.counters.hint_not_cascaded += len(keys) - len(kept)
        return kept
