"""`ColdSet`: the blocks a persistent tier restored at open, held without an object per block.

A tier of 10^6 restored blocks entered into its policy one by one costs seconds and hundreds
of bytes per block (a `BlockStatus` and a policy entry each). Instead `TierManager.restore_cold`
keeps them here: their slots oldest first (an int64 array), a flag per slot, and the storage's
own look-ups (`ColdSource`, `kvtier.tiers.storage`: a key's slot, a slot's key). The policy
does not know them:

- a block of the cold set that is asked for (`TierManager` looks a key up in the cold set when
  its policy does not hold it) leaves the set and enters the policy as a ready block, as if it
  had just been stored there: from then on it is an ordinary block;
- an eviction takes the cold blocks first, oldest first, and only then asks the policy: they
  were not used since the restart, so for LRU this is exactly LRU order;
- a cold block can be evicted only once the storage can name its key (`ColdSource.key_of`:
  a disk store loads its keys in the background after opening); until then it is skipped.
"""

from __future__ import annotations

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.storage import ColdSource


class ColdSet:
    """The restored blocks of a tier of `num_blocks` slots that its policy does not hold."""

    __slots__ = ("_cursor", "_live", "_order", "_source", "count")

    def __init__(self, source: ColdSource, num_blocks: int) -> None:
        self._source = source
        self._order = np.asarray(source.slots(), dtype=np.int64)
        self._live = np.zeros(num_blocks, dtype=np.bool_)
        self._live[self._order] = True
        self._cursor = 0
        self.count = len(self._order)
        """Blocks in the set."""

    def slots(self) -> np.ndarray:
        """The slots in the set, oldest first."""
        rest = self._order[self._cursor :]
        return rest[self._live[rest]]

    def holds_slot(self, slot: int) -> bool:
        """Whether `slot` is in the set."""
        return bool(self._live[slot])

    def find(self, key: OffloadKey) -> int | None:
        """The slot of `key` if it is in the set, or None."""
        if not self.count:
            return None
        slot = self._source.slot_of(key)
        if slot is None or not 0 <= slot < len(self._live) or not self._live[slot]:
            return None
        return slot

    def take(self, slot: int) -> None:
        """Remove `slot` from the set (its block entered the policy, or left the tier)."""
        if self._live[slot]:
            self._live[slot] = False
            self.count -= 1

    def evictable(self, count: int) -> list[tuple[OffloadKey, int]]:
        """Up to `count` blocks of the set, oldest first, as (key, slot), left in the set:
        the ones whose keys the storage can name (`take` each one evicted)."""
        found: list[tuple[OffloadKey, int]] = []
        order, live, key_of = self._order, self._live, self._source.key_of
        position = self._cursor
        while position < len(order) and not live[order[position]]:
            position += 1
        self._cursor = position  # everything before it has left the set
        while position < len(order) and len(found) < count:
            slot = int(order[position])
            position += 1
            if not live[slot]:
                continue
            key = key_of(slot)
            if key is None:
                break  # keys not loaded yet: the rest cannot be named either
            found.append((key, slot))
        return found

    def all_keys(self) -> list[OffloadKey] | None:
        """Every key of the set, oldest first; None (at the first) if one cannot be named
        yet (a disk store names none until it has loaded them all)."""
        key_of = self._source.key_of
        found = []
        for slot in self.slots():
            key = key_of(int(slot))
            if key is None:
                return None
            found.append(key)
        return found

    def keys(self) -> list[OffloadKey]:
        """The keys of the set that the storage can name, oldest first."""
        key_of = self._source.key_of
        keys = (key_of(int(slot)) for slot in self.slots())
        return [key for key in keys if key is not None]
