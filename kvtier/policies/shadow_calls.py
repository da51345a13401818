"""`ShadowCalls`: how `auto` drives its shadows, those on ids through one key table.

A shadow of LRU, ARC or S3-FIFO runs on the ids of one `KeyIds` table
(`kvtier.policies._key_ids`, `takeover.shadow_on_ids`): a request's keys are interned once
(one dict look-up per key) and every such shadow takes the ids, keeping each id's node in
an int array instead of a dict of its own; lct's shadow takes the keys. Before, every shadow
looked each key up in dicts of its own, and those probes of large dicts (cache misses) were
30-40 % of `auto`'s time (docs/BENCHMARKS.md, "Policy cost, fifth round").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtier.blocks import BlockStatus
from kvtier.keys import OffloadKey
from kvtier.policies._key_ids import KeyIds
from kvtier.policies.base import CachePolicy
from kvtier.policies.takeover import shadow_on_ids, store_moved


class ShadowCalls:
    """The calls `auto` makes to its shadows, per request (`access`, `store`)."""

    def __init__(self) -> None:
        self.table = KeyIds()
        """The keys the shadows on ids remember, each with its id."""
        self.keyed: list[tuple[CachePolicy, int, Callable[..., int]]] = []
        """(shadow, candidate, its `access`) of each shadow on keys."""
        self.on_ids: list[tuple[CachePolicy, int, Callable[..., int]]] = []
        """(shadow, candidate, its `access_ids`) of each shadow on ids."""

    def route(self, policies: Sequence[CachePolicy], shadows: Sequence[int]) -> None:
        """The shadows are `policies[i]` for i in `shadows`: put each that can run on ids
        on them (in its state: a policy that stopped serving goes on ids so)."""
        self.keyed, self.on_ids = [], []
        for index in shadows:
            policy = policies[index]
            if shadow_on_ids(policy, self.table):
                self.on_ids.append((policy, index, policy.access_ids))  # type: ignore[attr-defined]
            else:
                self.keyed.append((policy, index, policy.access))

    def access(self, keys: Sequence[OffloadKey], block: BlockStatus, hits: list[int]) -> None:
        """A request's accesses of every shadow (`CachePolicy.access`), each one's hits added
        to `hits[candidate]`."""
        for _, index, access in self.keyed:
            hits[index] += access(keys, block)
        if self.on_ids:
            ids = self.table.intern(keys)
            for _, index, access in self.on_ids:
                hits[index] += access(ids, block)

    def store(self, keys: Sequence[OffloadKey], block: BlockStatus) -> None:
        """`on_store_move` of every shadow: each key it lacks stored (if admitted) as the
        tier stores it; no hit, nothing touched."""
        if self.on_ids:
            ids = self.table.intern(keys)
            for policy, _, _ in self.on_ids:
                policy.store_ids(ids, block)  # type: ignore[attr-defined]
        for policy, _, _ in self.keyed:
            store_moved(policy, keys, block)
