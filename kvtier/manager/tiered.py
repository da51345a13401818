"""`TieredManager`: the bookkeeping of a chain of tiers, which decides promotions and demotions.

It is itself an `OffloadingManager`, so an engine that drives one tier can drive the chain:

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

Nothing here does I/O or waits: decisions go out as `TransferJob`s (`take_jobs`), the engine
moves the bytes, and `complete_job` settles the bookkeeping, including failures (a block that
could not be copied leaves no trace at its destination; a block found corrupt is dropped).
A block is never evicted while it is read, demoted or promoted: every job pins its sources
and its destinations are pending until it completes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from kvtier.errors import BlockStateError, InvalidValueError, ManagerClosedError
from kvtier.hints import HeldHint
from kvtier.keys import OffloadKey
from kvtier.manager.base import (
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvtier.manager.chain_tier import ChainTier
from kvtier.manager.counters import ChainCounters
from kvtier.manager.jobs import (
    CopyStep,
    JobKind,
    PromotionHold,
    TransferJob,
    slot_ids,
)
from kvtier.manager.ledger import JobLedger
from kvtier.manager.tier import TierStats
from kvtier.specs import LoadStoreSpec

WritePolicy = Literal["write-back", "write-through"]

Watermarks = tuple[float, float]
"""(low, high) occupancy fractions of a tier: fuller than `high`, it is demoted in the
background down to `low`, so that a store finds free slots at once."""


RESERVE_GROWTH_DIVISOR = 8
"""A top tier's reserve grows (`TieredManager.reserve_for`) to at most 1/8 of the tier."""


def reserve_slots(num_blocks: int, watermarks: Watermarks) -> tuple[int, int]:
    """(free slots below which a refill starts, free slots a refill aims for) of a tier of
    `num_blocks` with these watermarks; (0, 0) when they keep no reserve."""
    low, high = watermarks
    if not 0 < low < high <= 1:
        raise InvalidValueError(
            f"watermarks must satisfy 0 < low < high <= 1, got low={low}, high={high}"
        )
    trigger = num_blocks - int(high * num_blocks)
    target = num_blocks - int(low * num_blocks)
    return (trigger, max(trigger, target)) if trigger > 0 else (0, 0)


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


