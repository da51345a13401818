"""`auto`: serve with whichever candidate policy (lct, ARC, LRU) a miniature simulation of
the same workload says is winning now.

No single policy suits every workload: lct wins by a wide margin on conversation traces and
scan-heavy ones, ARC on some frequency mixes, and plain LRU on a loop that fits (issue 22).
`auto` keeps, for each candidate, a *shadow*: a real instance of that policy, a small
fraction of the capacity in size, driven with the accesses of a spatially hashed sample of
the keys (SHARDS, Waldspurger et al., FAST 2015: a key is sampled when a seeded hash of it,
as a fraction of 2**32, is below the sampling rate; a sampled key is sampled at every one of
its accesses, so reuse distances scale with the rate and a shadow of `rate` x capacity
blocks sees what the full cache would, in miniature). The rate is `SAMPLE_RATE` (1 %), or
more for a small cache, so that a shadow holds at least `SHADOW_BLOCKS` blocks: a shadow of a
dozen blocks says nothing.

Every `EPOCH` x shadow capacity sampled accesses (about `EPOCH` capacities of real
accesses), each shadow's hits of that epoch join an exponentially fading score (`DECAY` per
epoch), and `auto` switches to the candidate with the best score when it leads the one
serving by more than `MARGIN` (a hit ratio, over the faded number of sampled accesses) and
the scores have seen `WARMUP` epochs: the hysteresis that keeps it from flapping on noise.
Shadows are compared with shadows, on the same sample and at the same scale, so a policy
that has just taken over (and is still learning) is not judged by its cold start.

A switch drops nothing: a fresh instance of the winner, at full capacity, adopts every
resident block (pinned and pending ones too), inserted least recently used first, so its
first victims are the blocks the old policy's recency would have given up (the adopted
blocks carry no learned history: lct counts them as seen once, ARC as recent). An lct that
stops serving is parked, not dropped: it gives up its blocks but hears every access as a
miss, so it keeps learning, and takes over again, if it does, with its classes' statistics
and horizon current (a fresh one is LRU-like for its first capacities: on a stationary Zipf
mix where the shadows judge ARC ahead early, the switch to ARC and back left auto at 0.4323
against lct's 0.4447; parked, 0.4447). An lct that takes over for the first time starts at
the horizon its shadow learned. `auto` keeps its own index of the
resident blocks in recency order for that (and for `get`, `len` and `items`, so a getter
stays valid across switches); every other decision (admission, eviction order) is the
serving policy's.

Deterministic: the sample is a function of the key and `seed` (CRC-32 of a bytes key,
splitmix64's finalizer of an int), with no clock and no randomness.

Cost per access: the serving policy's, plus a hash of each accessed key, an ordered-dict
move for a hit, for the sampled keys (`rate`) one access to each of the three shadows, and,
while another candidate serves after lct did, the parked lct's bookkeeping of the access.
Memory: the shadows hold `rate` x capacity blocks each (with their ghosts: lct remembers
`MEMORY` capacities of keys), plus the index, plus, once lct has stopped serving, the parked
lct's memory of keys (as much as a serving lct's).
"""

from __future__ import annotations

import itertools
import zlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from typing import ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies.arc import ARCCachePolicy
from kvtier.policies.base import CachePolicy, check_evict_count
from kvtier.policies.hinted import HintBook
from kvtier.policies.lct import LCTCachePolicy
from kvtier.policies.lru import LRUCachePolicy

CANDIDATE_CLASSES: dict[str, type[CachePolicy]] = {
    LCTCachePolicy.name: LCTCachePolicy,
    ARCCachePolicy.name: ARCCachePolicy,
    LRUCachePolicy.name: LRUCachePolicy,
}
"""The policies `auto` may serve with, by name."""
# The tunables were chosen on the first half (by time) of the shipped conversation trace and
# are reported on other traces too (kvtier_tools.bench.policy_traces).
CANDIDATES: tuple[str, ...] = ("lct", "arc", "lru")
"""The candidates, in order of preference on a tie; the first serves until a shadow leads."""
SAMPLE_RATE = 0.01
"""Share of the keys the shadows simulate (SHARDS' sampling rate), at the least."""
SHADOW_BLOCKS = 128
"""The smallest shadow, in blocks: the rate is raised for a cache smaller than this / rate."""
EPOCH = 1.0
"""Sampled accesses between decisions, as a multiple of the shadow capacity."""
DECAY = 0.9
"""Weight a shadow's score keeps at each decision (older hits fade)."""
MARGIN = 0.005
"""The lead, in hit ratio, a candidate's shadow needs over the serving one's to take over."""
WARMUP = 4
Z = 2.0
"""The lead must also exceed this many standard deviations of the noise between the two
shadows (about the square root of the sampled accesses where one hit and the other missed)."""
"""Decisions before the first switch: the shadows' first capacities are all cold misses."""

