"""Replay an access sequence through a fresh policy, exactly as a tier drives it."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from kvtier.blocks import BlockStatus
from kvtier.errors import InvalidValueError, KvtierError
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
