"""`HintBook`: the reuse hints a policy holds on its resident blocks, and the eviction that
honours them (see `kvtier.hints` for what each hint means).

A side structure on purpose: a policy with no hinted block pays one attribute test per
`evict` (`active`) and one per `touch` and `remove`, and its own eviction (ARC's planners,
lct's class queues) runs unchanged. With hinted blocks, `evict` takes the `"never"` blocks
first, then the `"unlikely"` ones (each in the order they were hinted), then asks the
policy's own eviction for the rest with the `"likely"` blocks protected; if that finds too
few, the unhinted blocks go first and the policy's own next victims among the `"likely"`
ones make up the rest. Hinted victims leave by the policy's `remove` (an ARC ghost list does
not remember them: the application said they will not be reused).

An application may also *rank* resident blocks (`rank`: what a session hint becomes, see
`kvtier.sessions`): after the `"never"` and `"unlikely"` blocks, the ranked blocks that are
not `"likely"` go lowest rank first, before the policy's own eviction of the unranked ones;
when only `"likely"` blocks are left, the ranked ones among them go lowest rank first too.
A rank is any value comparable with the others the driver gives (a session's tuple); the
book keeps them in a heap, so a ranked eviction costs O(log n) a block. A rank outlives no
block: a victim's is dropped, and one left on a block the policy removed is dropped when it
surfaces (the driver ranks a block again whenever its session changes).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from kvtier.blocks import BlockStatus
from kvtier.hints import Reuse, check_reuse
from kvtier.keys import OffloadKey

_Entry = tuple[OffloadKey, BlockStatus]
Evict = Callable[[int, Collection[OffloadKey]], list[_Entry] | None]


class _Union(Collection[OffloadKey]):
    """The keys of any of `parts`, without copying them: a policy's eviction only asks
    `key in protected`, so shielding the "likely" blocks costs nothing per eviction however
    many there are."""

    __slots__ = ("_parts",)

    def __init__(self, *parts: Collection[OffloadKey]) -> None:
        self._parts = parts

    def __contains__(self, key: Any) -> bool:
        for part in self._parts:  # noqa: SIM110 - a loop, not a generator: asked per key
            if key in part:
                return True
        return False

    def __iter__(self) -> Iterator[OffloadKey]:
        seen: set[OffloadKey] = set()
        for part in self._parts:
            for key in part:
                if key not in seen:
                    seen.add(key)
                    yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)


class HintBook:
    """The hinted resident keys of one policy, by hint, each in the order it was hinted."""

    def __init__(self) -> None:
        self.reuse: dict[OffloadKey, Reuse] = {}
        """Every hinted key and its hint (empty: the policy behaves as if hints did not exist)."""
        self._by_reuse: dict[Reuse, dict[OffloadKey, None]] = {
            "never": {},
            "unlikely": {},
            "likely": {},
        }
        self.active = False
        """Whether `evict` must go through `evict_hinted`: some key is hinted or ranked, and
        no hinted eviction is under way (which calls the policy's own eviction)."""
        self.ranks: dict[OffloadKey, Any] = {}
        """Every ranked key and its rank (see the module doc)."""
        self._heap: list[tuple[Any, int, OffloadKey]] = []
        self._seq = 0

    def _refresh(self) -> None:
        self.active = bool(self.reuse) or bool(self.ranks)

    def set_rank(self, key: OffloadKey, rank: Any, resident: bool) -> None:
        """Rank `key` (`rank` None: unrank it); a key that is not resident is ignored."""
        if rank is None or not resident:
            if self.ranks.pop(key, None) is not None:
                self._refresh()
            return
        if self.ranks.get(key, None) == rank:
            return  # its heap entry holds already (a rank carried to a tier that had it)
        self.ranks[key] = rank
        self._seq += 1
        heapq.heappush(self._heap, (rank, self._seq, key))
        if len(self._heap) > 4 * len(self.ranks) + 64:  # stale entries: rebuild
            self._heap = [(r, i, k) for i, (k, r) in enumerate(self.ranks.items())]
            heapq.heapify(self._heap)
        self.active = True

    def mark(self, key: OffloadKey, reuse: Reuse | None, resident: bool) -> None:
        """Hint `key` (`reuse` None: withdraw its hint). A key that is not resident is
        ignored: a hint is about a block the tier holds."""
        if reuse is not None:
            check_reuse(reuse)
        self.discard(key)
        if reuse is None or not resident:
            return
        self.reuse[key] = reuse
        self._by_reuse[reuse][key] = None
        self.active = True

    def discard(self, key: OffloadKey) -> None:
        """Forget `key`'s hint and rank, if any (it left the tier)."""
        reuse = self.reuse.pop(key, None)
        if reuse is not None:
            del self._by_reuse[reuse][key]
        if (self.ranks and self.ranks.pop(key, None) is not None) or reuse is not None:
            self._refresh()

    def touched(self, keys: Sequence[OffloadKey]) -> None:
        """A hit on a `"never"` or `"unlikely"` block disproves its hint: withdraw it."""
        reuse = self.reuse
        for key in keys:
            if reuse.get(key) in ("never", "unlikely"):
                self.discard(key)

    def clear(self) -> None:
        self.reuse.clear()
        for keys in self._by_reuse.values():
            keys.clear()
        self.ranks.clear()
        self._heap.clear()
        self.active = False

    def evict_hinted(
        self,
        n: int,
        protected: Collection[OffloadKey],
        evict: Evict,
        get: Callable[[OffloadKey], BlockStatus | None],
        remove: Callable[[OffloadKey], None],
        items: Callable[[], Iterator[_Entry]],
    ) -> list[_Entry] | None:
        """`CachePolicy.evict(n, protected)` honouring the hints (see the module doc);
        `evict`, `get`, `remove` and `items` are the policy's own. None, changing nothing,
        when fewer than `n` blocks may be evicted."""
        chosen = self._hinted_victims(n, protected, get)
        if self.ranks and len(chosen) < n:
            chosen += self._ranked_victims(
                n - len(chosen), _Union(protected, {key for key, _ in chosen}), get, likely=False
            )
        rest = n - len(chosen)
        self.active = False  # `evict` below is the policy's own eviction
        try:
            plain: list[_Entry] = []
            if rest:
                shield = _Union(protected, {key for key, _ in chosen})
                found = evict(rest, _Union(shield, self._by_reuse["likely"]))
                if found is None:
                    found = self._evict_likely_too(rest, shield, evict, get, remove, items)
                if found is None:
                    return None
                plain = found
            for key, _ in chosen:
                remove(key)
            for key, _ in plain:
                self.discard(key)
            for key, _ in chosen:
                self.discard(key)
        finally:
            self._refresh()
        return chosen + plain

    def _ranked_victims(
        self,
        n: int,
        protected: Collection[OffloadKey],
        get: Callable[[OffloadKey], BlockStatus | None],
        *,
        likely: bool,
    ) -> list[_Entry]:
        """Up to `n` evictable ranked blocks, lowest rank first: those not `"likely"`
        (`likely` False) or only the `"likely"` ones (True). Skipped entries go back."""
        heap, ranks, hinted = self._heap, self.ranks, self._by_reuse["likely"]
        chosen: list[_Entry] = []
        skipped: list[tuple[Any, int, OffloadKey]] = []
        seen: set[OffloadKey] = set()
        while heap and len(chosen) < n:
            entry = heapq.heappop(heap)
            rank, _, key = entry
            if key not in ranks or ranks[key] is not rank or key in seen:
                continue  # stale: re-ranked or unranked since (or ranked A, B, A again)
            seen.add(key)
            block = get(key)
            if block is None:
                del ranks[key]  # the policy removed it
                continue
            if block.ref_cnt != 0 or key in protected or (key in hinted) is not likely:
                skipped.append(entry)
                continue
            chosen.append((key, block))
        for entry in skipped:
            heapq.heappush(heap, entry)
        return chosen

    def _hinted_victims(
        self,
        n: int,
        protected: Collection[OffloadKey],
        get: Callable[[OffloadKey], BlockStatus | None],
    ) -> list[_Entry]:
        """Up to `n` evictable `"never"` blocks, then `"unlikely"` ones, in hint order."""
        chosen: list[_Entry] = []
        for reuse in ("never", "unlikely"):
            for key in self._by_reuse[reuse]:
                if len(chosen) == n:
                    return chosen
                block = get(key)
                if block is not None and block.ref_cnt == 0 and key not in protected:
                    chosen.append((key, block))
        return chosen

    def _evict_likely_too(
        self,
        n: int,
        shield: Collection[OffloadKey],
        evict: Evict,
        get: Callable[[OffloadKey], BlockStatus | None],
        remove: Callable[[OffloadKey], None],
        items: Callable[[], Iterator[_Entry]],
    ) -> list[_Entry] | None:
        """Too few blocks besides the `"likely"` ones: every other evictable block, then the
        policy's own next victims among the `"likely"` ones. Walks every resident block:
        only when hints protect nearly the whole tier."""
        likely = self._by_reuse["likely"]
        others = sum(
            1
            for key, block in items()
            if block.ref_cnt == 0 and key not in shield and key not in likely
        )
        hinted = 0
        for key in likely:
            block = get(key)
            if block is not None and block.ref_cnt == 0 and key not in shield:
                hinted += 1
        if others + hinted < n:
            return None
        first = evict(others, _Union(shield, likely)) if others else []
        if first is None:
            return None
        ranked: list[_Entry] = []
        if self.ranks:  # the ranked "likely" blocks, lowest rank first
            ranked = self._ranked_victims(n - others, shield, get, likely=True)
            for key, _ in ranked:
                remove(key)
        taken = _Union(shield, {key for key, _ in ranked})
        second = evict(n - others - len(ranked), taken) if n - others - len(ranked) else []
        if second is None:
            return None  # not reached: counted above
        return first + ranked + second
