"""Adaptive Replacement Cache (Megiddo & Modha, FAST 2003, Fig. 4).

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

This module's class is `PureARCCachePolicy`. When the compiled core is selected (see
`kvtier.compiled`), `ARCCachePolicy` is the one of `kvtier.policies._arc_core`: this
algorithm step for step with the four lists in C (linked lists over arrays instead of ordered
dicts); otherwise it is `PureARCCachePolicy` itself. Both decide alike
(`tests/test_compiled_core.py`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from itertools import chain, islice
from operator import attrgetter, itemgetter
from typing import ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies.base import CachePolicy, check_evict_count
from kvtier.policies.hinted import HintBook

# Where a requested key comes from: a new key, or a hit in ghost list B1 or B2. Plain ints,
# compared in the eviction planner's loop, where enum members cost an attribute lookup each.
_NEW, _FROM_B1, _FROM_B2 = 0, 1, 2

# What an eviction plan does with each victim.
_EVICT_T1 = 0  # move a T1 block to the MRU end of B1
_EVICT_T2 = 1  # move a T2 block to the MRU end of B2
_DROP_T1 = 2  # delete a T1 block without remembering it (paper case IV.A, |T1| = c)

_Entry = tuple[OffloadKey, BlockStatus]
_Entries = Iterator[_Entry]
# An eviction plan: victims in order, what happens to each, the ghosts of B1 and of B2 to
# delete, and the new p.
_Plan = tuple[list[_Entry], list[int], list[OffloadKey], list[OffloadKey], float]

# C-level field readers for map() over a batch of entries.
_key_of = itemgetter(0)
_block_of = itemgetter(1)
_ref_cnt = attrgetter("ref_cnt")


def _next_evictable(entries: _Entries, protected: Collection[OffloadKey]) -> _Entry | None:
    """Advance `entries` to the next block that may be evicted, and return it."""
    for entry in entries:
        if entry[1].ref_cnt == 0 and entry[0] not in protected:
            return entry
    return None


class ARCCachePolicy(CachePolicy):
    """ARC: balances recency (T1) against frequency (T2) with a self-tuning target."""

    name: ClassVar[str] = "arc"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        # Each ordered dict is least recently used first.
        self._t1: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._t2: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        self._b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self._b2: OrderedDict[OffloadKey, None] = OrderedDict()
        # T1 and T2 together, unordered: `get` is one C-level dict lookup instead of a Python
        # call probing two lists, and a tier calls it several times per block.
        self._resident: dict[OffloadKey, BlockStatus] = {}
        # `get` is that dict's own bound method (shadowing the method below, which documents
        # it): every caller, not only `getter()`'s, looks up with no Python frame. The dict
        # is never replaced (`clear` empties it), so the binding stays valid. A subclass
        # that overrides `get` keeps its own.
        if type(self).get is PureARCCachePolicy.get:
            self.get = self._resident.get  # type: ignore[method-assign,assignment]
        self._p = 0.0
        # Keys announced by on_store_miss, in order (a dict used as an ordered set), and
        # whether p already adapted to them: evict adapts for every announced key at once, so
        # one flag serves them all; insert adapts for a key that evict did not see.
        self._incoming: dict[OffloadKey, None] = {}
        self._incoming_adapted = False
        # How many new keys `insert` may still add to T1 without testing the ghost bound
        # (see insert). Only insert and evict add to |T1|+|B1| or to the lists' total
        # (every other change shrinks them, which keeps the figure safe): evict and
        # insert_many reset it to 0, meaning "test".
        self._insert_room = 0
        # Reuse hints on resident blocks, consulted only while some block is hinted.
        self._hints = HintBook()

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
        return self._resident.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._resident.get

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        # insert_many((key,), (block,)) without its batch checks and set-ups for the usual
        # case, a new key (no ghost hit): it joins T1, leaves the announced keys, and the
        # ghost bound is applied if the new |T1| trips it, as insert_many's loop does.
        resident, b1, b2 = self._resident, self._b1, self._b2
        if key in b1 or key in b2:
            self.insert_many((key,), (block,))
            return
        if key in resident:
            raise BlockStateError(f"{self.name}: key {key!r} is already resident")
        t1 = self._t1
        t1[key] = block
        resident[key] = block
        incoming = self._incoming
        if incoming:
            incoming.pop(key, None)
        room = self._insert_room
        if room:
            self._insert_room = room - 1
            return
        # _bound_ghosts' entry test (T1 and T2 together are `resident`), cheapest part first
        b1n, b2n, c = len(b1), len(b2), self.cache_capacity
        if (b1n and len(t1) + b1n > c) or (len(resident) + b1n + b2n > 2 * c and (b1n or b2n)):
            self._bound_ghosts()
            b1n, b2n = len(b1), len(b2)
        # How many more new keys can join T1 before that test could pass again (it is
        # false now): each adds one to |T1| and to |T1|+|T2|; the ghost counts stay.
        self._insert_room = min(
            c - len(t1) - b1n if b1n else c,
            2 * c - len(resident) - b1n - b2n if b1n or b2n else c,
        )

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        resident = self._resident
        self._check_insert_batch(keys, blocks, resident)
        self._insert_room = 0
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        incoming = self._incoming
        c = self.cache_capacity
        t1n, t2n, b1n, b2n = len(t1), len(t2), len(b1), len(b2)
        m = len(keys)
        # A batch of new keys (no ghost hit) that never trips the ghost bound (only |T1|
        # grows, so the last key is the first that could) changes nothing but T1: insert it
        # with C-level updates. This is a tier's usual batch.
        if (
            b1.keys().isdisjoint(keys)
            and b2.keys().isdisjoint(keys)
            and not (b1n and t1n + m + b1n > c)
            and not ((b1n or b2n) and t1n + m + t2n + b1n + b2n > 2 * c)
        ):
            # one loop fills both (OrderedDict.update is slower than item assignment)
            for key, block in zip(keys, blocks, strict=True):
                t1[key] = block
                resident[key] = block
            if incoming:
                if list(incoming) == list(keys):  # exactly the announced keys, as a tier does
                    incoming.clear()
                else:
                    for key in keys:
                        incoming.pop(key, None)
            return
        p = self._p
        adapted_all = self._incoming_adapted
        for key, block in zip(keys, blocks, strict=True):
            # pop returns the stored None for an announced key, False for any other
            adapted = incoming.pop(key, False) is None and adapted_all
            if key in b1:
                if not adapted:  # case II: a B1 ghost hit grows T1's target
                    p = min(p + (1.0 if b1n >= b2n else b2n / b1n), float(c))
                del b1[key]
                t2[key] = block
                b1n -= 1
                t2n += 1
            elif key in b2:
                if not adapted:  # case III: a B2 ghost hit shrinks T1's target
                    p = max(p - (1.0 if b2n >= b1n else b1n / b2n), 0.0)
                del b2[key]
                t2[key] = block
                b2n -= 1
                t2n += 1
            else:
                t1[key] = block
                t1n += 1
            resident[key] = block
            # The entry test of _bound_ghosts' loops: call it only when it has work to do.
            if (b1n and t1n + b1n > c) or ((b1n or b2n) and t1n + t2n + b1n + b2n > 2 * c):
                self._bound_ghosts()
                b1n, b2n = len(b1), len(b2)
        self._p = p

    def remove(self, key: OffloadKey) -> None:
        if self._resident.pop(key, None) is None:
            raise BlockStateError(f"arc: key {key!r} is not resident")
        if self._t1.pop(key, None) is None:
            del self._t2[key]
        self._incoming.pop(key, None)
        if self._hints.reuse:
            self._hints.discard(key)

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        self._hints.mark(key, reuse, key in self._resident)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        if self._hints.reuse:
            self._hints.touched(keys)
        t1, t2 = self._t1, self._t2
        t1_get, t2_move_to_end = t1.get, t2.move_to_end
        for key in reversed(keys):
            # T2 first (a key is in one list at most): most blocks a tier reads again are
            # frequent already, and this finds them with one lookup instead of two.
            if key in t2:
                t2_move_to_end(key)
                continue
            block = t1_get(key)
            if block is not None:
                if block.ref_cnt >= 0:
                    # Case I: a second access to a ready block makes it frequent.
                    del t1[key]
                    t2[key] = block
                else:
                    # Still being written: its store was the first access, not a second.
                    t1.move_to_end(key)

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        resident = self._resident
        if resident.keys().isdisjoint(keys):  # a tier announces only absent keys: C-level
            self._incoming = dict.fromkeys(keys)
        else:
            self._incoming = {key: None for key in keys if key not in resident}
        self._incoming_adapted = False

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if type(n) is not int or n < 1:  # the common case skips check_evict_count's call
            check_evict_count(n)
            if n == 0:
                return []
        if self._hints.active:
            return self._hints.evict_hinted(
                n, protected, self.evict, self._resident.get, self.remove, self.items
            )
        plan = self._plan_new_keys(n, protected)
        if plan is None:
            plan = self._plan_evictions(n, protected)
            if plan is None:
                return None
        victims, ops, popped_b1, popped_b2, p = plan
        t1, t2, b1, b2, resident = self._t1, self._t2, self._b1, self._b2, self._resident
        if ops.count(_EVICT_T1) == len(ops):  # the usual plan: every victim from T1 to B1
            for key, _ in victims:
                del resident[key]
                del t1[key]
                b1[key] = None
        else:
            for (key, _), op in zip(victims, ops, strict=True):
                del resident[key]
                if op == _EVICT_T1:
                    del t1[key]
                    b1[key] = None
                elif op == _EVICT_T2:
                    del t2[key]
                    b2[key] = None
                else:  # _DROP_T1
                    del t1[key]
        # The ghosts the step-by-step order deletes, by key: not simply the oldest ones now,
        # since a ghost hit earlier in the batch had already left its list then (it leaves
        # it here only at insert).
        for key in popped_b1:
            del b1[key]
        for key in popped_b2:
            del b2[key]
        self._p = p
        self._incoming_adapted = True
        self._insert_room = 0  # B1 or B2 may have gained their first ghosts
        self._bound_ghosts()
        return victims

    def clear(self) -> None:
        self._t1.clear()
        self._t2.clear()
        self._b1.clear()
        self._b2.clear()
        self._resident.clear()
        self._incoming.clear()
        self._incoming_adapted = False
        self._insert_room = 0
        self._p = 0.0
        self._hints.clear()

    def __len__(self) -> int:
        return len(self._resident)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(list(chain(self._t1.items(), self._t2.items())))

    # -- the algorithm ---------------------------------------------------------------------

    def _plan_new_keys(self, n: int, protected: Collection[OffloadKey]) -> _Plan | None:  # noqa: C901 - one pass on purpose: the batched hot path (issue 23); see tests/test_arc_paper.py
        """`_plan_evictions` for a tier's usual batch, faster; None when it does not apply.

        It applies when the n keys to make room for are exactly the announced ones and none
        is a ghost (all take case IV), each REPLACE finds the oldest remaining block of the
        list it chose evictable and unprotected, and the ghosts deleted are only ones listed
        before the batch. The steps then depend on the list sizes alone: they are followed
        on counts (no dict work, and in one go once the steady state is reached, see
        `_plan_evictions`), and the victims and ghosts are slices of the lists' old ends,
        checked with C-level calls. The result is the one `_plan_evictions` returns.
        """
        incoming = self._incoming
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        if len(incoming) != n or not (
            b1.keys().isdisjoint(incoming) and b2.keys().isdisjoint(incoming)
        ):
            return None
        c, p = self.cache_capacity, self._p
        c2 = 2 * c
        t1n, t2n, b1n, b2n = len(t1), len(t2), len(b1), len(b2)
        ops: list[int] = []
        pop1 = pop2 = 0  # ghosts deleted from B1's and B2's old ends
        left = n
        while left:
            if b1n > 0 and p < t1n < c <= t1n + b1n:  # steady: every step left is the same
                ops += [_EVICT_T1] * left
                pop1 += left
                break
            left -= 1
            if t1n + b1n >= c:  # IV.A
                if t1n >= c:
                    return None  # T1 holds the whole cache: rare, left to the general plan
                if b1n > 0:
                    pop1 += 1
                    b1n -= 1
            elif b2n > 0 and t1n + t2n + b1n + b2n >= c2:  # IV.B, directory full
                pop2 += 1
                b2n -= 1
            if t1n > p:  # REPLACE(x, p) from T1 (t1n > p >= 0), else from T2
                ops.append(_EVICT_T1)
                b1n += 1  # and T1 loses the victim but gains the new key
            else:
                ops.append(_EVICT_T2)
                t2n, b2n, t1n = t2n - 1, b2n + 1, t1n + 1
            while b1n and t1n + b1n > c:  # _bound_ghosts, as `trimmed` applies it
                pop1 += 1
                b1n -= 1
            while (b1n or b2n) and t1n + t2n + b1n + b2n > c2:
                if b2n:
                    pop2 += 1
                    b2n -= 1
                else:
                    pop1 += 1
                    b1n -= 1
        if pop1 > len(b1) or pop2 > len(b2):
            return None  # a ghost this batch makes would be deleted: the general plan
        k1 = ops.count(_EVICT_T1)
        from_t1 = list(islice(t1.items(), k1))
        from_t2 = list(islice(t2.items(), n - k1)) if k1 < n else []
        if (
            len(from_t1) != k1
            or len(from_t2) != n - k1
            or any(map(_ref_cnt, map(_block_of, from_t1)))
            or any(map(_ref_cnt, map(_block_of, from_t2)))
            or any(map(protected.__contains__, map(_key_of, from_t1)))
            or any(map(protected.__contains__, map(_key_of, from_t2)))
        ):
            return None
        if k1 == n:
            victims = from_t1
        elif k1 == 0:
            victims = from_t2
        else:
            next1, next2 = iter(from_t1).__next__, iter(from_t2).__next__
            victims = [next1() if op == _EVICT_T1 else next2() for op in ops]
        return victims, ops, list(islice(b1, pop1)), list(islice(b2, pop2)), p

    def _plan_evictions(self, n: int, protected: Collection[OffloadKey]) -> _Plan | None:  # noqa: C901 - one loop on purpose: the hot path, the paper step by step; see tests/test_arc_paper.py
        """Decide n evictions without changing anything: the victims in order, what happens
        to each (`_EVICT_T1`, `_EVICT_T2` or `_DROP_T1`), the ghosts of B1 and of B2 to
        delete, and the new p; or None when n blocks cannot be evicted.

        Serves the announced keys in order as single requests: those before the last n fill
        free slots (only p adapts), each of the last n pays for one eviction. List sizes are
        tracked as the sequential algorithm would see them.
        """
        c = self.cache_capacity
        fc = float(c)
        b1, b2 = self._b1, self._b2
        t1n, t2n, b1n, b2n = len(self._t1), len(self._t2), len(b1), len(b2)
        p = self._p
        incoming: list[OffloadKey | None] = list(self._incoming)
        if len(incoming) >= n:
            free_slot_keys, paying_keys = incoming[:-n], incoming[-n:]
        else:
            # More evictions than announced keys: the unannounced ones (None) are plain misses.
            unannounced: list[OffloadKey | None] = [None] * (n - len(incoming))
            free_slot_keys, paying_keys = [], unannounced + incoming
        t1_entries: _Entries = iter(self._t1.items())
        t2_entries: _Entries = iter(self._t2.items())
        victims: list[_Entry] = []
        ops: list[int] = []
        # The ghost lists as the step-by-step order sees them: a ghost leaves when a request
        # hits it or when a case IV deletes its list's oldest (`gone`); the pops walk each
        # list from its oldest, skipping ghosts already gone.
        gone: set[OffloadKey] = set()
        b1_oldest, b2_oldest = iter(b1), iter(b2)
        popped_b1: list[OffloadKey] = []
        popped_b2: list[OffloadKey] = []

        def in_b1(key: OffloadKey | None) -> bool:
            return b1n > 0 and key in b1 and key not in gone

        def in_b2(key: OffloadKey | None) -> bool:
            return b2n > 0 and key in b2 and key not in gone

        def pop_oldest(oldest: Iterator[OffloadKey], popped: list[OffloadKey]) -> None:
            for ghost in oldest:
                if ghost not in gone:
                    gone.add(ghost)
                    popped.append(ghost)
                    return

        def trimmed(t1n: int, t2n: int, b1n: int, b2n: int) -> tuple[int, int]:
            """`_bound_ghosts` as the step-by-step order applies it after a request (a no-op
            while the paper's invariants hold): the ghost counts after it."""
            while b1n and t1n + b1n > c:
                pop_oldest(b1_oldest, popped_b1)
                b1n -= 1
            while (b1n or b2n) and t1n + t2n + b1n + b2n > 2 * c:
                if b2n:
                    pop_oldest(b2_oldest, popped_b2)
                    b2n -= 1
                else:
                    pop_oldest(b1_oldest, popped_b1)
                    b1n -= 1
            return b1n, b2n

        # Keys served by free slots: p adapts to ghost hits (cases II and III), then the key
        # joins T2 (a ghost hit) or T1 (a new key).
        for key in free_slot_keys:
            if in_b1(key):
                p = min(p + (1.0 if b1n >= b2n else b2n / b1n), fc)
                t2n, b1n = t2n + 1, b1n - 1
                gone.add(key)  # type: ignore[arg-type]
            elif in_b2(key):
                p = max(p - (1.0 if b2n >= b1n else b1n / b2n), 0.0)
                t2n, b2n = t2n + 1, b2n - 1
                gone.add(key)  # type: ignore[arg-type]
            else:
                t1n += 1
            b1n, b2n = trimmed(t1n, t2n, b1n, b2n)

        # `victim = next(entries, None)`, re-checked, is _next_evictable's first iteration
        # without its call: the oldest block of a list is nearly always evictable.
        #
        # `steady`: a new key now would take case IV.A with |T1| < c and |B1| > 0 (delete
        # B1's LRU) and REPLACE from T1 (|T1| > p): it evicts T1's next block to B1 and joins
        # T1, leaving every count and p as they were, so the next new key takes the same path.
        # Runs of new keys (most of a tier's misses) then cost a victim each, nothing more.
        steady = b1n > 0 and p < t1n < c <= t1n + b1n
        for key in paying_keys:
            if steady and key is not None and not in_b1(key) and not in_b2(key):
                victim = next(t1_entries, None)
                if victim is None or victim[1].ref_cnt or victim[0] in protected:
                    victim = _next_evictable(t1_entries, protected)
                if victim is not None:
                    victims.append(victim)
                    ops.append(_EVICT_T1)
                    for ghost in b1_oldest:  # pop_oldest(b1_oldest, popped_b1), inlined
                        if ghost not in gone:
                            gone.add(ghost)
                            popped_b1.append(ghost)
                            break
                    continue
                # T1 has no evictable block left: the general path below takes T2's.
            # A ghost list this batch has already emptied cannot hold the key: sequentially,
            # its ghost was deleted before its request came, so it is a new miss (case IV).
            if in_b1(key):  # case II (None, an unannounced miss, is in no list)
                origin = _FROM_B1
                p = min(p + (1.0 if b1n >= b2n else b2n / b1n), fc)
                gone.add(key)  # type: ignore[arg-type]
            elif in_b2(key):  # case III
                origin = _FROM_B2
                p = max(p - (1.0 if b2n >= b1n else b1n / b2n), 0.0)
                gone.add(key)  # type: ignore[arg-type]
            else:  # case IV
                origin = _NEW
                if t1n + b1n >= c:  # IV.A: L1 is full
                    if t1n >= c:
                        # |T1| = c: delete T1's LRU block without remembering it
                        victim = next(t1_entries, None)
                        if victim is None or victim[1].ref_cnt or victim[0] in protected:
                            victim = _next_evictable(t1_entries, protected)
                        if victim is not None:
                            victims.append(victim)
                            ops.append(_DROP_T1)
                            t1n -= 1
                        else:  # T1's blocks are all pinned: fall back to REPLACE from T2
                            victim = _next_evictable(t2_entries, protected)
                            if victim is None:
                                return None
                            victims.append(victim)
                            ops.append(_EVICT_T2)
                            t2n, b2n = t2n - 1, b2n + 1
                        if key is not None:
                            t1n += 1
                        b1n, b2n = trimmed(t1n, t2n, b1n, b2n)
                        steady = b1n > 0 and p < t1n < c <= t1n + b1n
                        continue
                    if b1n > 0:
                        pop_oldest(b1_oldest, popped_b1)
                        b1n -= 1
                elif t1n + t2n + b1n + b2n >= 2 * c and b2n > 0:  # IV.B, directory full
                    pop_oldest(b2_oldest, popped_b2)
                    b2n -= 1
            # REPLACE(x, p)
            from_t1 = t1n > 0 and (t1n > p or (origin == _FROM_B2 and t1n == p))
            entries = t1_entries if from_t1 else t2_entries
            victim = next(entries, None)
            if victim is None or victim[1].ref_cnt or victim[0] in protected:
                victim = _next_evictable(entries, protected)
                if victim is None:  # none evictable there: take the other list's
                    from_t1 = not from_t1
                    victim = _next_evictable(t1_entries if from_t1 else t2_entries, protected)
                    if victim is None:
                        return None
            victims.append(victim)
            if from_t1:
                ops.append(_EVICT_T1)
                t1n, b1n = t1n - 1, b1n + 1
            else:
                ops.append(_EVICT_T2)
                t2n, b2n = t2n - 1, b2n + 1
            # the requested key joins T2 (a ghost hit) or T1 (a new key)
            if origin == _FROM_B1:
                t2n, b1n = t2n + 1, b1n - 1
            elif origin == _FROM_B2:
                t2n, b2n = t2n + 1, b2n - 1
            elif key is not None:
                t1n += 1
            b1n, b2n = trimmed(t1n, t2n, b1n, b2n)
            steady = b1n > 0 and p < t1n < c <= t1n + b1n
        return victims, ops, popped_b1, popped_b2, p

    def _bound_ghosts(self) -> None:
        c = self.cache_capacity
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        while b1 and len(t1) + len(b1) > c:
            b1.popitem(last=False)
        while (b1 or b2) and len(t1) + len(t2) + len(b1) + len(b2) > 2 * c:
            (b2 if b2 else b1).popitem(last=False)


PureARCCachePolicy = ARCCachePolicy
"""ARC in pure Python: the fallback, and the reference the compiled ARC is tested against."""

try:  # the compiled ARC, present only when kvtier.compiled selected it
    import kvtier.policies._arc_core as _arc_core
except ImportError:
    pass
else:
    ARCCachePolicy = _arc_core.ARCCachePolicy  # type: ignore[misc]
