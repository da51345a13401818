"""LCT, learned class thresholds: a cache policy that learns, online, how long each class of
block deserves to stay, and admits nothing of a class that never pays.

A block's class is how often it was accessed so far (1, 2, 3, 4 or more), remembered across
eviction by a bounded ghost directory of recently seen keys. Each class keeps an LRU queue of
its resident blocks and, online, a decayed histogram of its reuse distances (in accesses,
log-spaced bins) and of its arrivals. Every `period` accesses the policy solves for per-class
residency limits L_k (in accesses since the last use) that maximize expected hits within the
capacity: by Little's law a class occupies rate_k * E[min(d, L_k)] slots, and a Lagrange
multiplier lambda, bisected, prices a slot-access so that the chosen limits fit. A class
whose limit is 0 is not admitted (`admit` says False: the key stays in the ghost
directory). Limits never decrease with the access count, so a prompt's tail is never kept
longer than its prefix. Eviction takes, among the classes' LRU tails, the block furthest past
its class limit, as a ratio: age / limit (a block 1,000 accesses past a limit of 2,000 is
further past its use than one 1,000 past a limit of 30,000; reuse distances are compared on
a log scale, as the histograms bin them). Blocks of a class with no limit go only when no
limited class has a block to give, oldest first.

Within one request the deepest blocks go first: `on_store_miss` and `touch` take a request's
keys tail to head, so its head is the newest access and a prefix outlives its tail.
`insert_many` inserts in order, as every policy's does (the fast paths' contract); storing a
batch tail first was measured and did not pay for breaking it (prefix hits at 5 % of the
shipped trace: 0.2159 tail first, 0.2165 in order).

Decisions are O(1) amortized per access: four queues, a dict per class, and a solve of
(4 classes x ~100 bins) every `period` accesses.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import ClassVar, Literal

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.policies.base import CachePolicy, check_evict_count

EvictionOrder = Literal["ratio", "over"]

CLASSES = 4
"""Classes by access count: 1, 2, 3, and 4 or more."""
BINS_PER_OCTAVE = 4
MAX_BINS = 4 * 26
# The four tunables were chosen together on the first half (by time) of the shipped trace,
# one set for every capacity (benchmarks/lct_tuning.py), and reported on the second half.
GHOST_FACTOR = 32
"""Keys the ghost directory remembers, per block of capacity."""
DECAY = 0.8
"""Weight the statistics keep at each solve (older behaviour fades)."""
SOLVE_EVERY = 2.0
"""The limits are solved again every this many times the capacity, in accesses."""
ORDER: EvictionOrder = "ratio"
"""How far past its class limit a queue's oldest block is: "ratio" (age / limit) or "over"
(age - limit); the evicted block is the one furthest past (see `LCTCachePolicy.evict`)."""
UNLIMITED = float("inf")
MIN_REUSE = 1e-4
"""A class whose blocks are reused less often than this (per arrival) never pays: limit 0."""


def _class_of(count: int) -> int:
    """The queue (0..CLASSES-1) of a block accessed `count` (>= 1) times."""
    return min(count, CLASSES) - 1


def _bin(distance: int) -> int:
    """The log-spaced bin of a reuse distance (>= 1)."""
    return min(MAX_BINS - 1, int(math.log2(distance) * BINS_PER_OCTAVE))


_EDGES = [2 ** ((b + 1) / BINS_PER_OCTAVE) for b in range(MAX_BINS)]
"""Upper edge of each bin: the residency limits the solver chooses among."""
_MIDS = [
    (2 ** (b / BINS_PER_OCTAVE) + 2 ** ((b + 1) / BINS_PER_OCTAVE)) / 2 for b in range(MAX_BINS)
]


class LCTCachePolicy(CachePolicy):
    """Learned class thresholds (see the module doc)."""

    name: ClassVar[str] = "lct"
    admits_all: ClassVar[bool] = False

    def __init__(
        self,
        cache_capacity: int,
        *,
        decay: float = DECAY,
        solve_every: float = SOLVE_EVERY,
        ghost_factor: int = GHOST_FACTOR,
        order: EvictionOrder = ORDER,
    ) -> None:
        """`decay`, `solve_every` (a multiple of the capacity, in accesses), `ghost_factor`
        and `order` default to the module's constants, the one set chosen for every capacity
        (see `benchmarks/lct_tuning.py`); they are parameters for that tuning only."""
        super().__init__(cache_capacity)
        if not 0.0 < decay <= 1.0:
            raise InvalidValueError(f"lct: decay must be in (0, 1], got {decay!r}")
        if not solve_every > 0.0:
            raise InvalidValueError(f"lct: solve_every must be positive, got {solve_every!r}")
        if isinstance(ghost_factor, bool) or not isinstance(ghost_factor, int) or ghost_factor < 1:
            raise InvalidValueError(
                f"lct: ghost_factor must be a positive int, got {ghost_factor!r}"
            )
        if order not in ("ratio", "over"):
            raise InvalidValueError(f"lct: order must be 'ratio' or 'over', got {order!r}")
        self.decay = decay
        self.order: EvictionOrder = order
        self._queues: list[OrderedDict[OffloadKey, BlockStatus]] = [
            OrderedDict() for _ in range(CLASSES)
        ]
        self._resident: dict[OffloadKey, BlockStatus] = {}
        self._count: dict[OffloadKey, int] = {}
        """Accesses so far of resident keys."""
        self._last: dict[OffloadKey, int] = {}
        """Access time (the access counter) of the last access of resident keys."""
        self._ghosts: OrderedDict[OffloadKey, tuple[int, int]] = OrderedDict()
        """Non-resident keys seen recently: (access count, last access time)."""
        self._ghost_limit = ghost_factor * cache_capacity
        self._clock = 0
        self._reuse = [[0.0] * MAX_BINS for _ in range(CLASSES)]
        self._arrivals = [0.0] * CLASSES
        self._window = 0.0
        self.limits: list[float] = [UNLIMITED] * CLASSES
        """Per class, the accesses since its last use a block may stay (inf: no limit)."""
        self.period = max(64, int(cache_capacity * solve_every))
        self._since_solve = 0
        self.refused = 0
        """Stores not admitted."""

    # -- what every access does -----------------------------------------------------------------

    def _observe(self, key: OffloadKey, count: int, last: int | None) -> None:
        """An access of `key`, seen `count` times before (its class is min(count, 4) - 1 for
        the histogram: the class it was in when this reuse came)."""
        self._clock += 1
        if count > 0:
            cls = _class_of(count)
            if last is not None:
                self._reuse[cls][_bin(max(1, self._clock - last))] += 1.0
        arrival = _class_of(count + 1)
        self._arrivals[arrival] += 1.0
        self._window += 1.0
        self._since_solve += 1
        if self._since_solve >= self.period:
            self._solve()

    def _seen(self, key: OffloadKey) -> tuple[int, int | None]:
        """(accesses so far, last access time) of a key, resident or ghost."""
        if key in self._resident:
            return self._count[key], self._last[key]
        ghost = self._ghosts.get(key)
        return ghost if ghost is not None else (0, None)

    def _remember_ghost(self, key: OffloadKey, count: int, last: int) -> None:
        ghosts = self._ghosts
        ghosts[key] = (count, last)
        ghosts.move_to_end(key)
        while len(ghosts) > self._ghost_limit:
            ghosts.popitem(last=False)

    # -- the solver -------------------------------------------------------------------------

    def _solve(self) -> None:
        self._since_solve = 0
        window = self._window
        if window <= 0:
            return
        curves = []
        for cls in range(CLASSES):
            arrivals = self._arrivals[cls]
            if arrivals <= 0 or sum(self._reuse[cls]) < MIN_REUSE * arrivals:
                curves.append([(0.0, 0.0, 0.0)])
                continue
            rate = arrivals / window
            hits = 0.0
            time_reused = 0.0
            options = [(0.0, 0.0, 0.0)]  # (limit, hits per access, slots)
            for b in range(MAX_BINS):
                reused = self._reuse[cls][b]
                hits += reused
                time_reused += reused * _MIDS[b]
                limit = _EDGES[b]
                if reused <= 0 and b + 1 < MAX_BINS:
                    continue
                expected = hits / arrivals
                residency = (time_reused + (arrivals - hits) * limit) / arrivals
                options.append((limit, rate * min(1.0, expected), rate * residency))
            curves.append(options)
        capacity = float(self.cache_capacity)

        def choose(price: float) -> tuple[list[float], float]:
            limits, slots = [], 0.0
            cost = price
            for options in curves:
                best = max(options, key=lambda o: o[1] - cost * o[2])
                limits.append(best[0])
                slots += best[2]
            return limits, slots

        limits, slots = choose(0.0)
        if slots > capacity:
            low, high = 0.0, 1.0
            for _ in range(40):
                middle = (low + high) / 2
                _, slots = choose(middle)
                if slots > capacity:
                    low = middle
                else:
                    high = middle
            limits, _ = choose(high)
        else:
            limits = [UNLIMITED if lim > 0 else 0.0 for lim in limits]
        for cls in range(1, CLASSES):  # never keep a later access class shorter
            limits[cls] = max(limits[cls], limits[cls - 1])
        self.limits = limits
        for cls in range(CLASSES):
            self._arrivals[cls] *= self.decay
            row = self._reuse[cls]
            for b in range(MAX_BINS):
                row[b] *= self.decay
        self._window *= self.decay

    # -- CachePolicy ------------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._resident.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._resident.get

    def admit(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """Whether each (absent) key is worth storing: its class's limit is above 0."""
        answers = []
        for key in keys:
            count, _ = self._seen(key)  # this access included (`on_store_miss` counted it)
            answers.append(self.limits[_class_of(max(count, 1))] > 0)
        return answers

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        for key in reversed(keys):  # a request's deepest block first: its prefix is newer
            count, last = self._seen(key)
            self._observe(key, count, last)
            self._remember_ghost(key, count + 1, self._clock)

    def on_store_move(self, keys: Sequence[OffloadKey]) -> None:
        """A block the tier above evicts is not an access: its class stays what the accesses
        this tier heard made it (one, if it heard none), and nothing is learned from it."""
        for key in reversed(keys):
            if key in self._resident:
                continue
            count, last = self._seen(key)
            self._remember_ghost(key, max(count, 1), self._clock if last is None else last)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._resident:
            raise BlockStateError(f"lct: key {key!r} is already resident")
        ghost = self._ghosts.pop(key, None)
        count, last = ghost if ghost is not None else (1, self._clock)
        self._resident[key] = block
        self._count[key] = count
        self._last[key] = last
        self._queues[_class_of(count)][key] = block

    def remove(self, key: OffloadKey) -> None:
        if self._resident.pop(key, None) is None:
            raise BlockStateError(f"lct: key {key!r} is not resident")
        count = self._count.pop(key)
        del self._queues[_class_of(count)][key]
        self._remember_ghost(key, count, self._last.pop(key))

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        for key in reversed(keys):  # tail first, so the request's head is the newest
            block = self._resident.get(key)
            if block is None:
                continue
            count = self._count[key]
            self._observe(key, count, self._last[key])
            self._count[key] = count + 1
            self._last[key] = self._clock
            old, new = _class_of(count), _class_of(count + 1)
            if old == new:
                self._queues[new].move_to_end(key)
            else:
                del self._queues[old][key]
                self._queues[new][key] = block

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """The `n` blocks furthest past their class limits (see the module doc), taken one at
        a time among the queues' oldest evictable entries."""
        check_evict_count(n)
        if n == 0:
            return []
        chosen: list[tuple[OffloadKey, BlockStatus]] = []
        taken: set[OffloadKey] = set()
        iterators: list[Iterator[tuple[OffloadKey, BlockStatus]]] = [
            iter(queue.items()) for queue in self._queues
        ]
        heads: list[tuple[OffloadKey, BlockStatus] | None] = [
            self._next(it, protected, taken) for it in iterators
        ]
        clock = self._clock
        by_ratio = self.order == "ratio"
        while len(chosen) < n:
            best, best_over = -1, -UNLIMITED
            for cls, head in enumerate(heads):
                if head is None:
                    continue
                age = clock - self._last[head[0]]
                limit = self.limits[cls]
                if limit == UNLIMITED:  # after every limited class, oldest first
                    over = age - 1e18
                elif by_ratio:
                    over = age / limit if limit > 0 else 1e18 + age
                else:
                    over = age - limit
                if over > best_over:
                    best, best_over = cls, over
            if best < 0:
                return None
            head = heads[best]
            assert head is not None
            chosen.append(head)
            taken.add(head[0])
            heads[best] = self._next(iterators[best], protected, taken)
        for key, _ in chosen:
            count = self._count.pop(key)
            del self._queues[_class_of(count)][key]
            del self._resident[key]
            self._remember_ghost(key, count, self._last.pop(key))
        return chosen

    @staticmethod
    def _next(
        entries: Iterator[tuple[OffloadKey, BlockStatus]],
        protected: Collection[OffloadKey],
        taken: set[OffloadKey],
    ) -> tuple[OffloadKey, BlockStatus] | None:
        for entry in entries:
            if entry[1].ref_cnt == 0 and entry[0] not in protected and entry[0] not in taken:
                return entry
        return None

    def clear(self) -> None:
        for queue in self._queues:
            queue.clear()
        self._resident.clear()
        self._count.clear()
        self._last.clear()
        self._ghosts.clear()

    def __len__(self) -> int:
        return len(self._resident)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(list(self._resident.items()))
