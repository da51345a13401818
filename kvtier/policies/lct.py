"""LCT, learned class thresholds: a cache policy that learns, online, how long each class of
block deserves to stay, and admits nothing of a class that never pays.

A block's class is how many times it was accessed within the horizon: 1 + how many of its
previous three accesses are at most `horizon` accesses old (1, 2, 3 or 4). Each class keeps
an LRU queue of its resident blocks and, online, statistics of its arrivals (accesses that
leave a block in that class) and of their reuse distances (the next access, in accesses,
log-spaced bins). Every `period` accesses the policy solves for per-class residency limits
L_k (in accesses since the last use) that maximize expected hits within the capacity, and
admits nothing of a class whose limit is 0 (`admit` says False; the key is remembered).
Eviction takes, among the classes' LRU tails, first a block past its class limit, of the
lowest class that has one (`BY_CLASS`: past its limit, the statistics say nothing more of a
block, and a block accessed more often is kept longer, as S3-FIFO's main queue keeps a block
seen twice), the furthest past as a ratio, age / limit (reuse distances are compared on a
log scale, as the histograms bin them); then, when no block is past its limit, the one
nearest to it by that ratio; blocks of a class with no limit go only when no limited class
has a block to give, oldest first. Limits never decrease with the class, so a prompt's tail
is never kept longer than its prefix.

The horizon is learned. A count since the start (the first version of this policy, whose
ghost directory outlived long traces) puts every reused block into class 4 after warm-up,
and the policy degenerates to LRU; a horizon too short cannot tell a block reused now and
then from one seen once. So the policy counts every key under each candidate (`HORIZONS`:
16 and 64 times the capacity, in accesses; up to four may be given) at once: the ages of a
key's previous three accesses, each summed up by how many candidates it is within, make one
small state id (10 states for two candidates, 35 for four), and the statistics are kept per
state, so each candidate's classes are a grouping of the same statistics. At each solve the
solver runs for every candidate and the horizon moves one step toward the one whose classes
are expected to hit most (as ARC moves its target toward the list whose ghosts hit); the
resident blocks are then queued again by their class under the new horizon. What is kept
of a key that is not resident, (state, its last three access times), is dropped `memory`
accesses (`MEMORY` times the capacity) after its last access: a reuse further apart is a new
arrival. That is at most two keys per access of that window, usually the window's distinct
keys, whatever the trace's length (on the shipped trace at 1 %: 41 x capacity, where the
first version kept 32 x; at 5 and 10 % the window is longer than the trace).

The solver, and why it is sound:
  - Same cohort. The statistics fade by `decay` at every solve; a reuse is weighted as its own
    arrival is now (by the solves since that arrival, not since the reuse), so a class never
    counts more reuses than arrivals, however fast the workload changes.
  - Exposure. The probability of a reuse at distance d is estimated over the arrivals at
    least d old, the ones that could have shown it (arrivals are kept per solve period for
    that, `kept_epochs` of them, older ones summed): recent arrivals are not counted as
    never reused.
  - Evidence. No limit is set from fewer than a capacity's worth of observed reuse distance
    beyond it: limit L needs L + capacity accesses watched (within the memory), so limit 0,
    refusing a class, needs a capacity's worth. A class whose best limit is the longest the
    evidence allows has none, and until anything can be set every class is unlimited: the
    policy evicts as LRU does and admits every block.
  - The optimum. By Little's law a class occupies rate_k * E[min(d, L_k)] slots; each class's
    options (limit 0 and every bin) form a curve of hits against slots; the segments of the
    curves' concave hulls, steepest first, are taken while they fit (the Lagrangian solution,
    one price per slot for every class, found exactly). The first segment that does not fit
    is the marginal one: its class keeps its shorter option, except when that is 0 (refused),
    where it takes the longer one for the share of its keys that fits (`shares`: while the
    cache has room, all of them; once it is full, the keys whose hash, `sample_point`, falls
    below the share, the same keys every time, and only while some resident block is past
    its limit; the first key of the class in an `admit` call decides for the call's keys of
    that class, so a request's blocks of one class go together and a prefix is not cut;
    deterministic). A fixed share is what the optimum keeps of a loop longer than the cache;
    admitting every n-th miss instead (before issue 34) made each admitted block of such a
    loop evict the next one needed, LRU's zero. This realizes the relaxation's optimum,
    whose value is what the candidates' horizons are compared by. When every segment fits,
    the limits stay as solved: eviction runs only when the cache is full, and then takes
    first the blocks past their limits. (Before issue 34 item 2 every class that paid was
    then unlimited, which is LRU: blocks seen once, past their short limit, pushed out the
    blocks waiting for a reuse that did fit. On blocks read twice in a burst and again two
    capacities later, lct gave LRU's 0.21 where the limits give 0.39, ARC 0.40.)
  - Classes in order. A later class is kept at least as long as the one below it; a class
    the statistics refuse (limit 0) that is lifted so takes the share of keys the class
    below it takes, not all of its keys (which let never-reused blocks of class 3 fill the
    cache while class 2 was admitted in part).

What the model realizes (issue 34 item 2, third round; docs/BENCHMARKS.md, "lct, third
round"): on the shipped trace at 1 % it gets about 97 % of the hits per access it expects
(0.115 of 0.118 per access it hears; the prompts' partial last blocks, 4 % of the trace's
accesses, are never heard: 0.110 per access of the trace after its first solves, 0.108
over the whole). A finer grouping of the states, feedback from the observed hits, a prior
in the allocation, other horizons or solve periods did not raise what it gets: the 0.111
target needs what a key's own history lacks.

Within one request the deepest blocks go first: `on_store_miss` and `touch` take a request's
keys tail to head, so its head is the newest access and a prefix outlives its tail.
`insert_many` inserts in order, as every policy's does (the fast paths' contract).

Cost: O(1) amortized per access (a state from three ages, one histogram cell, four queues),
a solve every `period` accesses over (10 states x ~70 bins, two candidates) and, when the
horizon moves, a requeue of the resident blocks (O(n log n)).

The per-access state and steps are `LCTState` (`kvtier/policies/_lct_core.py`, their one
source): each key's state and last three access times, the class queues and the remembered
keys as linked lists over arrays, the reuse histogram and the arrivals. That module is written
in Cython's pure Python mode: `scripts/build-core` compiles it (see `kvtier.compiled`), and
without a build it runs as plain Python, the same text. This class keeps the solver (reading
and writing the core's arrays through the properties below; the curves' loop runs in the core,
`LCTState.class_curve`, see `_curve`), the checks of its arguments and
the reuse hints.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import ClassVar, Literal

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies._lct_core import BINS_PER_OCTAVE, CREDIT, LIMITS, SHARES, LCTState
from kvtier.policies.base import CachePolicy, check_evict_count
from kvtier.policies.hinted import HintBook

EvictionOrder = Literal["ratio", "over"]

CLASSES = 4
"""Classes by accesses within the horizon: 1, 2, 3, and 4 (the last three accesses are
remembered)."""
MAX_BINS = BINS_PER_OCTAVE * 48
"""Reuse distances up to 2**48 accesses: beyond any memory, so no bin is ever capped."""
# The tunables were chosen together on the first half (by time) of the shipped trace, one set
# for every capacity (kvtier_tools.bench.lct_tuning), and are reported on other traces too
# (kvtier_tools.bench.policy_traces).
HORIZONS: tuple[float, ...] = (16.0, 64.0)
"""Candidate horizons, in accesses, as multiples of the capacity (ascending). Until issue 34
item 2 also 1 and 4 capacities (starting at 16): a horizon that short classes a block read
again more than 1 or 4 capacities later as one seen once, and the solver moved there in its
first solves, on expected hits equal to a few thousandths, before any reuse that far apart
had been seen (cloudPhysics at 25 %: 16 -> 4 -> 1 capacities in its first three solves);
the blocks then read again 4 capacities later were class 1, refused or limited to tens of
accesses. Without them: cloudPhysics 10 / 25 % +0.009 / +0.008, the shipped trace 1 %
+0.0015; no other trace of docs/BENCHMARKS.md loses more than 0.001."""
START = 0
"""The index in `HORIZONS` of the horizon the policy starts with."""
MEMORY = 64.0
"""How long what is known of a key is kept after its last access, in accesses, as a multiple
of the capacity (at least the longest horizon)."""
DECAY = 0.9
"""Weight the statistics keep at each solve (older behaviour fades)."""
SOLVE_EVERY = 1.0
"""The limits are solved again every this many times the capacity, in accesses."""
ORDER: EvictionOrder = "ratio"
"""How far past its class limit a queue's oldest block is: "ratio" (age / limit) or "over"
(age - limit); the evicted block is the one furthest past (see `LCTCachePolicy.evict`)."""
BY_CLASS = True
"""Among the blocks past their class limits, evict the lowest class first (then the furthest
past, by `ORDER`), instead of the furthest past whatever its class. A limit says how long a
block is worth keeping on what the solver has seen; past it, the statistics have nothing
more to say, and the prior of S3-FIFO, ARC and LIRS takes over: a block accessed more often
is kept longer. Issue 34 item 2, third round: `cloudphysics` at 10 / 25 % 0.2467 / 0.3452 ->
0.2527 / 0.3552 (its repeat reads blocks seen twice about 4 capacities later, which no
statistics of its past predicted), no workload of docs/BENCHMARKS.md losing more than
0.0005."""
UNLIMITED = float("inf")
MIN_REUSE = 1e-4
"""A class whose blocks are reused less often than this (per arrival) never pays: limit 0."""
_NO_KEYS: dict[OffloadKey, BlockStatus] = {}
"""What `insert_many` on ids gives the batch check: no key to compare the batch with (the
core checks the residents after it, in one call)."""


def _bin(distance: int) -> int:
    """The log-spaced bin of a reuse distance (>= 1)."""
    return min(MAX_BINS - 1, int(math.log2(distance) * BINS_PER_OCTAVE))


_EDGES = [2 ** ((b + 1) / BINS_PER_OCTAVE) for b in range(MAX_BINS)]
"""Upper edge of each bin: the residency limits the solver chooses among."""
_LOWS = [2 ** (b / BINS_PER_OCTAVE) for b in range(MAX_BINS)]
_MIDS = [(low + high) / 2 for low, high in zip(_LOWS, _EDGES, strict=True)]

History = tuple[int, int, int, int]
"""What the policy remembers of a key: its state and the times of its last three accesses,
newest first (NEVER for those that did not happen)."""


class _States:
    """A key's classes under each of `horizons` candidates, as one small int.

    The ages of a key's previous three accesses, newest first, each summed up by how many
    candidates it is within (0 to `horizons`, non-increasing from the newest), make a triple;
    a state is one triple: 20 of them for 3 candidates, 35 for 4.
    `ids[(g1 * (H + 1) + g2) * (H + 1) + g3]` is the state of a triple and `classes[i][s]`
    the class (0-based) of state `s` under candidate `i`: how many of the three are within it.
    """

    def __init__(self, horizons: int) -> None:
        width = horizons + 1
        triples = [
            combo
            for combo in itertools.product(range(width), repeat=CLASSES - 1)
            if all(a >= b for a, b in itertools.pairwise(combo))
        ]
        self.width = width
        self.ids = [0] * width ** (CLASSES - 1)
        for index, (g1, g2, g3) in enumerate(triples):
            self.ids[(g1 * width + g2) * width + g3] = index
        self.count = len(triples)
        self.first = triples.index((0,) * (CLASSES - 1))
        self.classes = [
            [sum(g >= horizons - i for g in combo) for combo in triples] for i in range(horizons)
        ]


_Curve = list[tuple[float, float, float]]
"""A class's options: (slots, hits per access, limit), slots and hits non-decreasing."""


