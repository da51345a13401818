"""ARC as the paper gives it (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement
Cache", FAST 2003, Fig. 4), one request at a time, keys only, written from the pseudo-code,
as an independent reference for `kvtier.policies.arc`.

Two departures, the ones a tier needs (with neither in play this is the paper's algorithm):
- a request may name `protected` keys (the other keys of its batch, being stored together,
  and blocks a reader has pinned) that are never evicted: where the paper takes the LRU
  block of a list, the first unprotected one of that list is taken, or of the other list
  when that one has none;
- `remove(x)` forgets a block whose store failed (no ghost), and a request with a free slot
  (the cache below c blocks after such a removal) takes it without REPLACE; the ghost lists
  are then trimmed to |T1| + |B1| <= c and |L1| + |L2| <= 2c, oldest first (B2 before B1
  for the second), which the paper's invariants make a no-op otherwise.

Lists are OrderedDicts, least recently used first; "MRU" is the end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class PaperARC:
    def __init__(self, c: int) -> None:
        self.c = c
        self.p = 0.0
        self.t1: OrderedDict[Hashable, None] = OrderedDict()
        self.t2: OrderedDict[Hashable, None] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()

    def lists(self) -> dict[str, list[Hashable]]:
        return {"t1": list(self.t1), "t2": list(self.t2), "b1": list(self.b1), "b2": list(self.b2)}

    @staticmethod
    def _oldest(entries: OrderedDict[Hashable, None], protected: set[Hashable]) -> Hashable:
        return next((key for key in entries if key not in protected), None)

    def _replace(self, x: Hashable, protected: set[Hashable]) -> Hashable:
        """REPLACE(x, p): the evicted key."""
        from_t1 = bool(self.t1) and (
            len(self.t1) > self.p or (x in self.b2 and len(self.t1) == self.p)
        )
        lists = [(self.t1, self.b1), (self.t2, self.b2)]
        if not from_t1:
            lists.reverse()
        for source, ghosts in lists:
            victim = self._oldest(source, protected)
            if victim is not None:
                del source[victim]
                ghosts[victim] = None
                return victim
        raise AssertionError("nothing evictable")

    def request(self, x: Hashable, protected: set[Hashable] | None = None) -> list[Hashable]:
        """Serve a request for `x`; the keys it evicted from the cache (T1 or T2)."""
        c = self.c
        protected = protected or set()
        if x in self.t1:  # Case I: a hit
            del self.t1[x]
            self.t2[x] = None
            return []
        if x in self.t2:
            self.t2.move_to_end(x)
            return []
        full = len(self.t1) + len(self.t2) >= c
        if x in self.b1:  # Case II
            delta = 1.0 if len(self.b1) >= len(self.b2) else len(self.b2) / len(self.b1)
            self.p = min(self.p + delta, float(c))
            evicted = [self._replace(x, protected)] if full else []
            del self.b1[x]
            self.t2[x] = None
            self._trim()
            return evicted
        if x in self.b2:  # Case III
            delta = 1.0 if len(self.b2) >= len(self.b1) else len(self.b1) / len(self.b2)
            self.p = max(self.p - delta, 0.0)
            evicted = [self._replace(x, protected)] if full else []
            del self.b2[x]
            self.t2[x] = None
            self._trim()
            return evicted
        evicted = []
        l1 = len(self.t1) + len(self.b1)
        total = l1 + len(self.t2) + len(self.b2)
        if len(self.t1) + len(self.t2) < c and (self.b1 or self.b2):
            self.t1[x] = None  # a free slot left by a removal: no REPLACE
            self._trim()
            return evicted
        if l1 == c:  # Case IV.A
            if len(self.t1) < c:
                self.b1.popitem(last=False)
                evicted.append(self._replace(x, protected))
            else:  # delete T1's LRU block (not remembered)
                victim = self._oldest(self.t1, protected)
                if victim is not None:
                    del self.t1[victim]
                else:  # all of T1 protected: REPLACE from T2
                    victim = self._oldest(self.t2, protected)
                    del self.t2[victim]
                    self.b2[victim] = None
                evicted.append(victim)
        elif total >= c:  # Case IV.B (l1 < c)
            if total == 2 * c:
                self.b2.popitem(last=False)
            evicted.append(self._replace(x, protected))
        self.t1[x] = None
        self._trim()
        return evicted

    def remove(self, x: Hashable) -> None:
        """A failed store: `x` leaves the cache without a ghost."""
        if x in self.t1:
            del self.t1[x]
        else:
            del self.t2[x]
        self._trim()

    def _trim(self) -> None:
        c = self.c
        while self.b1 and len(self.t1) + len(self.b1) > c:
            self.b1.popitem(last=False)
        while (self.b1 or self.b2) and (
            len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) > 2 * c
        ):
            (self.b2 if self.b2 else self.b1).popitem(last=False)
