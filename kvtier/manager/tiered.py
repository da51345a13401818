"""`TieredManager`: the bookkeeping of a chain of tiers, an `OffloadingManager` of its own.

An engine that drives one tier can drive the chain: `lookup` / `prepare_store` / ... behave
as a single tier's, at the top, while lower tiers hold what the top evicted. The manager is
a composition of two parts with one job each:

- `ChainPlanner` (`planner.py`) decides: stores at the top, demotions of their victims,
  promotions of what only a lower tier holds, write-through cascades, flushes and the
  background refills of a tier's reserve of free slots, each as a `TransferJob`; its
  docstring gives the rules.
- `JobLedger` (`ledger.py`) tracks those jobs: queued, in flight, the readers waiting for a
  promotion, and their settling once the engine is done (failed copies, corrupt blocks).

The manager itself answers the reads (which tier holds a key, the hits and misses it counts
in `ChainCounters`), checks that it is open, and hands the rest to its parts.

Nothing here does I/O or waits: decisions go out as `TransferJob`s (`take_jobs`), the engine
moves the bytes, and `complete_job` settles the bookkeeping, including failures (a block that
could not be copied leaves no trace at its destination; a block found corrupt is dropped).
A block is never evicted while it is read, demoted or promoted: every job pins its sources
and its destinations are pending until it completes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from kvtier.errors import InvalidValueError, ManagerClosedError
from kvtier.hints import HeldHint
from kvtier.keys import OffloadKey
from kvtier.manager.base import OffloadingEvent, OffloadingManager, ReqContext
from kvtier.manager.chain_tier import ChainTier
from kvtier.manager.counters import ChainCounters
from kvtier.manager.events import ChainEvents, EventSink, TierContents
from kvtier.manager.jobs import PromotionHold, TransferJob
from kvtier.manager.ledger import JobLedger
from kvtier.manager.planner import ChainPlanner, TieredStoreOutput, Watermarks, WritePolicy
from kvtier.manager.tier import TierStats
from kvtier.specs import LoadStoreSpec


class TieredManager(OffloadingManager):
    """Bookkeeping of an ordered chain of tiers, top (fastest) first."""

    def __init__(
        self,
        tiers: Sequence[ChainTier],
        *,
        write_policy: WritePolicy = "write-back",
        watermarks: Sequence[Watermarks | None] | None = None,
        merge_demotions_up_to: int = 0,
        min_refills: Sequence[int] | None = None,
        defer_refills: bool = False,
    ) -> None:
        """`watermarks`: per tier, its (low, high) occupancy watermarks or None; a tier with
        watermarks and a tier below it keeps a reserve of free slots (see `Watermarks`).
        None (the default): no reserve anywhere, every eviction happens in the store that
        needs the room. `merge_demotions_up_to`: the most blocks one copy of the background
        refills of one store may merge into (0, the default: none merged; the chain passes
        its staging arena's rows: `ChainPlanner._fold`). `min_refills`: per tier, the least
        blocks a refill of its reserve frees (`refill_target`; None, the default: 0, the
        watermarks alone decide). `defer_refills`: a store does not plan the refills it
        makes due, `plan_refills` does (the chain calls it once the put returned: see
        `ChainPlanner.plan_refills`); False, the default: the store plans them."""
        if (
            isinstance(merge_demotions_up_to, bool)
            or not isinstance(merge_demotions_up_to, int)
            or merge_demotions_up_to < 0
        ):
            raise InvalidValueError(
                f"merge_demotions_up_to must be an int >= 0, got {merge_demotions_up_to!r}"
            )
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
        if min_refills is not None and (
            len(min_refills) != len(tiers)
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in min_refills)
        ):
            raise InvalidValueError(
                f"min_refills must be one int >= 0 per tier ({len(tiers)}), got {min_refills!r}"
            )
        self.counters = ChainCounters(hits=[0] * len(tiers))
        self.events = ChainEvents(names)
        """The chain's ordered stored / removed stream (`connect_events`)."""
        self.ledger = JobLedger(self.tiers, self.counters, self.events)
        self.planner = ChainPlanner(
            self.tiers,
            self.counters,
            self.ledger,
            write_policy=write_policy,
            watermarks=watermarks,
            merge_demotions_up_to=merge_demotions_up_to,
            min_refills=min_refills,
            defer_refills=defer_refills,
        )
        self.write_policy: WritePolicy = write_policy
        self.block_size = tiers[0].block_size
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
                promoted = self.planner.start_promotion([keys[i] for i in positions], source)
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
        return self.planner.plan_store(keys, partial)

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
        if success and newly_ready:
            self.planner.on_stored(newly_ready)

    def reserve_for(self, count: int) -> None:
        """Grow the top tier's reserve to cover stores of `count` blocks (`prepare_store`
        does it too; see `ChainPlanner.reserve_for`)."""
        self.planner.reserve_for(count)

    @property
    def refill_due(self) -> bool:
        """A store made a refill due that is not planned yet (`defer_refills` only)."""
        return self.planner.refill_due

    def plan_refills(self) -> bool:
        """Plan the refills due (`refill_due`), queued for `take_jobs`; whether any was due
        (see `ChainPlanner.plan_refills`)."""
        self._check_open()
        return self.planner.plan_refills()

    def plan_flush(self) -> list[TransferJob]:
        """CASCADE jobs that copy every readable block only the tiers above the bottom hold
        down to the bottom tier, returned, not queued (see `ChainPlanner.plan_flush`)."""
        self._check_open()
        return self.planner.plan_flush()

    def hinted_never(self, index: int, key: OffloadKey) -> bool:
        """Whether tier `index` holds `key` hinted "never" (no cascade copies it down)."""
        return self.planner.hinted_never(index, key)

    def hint(self, keys: Collection[OffloadKey], hint: HeldHint | None) -> None:
        """Give every tier holding some of `keys` an application's reuse hint on them (None:
        withdraw it); keys no tier holds are ignored."""
        self._check_open()
        for tier in self.tiers:
            tier.hint(keys, hint)

    def rank(self, ranks: Mapping[OffloadKey, Any]) -> None:
        """Give every tier holding some of `ranks`' keys the application's eviction rank of
        each (None: withdraw it; `CachePolicy.rank`, what session hints become); keys no
        tier holds are ignored."""
        self._check_open()
        for tier in self.tiers:
            tier.rank(ranks)

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

    # -- housekeeping ----------------------------------------------------------------------

    def connect_events(self, sink: EventSink | None) -> None:
        """Hand every tier's stored / removed batches, in the chain's order (a move down is
        a store on the tier below, then the removal from the tier above), to `sink` as they
        happen (see `ChainEvents`); None disconnects. `take_events` is unaffected."""
        self._check_open()
        self.events.sink = sink
        for tier in self.tiers:
            tier.event_log.sink = None if sink is None else self.events.record

    def contents(self) -> list[TierContents] | None:
        """What every tier holds now, top first (a snapshot for the fleet: called on the
        bookkeeping's thread, it is consistent with the events recorded so far); None while
        a tier cannot name all its blocks yet (restored keys still loading: ask again)."""
        self._check_open()
        found = []
        for tier in self.tiers:
            keys = tier.ready_keys()
            if keys is None:
                return None
            found.append(TierContents(tier.name, str(tier.medium), tuple(keys)))
        return found

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
