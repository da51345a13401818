"""`TierManager`: the bookkeeping of one tier, a Backend plus a CachePolicy."""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, NoReturn, cast

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, ManagerClosedError
from kvtier.hints import HeldHint
from kvtier.keys import OffloadKey
from kvtier.manager.backend import Backend, SlotPoolBackend
from kvtier.manager.base import (
    EventLog,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvtier.manager.cold import ColdSet
from kvtier.policies import CachePolicy, get_policy_class, with_admission
from kvtier.specs import LoadStoreSpec
from kvtier.tiers.storage import ColdSource

# C-level field readers for map() over batches of blocks and (key, block) pairs.
_key_of = itemgetter(0)
_block_of = itemgetter(1)
_ref_cnt = attrgetter("ref_cnt")


@dataclass(frozen=True, slots=True)
class TierStats:
    """A snapshot of one tier's occupancy."""

    name: str
    medium: str
    num_blocks: int
    free: int
    pending: int
    evictable: int
    pinned: int
    draining: int = 0
    """Slots evicted by a background demotion whose bytes are still being read out; they
    become free once the demotion has taken its copy."""

    @property
    def used(self) -> int:
        return self.num_blocks - self.free


class TierManager(OffloadingManager):
    """Bookkeeping of one tier: which keys it holds, in which slots, in what state.

    Keeps a running count of ready, unpinned blocks so that a store that cannot possibly find
    room fails in O(1) instead of walking the policy.
    """

    def __init__(
        self,
        backend: Backend,
        policy: CachePolicy,
        *,
        name: str = "",
        enable_events: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: what a hint's deadline is read against (`HeldHint.expires_at`)."""
        if policy.cache_capacity != backend.num_blocks:
            raise BlockStateError(
                f"policy capacity {policy.cache_capacity} != backend slots {backend.num_blocks}"
            )
        self.backend = backend
        self.policy = policy
        # The policy's lookup, bound once: a C-level dict lookup for LRU and ARC.
        self._get = policy.getter()
        self._policy_get = self._get
        self._cold: ColdSet | None = None
        """Restored blocks the policy does not hold yet (`restore_cold`), or None."""
        self.name = name or str(backend.medium)
        self.medium: str = backend.medium
        self.block_size = backend.block_size
        self._events = EventLog(self.block_size, self.medium, self.name, enabled=enable_events)
        self.blocks_written = 0
        """Blocks stored into this tier so far (every completed store, demotions included)."""
        self.blocks_evicted = 0
        """Blocks its policy evicted (in a store, or to refill a reserve)."""
        self.blocks_refused = 0
        """Blocks a store asked it to take and it did not: not admitted, or no room."""
        self._num_pending = 0
        self._num_evictable = 0
        self._num_draining = 0
        self._closed = False
        self.clock = clock
        # Reuse hints of resident blocks (kvtier.hints), as the policy was given them, with
        # their deadlines: a hint leaves with its block (to travel with its demotion) and is
        # withdrawn from the policy when its deadline passes. Empty: no cost anywhere.
        self._hints: dict[OffloadKey, HeldHint] = {}
        self._deadlines: list[tuple[float, int, OffloadKey, HeldHint]] = []
        self._deadline_seq = 0
        self._evicted_hints: dict[OffloadKey, HeldHint] = {}
        # Eviction ranks of resident blocks (session hints, `rank`), as the policy was given
        # them: a rank leaves with its block and travels with its demotion or promotion, so
        # the tier a block moves to ranks it as this one did. Empty: no cost anywhere.
        self._ranks: dict[OffloadKey, Any] = {}
        self._evicted_ranks: dict[OffloadKey, Any] = {}

    # -- reads -----------------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext | None = None) -> bool | None:
        if self._closed:
            raise ManagerClosedError(f"tier {self.name!r} is shut down")
        block = self._policy_get(key)  # a look that does not move a cold block
        if block is None:
            cold = self._cold
            return cold is not None and cold.find(key) is not None
        return True if block.ref_cnt >= 0 else None

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> LoadStoreSpec:
        if self._closed:
            raise ManagerClosedError(f"tier {self.name!r} is shut down")
        found = list(map(self._get, keys))
        for block in found:
            if block is None or block.ref_cnt < 0:
                self._raise_cannot_load(keys)
        blocks = cast("list[BlockStatus]", found)  # every block was checked present above
        newly_pinned = 0
        for block in blocks:
            ref_cnt = block.ref_cnt  # read once: a ctypes field read is not free
            if ref_cnt == 0:
                newly_pinned += 1
            block.ref_cnt = ref_cnt + 1
        self._num_evictable -= newly_pinned
        keys_list = keys if type(keys) is list else list(keys)  # copy only a non-list
        return self.backend.get_load_store_spec(keys_list, blocks)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext | None = None) -> None:
        if self._closed:
            raise ManagerClosedError(f"tier {self.name!r} is shut down")
        # isinstance with a tuple of types: about half the cost of a `list | tuple` union
        self.policy.touch(keys if isinstance(keys, (list, tuple)) else list(keys))
        if self._hints:
            self._hints_touched(keys)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> None:
        if self._closed:
            raise ManagerClosedError(f"tier {self.name!r} is shut down")
        found = list(map(self._get, keys))
        for block in found:
            if block is None or block.ref_cnt < 1:
                self._raise_cannot_unpin(keys)
        blocks = cast("list[BlockStatus]", found)  # every block was checked present above
        if len(blocks) > 1 and len(set(keys)) != len(blocks):
            self._check_repeated_unpins(keys)
        unpinned = 0
        for block in blocks:
            ref_cnt = block.ref_cnt - 1
            block.ref_cnt = ref_cnt
            if ref_cnt == 0:
                unpinned += 1
        self._num_evictable += unpinned

    # -- writes ----------------------------------------------------------------------------

    def prepare_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext | None = None,
        *,
        moved: bool = False,
    ) -> PrepareStoreOutput | None:
        """Reserve slots for the absent keys the policy admits, evicting if needed; None when
        there is no room. `moved`: the blocks are being evicted from a tier above and their
        access was already announced here (`CachePolicy.on_store_move`)."""
        if self._closed:
            raise ManagerClosedError(f"tier {self.name!r} is shut down")
        policy, backend, get = self.policy, self.backend, self._get
        # The keys of this call, once each, in order; its key view is also the protected set
        # of the eviction below (a dict lookup, as a set's, without building a set).
        offered = dict.fromkeys(keys)
        keys_to_store = [key for key in offered if get(key) is None]
        if not keys_to_store:
            return PrepareStoreOutput([], backend.get_load_store_spec([], []), [])
        if len(keys_to_store) > backend.num_blocks:
            self.blocks_refused += len(keys_to_store)
            return None
        if moved:
            policy.on_store_move(keys_to_store)
        else:
            policy.on_store_miss(keys_to_store)
        refused: list[OffloadKey] = []
        if not policy.admits_all:
            admitted = policy.admit(keys_to_store)
            if not all(admitted):
                refused = [k for k, ok in zip(keys_to_store, admitted, strict=True) if not ok]
                keys_to_store = [k for k, ok in zip(keys_to_store, admitted, strict=True) if ok]
                self.blocks_refused += len(refused)
                if not keys_to_store:
                    return PrepareStoreOutput(
                        [], backend.get_load_store_spec([], []), [], refused_keys=refused
                    )
        num_to_evict = len(keys_to_store) - backend.get_num_free_blocks()
        evicted_keys: list[OffloadKey] = []
        evicted_spec: LoadStoreSpec | None = None
        if num_to_evict > 0:
            if num_to_evict > self._num_evictable:
                self.blocks_refused += len(keys_to_store)
                return None
            if self._deadlines:
                self.expire_hints()
            evicted = self._evict(num_to_evict, offered.keys())
            if evicted is None:
                self.blocks_refused += len(keys_to_store)
                return None
            self._num_evictable -= len(evicted)
            self.blocks_evicted += len(evicted)
            evicted_keys = list(map(_key_of, evicted))
            evicted_spec = backend.evict_blocks(evicted_keys, list(map(_block_of, evicted)))
            self._events.record(evicted_keys, removed=True)
            if self._hints or self._evicted_hints or self._ranks or self._evicted_ranks:
                self._hints_leave(evicted_keys, evicted=True)
        blocks, store_spec = backend.allocate_with_spec(keys_to_store)
        policy.insert_many(keys_to_store, blocks)
        self._num_pending += len(blocks)
        return PrepareStoreOutput(
            keys_to_store, store_spec, evicted_keys, evicted_spec, refused_keys=refused
        )

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        success: bool = True,
        req_context: ReqContext | None = None,
    ) -> None:
        if self._closed:
            raise ManagerClosedError(f"tier {self.name!r} is shut down")
        found = list(map(self._get, keys))
        if None in found:
            key = next(key for key, block in zip(keys, found, strict=True) if block is None)
            raise BlockStateError(
                f"tier {self.name!r}: cannot complete the store of {key!r}: never prepared"
            )
        blocks = cast("list[BlockStatus]", found)  # every block was checked present above
        if not success:
            pending = {
                key: block for key, block in zip(keys, blocks, strict=True) if block.ref_cnt < 0
            }
            self._num_pending -= len(pending)
            remove, free = self.policy.remove, self.backend.free
            for key, block in pending.items():
                remove(key)
                free(block)
            if self._hints or self._ranks:
                self._hints_leave(pending, evicted=False)
            return
        stored: list[OffloadKey]
        if max(map(_ref_cnt, blocks), default=0) < 0:
            # The usual call: every block is being written. Each key is stored once (a key
            # given twice names one block), in order of first appearance.
            for block in blocks:
                block.ref_cnt = 0
            stored = list(dict.fromkeys(keys))
        else:
            # One pass: a block made ready here is skipped if its key comes again.
            stored = []
            for key, block in zip(keys, blocks, strict=True):
                if block.ref_cnt < 0:
                    block.ref_cnt = 0
                    stored.append(key)
        if not stored:
            return
        self._num_pending -= len(stored)
        self._num_evictable += len(stored)
        self.blocks_written += len(stored)
        self._events.record(stored, removed=False)

    def evict_to_drain(self, count: int) -> tuple[list[OffloadKey], list[BlockStatus]]:
        """Evict up to `count` ready, unpinned blocks by the policy, keeping their slots
        out of the free list ("draining") until `release_drained`: a background demotion
        reads their bytes first. Returns the victims' keys and blocks (maybe fewer, or none)."""
        self._check_open()
        count = min(count, self._num_evictable)
        if count <= 0:
            return [], []
        if self._deadlines:
            self.expire_hints()
        evicted = self._evict(count, ())
        if not evicted:
            return [], []
        keys = [key for key, _ in evicted]
        if self._hints or self._evicted_hints or self._ranks or self._evicted_ranks:
            self._hints_leave(keys, evicted=True)
        blocks = [block for _, block in evicted]
        self._num_evictable -= len(blocks)
        self._num_draining += len(blocks)
        self.blocks_evicted += len(blocks)
        self._events.record(keys, removed=True)
        return keys, blocks

    def release_drained(self, blocks: Collection[BlockStatus]) -> None:
        """Free the slots of blocks evicted by `evict_to_drain` (their bytes were copied)."""
        if not blocks:
            return
        self.backend.free_blocks(list(blocks))
        self._num_draining -= len(blocks)

    owns_index = False
    """A slot pool whose contents this bookkeeping decides (see `KeyedTierManager` for a
    tier that owns its own index)."""

    @property
    def num_blocks(self) -> int:
        """Slots of the tier."""
        return self.backend.num_blocks

    def has(self, key: OffloadKey) -> bool | None:
        """`lookup` as pure inspection: True ready, None being written, False absent."""
        return self.lookup(key)

    def spec_of(self, keys: Collection[OffloadKey]) -> LoadStoreSpec:
        """Where blocks already pinned (or being written) by the caller are."""
        blocks = []
        for key in keys:
            block = self._get(key)
            if block is None:
                raise BlockStateError(f"tier {self.name!r} lost {key!r}")
            blocks.append(block)
        return self.backend.get_load_store_spec(list(keys), blocks)

    def idle_keys(self) -> list[OffloadKey]:
        """Ready, unpinned blocks: the cold ones (`restore_cold`) oldest first, then the
        policy's, in its order."""
        cold = [] if self._cold is None else self._cold.keys()
        return cold + [key for key, block in self.policy.items() if block.ref_cnt == 0]

    def ready_keys(self) -> list[OffloadKey] | None:
        """Every ready block, pinned ones too (not those being written), the cold ones
        first; None while some cold block's key cannot be named yet (`ColdSet.all_keys`)."""
        cold = [] if self._cold is None else self._cold.all_keys()
        if cold is None:
            return None
        return cold + [key for key, block in self.policy.items() if block.ref_cnt >= 0]

    @property
    def num_free(self) -> int:
        """Slots a store can take now without evicting."""
        return self.backend.get_num_free_blocks()

    @property
    def num_draining(self) -> int:
        """Slots evicted whose bytes a background demotion is still reading."""
        return self._num_draining

    @property
    def num_evictable(self) -> int:
        """Ready, unpinned blocks the policy may evict."""
        return self._num_evictable

    def discard(self, keys: Collection[OffloadKey]) -> list[OffloadKey]:
        """Drop ready, unpinned blocks whose bytes were found bad (a failed checksum, a read
        error): they leave the tier with a `removed` event and their slots are freed. Keys that
        are absent, pinned or being written are left alone; returns the keys dropped."""
        self._check_open()
        get, remove, free = self._get, self.policy.remove, self.backend.free
        dropped: list[OffloadKey] = []
        for key in dict.fromkeys(keys):
            block = get(key)
            if block is None or block.ref_cnt != 0:
                continue
            remove(key)
            free(block)
            self._num_evictable -= 1
            dropped.append(key)
        self._events.record(dropped, removed=True)
        if self._hints or self._ranks:
            self._hints_leave(dropped, evicted=False)
        return dropped

    def restore(self, blocks: Collection[tuple[OffloadKey, int]]) -> None:
        """Re-enter blocks that a persistent tier already holds (key, slot), oldest first, as
        ready blocks; used once, on an empty tier, when a hierarchy is reopened. No events:
        nothing was stored now. Raises BlockStateError, changing nothing, on a duplicate key or
        a tier that is not empty."""
        self._check_empty()
        keys = [key for key, _ in blocks]
        if len(set(keys)) != len(keys):
            raise BlockStateError(f"tier {self.name!r}: restore got a key twice")
        if not isinstance(self.backend, SlotPoolBackend):
            raise BlockStateError(f"tier {self.name!r}: its backend cannot restore slots")
        statuses = self.backend.restore([slot for _, slot in blocks])
        insert = self.policy.insert
        for key, block in zip(keys, statuses, strict=True):
            block.ref_cnt = 0
            insert(key, block)
        self._num_evictable += len(statuses)

    def restore_cold(self, source: ColdSource) -> None:
        """`restore` for a storage that answers for its restored blocks compactly
        (`kvtier.manager.cold`): their slots are allocated and they are held in a cold set
        the policy does not know; a block asked for enters the policy then, and evictions
        take cold blocks first, oldest first. Used once, on an empty tier."""
        self._check_empty()
        if not isinstance(self.backend, SlotPoolBackend):
            raise BlockStateError(f"tier {self.name!r}: its backend cannot restore slots")
        cold = ColdSet(source, self.backend.num_blocks)
        if not cold.count:
            return  # nothing restored: the plain bookkeeping, at no cost
        self.backend.restore_slots(cold.slots())
        self._cold = cold
        self._num_evictable += cold.count
        self._get = self._get_or_warm

    @property
    def num_cold(self) -> int:
        """Restored blocks not asked for since (`restore_cold`): held outside the policy."""
        return 0 if self._cold is None else self._cold.count

    def _check_empty(self) -> None:
        self._check_open()
        if (
            len(self.policy)
            or self._cold is not None
            or self.backend.get_num_free_blocks() != self.backend.num_blocks
        ):
            raise BlockStateError(f"tier {self.name!r}: restore needs an empty tier")

    def _get_or_warm(self, key: OffloadKey) -> BlockStatus | None:
        """The policy's block of `key`, or its cold block, moved into the policy as a ready
        block (it is being used), or None."""
        block = self._policy_get(key)
        if block is not None:
            return block
        cold = self._cold
        slot = None if cold is None else cold.find(key)
        if cold is None or slot is None:
            return None
        cold.take(slot)
        block = BlockStatus(slot)
        block.ref_cnt = 0
        self.policy.insert(key, block)
        return block

    def _evict(
        self, count: int, protected: Collection[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """`count` victims: cold blocks first (oldest first; those whose keys the storage
        can name), then the policy's; None when the policy cannot give the rest."""
        cold = self._cold
        if cold is None or not cold.count:
            return self.policy.evict(count, protected)
        taken = cold.evictable(count)
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        if len(taken) < count:
            rest = self.policy.evict(count - len(taken), protected)
            if rest is None:
                return None
            victims = rest
        cold_victims = []
        for key, slot in taken:
            cold.take(slot)
            block = BlockStatus(slot)
            block.ref_cnt = 0
            cold_victims.append((key, block))
        return cold_victims + victims

    # -- reuse hints -----------------------------------------------------------------------

    def hint(self, keys: Collection[OffloadKey], hint: HeldHint | None) -> None:
        """Give the policy an application's reuse hint on each resident key of `keys` (None:
        withdraw it); absent keys are ignored. The hint is withdrawn when `hint.expires_at`
        passes on `clock` (checked before each eviction), and leaves with its block."""
        self._check_open()
        policy, get = self.policy, self._get
        reuse = None if hint is None else hint.reuse
        for key in keys:
            if get(key) is None:
                continue
            policy.hint(key, reuse)
            if hint is None:
                self._hints.pop(key, None)
                continue
            self._hints[key] = hint
            if hint.expires_at is not None:
                self._deadline_seq += 1
                heapq.heappush(self._deadlines, (hint.expires_at, self._deadline_seq, key, hint))

    def rank(self, ranks: Mapping[OffloadKey, Any]) -> None:
        """Give the policy the application's eviction rank of each resident key of `ranks`
        (None: withdraw it; `CachePolicy.rank`); absent keys are ignored. A rank leaves
        with its block (`take_evicted_ranks`): the chain gives it to the tier the block is
        demoted or promoted to (`ChainPlanner`), so every copy of a block is ranked alike."""
        self._check_open()
        policy, get, held = self.policy, self._get, self._ranks
        for key, value in ranks.items():
            if get(key) is not None:
                policy.rank(key, value)
                if value is None:
                    held.pop(key, None)
                else:
                    held[key] = value

    def rank_of(self, key: OffloadKey) -> Any:
        """The rank resident `key` holds now, or None."""
        return self._ranks.get(key)

    def take_evicted_ranks(self) -> dict[OffloadKey, Any]:
        """The ranks of the blocks the last eviction took (by `prepare_store` or
        `evict_to_drain`), once: what the chain carries down with their demotion."""
        ranks, self._evicted_ranks = self._evicted_ranks, {}
        return ranks

    def hint_of(self, key: OffloadKey) -> HeldHint | None:
        """The hint resident `key` holds now, or None."""
        return self._hints.get(key)

    def expire_hints(self) -> None:
        """Withdraw every hint whose deadline passed (a later hint on the key stays)."""
        deadlines, now = self._deadlines, self.clock()
        while deadlines and deadlines[0][0] <= now:
            _, _, key, hint = heapq.heappop(deadlines)
            if self._hints.get(key) is hint:
                del self._hints[key]
                self.policy.hint(key, None)

    def take_evicted_hints(self) -> dict[OffloadKey, HeldHint]:
        """The hints of the blocks the last eviction took (by `prepare_store` or
        `evict_to_drain`), once: what the chain carries down with their demotion."""
        hints, self._evicted_hints = self._evicted_hints, {}
        return hints

    def _hints_leave(self, keys: Collection[OffloadKey], *, evicted: bool) -> None:
        """Blocks left the tier: their hints and ranks too (kept for `take_evicted_hints`
        and `take_evicted_ranks` when they were evicted, so a demotion carries them)."""
        taken = {key: hint for key in keys if (hint := self._hints.pop(key, None)) is not None}
        ranks = self._ranks
        ranked = {key: rank for key in keys if (rank := ranks.pop(key, None)) is not None}
        if evicted:
            self._evicted_hints = taken
            self._evicted_ranks = ranked
        if not self._hints:
            self._deadlines.clear()

    def _hints_touched(self, keys: Collection[OffloadKey]) -> None:
        """A hit withdraws a `"never"` or `"unlikely"` hint, as the policy did."""
        hints = self._hints
        for key in keys:
            hint = hints.get(key)
            if hint is not None and hint.reuse != "likely":
                del hints[key]

    # -- housekeeping ----------------------------------------------------------------------

    def take_events(self) -> list[OffloadingEvent]:
        return self._events.take()

    @property
    def event_log(self) -> EventLog:
        """The tier's event log (what `take_events` takes; its `sink` sees every batch)."""
        return self._events

    @property
    def events_dropped(self) -> int:
        """Blocks of events dropped because nobody took them in time (see `EventLog`)."""
        return self._events.dropped

    def shutdown(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> TierStats:
        """Occupancy now: free slots, blocks being written, evictable and pinned blocks."""
        num_blocks = self.backend.num_blocks
        free = self.backend.get_num_free_blocks()
        draining = self._num_draining
        pinned = num_blocks - free - self._num_pending - self._num_evictable - draining
        return TierStats(
            self.name,
            self.medium,
            num_blocks,
            free,
            self._num_pending,
            self._num_evictable,
            pinned,
            draining,
        )

    def check(self) -> None:
        """Verify the bookkeeping against itself; raises BlockStateError on the first
        inconsistency. Walks every block: for tests and `kvtier check`, not the hot path."""
        resident = list(self.policy.items())
        slots = [block.block_id for _, block in resident]
        num_cold = 0
        if self._cold is not None:
            cold_slots = self._cold.slots().tolist()
            num_cold = len(cold_slots)
            slots += cold_slots
        problems: list[str] = []
        if len(set(slots)) != len(slots):
            problems.append("two resident blocks share a slot")
        free = self.backend.get_num_free_blocks()
        if len(resident) + num_cold + free + self._num_draining != self.backend.num_blocks:
            problems.append(
                f"{len(resident) + num_cold} resident + {free} free + {self._num_draining} "
                "draining != "
                f"{self.backend.num_blocks} slots"
            )
        pending = sum(1 for _, block in resident if block.ref_cnt < 0)
        evictable = num_cold + sum(1 for _, block in resident if block.ref_cnt == 0)
        if pending != self._num_pending:
            problems.append(f"pending count {self._num_pending} != {pending} pending blocks")
        if evictable != self._num_evictable:
            problems.append(f"evictable count {self._num_evictable} != {evictable} ready blocks")
        if any(block.ref_cnt < -1 for _, block in resident):
            problems.append("a block has ref_cnt below -1")
        if len(resident) + num_cold > self.policy.cache_capacity:
            problems.append(f"{len(resident)} resident blocks exceed capacity")
        if problems:
            raise BlockStateError(f"tier {self.name!r}: " + "; ".join(problems))

    def __len__(self) -> int:
        return len(self.policy) + (0 if self._cold is None else self._cold.count)

    def __repr__(self) -> str:
        return (
            f"TierManager(name={self.name!r}, medium={str(self.medium)!r}, "
            f"policy={self.policy.name!r}, blocks={self.backend.num_blocks}, "
            f"block_size={self.block_size})"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError(f"tier {self.name!r} is shut down")

    # The error paths of the hot methods, out of line: each finds the first offending key
    # again (in call order, as a one-pass check would have) and raises.

    def _raise_cannot_load(self, keys: Collection[OffloadKey]) -> NoReturn:
        for key in keys:
            block = self._get(key)
            if block is None:
                raise BlockStateError(f"tier {self.name!r}: cannot load {key!r}: not present")
            if block.ref_cnt < 0:
                raise BlockStateError(
                    f"tier {self.name!r}: cannot load {key!r}: still being written"
                )
        raise AssertionError("no key of the batch is unloadable")

    def _raise_cannot_unpin(self, keys: Collection[OffloadKey]) -> NoReturn:
        for key in keys:
            block = self._get(key)
            if block is None or block.ref_cnt < 1:
                raise BlockStateError(
                    f"tier {self.name!r}: cannot complete the load of {key!r}: "
                    + ("not present" if block is None else "not pinned")
                )
        raise AssertionError("no key of the batch is unpinnable")

    def _check_repeated_unpins(self, keys: Collection[OffloadKey]) -> None:
        """A key given n times must be pinned at least n times."""
        for key, count in Counter(keys).items():
            found = self._get(key)
            if found is not None and found.ref_cnt < count:
                raise BlockStateError(
                    f"tier {self.name!r}: cannot unpin {key!r} {count} times: "
                    f"pinned {found.ref_cnt} times"
                )


def make_tier_manager(
    num_blocks: int,
    block_size: int,
    medium: str,
    policy: str = "lru",
    *,
    name: str = "",
    enable_events: bool = True,
    admission: str = "all",
) -> TierManager:
    """A TierManager over a slot pool of `num_blocks`, with the named policy behind the
    named admission filter (`kvtier.policies.admission`)."""
    policy_instance = with_admission(get_policy_class(policy)(num_blocks), admission)
    backend = SlotPoolBackend(num_blocks, block_size, medium)
    return TierManager(backend, policy_instance, name=name, enable_events=enable_events)
