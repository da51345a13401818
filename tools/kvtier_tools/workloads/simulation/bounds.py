"""Upper bounds on the hit ratio of any cache: the infinite cache and Belady's OPT.

Both count hits the way `kvtier.policies.simulate` does (one access per key, cold start,
every miss admitted), so a policy's hit ratio can be read against them directly:

- the **infinite-cache bound** hits every access but each block's first; no cache of any size
  or policy does better;
- **Belady's OPT** (MIN) is the best any cache of the same capacity can do when every miss is
  admitted: on a miss with a full cache it evicts the resident block whose next use lies
  farthest in the future (a block never used again first). It needs the whole future, so it is
  a yardstick, not a policy a tier could run.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence

from kvtier.errors import InvalidValueError
from kvtier.policies import SimulationResult

OPT_NAME = "opt"
"""The `policy` name of Belady's OPT in results and reports."""

INFINITE_NAME = "infinite"
"""The `policy` name of the infinite-cache bound in results and reports."""


def infinite_cache_hits(keys: Iterable[Hashable]) -> SimulationResult:
    """The infinite-cache bound: every access hits except the first one to each block.

    The result's `capacity` is the number of distinct blocks (the smallest cache that reaches
    the bound) and `evictions` is 0.
    """
    accesses = 0
    seen: set[Hashable] = set()
    for key in keys:
        accesses += 1
        seen.add(key)
    return SimulationResult(INFINITE_NAME, max(1, len(seen)), accesses, accesses - len(seen), 0)


class BeladyOracle:
    """Belady's OPT over one access sequence, at any number of capacities.

    The constructor precomputes, for every access, the index of the next access to the same
    key (O(n) once); each `simulate(capacity)` then runs in O(n log n) with a max-heap of
    resident blocks keyed by next use. A hit pushes a fresh heap entry instead of updating
    the old one, which becomes stale and is skipped when it surfaces (lazy deletion): a key's
    next use only grows, so an entry is current exactly when it equals the resident's
    recorded next use.
    """

    def __init__(self, keys: Iterable[Hashable]) -> None:
        sequence: Sequence[Hashable] = keys if isinstance(keys, list | tuple) else list(keys)
        n = len(sequence)
        next_use = [0] * n
        last: dict[Hashable, int] = {}
        for index in range(n - 1, -1, -1):
            key = sequence[index]
            next_use[index] = last.get(key, n)  # n: never used again
            last[key] = index
        self._keys = sequence
        self._next_use = next_use

    @property
    def accesses(self) -> int:
        """Length of the access sequence."""
        return len(self._keys)

    def simulate(self, capacity: int) -> SimulationResult:
        """Hits of Belady's OPT with `capacity` blocks (cold start, every miss admitted)."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidValueError(f"OPT: capacity must be a positive int, got {capacity!r}")
        keys, next_use = self._keys, self._next_use
        resident: dict[Hashable, int] = {}  # key -> index of its next access
        # Entries (-next use, index of the access that set it); the key is keys[index]. The
        # index rather than the key breaks ties, so keys of mixed types never get compared.
        heap: list[tuple[int, int]] = []
        push, pop = heapq.heappush, heapq.heappop
        hits = evictions = 0
        for index, key in enumerate(keys):
            upcoming = next_use[index]
            if key in resident:
                hits += 1
            elif len(resident) >= capacity:
                while True:
                    negated, at = pop(heap)
                    victim = keys[at]
                    if resident.get(victim) == -negated:
                        del resident[victim]
                        break
                evictions += 1
            resident[key] = upcoming
            push(heap, (-upcoming, index))
        return SimulationResult(OPT_NAME, capacity, len(keys), hits, evictions)


def belady_opt(capacity: int, keys: Iterable[Hashable]) -> SimulationResult:
    """Hits of Belady's OPT with `capacity` blocks over `keys` (see `BeladyOracle`)."""
    return BeladyOracle(keys).simulate(capacity)