_SCALE = 1 << 32
_MASK32 = _SCALE - 1
_MASK64 = (1 << 64) - 1
_MIX32 = 0x9E3779B1
_MIX64 = 0x9E3779B97F4A7C15
_SPLIT1 = 0xBF58476D1CE4E5B9
_SPLIT2 = 0x94D049BB133111EB


def sample_point(key: Hashable, seed: int = 0) -> int:
    """Where `key` falls in [0, 2**32): a seeded, deterministic hash (never Python's `hash`,
    which is salted per process for bytes). A bytes key (an `OffloadKey`) is hashed by
    CRC-32, an int (a trace's block id) by splitmix64's finalizer, anything else by the
    CRC-32 of its repr; a CRC is multiplied by an odd constant so its high bits, which the
    sampling compares, depend on every bit of the key.

    Ints are mixed, not just multiplied: a multiplicative hash maps key 0 to point 0, in
    every sample, and key 0 is the shipped trace's hottest block (the first block of most
    prompts: 6,016 of the second half's 135,498 accesses). It was 62 % of the sampled
    accesses at 5 %, every shadow's hits were mostly its hits, and the real differences
    between the candidates drowned (auto left lct for ARC there: 0.1420, lct 0.1490)."""
    if type(key) is bytes:
        point = zlib.crc32(key, seed & _MASK32)
    elif type(key) is int:
        mixed = (key + (seed + 1) * _MIX64) & _MASK64
        mixed = ((mixed ^ (mixed >> 30)) * _SPLIT1) & _MASK64
        mixed = ((mixed ^ (mixed >> 27)) * _SPLIT2) & _MASK64
        return (mixed ^ (mixed >> 31)) >> 32
    else:
        point = zlib.crc32(repr(key).encode(), seed & _MASK32)
    return (point * _MIX32) & _MASK32


def _frequent(policy: CachePolicy) -> Collection[OffloadKey]:
    """The resident keys `policy` knows were accessed more than once (none for LRU)."""
    if isinstance(policy, ARCCachePolicy):
        return set(policy.lists()["t2"])
    if isinstance(policy, LCTCachePolicy):
        return {key for key, _ in policy.items() if policy.count(key) >= 2}
    return ()


class _Shadow:
    """A candidate policy at the shadow capacity, driven as `simulate` drives a policy."""

    __slots__ = ("block", "get", "hits", "policy", "total_hits")

    def __init__(self, policy: CachePolicy) -> None:
        self.policy = policy
        self.get = policy.getter()
        self.hits = 0
        """Hits since the last decision."""
        self.total_hits = 0
        self.block = BlockStatus(0)
        """The one ready block every stored key shares: a shadow stores no data."""
        self.block.ref_cnt = 0

    def access(self, key: OffloadKey) -> bool:
        """One access: a hit is touched; a miss is announced and stored if admitted. True
        on a hit."""
        one = (key,)
        if self.get(key) is not None:
            self.hits += 1
            self.total_hits += 1
            self.policy.touch(one)
            return True
        self.policy.on_store_miss(one)
        self._store(one)
        return False

    def move(self, key: OffloadKey) -> None:
        """A block moved in from the tier above (not an access): stored if admitted."""
        if self.get(key) is None:
            one = (key,)
            self.policy.on_store_move(one)
            self._store(one)

    def _store(self, one: tuple[OffloadKey]) -> None:
        policy = self.policy
        if not policy.admits_all and not policy.admit(one)[0]:
            return
        if len(policy) >= policy.cache_capacity:
            policy.evict(1)  # every shadow block is ready and unprotected: never None
        policy.insert(one[0], self.block)


