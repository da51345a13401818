"""The LRU evictor of a prefix-caching allocator: which unused cached block to reuse first.

Candidates are physical blocks that hold a cached, computed prefix and that no sequence
references. The victim is the one accessed longest ago; among equal access times, the one that
ends the longest prefix (most tokens before and in it) goes first, so a freed sequence is
dismantled from its tail and its shorter, more shareable prefixes stay cached longest; among
those, the one that became a candidate first.

A binary heap with lazy deletion: `add`, `update` and `evict` are O(log n) amortized, `remove`
and membership O(1). Stale heap entries are skipped when they surface, and the heap is rebuilt
when stale entries outnumber live ones, so memory stays O(n).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from kvtier.errors import BlockStateError

_COMPACT_SLACK = 64


@dataclass(slots=True)
class _Candidate:
    content_hash: bytes
    num_tokens_total: int
    last_accessed: float
    seq: int


class LRUEvictor:
    """Unused cached blocks, ordered by (last access, longest prefix first, arrival)."""

    __slots__ = ("_candidates", "_heap", "_next_seq")

    def __init__(self) -> None:
        self._candidates: dict[int, _Candidate] = {}
        self._heap: list[tuple[float, int, int, int]] = []
        self._next_seq = 0

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._candidates

    def __len__(self) -> int:
        return len(self._candidates)

    @property
    def num_blocks(self) -> int:
        """How many blocks could be evicted."""
        return len(self._candidates)

    def add(
        self, block_id: int, content_hash: bytes, num_tokens_total: int, last_accessed: float
    ) -> None:
        """Make `block_id` (holding the prefix `content_hash`) a candidate for eviction."""
        if block_id in self._candidates:
            raise BlockStateError(f"block {block_id} is already in the evictor")
        candidate = _Candidate(content_hash, num_tokens_total, last_accessed, self._next_seq)
        self._candidates[block_id] = candidate
        self._push(block_id, candidate)

    def update(self, block_id: int, last_accessed: float) -> None:
        """Record a new access time for a candidate (it moves in the eviction order)."""
        candidate = self._get(block_id)
        candidate.last_accessed = last_accessed
        self._push(block_id, candidate)

    def remove(self, block_id: int) -> tuple[bytes, float]:
        """Stop considering `block_id` (it is being revived); returns its content hash and last
        access time."""
        candidate = self._get(block_id)
        del self._candidates[block_id]
        return candidate.content_hash, candidate.last_accessed

    def peek(self) -> tuple[int, bytes]:
        """The next victim's block id and content hash, without evicting it."""
        heap = self._heap
        candidates = self._candidates
        while heap:
            _, _, seq, block_id = heap[0]
            candidate = candidates.get(block_id)
            if candidate is not None and candidate.seq == seq:
                return block_id, candidate.content_hash
            heapq.heappop(heap)
        raise BlockStateError("the evictor is empty")

    def evict(self) -> tuple[int, bytes]:
        """Take the next victim out; returns its block id and content hash."""
        block_id, content_hash = self.peek()
        heapq.heappop(self._heap)
        del self._candidates[block_id]
        return block_id, content_hash

    def block_ids(self) -> list[int]:
        """Every candidate's block id (O(n); for checks)."""
        return list(self._candidates)

    def content_hash(self, block_id: int) -> bytes:
        """The content hash recorded for candidate `block_id`."""
        return self._get(block_id).content_hash

    def _get(self, block_id: int) -> _Candidate:
        try:
            return self._candidates[block_id]
        except KeyError:
            raise BlockStateError(f"block {block_id} is not in the evictor") from None

    def _push(self, block_id: int, candidate: _Candidate) -> None:
        candidate.seq = self._next_seq
        self._next_seq += 1
        entry = (candidate.last_accessed, -candidate.num_tokens_total, candidate.seq, block_id)
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._candidates) + _COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Drop every stale heap entry: O(n), at most once per n pushes, so O(1) amortized."""
        self._heap = [
            (c.last_accessed, -c.num_tokens_total, c.seq, block_id)
            for block_id, c in self._candidates.items()
        ]
        heapq.heapify(self._heap)