class TieredManager(OffloadingManager):
    """Bookkeeping of an ordered chain of tiers, top (fastest) first."""

    def __init__(
        self,
        tiers: Sequence[ChainTier],
        *,
        write_policy: WritePolicy = "write-back",
        watermarks: Sequence[Watermarks | None] | None = None,
    ) -> None:
        """`watermarks`: per tier, its (low, high) occupancy watermarks or None; a tier with
        watermarks and a tier below it keeps a reserve of free slots (see `Watermarks`).
        None (the default): no reserve anywhere, every eviction happens in the store that
        needs the room."""
        if not tiers:
            raise InvalidValueError("a TieredManager needs at least one tier")
        if write_policy not in ("write-back", "write-through"):
            raise InvalidValueError(
                f'write_policy must be "write-back" or "write-through", got {write_policy!r}'
            )
        block_sizes = {tier.block_size for tier in tiers}
        if len(block_sizes) != 1:
            raise InvalidValueError(f"every tier needs the same block size, got {block_sizes}")
        names = [tier.name for tier in tiers]
        if len(set(names)) != len(names):
            raise InvalidValueError(f"tier names must be unique, got {names}")
        self.tiers: tuple[ChainTier, ...] = tuple(tiers)
        if watermarks is not None and len(watermarks) != len(tiers):
            raise InvalidValueError(f"{len(watermarks)} watermarks for {len(tiers)} tiers")
        self._reserves: list[tuple[int, int]] = [
            (0, 0)
            if watermarks is None or watermarks[index] is None or index + 1 == len(tiers)
            else reserve_slots(tier.num_blocks, watermarks[index])  # type: ignore[arg-type]
            for index, tier in enumerate(tiers)
        ]
        self.write_policy: WritePolicy = write_policy
        self.block_size = tiers[0].block_size
        self.counters = ChainCounters(hits=[0] * len(tiers))
        self.ledger = JobLedger(self.tiers, self.counters)
        self._closed = False

    @property
    def top(self) -> ChainTier:
        return self.tiers[0]

    # -- reads -----------------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext | None = None) -> bool | None:
        return self.lookup_many([key], req_context)[0]

    def lookup_many(
        self,
        keys: Sequence[OffloadKey],
        req_context: ReqContext | None = None,
        *,
        counted: set[OffloadKey] | None = None,
    ) -> list[bool | None]:
        """`lookup` of a request's prefix, head first, stopping at the first miss (the answer
        list then ends with that False and is shorter than `keys`). Blocks found below the top
        are promoted together, one PROMOTE job per source tier, so their reads are batched;
        each is counted a hit of the tier it was found in and added to `counted` (a reader's
        ledger: see `count_joined_hits`)."""
        self._check_open()
        answers: list[bool | None] = []
        # Source tier -> positions in answers. Each found block is pinned at once: planning
        # one source tier's promotion may evict in another, and must not take these blocks.
        found_below: dict[int, list[int]] = {}
        found: set[OffloadKey] = set()
        for key in keys:
            state = self.top.lookup(key)
            if state is True:
                self.counters.lookups += 1
                self.counters.hits[0] += 1
                answers.append(True)
                continue
            if state is None or self.ledger.promotion_of(key) is not None or key in found:
                answers.append(None)
                continue
            source, state = self._lookup_below(key)
            if source is None:
                self.counters.lookups += 1
                self.counters.misses += 1
                answers.append(False)
                break
            if state is None:  # on its way into a lower tier (demotion, cascade): ask again
                answers.append(None)
                continue
            self.counters.lookups += 1
            self.counters.hits[source] += 1
            if counted is not None:
                counted.add(key)
            self.tiers[source].prepare_load([key])
            found.add(key)
            found_below.setdefault(source, []).append(len(answers))
            answers.append(None)
        # Blocks answered True must still be there when the caller pins them: hold them
        # while this call's promotions make room at the top.
        at_top = [key for key, answer in zip(keys, answers, strict=False) if answer is True]
        if found_below and at_top:
            self.top.prepare_load(at_top)
        try:
            for source, positions in found_below.items():
                promoted = self._start_promotion([keys[i] for i in positions], source)
                for position in positions:
                    if keys[position] not in promoted:
                        answers[position] = False
        finally:
            if found_below and at_top:
                self.top.complete_load(at_top)
        # A refused promotion ends the prefix there.
        for position, answer in enumerate(answers):
            if answer is False:
                return answers[: position + 1]
        return answers

    def _lookup_below(self, key: OffloadKey) -> tuple[int | None, bool | None]:
        """(the first tier below the top whose `lookup` of `key` is not False, that answer:
        True readable, None being written), or (None, False) when no tier below holds it."""
        for index in range(1, len(self.tiers)):
            state = self.tiers[index].lookup(key)
            if state is not False:
                return index, state
        return None, False

    def locate(self, key: OffloadKey) -> tuple[int, bool] | None:
        """(index of the highest tier holding `key`, whether it is readable there), or None.
        Pure inspection: starts nothing and counts nothing."""
        for index, tier in enumerate(self.tiers):
            state = tier.has(key)
            if state is not False:
                return index, state is True
        return None

    def writing_tiers(self, keys: Sequence[OffloadKey]) -> list[int | None]:
        """Per key, the highest tier holding it (None: no tier), readable or being written:
        the tier a block on its way down is logically in. Pure inspection."""
        return [None if (found := self.locate(key)) is None else found[0] for key in keys]

    def count_staged_hits(self, tiers: Sequence[int | None]) -> None:
        """A get served blocks from their copy in flight (a demotion's snapshot, readable in
        neither tier until its write lands), `lookup_many` having answered them "ask
        again": count each as a lookup and a hit of the tier it is being written to
        (`writing_tiers`, taken before the copy; the tier `Hierarchy.where` names), so that
        hits + misses = lookups holds for every get. A block no tier held any more (None)
        is left out of both."""
        for index in tiers:
            if index is not None:
                self.counters.lookups += 1
                self.counters.hits[index] += 1

    def count_joined_hits(self, hold: PromotionHold, keys: Sequence[OffloadKey]) -> None:
        """A get was served `keys` by a promotion another get started (`hold_promotion`),
        `lookup_many` having answered them "ask again" while they were on their way up:
        count each as a lookup and a hit of the tier the promotion read them from, as the
        get that started it was counted, so that hits + misses = lookups holds for every
        get. The caller passes only keys its own `lookup_many` calls did not count."""
        if hold.source is None or not keys:
            return
        self.counters.lookups += len(keys)
        self.counters.hits[hold.source] += len(keys)

    def held_prefix(self, keys: Sequence[OffloadKey]) -> int:
        """How many leading `keys` some tier holds (readable or being written); starts
        nothing. The first key no tier holds was asked of every tier and found in none: it
        is counted as a miss of the chain (so every tier counts it, see `ChainCounters`),
        and a caller that then gets only the held prefix has each miss counted once."""
        self._check_open()
        for count, key in enumerate(keys):
            if self.locate(key) is None:
                self.counters.lookups += 1
                self.counters.misses += 1
                return count
        return len(keys)

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> LoadStoreSpec:
        """Pin blocks of the top tier (after `lookup` said True) and say where they are."""
        self._check_open()
        return self.top.prepare_load(keys, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext | None = None) -> None:
        self._check_open()
        self.top.touch(keys, req_context)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> None:
        self._check_open()
        self.top.complete_load(keys, req_context)

    # -- writes ----------------------------------------------------------------------------

    def prepare_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext | None = None,
        *,
        partial: Collection[OffloadKey] = (),
    ) -> TieredStoreOutput | None:
        """Reserve top-tier slots for the keys that no tier holds. Run `demotion` (if any)
        before writing into `store_spec`; then `complete_store`. None: no room at the top.

        `partial` names keys that are a prompt's last, partial block (fewer tokens than a
        block holds): its hash covers tokens no later prompt repeats exactly, so no tier
        stores it; an absent one is reported in `refused_keys` (counted `partial_refused`)
        and no policy hears of it."""
        self._check_open()
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
        self._plan_reserves()
        return TieredStoreOutput(
            out.keys_to_store,
            out.store_spec,
            out.evicted_keys,
            out.evicted_spec,
            refused_keys=[*out.refused_keys, *skipped],
            demotion=demotion,
        )

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        success: bool = True,
        req_context: ReqContext | None = None,
    ) -> None:
        """Settle the top-tier stores of `prepare_store`. With write-through, successfully
        stored blocks are then cascaded down the chain (a CASCADE job from `take_jobs`)."""
        self._check_open()
        newly_ready = [key for key in dict.fromkeys(keys) if self.top.has(key) is None]
        self.top.complete_store(keys, success, req_context)
        if success and newly_ready and self.write_policy == "write-through":
            self._plan_cascade(newly_ready)

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

    def hint(self, keys: Collection[OffloadKey], hint: HeldHint | None) -> None:
        """Give every tier holding some of `keys` an application's reuse hint on them (None:
        withdraw it); keys no tier holds are ignored."""
        self._check_open()
        for tier in self.tiers:
            tier.hint(keys, hint)

    # -- jobs: tracked by the ledger -------------------------------------------------------

    def take_jobs(self) -> list[TransferJob]:
        """Jobs decided since the last call (promotions, cascades, background demotions that
        keep the reserves), oldest first. The DEMOTE job of a store that had to evict is
        returned by `prepare_store` itself, not here."""
        return self.ledger.take_jobs()

    def complete_job(
        self,
        job: TransferJob,
        failed: Iterable[tuple[int, OffloadKey]] = (),
        corrupt: Iterable[tuple[int, OffloadKey]] = (),
    ) -> None:
        """Settle a job once the engine is done with it (or gave up on it): `failed` copies
        and `corrupt` sources are dropped, every pin and pending block released exactly once
        (`JobLedger.complete_job`)."""
        self._check_open()
        self.ledger.complete_job(job, failed, corrupt)

    def settle_tiers(
        self,
        job: TransferJob,
        tiers: Collection[int],
        failed: Iterable[tuple[int, OffloadKey]] = (),
        corrupt: Iterable[tuple[int, OffloadKey]] = (),
    ) -> None:
        """Settle early the blocks `job` writes into `tiers`, whose copies are all done; a
        promotion's blocks reach their readers here (`JobLedger.settle_tiers`)."""
        self._check_open()
        self.ledger.settle_tiers(job, tiers, failed, corrupt)

    def release_sources(self, job: TransferJob) -> None:
        """The job no longer reads its sources: unpin them and free the slots it drained
        (`JobLedger.release_sources`; idempotent)."""
        self._check_open()
        self.ledger.release_sources(job)

    def discard_corrupt(self, tier: int, keys: Iterable[OffloadKey]) -> None:
        """Drop blocks of tier `tier` whose stored bytes a read found bad (once unpinned;
        counted in `corrupt_dropped`)."""
        self._check_open()
        self.ledger.discard_corrupt((tier, key) for key in keys)

    def is_open(self, job: TransferJob) -> bool:
        """Whether `job` was emitted and is not completed yet."""
        return self.ledger.is_open(job)

    def open_jobs(self) -> list[TransferJob]:
        """Jobs emitted and not yet completed."""
        return self.ledger.open_jobs()

    def promotion_of(self, key: OffloadKey) -> TransferJob | None:
        """The PROMOTE job bringing `key` to the top tier, while it is open."""
        return self.ledger.promotion_of(key)

    def hold_promotion(self, keys: Sequence[OffloadKey]) -> PromotionHold | None:
        """Claim the leading `keys` one open PROMOTE job is bringing to the top (None: `keys[0]`
        is not being promoted); see `PromotionHold` and `JobLedger.hold_promotion`."""
        self._check_open()
        return self.ledger.hold_promotion(keys)

    def release_hold(self, hold: PromotionHold) -> None:
        """The reader stopped waiting: drop the claim, or unpin what it was granted."""
        self._check_open()
        self.ledger.release_hold(hold)

    # -- planning --------------------------------------------------------------------------

    def _store_into(
        self, index: int, keys: Sequence[OffloadKey], job: TransferJob, *, moved: bool = False
    ) -> PrepareStoreOutput | None:
        """prepare_store on one tier; its victims are demoted by steps added to `job` (the
        deeper demotions first), and its new keys recorded as pending in `job`. `moved`: see
        `TierManager.prepare_store`."""
        out = self.tiers[index].prepare_store(keys, moved=moved)
        if out is None:
            return None
        if out.keys_to_store and index > 0:
            job.pending.append((index, tuple(out.keys_to_store)))
        if out.evicted_keys:
            if out.evicted_spec is None:
                raise BlockStateError(f"tier {self.tiers[index].name!r} evicted without slots")
            self._demote(index, out.evicted_keys, slot_ids(out.evicted_spec), job)
        return out

    def reserve_for(self, count: int) -> None:
        """Grow the top tier's reserve to cover stores of `count` blocks (`prepare_store`
        calls it): its refill then starts below `count` free slots and aims for twice that,
        at most 1/8 of the tier. Only a reserve the watermarks keep grows. So a stream of
        stores larger than the watermarks' reserve finds its slots freed in the background
        instead of evicting, and waiting for its victims' snapshot, on the store's path."""
        trigger, target = self._reserves[0]
        if trigger == 0 or count <= trigger:
            return
        cap = self.top.num_blocks // RESERVE_GROWTH_DIVISOR
        self._reserves[0] = (max(trigger, min(count, cap)), max(target, min(2 * count, cap)))

    def _plan_reserves(self) -> None:
        """Queue background DEMOTE jobs for every tier whose free slots (counting those
        already draining) fell below its reserve: the policy's victims are evicted at once
        (their slots drain until the job has read them) and copied to the tier below where it
        lacks them. Top first, so a tier's refill can use the reserve of the tier below."""
        for index, (trigger, target) in enumerate(self._reserves):
            if trigger == 0:
                continue
            tier = self.tiers[index]
            eventual = tier.num_free + tier.num_draining
            if eventual >= trigger:
                continue
            keys, blocks = tier.evict_to_drain(target - eventual)
            if not keys:
                continue
            self.counters.reserve_evicted += len(keys)
            job = TransferJob(JobKind.DEMOTE, background=True)
            slots = np.fromiter((block.block_id for block in blocks), np.int64, len(blocks))
            self._demote(index, keys, slots, job)
            if job.steps:
                job.drain.append((index, blocks))
                self.ledger.emit(job)
            else:  # every victim is held below already (or dropped): nothing to read
                tier.release_drained(blocks)

    def _demote(
        self, index: int, victims: Sequence[OffloadKey], slots: np.ndarray, job: TransferJob
    ) -> None:
        """Copy victims of tier `index` that the tier below lacks down to it, with their
        reuse hints; a victim hinted "never" is dropped instead."""
        hints = self.tiers[index].take_evicted_hints()
        if hints:
            victims, slots = self._drop_never(victims, slots, hints)
        if index + 1 == len(self.tiers):
            self.counters.dropped_at_bottom += len(victims)
            return
        below = self.tiers[index + 1]
        states = [below.has(key) for key in victims]
        held = [key for key, state in zip(victims, states, strict=True) if state is True]
        if held:
            below.touch(held)
        if hints:
            self._carry_hints(below, held, hints)
        missing = [
            (key, slot)
            for key, slot, state in zip(victims, slots, states, strict=True)
            if state is False
        ]
        if not missing:
            return
        keys = [key for key, _ in missing]
        deeper = TransferJob(job.kind)
        # Write-through told the tier below of these blocks when they missed (the cascade);
        # their eviction from this tier is not another access. Write-back's demotion is the
        # first the tier below hears of them, so it stands for their accesses up here.
        out = self._store_into(index + 1, keys, deeper, moved=self.write_policy == "write-through")
        if out is None:
            self.counters.demotions_dropped += len(keys)
            return
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
        self.counters.demoted += len(stored)

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

    def _start_promotion(self, keys: Sequence[OffloadKey], source: int) -> set[OffloadKey]:
        """Plan one PROMOTE job for `keys` (pinned in tier `source` by the caller; the job
        takes over the pins) up to the top; returns the keys that will reach it. The climb
        stops at a tier that cannot make room (the job still brings the blocks as high as they
        got, and they are misses for now)."""
        job = TransferJob(JobKind.PROMOTE, source=source)
        spec = self.tiers[source].spec_of(keys)
        job.pins.append((source, tuple(keys)))
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
        self._check_open()
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

    # -- housekeeping ----------------------------------------------------------------------

    def take_events(self) -> list[OffloadingEvent]:
        events: list[OffloadingEvent] = []
        for tier in self.tiers:
            events.extend(tier.take_events())
        return events

    def stats(self) -> list[TierStats]:
        return [tier.stats() for tier in self.tiers]

    def check(self) -> None:
        """Every tier's own check (raises BlockStateError on the first inconsistency)."""
        for tier in self.tiers:
            tier.check()

    def shutdown(self) -> None:
        for tier in self.tiers:
            tier.shutdown()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("the tiered manager is shut down")

    def __repr__(self) -> str:
        chain = " -> ".join(f"{t.name}({t.medium}, {t.num_blocks})" for t in self.tiers)
        return f"TieredManager({chain}, {self.write_policy})"
