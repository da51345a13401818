"""The oracle for `kvtier.policies.arc`: its ARC as of commit a423712, before the
bookkeeping-throughput work, kept verbatim (only renamed) so that tests can check that the
faster implementation takes exactly the same decisions. Do not optimize this file.

Adaptive Replacement Cache (Megiddo & Modha, FAST 2003, Fig. 4).

T1 holds blocks seen once recently, T2 blocks seen at least twice; the ghost lists B1 and B2
remember keys recently evicted from T1 and T2 (keys only, no blocks). A request for a key in
B1 means T1 was too small: the target size p of T1 grows; a key in B2 shrinks it. REPLACE
evicts from T1 while |T1| exceeds p, else from T2.

The paper's algorithm is followed step for step; the only departures are where a tier cannot
follow it:
  - a pinned, pending or protected block is never evicted: REPLACE takes the next evictable
    block of the list it chose, or of the other list when that one has none;
  - a batch of misses is served in order as the paper serves single requests: the first ones
    fill free slots, each later one pays for one REPLACE, and p adapts before each REPLACE;
  - a failed store (`remove`) or a pinned block can leave the lists outside the paper's
    invariants, so ghost lists are trimmed to |T1|+|B1| <= c and |L1|+|L2| <= 2c after every
    change (a no-op whenever the paper's invariants hold).
On a single stream of requests driven as a tier drives it (see `simulate`) it makes the same
decisions as the paper's pseudo-code.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from itertools import chain
from typing import ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.keys import OffloadKey
from kvtier.policies.base import CachePolicy, check_evict_count


class _Origin(enum.Enum):
    NEW = 0
    B1 = 1
    B2 = 2


class _Op(enum.Enum):
    POP_B1 = 0  # delete the LRU key of B1
    POP_B2 = 1  # delete the LRU key of B2
    EVICT_T1 = 2  # move a T1 block to the MRU end of B1
    EVICT_T2 = 3  # move a T2 block to the MRU end of B2
    DROP_T1 = 4  # delete a T1 block without remembering it (paper case IV.A, |T1| = c)


_Step = tuple[_Op, OffloadKey | None, BlockStatus | None]
_Entries = Iterator[tuple[OffloadKey, BlockStatus]]


def _adapt(p: float, origin: _Origin, b1: int, b2: int, capacity: int) -> float:
    """The paper's adaptation of the target p on a ghost hit (cases II and III)."""
    if origin is _Origin.B1:
        return min(p + (1.0 if b1 >= b2 else b2 / b1), float(capacity))
    if origin is _Origin.B2:
        return max(p - (1.0 if b2 >= b1 else b1 / b2), 0.0)
    return p


def _next_evictable(
    entries: _Entries, protected: Collection[OffloadKey]
) -> tuple[OffloadKey, BlockStatus] | None:
    """Advance `entries` to the next block that may be evicted, and return it."""
    for key, block in entries:
        if block.ref_cnt == 0 and key not in protected:
            return key, block
    return None


