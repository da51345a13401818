"""`KeyedTierManager`: the bookkeeping of a tier that owns its own index.

A remote or shared store (Redis, a shared filesystem, an engine's own tier) is written by
many nodes and evicts by its own rules, so kvtier cannot decide what it holds. This
bookkeeping therefore keeps only:

- what kvtier is writing into it (pending until the write is durable there), and what it
  pins while copying out of it;
- a bounded memory of keys known to be there (learnt from its own writes and from the
  store's answers), forgotten least recently used first. Forgetting evicts nothing.

A lookup of a key it knows nothing of is put to the store through a non-blocking `probe`
(`KeyedIndex`): the store answers at once from its own cache, or starts an asynchronous
query and says "ask again" (None). A block that is gone when read is a miss; the engine
then `discard`s it here. The tier never evicts: its slots (`handles`) only name blocks in
transfer specs, and a store ignores them.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError, ManagerClosedError
from kvtier.hints import HeldHint
from kvtier.keys import OffloadKey
from kvtier.manager.base import EventLog, OffloadingEvent, PrepareStoreOutput, ReqContext
from kvtier.manager.tier import TierStats
from kvtier.specs import LoadStoreSpec
from kvtier.specs.base import BlockIDsLoadStoreSpec


class KeyedIndex(Protocol):
    """The store's side of a keyed tier's lookups (implemented by its storage)."""

    def probe(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        """Without blocking: True the store holds the key, False it does not, None not
        known yet (a query was started; ask again)."""
        ...


class _KeyedSpec(BlockIDsLoadStoreSpec):
    """Handles of blocks in a tier that owns its index (meaningful only in one job)."""

    @classmethod
    def medium(cls) -> str:
        return "keyed"


class KeyedTierManager:
    """`ChainTier` bookkeeping of a tier that owns its index (see the module docstring).

    `num_blocks` bounds how many keys it remembers (and so how many blocks may be in flight
    at once); it says nothing of the store's capacity.
    """

    owns_index = True

    def __init__(
        self,
        index: KeyedIndex,
        num_blocks: int,
        block_size: int,
        *,
        name: str,
        medium: str,
        enable_events: bool = True,
    ) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise InvalidValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.index = index
        self.name = name
        self._medium = medium
        self.block_size = block_size
        self._num_blocks = num_blocks
        self._known: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()  # LRU first
        self._handles = itertools.count()
        self._events = EventLog(block_size, medium, name, enabled=enable_events)
        self.blocks_written = 0
        """Blocks stored into this tier so far."""
        self.blocks_evicted = 0
        """Always 0: the store evicts by its own rules, unseen."""
        self.blocks_refused = 0
        """Blocks a store asked it to take while too many were in flight."""
        self._num_pending = 0
        self._num_pinned_blocks = 0
        self._closed = False

    @property
    def medium(self) -> str:
        return self._medium

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_free(self) -> int:
        return self._num_blocks - self._num_pending - self._num_pinned_blocks

    @property
    def num_draining(self) -> int:
        return 0

    @property
    def num_evictable(self) -> int:
        return len(self._known) - self._num_pending - self._num_pinned_blocks

    # -- reads -----------------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext | None = None) -> bool | None:
        self._check_open()
        block = self._known.get(key)
        if block is not None:
            return True if block.ref_cnt >= 0 else None
        answer = self.index.probe([key])[0]
        if answer is True:
            self._remember(key, 0)
        return answer

    def has(self, key: OffloadKey) -> bool | None:
        block = self._known.get(key)
        if block is None:
            return False
        return True if block.ref_cnt >= 0 else None

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> LoadStoreSpec:
        self._check_open()
        blocks = [self._known.get(key) for key in keys]
        for key, block in zip(keys, blocks, strict=True):
            if block is None or block.ref_cnt < 0:
                state = "not known" if block is None else "still being written"
                raise BlockStateError(f"tier {self.name!r}: cannot load {key!r}: {state}")
        for block in blocks:
            assert block is not None  # checked above
            if block.ref_cnt == 0:
                self._num_pinned_blocks += 1
            block.ref_cnt += 1
        return self.spec_of(keys)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext | None = None) -> None:
        self._check_open()
        for key in keys:
            if key in self._known:
                self._known.move_to_end(key)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext | None = None
    ) -> None:
        self._check_open()
        for key in keys:
            block = self._known.get(key)
            if block is None or block.ref_cnt < 1:
                raise BlockStateError(
                    f"tier {self.name!r}: cannot complete the load of {key!r}: not pinned"
                )
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._num_pinned_blocks -= 1
        self._forget_overflow()

    # -- writes ----------------------------------------------------------------------------

    def prepare_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext | None = None,
        *,
        moved: bool = False,
    ) -> PrepareStoreOutput | None:
        """Reserve handles for the keys not known to be there. Never evicts; None only when
        more than `num_blocks` blocks would be in flight. The store has no policy to tell
        whether the blocks are `moved` down or newly requested."""
        self._check_open()
        new = [key for key in dict.fromkeys(keys) if key not in self._known]
        if len(new) > self.num_free:
            self.blocks_refused += len(new)
            return None
        blocks = [self._remember(key, -1) for key in new]
        self._num_pending += len(blocks)
        spec = _KeyedSpec.from_valid_ids([block.block_id for block in blocks])
        return PrepareStoreOutput(new, spec, [], None)

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        success: bool = True,
        req_context: ReqContext | None = None,
    ) -> None:
        self._check_open()
        stored: list[OffloadKey] = []
        for key in dict.fromkeys(keys):
            block = self._known.get(key)
            if block is None:
                raise BlockStateError(
                    f"tier {self.name!r}: cannot complete the store of {key!r}: never prepared"
                )
            if block.ref_cnt >= 0:
                continue
            self._num_pending -= 1
            if success:
                block.ref_cnt = 0
                stored.append(key)
            else:
                del self._known[key]
        self.blocks_written += len(stored)
        self._events.record(stored, removed=False)
        self._forget_overflow()

    # -- chain support ---------------------------------------------------------------------

    def spec_of(self, keys: Collection[OffloadKey]) -> LoadStoreSpec:
        handles = []
        for key in keys:
            block = self._known.get(key)
            if block is None:
                raise BlockStateError(f"tier {self.name!r} lost track of {key!r}")
            handles.append(block.block_id)
        return _KeyedSpec.from_valid_ids(handles)

    def idle_keys(self) -> list[OffloadKey]:
        return [key for key, block in self._known.items() if block.ref_cnt == 0]

    def ready_keys(self) -> list[OffloadKey] | None:
        """The ready keys kvtier remembers (what its events announced), pinned ones too."""
        return [key for key, block in self._known.items() if block.ref_cnt >= 0]

    def discard(self, keys: Collection[OffloadKey]) -> list[OffloadKey]:
        """Forget ready, unpinned keys found gone or bad in the store (a `removed` event)."""
        self._check_open()
        dropped = []
        for key in dict.fromkeys(keys):
            block = self._known.get(key)
            if block is not None and block.ref_cnt == 0:
                del self._known[key]
                dropped.append(key)
        self._events.record(dropped, removed=True)
        return dropped

    def evict_to_drain(self, count: int) -> tuple[list[OffloadKey], list[BlockStatus]]:
        """Never: the store evicts by its own rules."""
        return [], []

    def release_drained(self, blocks: Collection[BlockStatus]) -> None:
        if blocks:
            raise BlockStateError(f"tier {self.name!r} never drains blocks")

    def hint(self, keys: Collection[OffloadKey], hint: HeldHint | None) -> None:
        """Ignored: the store evicts by its own rules, which kvtier does not steer."""
        self._check_open()

    def rank(self, ranks: Mapping[OffloadKey, Any]) -> None:
        """Ignored: the store evicts by its own rules, which kvtier does not steer."""
        self._check_open()

    def hint_of(self, key: OffloadKey) -> HeldHint | None:
        """None: the tier holds no hints."""
        return None

    def take_evicted_hints(self) -> dict[OffloadKey, HeldHint]:
        """Nothing: kvtier never evicts from this tier."""
        return {}

    def rank_of(self, key: OffloadKey) -> Any:
        """None: the tier holds no ranks."""
        return None

    def take_evicted_ranks(self) -> dict[OffloadKey, Any]:
        """Nothing: kvtier never evicts from this tier."""
        return {}

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

    def stats(self) -> TierStats:
        ready = len(self._known) - self._num_pending
        evictable = ready - self._num_pinned_blocks
        return TierStats(
            self.name,
            self._medium,
            self._num_blocks,
            self._num_blocks - len(self._known),
            self._num_pending,
            evictable,
            self._num_pinned_blocks,
        )

    def check(self) -> None:
        pending = sum(1 for block in self._known.values() if block.ref_cnt < 0)
        pinned = sum(1 for block in self._known.values() if block.ref_cnt > 0)
        problems = []
        if pending != self._num_pending:
            problems.append(f"pending count {self._num_pending} != {pending} pending blocks")
        if pinned != self._num_pinned_blocks:
            problems.append(f"pinned count {self._num_pinned_blocks} != {pinned} pinned blocks")
        if len(self._known) > self._num_blocks:
            problems.append(f"{len(self._known)} known blocks exceed {self._num_blocks}")
        if problems:
            raise BlockStateError(f"tier {self.name!r}: " + "; ".join(problems))

    def shutdown(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError(f"tier {self.name!r} is shut down")

    def _remember(self, key: OffloadKey, ref_cnt: int) -> BlockStatus:
        block = BlockStatus(next(self._handles) & (2**62 - 1))
        block.ref_cnt = ref_cnt
        self._known[key] = block
        self._known.move_to_end(key)
        self._forget_overflow()
        return block

    def _forget_overflow(self) -> None:
        """Forget the least recently used ready, unpinned keys past `num_blocks` (the store
        keeps them; kvtier just stops remembering)."""
        excess = len(self._known) - self._num_blocks
        if excess <= 0:
            return
        doomed: list[OffloadKey] = []
        for key, block in self._known.items():
            if block.ref_cnt == 0:
                doomed.append(key)
                if len(doomed) == excess:
                    break
        for key in doomed:
            del self._known[key]

    def __len__(self) -> int:
        return len(self._known)

    def __repr__(self) -> str:
        return (
            f"KeyedTierManager(name={self.name!r}, medium={self._medium!r}, "
            f"known={len(self._known)}/{self._num_blocks})"
        )
