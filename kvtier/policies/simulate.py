"""Replay an access sequence through a fresh policy, exactly as a tier drives it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from kvtier.blocks import BlockStatus
from kvtier.errors import InvalidValueError, KvtierError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies.registry import get_policy_class

if TYPE_CHECKING:
    from kvtier.policies.base import CachePolicy


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """Outcome of one replay: `hits` of `accesses`, and how many blocks were evicted."""

    policy: str
    capacity: int
    accesses: int
    hits: int
    evictions: int
    refused: int = 0
    """Misses the policy did not admit (stored nothing)."""

    @property
    def misses(self) -> int:
        return self.accesses - self.hits

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0


def partial_block_flags(
    requests: Iterable[Sequence[Hashable]], input_lengths: Iterable[int], block_tokens: int
) -> list[bool]:
    """For each access of the flattened requests: whether it is a request's last block
    holding fewer than `block_tokens` tokens (a partial block: its hash covers tokens no later
    prompt repeats exactly, so storing it only takes room)."""
    flags: list[bool] = []
    for request, length in zip(requests, input_lengths, strict=True):
        flags.extend([False] * len(request))
        if request and length % block_tokens:
            flags[-1] = True
    return flags


def simulate(
    name: str | Callable[[int], CachePolicy],
    capacity: int,
    keys: Iterable[Hashable],
    partial: Iterable[bool] | None = None,
) -> SimulationResult:
    """Drive a fresh `name` policy of `capacity` blocks over `keys`, one access per key.

    A hit is `touch`ed; a miss is announced (`on_store_miss`), one block is evicted if the
    cache is full, and a ready block is inserted, unless the policy does not admit it
    (`CachePolicy.admit`) or `partial` (a flag per access, see `partial_block_flags`) says it
    is a partial block, which no policy stores. Keys may be any hashable values (offload keys,
    trace hash ids, ...). Cold start. `name` may also be a callable that builds the policy
    from the capacity (a policy with other parameters, for tuning).
    """
    policy_class = get_policy_class(name) if isinstance(name, str) else name
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise InvalidValueError(f"simulate: capacity must be a positive int, got {capacity!r}")
    policy = policy_class(capacity)
    name = policy.name
    get, touch, announce = policy.get, policy.touch, policy.on_store_miss
    evict, insert = policy.evict, policy.insert
    admits_all = policy.admits_all
    accesses = hits = evictions = refused = 0
    flags = iter(partial) if partial is not None else None
    for raw_key in keys:
        is_partial = next(flags, False) if flags is not None else False
        key = cast(OffloadKey, raw_key)
        accesses += 1
        one = (key,)
        if get(key) is not None:
            hits += 1
            touch(one)
            continue
        if is_partial:
            refused += 1  # the caller says it is a partial block: never stored
            continue
        announce(one)
        if not admits_all and not policy.admit(one)[0]:
            refused += 1  # not worth storing: a miss that stores nothing
            continue
        if len(policy) >= capacity:
            if evict(1) is None:
                raise KvtierError(f"{name}: a full cache of ready blocks could not evict one")
            evictions += 1
        block = BlockStatus(0)
        block.ref_cnt = 0
        insert(key, block)
    return SimulationResult(name, capacity, accesses, hits, evictions, refused)


def simulate_hinted(
    name: str | Callable[[int], CachePolicy],
    capacity: int,
    keys: Sequence[Hashable],
    hints: Sequence[Reuse | None],
    likely_ttl: int | None = None,
    partial: Sequence[bool] | None = None,
) -> SimulationResult:
    """`simulate`, with the application's reuse hint of each access: `hints[i]` is given to
    the policy on access `i`'s key once it is served (after the `touch` of a hit, which
    withdraws a "never" or "unlikely" hint, or the `insert` of a miss), as
    `Hierarchy.hint` gives it once a request is served; None gives none (an earlier hint
    stays). A "likely" hint is withdrawn `likely_ttl` accesses later (None: never), as a
    tier withdraws it at its TTL; a later hint on the key replaces it."""
    if len(hints) != len(keys):
        raise InvalidValueError(
            f"simulate_hinted: {len(hints)} hints for {len(keys)} accesses; one per access"
        )
    if likely_ttl is not None and (isinstance(likely_ttl, bool) or likely_ttl < 1):
        raise InvalidValueError(
            f"simulate_hinted: likely_ttl must be a positive access count, got {likely_ttl!r}"
        )
    policy_class = get_policy_class(name) if isinstance(name, str) else name
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise InvalidValueError(f"simulate: capacity must be a positive int, got {capacity!r}")
    policy = policy_class(capacity)
    run = _HintedRun(policy, capacity, likely_ttl)
    for index, raw_key in enumerate(keys):
        run.expire(index)
        key = cast(OffloadKey, raw_key)
        if run.access(key, partial is not None and partial[index]):
            run.give(index, key, hints[index])
    return SimulationResult(policy.name, capacity, len(keys), run.hits, run.evictions, run.refused)


class _HintedRun:
    """The state of one `simulate_hinted` replay: the policy, the counts, and the deadlines
    of the "likely" hints (in access indices, so oldest first)."""

    def __init__(self, policy: CachePolicy, capacity: int, likely_ttl: int | None) -> None:
        self.policy = policy
        self.capacity = capacity
        self.likely_ttl = likely_ttl
        self.hits = self.evictions = self.refused = 0
        self.deadlines: deque[tuple[int, OffloadKey]] = deque()
        self.likely_until: dict[OffloadKey, int] = {}

    def expire(self, index: int) -> None:
        """Withdraw the "likely" hints whose TTL ended by access `index`."""
        deadlines, until = self.deadlines, self.likely_until
        while deadlines and deadlines[0][0] <= index:
            expires, key = deadlines.popleft()
            if until.get(key) == expires:
                del until[key]
                self.policy.hint(key, None)

    def access(self, key: OffloadKey, is_partial: bool) -> bool:
        """Serve one access as `simulate` does; whether the key is resident after it."""
        policy = self.policy
        one = (key,)
        if policy.get(key) is not None:
            self.hits += 1
            policy.touch(one)
            return True
        if is_partial:
            self.refused += 1
            return False
        policy.on_store_miss(one)
        if not policy.admits_all and not policy.admit(one)[0]:
            self.refused += 1
            return False
        if len(policy) >= self.capacity:
            victims = policy.evict(1)
            if victims is None:
                raise KvtierError(
                    f"{policy.name}: a full cache of ready blocks could not evict one"
                )
            self.evictions += 1
            for victim, _ in victims:
                self.likely_until.pop(victim, None)
        block = BlockStatus(0)
        block.ref_cnt = 0
        policy.insert(key, block)
        return True

    def give(self, index: int, key: OffloadKey, reuse: Reuse | None) -> None:
        """Give resident `key` access `index`'s hint (None: none)."""
        if reuse is None:
            return
        self.policy.hint(key, reuse)
        if reuse == "likely" and self.likely_ttl is not None:
            expires = index + self.likely_ttl
            self.likely_until[key] = expires
            self.deadlines.append((expires, key))
        else:
            self.likely_until.pop(key, None)