class OracleARCCachePolicy(CachePolicy):
    """ARC: balances recency (T1) against frequency (T2) with a self-tuning target."""

    name: ClassVar[str] = "arc-oracle"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        # Each ordered dict is least recently used first.
        self._t1: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self._b2: OrderedDict[OffloadKey, None] = OrderedDict()
        self._p = 0.0
        # Keys announced by on_store_miss, in order, mapped to whether p already adapted to
        # them (evict adapts for every announced key; insert for one it did not see).
        self._incoming: dict[OffloadKey, bool] = {}

    # -- inspection ------------------------------------------------------------------------

    @property
    def target_t1_size(self) -> float:
        """The adaptive target p for |T1|."""
        return self._p

    def lists(self) -> dict[str, list[OffloadKey]]:
        """T1, T2, B1 and B2, each least recently used first (for tests and inspection)."""
        return {
            "t1": list(self._t1),
            "t2": list(self._t2),
            "b1": list(self._b1),
            "b2": list(self._b2),
        }

    # -- CachePolicy -----------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        block = self._t1.get(key)
        return block if block is not None else self._t2.get(key)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._t1 or key in self._t2:
            raise BlockStateError(f"arc: key {key!r} is already resident")
        adapted = self._incoming.pop(key, False)
        if key in self._b1:
            if not adapted:
                self._p = _adapt(self._p, _Origin.B1, len(self._b1), len(self._b2), self._cap)
            del self._b1[key]
            self._t2[key] = block
        elif key in self._b2:
            if not adapted:
                self._p = _adapt(self._p, _Origin.B2, len(self._b1), len(self._b2), self._cap)
            del self._b2[key]
            self._t2[key] = block
        else:
            self._t1[key] = block
        self._bound_ghosts()

    def remove(self, key: OffloadKey) -> None:
        if self._t1.pop(key, None) is None and self._t2.pop(key, None) is None:
            raise BlockStateError(f"arc: key {key!r} is not resident")
        self._incoming.pop(key, None)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        t1, t2 = self._t1, self._t2
        for key in reversed(keys):
            block = t1.get(key)
            if block is not None:
                if block.ref_cnt >= 0:
                    # Case I: a second access to a ready block makes it frequent.
                    del t1[key]
                    t2[key] = block
                else:
                    # Still being written: its store was the first access, not a second.
                    t1.move_to_end(key)
            elif key in t2:
                t2.move_to_end(key)

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        t1, t2 = self._t1, self._t2
        self._incoming = {key: False for key in keys if key not in t1 and key not in t2}

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        check_evict_count(n)
        if n == 0:
            return []
        plan = self._plan_evictions(n, protected)
        if plan is None:
            return None
        steps, p = plan
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        for op, key, block in steps:
            if op is _Op.POP_B1:
                if self._b1:
                    self._b1.popitem(last=False)
            elif op is _Op.POP_B2:
                if self._b2:
                    self._b2.popitem(last=False)
            else:
                assert key is not None and block is not None  # set for every eviction step
                if op is _Op.EVICT_T2:
                    del self._t2[key]
                    self._b2[key] = None
                else:
                    del self._t1[key]
                    if op is _Op.EVICT_T1:
                        self._b1[key] = None
                victims.append((key, block))
        self._p = p
        self._incoming = dict.fromkeys(self._incoming, True)
        self._bound_ghosts()
        return victims

    def clear(self) -> None:
        self._t1.clear()
        self._t2.clear()
        self._b1.clear()
        self._b2.clear()
        self._incoming.clear()
        self._p = 0.0

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(list(chain(self._t1.items(), self._t2.items())))

    # -- the algorithm ---------------------------------------------------------------------

    @property
    def _cap(self) -> int:
        return self.cache_capacity

    def _plan_evictions(
        self, n: int, protected: Collection[OffloadKey]
    ) -> tuple[list[_Step], float] | None:
        """Decide n evictions without changing anything: the steps in order and the new p.

        Serves the announced keys in order as single requests: those before the last n fill
        free slots (only p adapts), each of the last n pays for one eviction. List sizes are
        tracked as the sequential algorithm would see them.
        """
        c = self._cap
        t1n, t2n, b1n, b2n = len(self._t1), len(self._t2), len(self._b1), len(self._b2)
        p = self._p
        incoming: list[OffloadKey | None] = list(self._incoming)
        if len(incoming) >= n:
            free_slot_keys, paying_keys = incoming[:-n], incoming[-n:]
        else:
            # More evictions than announced keys: the unannounced ones are plain misses.
            unannounced: list[OffloadKey | None] = [None] * (n - len(incoming))
            free_slot_keys, paying_keys = [], unannounced + incoming
        t1_entries: _Entries = iter(self._t1.items())
        t2_entries: _Entries = iter(self._t2.items())
        steps: list[_Step] = []

        def origin_of(key: OffloadKey | None) -> _Origin:
            if key is None:
                return _Origin.NEW
            if key in self._b1:
                return _Origin.B1
            if key in self._b2:
                return _Origin.B2
            return _Origin.NEW

        def take(from_t1: bool) -> tuple[OffloadKey, BlockStatus] | None:
            return _next_evictable(t1_entries if from_t1 else t2_entries, protected)

        for key in free_slot_keys:
            origin = origin_of(key)
            # Fixed in both: a ghost list this batch emptied cannot hold the key (case IV).
            if (origin is _Origin.B1 and b1n == 0) or (origin is _Origin.B2 and b2n == 0):
                origin = _Origin.NEW
            p = _adapt(p, origin, b1n, b2n, c)
            t1n, t2n, b1n, b2n = _after_insert(origin, t1n, t2n, b1n, b2n)

        for key in paying_keys:
            origin = origin_of(key)
            # Fixed in both: a ghost list this batch emptied cannot hold the key (case IV).
            if (origin is _Origin.B1 and b1n == 0) or (origin is _Origin.B2 and b2n == 0):
                origin = _Origin.NEW
            p = _adapt(p, origin, b1n, b2n, c)
            drop_t1_lru = False
            if origin is _Origin.NEW:
                if t1n + b1n >= c:  # case IV.A: L1 is full
                    if t1n < c:
                        if b1n > 0:
                            steps.append((_Op.POP_B1, None, None))
                            b1n -= 1
                    else:
                        drop_t1_lru = True
                elif t1n + t2n + b1n + b2n >= 2 * c and b2n > 0:  # case IV.B, directory full
                    steps.append((_Op.POP_B2, None, None))
                    b2n -= 1
            if drop_t1_lru:
                victim = take(True)
                if victim is not None:
                    steps.append((_Op.DROP_T1, *victim))
                    t1n -= 1
                else:  # T1's blocks are all pinned: fall back to REPLACE from T2
                    victim = take(False)
                    if victim is None:
                        return None
                    steps.append((_Op.EVICT_T2, *victim))
                    t2n, b2n = t2n - 1, b2n + 1
            else:
                # REPLACE(x, p)
                prefer_t1 = t1n > 0 and (t1n > p or (origin is _Origin.B2 and t1n == p))
                victim = take(prefer_t1)
                from_t1 = prefer_t1
                if victim is None:
                    victim = take(not prefer_t1)
                    from_t1 = not prefer_t1
                if victim is None:
                    return None
                if from_t1:
                    steps.append((_Op.EVICT_T1, *victim))
                    t1n, b1n = t1n - 1, b1n + 1
                else:
                    steps.append((_Op.EVICT_T2, *victim))
                    t2n, b2n = t2n - 1, b2n + 1
            if key is not None:
                t1n, t2n, b1n, b2n = _after_insert(origin, t1n, t2n, b1n, b2n)
        return steps, p

    def _bound_ghosts(self) -> None:
        c = self._cap
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        while b1 and len(t1) + len(b1) > c:
            b1.popitem(last=False)
        while (b1 or b2) and len(t1) + len(t2) + len(b1) + len(b2) > 2 * c:
            (b2 if b2 else b1).popitem(last=False)


def _after_insert(
    origin: _Origin, t1n: int, t2n: int, b1n: int, b2n: int
) -> tuple[int, int, int, int]:
    """List sizes after a requested key is inserted: a ghost hit moves to T2, a new key to T1."""
    if origin is _Origin.B1:
        return t1n, t2n + 1, b1n - 1, b2n
    if origin is _Origin.B2:
        return t1n, t2n + 1, b1n, b2n - 1
    return t1n + 1, t2n, b1n, b2n
