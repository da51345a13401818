"""Reference counts of physical blocks, and the log of copy-on-writes still to be executed.

Both are plain bookkeeping with loud failures: an unknown block id is a caller's bug
(InvalidValueError naming it), and decrementing a count that is already zero is a double free
(DoubleFreeError naming the block), rather than an assertion that `python -O` would strip.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvtier.errors import DoubleFreeError, InvalidValueError


class RefCounter:
    """How many Block objects name each physical block id of one allocator."""

    __slots__ = ("_counts",)

    def __init__(self, block_ids: Iterable[int]) -> None:
        self._counts: dict[int, int] = dict.fromkeys(block_ids, 0)

    def incr(self, block_id: int) -> int:
        """Add one reference to `block_id`; returns the new count."""
        count = self._count(block_id) + 1
        self._counts[block_id] = count
        return count

    def decr(self, block_id: int) -> int:
        """Drop one reference to `block_id`; returns the new count. DoubleFreeError if it has
        none (nothing changes)."""
        count = self._count(block_id)
        if count == 0:
            raise DoubleFreeError(f"block {block_id} has no references to drop (double free?)")
        self._counts[block_id] = count - 1
        return count - 1

    def get(self, block_id: int) -> int:
        """The number of references to `block_id`."""
        return self._count(block_id)

    def _count(self, block_id: int) -> int:
        try:
            return self._counts[block_id]
        except KeyError:
            raise InvalidValueError(f"block id {block_id!r} is not in this pool") from None

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._counts

    def in_use(self) -> dict[int, int]:
        """Every block id with at least one reference, with its count (O(blocks); for checks)."""
        return {block_id: count for block_id, count in self._counts.items() if count}


class CopyOnWriteTracker:
    """The (source, destination) physical block pairs whose contents must be copied before the
    destination is written. An allocator records one pair per copy-on-write; the engine drains
    them with `clear_copy_on_writes()` and runs the copies."""

    __slots__ = ("_pairs",)

    def __init__(self) -> None:
        self._pairs: list[tuple[int, int]] = []

    def record(self, src_block_id: int, dst_block_id: int) -> None:
        """Remember that `dst_block_id` must receive a copy of `src_block_id`."""
        self._pairs.append((src_block_id, dst_block_id))

    def clear(self) -> list[tuple[int, int]]:
        """The pairs recorded since the last call, in order; forgets them."""
        pairs, self._pairs = self._pairs, []
        return pairs

    def __len__(self) -> int:
        return len(self._pairs)