def _hull(curve: _Curve) -> list[int]:
    """The upper concave hull of a curve that starts at (0, 0, limit 0), as indices into it:
    the options a price per slot can choose."""
    hull = [0]
    for index in range(1, len(curve)):
        slots, hits, _ = curve[index]
        if hits <= curve[hull[-1]][1]:
            continue  # more slots for no more hits
        while len(hull) >= 2:
            (s0, h0, _), (s1, h1, _) = curve[hull[-2]], curve[hull[-1]]
            if (h1 - h0) * (slots - s0) <= (hits - h0) * (s1 - s0):
                hull.pop()  # the middle point lies on or under the chord
            else:
                break
        hull.append(index)
    return hull


def _allocate(
    curves: list[_Curve], capacity: float
) -> tuple[list[float], list[float], float, bool]:
    """Per class, the limit and the share of its new blocks to admit that maximize hits
    within `capacity` slots; the hits per access the relaxation expects within exactly
    `capacity` slots; and whether every option that adds hits fit (no slot was scarce).

    The segments of the classes' concave hulls are taken steepest first while they fit. The
    first that does not fit is the marginal one: the expected hits count it in proportion
    to the slots left, and its class keeps its shorter option, or, when that is 0 (the class
    refused), takes the longer one for that proportion of its new blocks."""
    hulls = [_hull(curve) for curve in curves]
    segments = []
    for cls, (curve, hull) in enumerate(zip(curves, hulls, strict=True)):
        for i in range(1, len(hull)):
            slots = curve[hull[i]][0] - curve[hull[i - 1]][0]
            hits = curve[hull[i]][1] - curve[hull[i - 1]][1]
            slope = hits / slots if slots > 0 else math.inf
            segments.append((-slope, cls, i, slots, hits))
    segments.sort()
    chosen = [0] * len(curves)  # per class, the hull vertex taken
    shares = [1.0] * len(curves)
    used = expected = 0.0
    fits = True
    for _, cls, i, slots, hits in segments:
        if used + slots <= capacity:
            used += slots
            expected += hits
            chosen[cls] = i
            continue
        fits = False
        share = (capacity - used) / slots
        expected += hits * share
        if i == 1:  # the class was refused: its longer option for the share that fits
            chosen[cls], shares[cls] = i, share
        break
    limits = [curve[hull[i]][2] for curve, hull, i in zip(curves, hulls, chosen, strict=True)]
    return limits, shares, expected, fits


