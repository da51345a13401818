"""Shared helpers for policy tests: a policy driven as a tier drives it."""

from __future__ import annotations

import random
from collections.abc import Callable

from kvtier.blocks import BlockStatus
from kvtier.keys import OffloadKey
from kvtier.policies.base import CachePolicy


def drive_as_a_tier(
    policy: CachePolicy,
    capacity: int,
    count: int,
    pick: Callable[[], OffloadKey],
    rng: random.Random,
) -> None:
    """`count` accesses of keys from `pick` as a tier of `capacity` blocks makes them: a
    hit is touched; a miss is announced, and stored if admitted and room is made (one
    eviction once full), each stored block unpinned."""
    for _ in range(count):
        key = pick()
        if policy.get(key) is not None:
            policy.touch([key])
            continue
        policy.on_store_miss([key])
        if not policy.admit([key])[0]:
            continue
        if len(policy) >= capacity and policy.evict(1) is None:
            continue
        block = BlockStatus(rng.randrange(10**6))
        block.ref_cnt = 0
        policy.insert(key, block)