class AutoCachePolicy(CachePolicy):
    """Serves with the candidate whose shadow is winning (see the module doc)."""

    name: ClassVar[str] = "auto"
    admits_all: ClassVar[bool] = False

    def __init__(
        self,
        cache_capacity: int,
        *,
        candidates: Sequence[str] = CANDIDATES,
        sample_rate: float = SAMPLE_RATE,
        shadow_blocks: int = SHADOW_BLOCKS,
        epoch: float = EPOCH,
        decay: float = DECAY,
        margin: float = MARGIN,
        warmup: int = WARMUP,
        z: float = Z,
        seed: int = 0,
    ) -> None:
        """Every parameter defaults to the module's constant of that name (the one set chosen
        for every capacity); they are parameters for tuning and tests."""
        super().__init__(cache_capacity)
        candidates = tuple(candidates)
        if not candidates or len(set(candidates)) != len(candidates):
            raise InvalidValueError(f"auto: candidates must be distinct, got {candidates!r}")
        unknown = [name for name in candidates if name not in CANDIDATE_CLASSES]
        if unknown:
            raise InvalidValueError(
                f"auto: unknown candidates {unknown!r}; valid: {', '.join(CANDIDATE_CLASSES)}"
            )
        if not 0.0 < sample_rate <= 1.0:
            raise InvalidValueError(f"auto: sample_rate must be in (0, 1], got {sample_rate!r}")
        if not (epoch > 0.0 and 0.0 < decay < 1.0 and margin >= 0.0 and warmup >= 0):
            raise InvalidValueError(
                f"auto: needs epoch > 0, 0 < decay < 1, margin >= 0, warmup >= 0; got "
                f"{epoch!r}, {decay!r}, {margin!r}, {warmup!r}"
            )
        self.candidates = candidates
        rate = min(1.0, max(sample_rate, shadow_blocks / cache_capacity))
        self.shadow_capacity = max(1, round(cache_capacity * rate))
        """The capacity of every shadow, in blocks."""
        self.rate = min(1.0, self.shadow_capacity / cache_capacity)
        """The share of the keys sampled: exactly the shadows' scale."""
        self._threshold = round(self.rate * _SCALE)
        self._seed = seed
        self._epoch = max(1, round(epoch * self.shadow_capacity))
        self.decay = decay
        self.margin = margin
        self.warmup = warmup
        self.z = z
        self._resident: OrderedDict[OffloadKey, BlockStatus] = OrderedDict()
        """Every resident block, least recently used first (what a new policy adopts)."""
        self._hints = HintBook()
        """Reuse hints on resident blocks: auto's own, so they survive a switch; the serving
        policy's eviction is asked for the rest (`HintBook.evict_hinted`)."""
        # `get` is that dict's own bound method, as LRU's is; the dict is never replaced, so
        # a getter stays valid across switches. A subclass that overrides `get` keeps its own.
        if type(self).get is AutoCachePolicy.get:
            self.get = self._resident.get  # type: ignore[method-assign,assignment]
        self._start_afresh()

    def _start_afresh(self) -> None:
        """The state of a new policy: the first candidate serving, cold shadows, no scores."""
        self._serving: CachePolicy = CANDIDATE_CLASSES[self.candidates[0]](self.cache_capacity)
        self._parked: LCTCachePolicy | None = None
        """The lct that served before a switch away from it: it holds no block but keeps
        learning from every access, so that it takes over again with what it learned."""
        self.serving_index = 0
        """The index in `candidates` of the policy serving now."""
        self._shadows = [
            _Shadow(CANDIDATE_CLASSES[name](self.shadow_capacity)) for name in self.candidates
        ]
        self.scores = [0.0] * len(self.candidates)
        """Per candidate, its shadow's hits, faded by `decay` at each decision."""
        self._pairs = list(itertools.combinations(range(len(self.candidates)), 2))
        self._squares = [0.0] * len(self._pairs)
        """Per pair of candidates (i, j), the faded sum of (hits i - hits j)**2 per epoch."""
        self._epochs = 0.0
        """The faded number of epochs (the sum of the weights)."""
        self._weights2 = 0.0
        """The faded sum of the squared weights (a faded sum's variance, per unit)."""
        self.weight = 0.0
        """The sampled accesses the scores are over, faded as they are."""
        self.decisions = 0
        self.switches: list[tuple[int, str]] = []
        """Each switch: (sampled accesses so far, the candidate that took over)."""
        self.sampled = 0
        """Sampled accesses so far (the shadows' clock)."""

    # -- inspection -------------------------------------------------------------------------

    @property
    def serving(self) -> str:
        """The name of the candidate serving now."""
        return self.candidates[self.serving_index]

    @property
    def policy(self) -> CachePolicy:
        """The policy serving now (for inspection; drive `auto` itself)."""
        return self._serving

    def shadow(self, name: str) -> CachePolicy:
        """The shadow of candidate `name` (for inspection)."""
        return self._shadows[self.candidates.index(name)].policy

    def shadow_hit_ratios(self) -> dict[str, float]:
        """Per candidate, its shadow's hit ratio over every sampled access so far."""
        return {
            name: shadow.total_hits / self.sampled if self.sampled else 0.0
            for name, shadow in zip(self.candidates, self._shadows, strict=True)
        }

    def lru_order(self) -> list[OffloadKey]:
        """Resident keys, least recently used first (the order a new policy adopts them)."""
        return list(self._resident)

    # -- the shadows and the choice ---------------------------------------------------------

    def _sampled(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """The keys of `keys` in the sample, in order."""
        if self._threshold >= _SCALE:
            return list(keys)
        threshold, seed = self._threshold, self._seed
        return [key for key in keys if sample_point(key, seed) < threshold]

    def _observe(self, keys: Sequence[OffloadKey]) -> None:
        """Accesses of `keys` (one request's, head first): the sampled ones drive every
        shadow, tail first as the policies take a request; a decision at each epoch's end."""
        if self._parked is not None:
            self._parked.on_store_miss(keys)  # every access, hit or miss: it holds nothing
        sampled = self._sampled(keys)
        shadows = self._shadows
        for key in reversed(sampled):
            for shadow in shadows:
                shadow.access(key)
            self.sampled += 1
            if self.sampled % self._epoch == 0:
                self._decide()

    def _decide(self) -> None:
        """Fade the scores, add the epoch's hits, and switch to the leader if its lead over
        the serving candidate is above the margin and above `z` standard deviations of its
        own noise (after the warm-up).

        The noise is estimated from the epochs themselves (batch means): the lead is a faded
        sum of per-epoch differences, whose variance is estimated by their faded spread. A
        per-access estimate would be too small, as a sampled key's accesses come in runs."""
        decay = self.decay
        hits = [shadow.hits for shadow in self._shadows]
        for shadow in self._shadows:
            shadow.hits = 0
        for index, count in enumerate(hits):
            self.scores[index] = self.scores[index] * decay + count
        for pair, (i, j) in enumerate(self._pairs):
            difference = hits[i] - hits[j]
            self._squares[pair] = self._squares[pair] * decay + difference * difference
        self.weight = self.weight * decay + self._epoch
        self._epochs = self._epochs * decay + 1.0
        self._weights2 = self._weights2 * decay * decay + 1.0
        self.decisions += 1
        serving = self.serving_index
        best = max(range(len(self.scores)), key=lambda i: (self.scores[i], i == serving, -i))
        if best != serving and self.decisions > self.warmup and self._leads(best, serving):
            self.serve_with(self.candidates[best])

    def _leads(self, best: int, serving: int) -> bool:
        """Whether candidate `best` leads `serving` by more than the margin and the noise."""
        lead = self.scores[best] - self.scores[serving]
        if lead <= self.margin * self.weight:
            return False
        squares = self._squares[self._pairs.index((min(best, serving), max(best, serving)))]
        mean = lead / self._epochs
        variance = max(0.0, squares / self._epochs - mean * mean)
        return lead * lead > self.z * self.z * variance * self._weights2

    def serve_with(self, name: str) -> None:
        """Serve with candidate `name` from now on (what a decision does; public for tests
        and for an operator who knows better): a fresh instance (for lct, the one parked
        when it last stopped serving, see `_park`) adopts every resident block, least
        recently used first; nothing is dropped. The blocks the old policy
        knows to be frequent (ARC's T2, lct's blocks accessed twice or more) are then
        touched in the same order, so an ARC that takes over keeps them in its T2. Serving
        with the candidate that serves already changes nothing."""
        if name not in self.candidates:
            raise InvalidValueError(f"auto: {name!r} is not a candidate of {self.candidates!r}")
        index = self.candidates.index(name)
        if index == self.serving_index:
            return
        policy: CachePolicy
        if name == LCTCachePolicy.name and self._parked is not None:
            policy, self._parked = self._parked, None  # what it learned while parked
        elif name == LCTCachePolicy.name:
            shadow = self._shadows[index].policy
            assert isinstance(shadow, LCTCachePolicy)
            policy = LCTCachePolicy(self.cache_capacity, start=shadow.horizon)
        else:
            policy = CANDIDATE_CLASSES[name](self.cache_capacity)
        for key, block in self._resident.items():
            policy.insert(key, block)
        if isinstance(policy, ARCCachePolicy):
            frequent = _frequent(self._serving)
            policy.touch([key for key in reversed(self._resident) if key in frequent])
        if isinstance(self._serving, LCTCachePolicy):
            self._park(self._serving)
        self._serving = policy
        self.serving_index = index
        self.switches.append((self.sampled, name))

    def _park(self, lct: LCTCachePolicy) -> None:
        """Keep `lct`, which no longer serves, learning: its blocks are dropped from it (each
        remembered as a ghost, with its access history) and every access is announced to it
        as a miss from now on (`_observe`), so a later switch back adopts the resident blocks
        into an lct that knows the workload. Without it an lct that takes over again starts
        afresh, LRU-like until it has a capacity's worth of evidence: a misjudged switch to
        ARC during lct's first capacities, and the one back, cost more than the switch
        (issue 22, the stationary Zipf test)."""
        for key in list(self._resident):
            lct.remove(key)
        self._parked = lct

    # -- CachePolicy ------------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._resident.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self._resident.get

    def admit(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """The serving policy's answer (lct refuses the classes that never pay)."""
        if self._serving.admits_all:
            return [True] * len(keys)
        return self._serving.admit(keys)

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        self._observe(keys)  # first: a switch it makes is heard by the policy that serves
        self._serving.on_store_miss(keys)

    def on_store_move(self, keys: Sequence[OffloadKey]) -> None:
        """Not an access: the sampled keys are stored in the shadows (if absent and
        admitted) as the tier stores them, and nothing is scored."""
        for key in reversed(self._sampled(keys)):
            for shadow in self._shadows:
                shadow.move(key)
        if self._parked is not None:
            self._parked.on_store_move(keys)
        self._serving.on_store_move(keys)

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._resident:
            raise BlockStateError(f"auto: key {key!r} is already resident")
        self._serving.insert(key, block)
        self._resident[key] = block

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        self._check_insert_batch(keys, blocks, self._resident)
        self._serving.insert_many(keys, blocks)
        resident = self._resident
        for key, block in zip(keys, blocks, strict=True):
            resident[key] = block

    def remove(self, key: OffloadKey) -> None:
        if self._resident.pop(key, None) is None:
            raise BlockStateError(f"auto: key {key!r} is not resident")
        self._serving.remove(key)
        if self._hints.reuse:
            self._hints.discard(key)

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        self._hints.mark(key, reuse, key in self._resident)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        if self._hints.reuse:
            self._hints.touched(keys)
        resident = self._resident
        hits = [key for key in keys if key in resident]
        self._observe(hits)
        move_to_end = resident.move_to_end
        for key in reversed(hits):  # tail first: the request's head is the most recent
            move_to_end(key)
        self._serving.touch(hits)

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """The serving policy's victims."""
        check_evict_count(n)
        if self._hints.active and n:
            return self._hints.evict_hinted(
                n, protected, self.evict, self._resident.get, self.remove, self.items
            )
        victims = self._serving.evict(n, protected)
        if victims:
            resident = self._resident
            for key, _ in victims:
                del resident[key]
        return victims

    def clear(self) -> None:
        """Forget every block and all learned state: a fresh policy of the same settings."""
        self._resident.clear()
        self._hints.clear()
        self._start_afresh()

    def __len__(self) -> int:
        return len(self._resident)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(list(self._resident.items()))