class LCTCachePolicy(CachePolicy):
    """Learned class thresholds over a learned horizon (see the module doc)."""

    name: ClassVar[str] = "lct"
    admits_all: ClassVar[bool] = False
    state_class: ClassVar[type[LCTState]] = LCTState
    """The class of the per-access state: `LCTState`, compiled when the core is; a test gives
    a subclass the pure-Python one to compare the two (`tests/test_compiled_core.py`)."""

    def __init__(
        self,
        cache_capacity: int,
        *,
        decay: float = DECAY,
        solve_every: float = SOLVE_EVERY,
        horizons: Sequence[float] = HORIZONS,
        start: int = START,
        memory: float = MEMORY,
        order: EvictionOrder = ORDER,
        by_class: bool = BY_CLASS,
    ) -> None:
        """`decay`, `solve_every` (a multiple of the capacity, in accesses), `horizons` and
        `memory` (multiples of the capacity, in accesses), `start` (an index in `horizons`)
        `order` and `by_class` default to the module's constants, the one set chosen for every
        capacity (see `kvtier_tools.bench.lct_tuning`); they are parameters for that tuning
        and for comparisons only."""
        super().__init__(cache_capacity)
        if not 0.0 < decay <= 1.0:
            raise InvalidValueError(f"lct: decay must be in (0, 1], got {decay!r}")
        if not solve_every > 0.0:
            raise InvalidValueError(f"lct: solve_every must be positive, got {solve_every!r}")
        horizons = tuple(horizons)
        if not (
            1 <= len(horizons) <= 4
            and all(h > 0 for h in horizons)
            and list(horizons) == sorted(set(horizons))
        ):
            raise InvalidValueError(
                f"lct: horizons must be 1 to 4 distinct positive values, ascending, got "
                f"{horizons!r}"
            )
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < len(horizons):
            raise InvalidValueError(f"lct: start must be an index of horizons, got {start!r}")
        if not memory >= horizons[-1]:
            raise InvalidValueError(
                f"lct: memory must be at least the longest horizon, got {memory!r}"
            )
        if order not in ("ratio", "over"):
            raise InvalidValueError(f"lct: order must be 'ratio' or 'over', got {order!r}")
        if not isinstance(by_class, bool):
            raise InvalidValueError(f"lct: by_class must be True or False, got {by_class!r}")
        self._core = self.state_class()
        self.decay = decay
        self.order = order
        self.by_class = by_class
        self._states = _States(len(horizons))
        self._horizons = [max(1, int(h * cache_capacity)) for h in horizons]
        """Candidate horizons, in accesses."""
        self._memory = max(self._horizons[-1], int(memory * cache_capacity))
        """Accesses after its last one that what is known of a non-resident key is kept."""
        self._bins = _bin(self._memory) + 1
        """Bins of the reuse histograms: no reuse further apart is recorded."""
        self._members = [
            [state for state, cls in enumerate(classes) if cls == c]
            for classes in self._states.classes
            for c in range(CLASSES)
        ]
        """Per candidate and class (candidate * CLASSES + class), the states in it."""
        self.period = max(64, int(cache_capacity * solve_every))
        self.kept_epochs = self._memory // self.period + 2
        """Solve periods whose arrivals are kept apart (for the exposure of each distance)."""
        self._weights = [decay**k for k in range(self.kept_epochs + 1)]
        """The weight of an arrival `k` solve periods old."""
        self._start = start
        self._hints = HintBook()
        """Reuse hints on resident blocks, consulted only while some block is hinted."""
        self._bind_core()
        self._learn_afresh()
        self.refused = 0
        """Stores not admitted."""

    def _bind_core(self) -> None:
        """Give the core the settings; bind its per-key calls to the instance: every caller
        reaches the core with no Python frame, unless a subclass overrides the method."""
        core, states = self._core, self._states
        core.capacity = self.cache_capacity
        core.configure(
            self._solve,
            self._horizons,
            self._memory,
            (states.width, states.first, states.count, states.ids, states.classes),
            self._bins,
            self._weights,
        )
        core.configure_solver(_LOWS, _MIDS, _EDGES, MIN_REUSE)
        cls = type(self)
        self._bind_get()
        if cls.insert is LCTCachePolicy.insert:
            self.insert = core.insert  # type: ignore[method-assign]
        if cls.on_store_miss is LCTCachePolicy.on_store_miss:
            self.on_store_miss = core.on_store_miss  # type: ignore[method-assign]
        if cls.admit is LCTCachePolicy.admit:
            self.admit = core.admit  # type: ignore[method-assign]

    def _bind_get(self) -> None:
        """`get` is the resident dict's own on keys, the core's on ids (its dict is empty
        then), unless a subclass overrides it."""
        if type(self).get is LCTCachePolicy.get:
            self.get = LCTCachePolicy.getter(self)  # type: ignore[method-assign,assignment]

    def _learn_afresh(self) -> None:
        """The learned state of a new policy: no statistics, no limits, the start horizon."""
        self._clock = 0
        self._since_solve = 0
        self._reuse = [[0.0] * self._bins for _ in range(self._states.count)]
        self._arrivals = [0.0] * self._states.count
        self._epochs: deque[list[float]] = deque()
        """Arrivals per candidate and class of the last solve periods, newest first."""
        self._older = [0.0] * len(self._members)
        """Arrivals per candidate and class of the periods before those."""
        self.limits = [UNLIMITED] * CLASSES
        self.shares = [1.0] * CLASSES
        self._credit = [0.0] * CLASSES
        self.expected: list[float] = [0.0] * len(self._horizons)
        """Per candidate horizon, the hits per access the last solve expected of it."""
        self._set_horizon(self._start)

    def _set_horizon(self, horizon: int) -> None:
        """Count the classes over candidate `horizon` (the queues are left as they are)."""
        self._core.set_horizon(horizon)

    def _move_horizon(self, horizon: int) -> None:
        """Count classes over candidate `horizon` from now on: the resident blocks are
        queued again by their class under it, oldest first."""
        self._core.requeue(horizon)

    def _seen(self, key: OffloadKey) -> History | None:
        """What is remembered of a key, resident or not (None: nothing)."""
        return self._core.seen(key)

    def _forget_old(self) -> None:
        """Drop the remembered keys last accessed more than `memory` accesses ago, from the
        oldest stored; a key stored later with an older access waits its turn (it reads as
        forgotten anyway), so at most two keys per access of the window are kept."""
        self._core.forget_old()

    def count(self, key: OffloadKey, horizon: int | None = None) -> int:
        """The accesses of `key` within the horizon (`horizon`: an index in the candidates,
        default the one in use) as of its last access, its last three at most: its class
        + 1 (0: a key this policy no longer remembers)."""
        seen = self._seen(key)
        if seen is None or (key not in self._core and self._clock - seen[1] > self._memory):
            return 0
        classes = self._states.classes[self.horizon if horizon is None else horizon]
        return classes[seen[0]] + 1

    def class_statistics(self, horizon: int | None = None) -> list[tuple[float, float]]:
        """Per class counted over candidate `horizon` (default: the one in use), the weighted
        (reuses, arrivals) the solver works from; reuses never exceed arrivals, as each is
        weighted as its own arrival is."""
        horizon = self.horizon if horizon is None else horizon
        found = []
        reuse, current = self._reuse, self._arrivals
        for cls in range(CLASSES):
            index = horizon * CLASSES + cls
            states = self._members[index]
            arrivals = self._older[index] + sum(epoch[index] for epoch in self._epochs)
            arrivals += sum(current[s] for s in states)
            found.append((sum(sum(reuse[s]) for s in states), arrivals))
        return found

    # -- the solver -------------------------------------------------------------------------

    def _solve(self) -> None:
        """New limits and shares, and a step of the horizon toward the candidate expected to
        hit most; then the statistics fade."""
        self._since_solve = 0
        arrivals = self._arrivals
        self._arrivals = [0.0] * len(arrivals)
        self._epochs.appendleft([sum(arrivals[s] for s in states) for states in self._members])
        if len(self._epochs) > self.kept_epochs:
            oldest = self._epochs.pop()
            self._older = [a + b for a, b in zip(self._older, oldest, strict=True)]
        self._forget_old()
        top = self._longest_limit()
        if top >= 0:
            results = [self._solve_horizon(i, top) for i in range(len(self._horizons))]
            self.expected = [hits for _, _, hits in results]
            best = max(range(len(results)), key=lambda i: (self.expected[i], -i))
            if self.expected[best] > self.expected[self.horizon]:
                self._move_horizon(self.horizon + (1 if best > self.horizon else -1))
            self.limits, self.shares, _ = results[self.horizon]
        decay = self.decay
        self._core.decay_reuse(decay)  # each reuse times `decay`, in place
        self._epochs = deque([x * decay for x in epoch] for epoch in self._epochs)
        self._older = [x * decay for x in self._older]

    def _longest_limit(self) -> int:
        """The bin of the longest limit the evidence allows: a capacity's worth of observed
        reuse distance beyond it (-1: none yet)."""
        span = min(self._clock, self._memory) - self.cache_capacity
        top = -1
        while top + 1 < self._bins and _EDGES[top + 1] <= span:
            top += 1
        return top

    def _solve_horizon(self, horizon: int, top: int) -> tuple[list[float], list[float], float]:
        """The limits and shares of the classes counted over candidate `horizon`, and the
        hits per access they are expected to give; limits end in bins up to `top`."""
        epochs = self._epochs
        per_epochs: list[list[float]] = []
        exposures: list[list[float]] = []
        arrivals: list[float] = []
        for cls in range(CLASSES):
            index = horizon * CLASSES + cls
            per_epoch = [epoch[index] for epoch in epochs]
            # exposed[j]: the arrivals of epoch j (newest first) and of every older one
            exposed = list(itertools.accumulate(reversed(per_epoch), initial=self._older[index]))
            exposed.reverse()
            arrivals.append(exposed[0])
            per_epochs.append(per_epoch)
            exposures.append(exposed)
        total = sum(arrivals)
        if total <= 0.0:
            return [UNLIMITED] * CLASSES, [1.0] * CLASSES, 0.0
        # each class's curve (see `_curve`; the core's loop), per access: times its rate
        core, members = self._core, self._members
        curves: list[_Curve] = [
            core.class_curve(
                members[horizon * CLASSES + cls],
                per_epochs[cls],
                exposures[cls],
                top,
                arrivals[cls] / total,
            )
            for cls in range(CLASSES)
        ]
        # Whether every option fit is not read: the limits stand even with room to spare
        # (eviction runs only when the cache is full; see the module doc, "The optimum").
        limits, shares, hits, _ = _allocate(curves, float(self.cache_capacity))
        longest = _EDGES[top]
        limits = [UNLIMITED if limit >= longest else limit for limit in limits]
        for cls in range(1, CLASSES):  # never keep a later class shorter
            if limits[cls] < limits[cls - 1]:
                refused = limits[cls] <= 0
                limits[cls] = limits[cls - 1]
                # a class refused on its own statistics is taken only as far as the class
                # below it is: the same share of its keys, not all of them
                shares[cls] = shares[cls - 1] if refused else max(shares[cls], shares[cls - 1])
        return limits, shares, hits

    def _curve(
        self, reuse: list[float], per_epoch: list[float], exposed: list[float], top: int
    ) -> _Curve:
        """A class's options, per arrival: (slots, hits, limit) for limit 0 and each bin up to
        `top`, the reuse in each bin taken over the arrivals that could have shown it.

        The core's loop (`LCTState.curve`; the solver runs `class_curve`, the same loop over
        the sum of a class's states' reuse), in C doubles when compiled, the same operations
        in the same order as this, in Python floats:

            found = time_reused = 0.0
            for each bin b up to top:
                if reuse[b] > 0:  # the arrivals at least _LOWS[b] old could show it
                    j = int(_LOWS[b] // period)
                    at_risk = (exposed[j + 1] + ((j + 1) * period - _LOWS[b]) / period
                               * per_epoch[j]) if j < len(per_epoch) else exposed[-1]
                    if at_risk > 0:
                        share = min(reuse[b] / at_risk, 1.0 - found)
                        found += share; time_reused += share * _MIDS[b]
                if reuse[b] > 0 or b == top:  # an option: limit _EDGES[b]
                    append (time_reused + (1.0 - found) * _EDGES[b], found, _EDGES[b])
            no option but (0, 0, 0) when found < MIN_REUSE (or no arrivals: exposed[0] <= 0)
        """
        return self._core.curve(reuse, per_epoch, exposed, top)

    # -- the state the solver reads and writes, kept by the core ------------------------------

    @property
    def _clock(self) -> int:
        return self._core.clock

    @_clock.setter
    def _clock(self, value: int) -> None:
        self._core.clock = value

    @property
    def _since_solve(self) -> int:
        return self._core.since_solve

    @_since_solve.setter
    def _since_solve(self, value: int) -> None:
        self._core.since_solve = value

    @property
    def period(self) -> int:
        """A solve every this many accesses."""
        return self._core.period

    @period.setter
    def period(self, value: int) -> None:
        self._core.period = value

    @property
    def order(self) -> EvictionOrder:
        """How far past its class limit a block is: "ratio" or "over" (`ORDER`)."""
        return "ratio" if self._core.ratio else "over"

    @order.setter
    def order(self, value: EvictionOrder) -> None:
        self._core.ratio = value == "ratio"

    @property
    def by_class(self) -> bool:
        """Whether the blocks past their limits go lowest class first (`BY_CLASS`)."""
        return bool(self._core.by_class)

    @by_class.setter
    def by_class(self, value: bool) -> None:
        self._core.by_class = value

    @property
    def _reuse(self) -> list[list[float]]:
        """Per state, the reuses of its arrivals by distance bin, each weighted as its
        arrival is now."""
        return self._core.get_reuse()

    @_reuse.setter
    def _reuse(self, rows: list[list[float]]) -> None:
        self._core.set_reuse(rows)

    @property
    def _arrivals(self) -> list[float]:
        """Arrivals per state in the current solve period."""
        return self._core.get_arrivals()

    @_arrivals.setter
    def _arrivals(self, values: list[float]) -> None:
        self._core.set_arrivals(values)

    @property
    def limits(self) -> list[float]:
        """Per class, the accesses since its last use a block may stay (inf: no limit)."""
        return self._core.get_vector(LIMITS)

    @limits.setter
    def limits(self, values: list[float]) -> None:
        self._core.set_vector(LIMITS, values)

    @property
    def shares(self) -> list[float]:
        """Per class, the share of its new blocks admitted where its limit is above 0."""
        return self._core.get_vector(SHARES)

    @shares.setter
    def shares(self, values: list[float]) -> None:
        self._core.set_vector(SHARES, values)

    @property
    def _credit(self) -> list[float]:
        """Per class, a credit no decision reads since issue 34 (admission by hash); kept
        in the core's state so that its compiled and pure forms stay comparable."""
        return self._core.get_vector(CREDIT)

    @_credit.setter
    def _credit(self, values: list[float]) -> None:
        self._core.set_vector(CREDIT, values)

    @property
    def horizon(self) -> int:
        """The index of the candidate the classes are counted over now."""
        return self._core.horizon

    def queues(self) -> list[list[OffloadKey]]:
        """The class queues' keys, each oldest first (for tests and inspection)."""
        return [self._core.keys_of(cls) for cls in range(CLASSES)]

    def ghosts(self) -> list[tuple[OffloadKey, History]]:
        """The remembered non-resident keys and what is remembered of each, oldest stored
        first (for tests and inspection)."""
        return self._core.ghost_entries()

    # -- CachePolicy ------------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._core.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        """The resident dict's `get` on keys; on ids the core's (valid while on ids)."""
        core = self._core
        return core.get if core.on_ids else core.resident.get

    def admit(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """Whether each (absent) key is worth storing: its class's limit is above 0, and, for
        a class admitted in part (`shares`), whether the cache has room, or else whether the
        call's first key of that class is in the share by its hash and some resident block
        is past its limit (see the module doc): the call's keys of one class are stored
        together or not at all."""
        return self._core.admit(keys)

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        """Each key's access, a request's deepest block first: its prefix is newer."""
        self._core.on_store_miss(keys)

    def on_store_miss_ids(self, ids: Sequence[int], keys: Sequence[OffloadKey]) -> None:
        """`on_store_miss(keys)` on ids (`use_ids`): `ids[i]` is the table's id of `keys[i]`,
        so no key is looked up."""
        self._core.on_store_miss_ids(ids, keys)

    def touch_ids(self, ids: Sequence[int], keys: Sequence[OffloadKey]) -> None:
        """`touch(keys)` on ids (`use_ids`): `ids[i]` is the table's id of `keys[i]`."""
        if self._hints.reuse:
            self._hints.touched(keys)
        self._core.touch_ids(ids)

    @property
    def on_ids(self) -> bool:
        """Whether the remembered keys are found by their ids in a `KeyIds` table."""
        return bool(self._core.on_ids)

    def use_ids(self, table: object) -> None:
        """Find each remembered key by its id in `table` (`kvtier.policies._key_ids.KeyIds`)
        from now on, each id counted while the key is remembered, instead of a dict of its
        own: `auto`'s serving lct shares the look-up of its shadows (`*_ids` calls; the
        calls on keys look the id up), and no resident dict either (`get`, `len` and `items`
        read the core's nodes). The same decisions (docs/BENCHMARKS.md, "Policy cost, ninth
        and eleventh rounds")."""
        self._core.use_ids(table)
        self._bind_get()

    def use_keys(self) -> None:
        """Back to a dict of its own, in the same state, the ids released."""
        self._core.use_keys()
        self._bind_get()

    def on_store_move(self, keys: Sequence[OffloadKey]) -> None:
        """A block the tier above evicts is not an access: its class stays what the accesses
        this tier heard made it (one, if it heard none), and nothing is learned from it."""
        self._core.on_store_move(keys)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._core.insert(key, block)

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        core = self._core
        if not core.on_ids:
            self._check_insert_batch(keys, blocks, core.resident)
        else:  # the lengths and repeats checked, then the residents in one call of the core
            self._check_insert_batch(keys, blocks, _NO_KEYS)
            found = core.first_resident(keys)
            if found >= 0:
                raise BlockStateError(f"{self.name}: key {keys[found]!r} is already resident")
        core.insert_many(keys, blocks)

    def remove(self, key: OffloadKey) -> None:
        self._core.remove(key)
        if self._hints.reuse:
            self._hints.discard(key)

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        self._hints.mark(key, reuse, key in self._core)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """Each resident key's access, tail first, so the request's head is the newest."""
        if self._hints.reuse:
            self._hints.touched(keys)
        self._core.touch(keys)

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """The `n` blocks furthest past their class limits (see the module doc), taken one at
        a time among the queues' oldest evictable entries: those past their limits first,
        the lowest class first (`by_class`), then by age / limit ("ratio") or age - limit
        ("over"), a class with no limit after every limited one, oldest first."""
        if type(n) is not int or n < 1:  # the common case skips check_evict_count's call
            check_evict_count(n)
            if n == 0:
                return []
        if self._hints.active:
            return self._hints.evict_hinted(
                n, protected, self.evict, self._core.get, self.remove, self.items
            )
        return self._core.evict(n, protected)

    def clear(self) -> None:
        """Forget every block and all learned state: a fresh policy of the same settings."""
        self._core.clear()
        self._hints.clear()
        self._learn_afresh()

    def __len__(self) -> int:
        return len(self._core)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(self._core.entries())
