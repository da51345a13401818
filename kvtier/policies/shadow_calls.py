"""`ShadowCalls`: how `auto` drives its shadows, those on ids through one key table.

A shadow of LRU, ARC or S3-FIFO runs on the ids of one `KeyIds` table
(`kvtier.policies._key_ids`, `takeover.shadow_on_ids`): a request's keys are interned once
(one look-up per key) and every such shadow takes the ids, keeping each id's node in
an int array instead of a dict of its own; lct's shadow takes the keys. Before, every shadow
looked each key up in dicts of its own, and those probes of large dicts (cache misses) were
30-40 % of `auto`'s time (docs/BENCHMARKS.md, "Policy cost, fifth round"). lct serving runs
on the same ids (`live_touch`, `live_miss`): the request's keys are interned before its call
and the shadows take the same ids, so lct's own dict of keys is gone too ("ninth round").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtier.blocks import BlockStatus
from kvtier.keys import OffloadKey
from kvtier.policies._key_ids import KeyIds
from kvtier.policies.base import CachePolicy
from kvtier.policies.takeover import live_on_ids, shadow_on_ids, store_moved


class ShadowCalls:
    """The calls `auto` makes to its shadows, per request (`access`, `store`)."""

    def __init__(self) -> None:
        self.table = KeyIds()
        """The keys the shadows on ids (and lct serving) remember, each with its id."""
        self.live_on_ids = False
        self.keyed: list[tuple[CachePolicy, int, Callable[..., int]]] = []
        """(shadow, candidate, its `access`) of each shadow on keys."""
        self.on_ids: list[tuple[CachePolicy, int, Callable[..., int]]] = []
        """(shadow, candidate, its `access_ids`) of each shadow on ids."""

    def route(self, policies: Sequence[CachePolicy], serving: int, shadows: Sequence[int]) -> None:
        """`policies[serving]` serves and the shadows are `policies[i]` for i in `shadows`:
        put each that can run on ids on them (in its state: a policy that stopped serving
        goes on ids so, lct serving too)."""
        self.live_on_ids = live_on_ids(policies[serving], self.table)
        """Whether the serving policy takes ids (`live_touch`, `live_miss`)."""
        self.keyed, self.on_ids = [], []
        for index in shadows:
            policy = policies[index]
            if shadow_on_ids(policy, self.table):
                self.on_ids.append((policy, index, policy.access_ids))  # type: ignore[attr-defined]
            else:
                self.keyed.append((policy, index, policy.access))

    def live_touch(self, live: CachePolicy, keys: Sequence[OffloadKey]) -> list[int] | None:
        """`live.touch(keys)` (the serving policy's), on ids where it runs so: the ids, for
        `access` (None: not interned)."""
        if not (self.live_on_ids and keys):
            live.touch(keys)
            return None
        ids = self.table.intern(keys)
        live.touch_ids(ids, keys)  # type: ignore[attr-defined]
        return ids

    def live_miss(self, live: CachePolicy, keys: Sequence[OffloadKey]) -> list[int] | None:
        """`live.on_store_miss(keys)`, on ids where it runs so (see `live_touch`)."""
        if not (self.live_on_ids and keys):
            live.on_store_miss(keys)
            return None
        ids = self.table.intern(keys)
        live.on_store_miss_ids(ids, keys)  # type: ignore[attr-defined]
        return ids

    def access(
        self,
        keys: Sequence[OffloadKey],
        block: BlockStatus,
        hits: list[int],
        ids: list[int] | None = None,
    ) -> None:
        """A request's accesses of every shadow (`CachePolicy.access`), each one's hits added
        to `hits[candidate]`; `ids`: the keys' ids if the live call interned them."""
        for _, index, access in self.keyed:
            hits[index] += access(keys, block)
        if self.on_ids:
            if ids is None:
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
