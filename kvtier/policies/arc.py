"""Adaptive Replacement Cache (Megiddo & Modha, FAST 2003, Fig. 4).

T1 holds blocks seen once recently, T2 blocks seen at least twice; the ghost lists B1 and B2
remember keys recently evicted from T1 and T2 (keys only, no blocks). A request for a key in
B1 means T1 was too small: the target size p of T1 grows; a key in B2 shrinks it. REPLACE
evicts from T1 while |T1| exceeds p, else from T2.

The paper's algorithm is followed step for step; the only departures are where a tier cannot
follow it:
  - a pinned, pending or protected block is never evicted: REPLACE takes the next evictable
    block of the list it chose, or of the other list when that one has none;
  - a batch of misses is served in order as the paper serves single requests: the first ones
    fill free slots, each later one pays for one REPLACE, and p adapts before each REPLACE;
  - a failed store (`remove`) or a pinned block can leave the lists outside the paper's
    invariants, so ghost lists are trimmed to |T1|+|B1| <= c and |L1|+|L2| <= 2c after every
    change (a no-op whenever the paper's invariants hold).
On a single stream of requests driven as a tier drives it (see `simulate`) it makes the same
decisions as the paper's pseudo-code.

The state and steps are `ARCLists` (`kvtier/policies/_arc_core.py`, this algorithm's one
source): T1, T2, B1 and B2 as linked lists over int arrays, and `evict` planned in full before
anything changes. That module is written in Cython's pure Python mode: `scripts/build-core`
compiles it (see `kvtier.compiled`), and without a build it runs as plain Python, the same
text. This class adds what is not ARC's: the checks of its arguments and the reuse hints.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import ClassVar

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies._arc_core import ARCLists
from kvtier.policies._key_ids import KeyIds
from kvtier.policies.base import CachePolicy, check_evict_count
from kvtier.policies.hinted import HintBook


class ARCCachePolicy(CachePolicy):
    """ARC: balances recency (T1) against frequency (T2) with a self-tuning target.

    The per-key calls (`get`, `insert`) and `on_store_miss` are `ARCLists`' own, with no
    frame of this class's, unless a subclass overrides them."""

    name: ClassVar[str] = "arc"
    lists_class: ClassVar[type[ARCLists]] = ARCLists
    """The class of the state and steps: `ARCLists`, compiled when the core is; a test gives
    a subclass the pure-Python one to compare the two (`tests/test_compiled_core.py`)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        core = self.lists_class(cache_capacity)
        self._core = core
        self._hints = HintBook()
        cls = type(self)
        # Bound to the instance: every caller, not only `getter()`'s, reaches the dict or
        # the core with no Python frame. The dict is never replaced (`clear` empties it).
        if cls.get is ARCCachePolicy.get:
            self.get = core.resident.get  # type: ignore[method-assign,assignment]
        if cls.insert is ARCCachePolicy.insert:
            self.insert = core.insert  # type: ignore[method-assign]
        if cls.on_store_miss is ARCCachePolicy.on_store_miss:
            self.on_store_miss = core.on_store_miss  # type: ignore[method-assign]

    # -- inspection ------------------------------------------------------------------------

    @property
    def target_t1_size(self) -> float:
        """The adaptive target p for |T1|."""
        return self._core.p

    def lists(self) -> dict[str, list[OffloadKey]]:
        """T1, T2, B1 and B2, each least recently used first (for tests and inspection)."""
        core = self._core
        return {name: core.keys_of(where) for where, name in enumerate(("t1", "t2", "b1", "b2"))}

    # -- CachePolicy -----------------------------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._core.resident.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        if self._core.on_ids:
            return self._core.get
        return self._core.resident.get

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self._core.insert(key, block)

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        core = self._core
        self._check_insert_batch(keys, blocks, core.resident)
        core.insert_many(keys, blocks)

    def remove(self, key: OffloadKey) -> None:
        self._core.remove(key)
        if self._hints.reuse:
            self._hints.discard(key)

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        self._hints.mark(key, reuse, key in self._core.resident)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        if self._hints.reuse:
            self._hints.touched(keys)
        self._core.touch(keys)

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        self._core.on_store_miss(keys)

    def access(self, keys: Sequence[OffloadKey], block: BlockStatus) -> int:
        """One call of the core (`ARCLists.access`): no Python call per key."""
        if self._hints.active:  # never in a shadow; the calls one by one honour the hints
            return super().access(keys, block)
        return self._core.access(keys, block)

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        if type(n) is not int or n < 1:  # the common case skips check_evict_count's call
            check_evict_count(n)
            if n == 0:
                return []
        if self._hints.active:
            return self._hints.evict_hinted(
                n, protected, self.evict, self._core.resident.get, self.remove, self.items
            )
        return self._core.evict(n, protected)

    def clear(self) -> None:
        self._core.clear()
        self._hints.clear()

    def __len__(self) -> int:
        return self._core.resident_count()

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return iter(self._core.entries())

    # -- a shadow on ids (`auto`) ------------------------------------------------------------

    @property
    def on_ids(self) -> bool:
        """Whether this shadow runs on ids (`use_ids`)."""
        return self._core.on_ids

    def use_ids(self, table: KeyIds) -> None:
        """Run as a shadow on the ids of `table` from now on (`kvtier.policies._key_ids`),
        in the same state: `access_ids` and `store_ids` take a request's ids; `get`, `len`,
        `items` and `lists` read through the table; nothing else is called."""
        core = self._core
        core.use_ids(table)
        self.get = core.get  # type: ignore[method-assign]
        self.access_ids = core.access  # type: ignore[method-assign,assignment]
        self.store_ids = core.store  # type: ignore[method-assign,assignment]

    def use_keys(self) -> None:
        """Run on keys again, in the same state (its ids released): a shadow that took
        over and is dropped by `auto` stays readable."""
        core = self._core
        if not core.on_ids:
            return
        core.use_keys()
        del self.get, self.access_ids, self.store_ids
        if type(self).get is ARCCachePolicy.get:
            self.get = core.resident.get  # type: ignore[method-assign,assignment]

    def access_ids(self, ids: Sequence[int], block: BlockStatus) -> int:
        """`access` of a shadow on ids (`use_ids`): a request's ids, as `KeyIds.intern`
        gives them; the hits. (Bound to the core's own by `use_ids`.)"""
        if not self._core.on_ids:
            raise BlockStateError("arc: access_ids needs a shadow on ids (use_ids)")
        return self._core.access(ids, block)  # type: ignore[arg-type]

    def store_ids(self, ids: Sequence[int], block: BlockStatus) -> None:
        """Each id not held stored as a miss (`auto`'s `on_store_move` of a shadow on ids)."""
        if not self._core.on_ids:
            raise BlockStateError("arc: store_ids needs a shadow on ids (use_ids)")
        self._core.store(ids, block)  # type: ignore[arg-type]
