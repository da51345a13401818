"""`PrefixCachingBlockAllocator`: full blocks with equal content hashes share one physical
block, and unused cached blocks stay cached until their space is needed.

Each physical block is in exactly one state:

- free: on the free list, no contents worth keeping;
- in use: referenced by one or more Block objects; if it is full and hashed it is also
  *cached* (findable by its content hash), and *computed* once `mark_blocks_as_computed` says
  its KV has been written;
- evictable: cached and computed but referenced by nobody. It stays findable: an allocation
  of an equal block *revives* it (no recomputation). When the free list is empty, the LRU
  evictor picks one to reuse; the eviction listener sees it first, which is where a tiered
  store demotes its bytes instead of losing them.

A cached block that was never marked computed goes back to the free list when its last
reference is dropped: its memory may hold garbage (an aborted prefill), so it must never be
served as a hit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from kvtier.allocator.base import PooledBlockAllocator, common_prefix
from kvtier.allocator.block import DEFAULT_LAST_ACCESSED, Block
from kvtier.allocator.evictor import LRUEvictor
from kvtier.allocator.hashing import hash_packed_tokens
from kvtier.allocator.interfaces import EvictionListener
from kvtier.errors import BlockStateError, InvalidValueError


class PrefixCachingBlockAllocator(PooledBlockAllocator):
    """A pool of `num_blocks` blocks of `block_size` tokens with prefix caching.

    `on_evict(content_hash, block_id)` is called just before an unused cached block is reused,
    while it still holds its KV (see `EvictionListener`); it must not call back into the
    allocator. Allocation, free, fork and promotion are O(1) per block plus O(log n) for the
    evictor's heap.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        block_ids: Iterable[int] | None = None,
        *,
        on_evict: EvictionListener | None = None,
    ) -> None:
        super().__init__(num_blocks, block_size, block_ids)
        self._cached: dict[bytes, int] = {}
        self._cached_info: dict[int, tuple[bytes, int]] = {}
        self._evictor = LRUEvictor()
        self._last_accessed = dict.fromkeys(self._all_block_ids, DEFAULT_LAST_ACCESSED)
        self._computed: set[int] = set()
        self._on_evict = on_evict
        self._num_evictions = 0

    @property
    def on_evict(self) -> EvictionListener | None:
        """The eviction listener (settable, e.g. once the KV memory it reads exists)."""
        return self._on_evict

    @on_evict.setter
    def on_evict(self, listener: EvictionListener | None) -> None:
        if listener is not None and not callable(listener):
            raise InvalidValueError(f"on_evict must be callable or None, got {listener!r}")
        self._on_evict = listener

    @property
    def num_evictions(self) -> int:
        """How many cached blocks have been evicted (reused for other contents) so far."""
        return self._num_evictions

    def get_num_free_blocks(self) -> int:
        """Free blocks plus unused cached blocks (which an allocation may evict)."""
        return len(self._free) + len(self._evictor)

    def get_num_evictable_blocks(self) -> int:
        """Unused cached blocks: cache hits that still take no memory of their own."""
        return len(self._evictor)

    # -- id life cycle -------------------------------------------------------------------------

    def _on_acquired(self, block_id: int) -> None:
        self._last_accessed[block_id] = DEFAULT_LAST_ACCESSED
        self._computed.discard(block_id)

    def _reclaim_id(self) -> int:
        """Evict the evictor's victim: tell the listener (it may refuse by raising, and then
        nothing changed), then forget its prefix."""
        if not self._evictor:
            raise self._no_free_blocks(1)
        block_id, content_hash = self._evictor.peek()
        if self._on_evict is not None:
            self._on_evict(content_hash, block_id)
        self._evictor.evict()
        self._uncache(block_id)
        self._num_evictions += 1
        return block_id

    def _on_unreferenced(self, block_id: int) -> None:
        info = self._cached_info.get(block_id)
        if info is not None and block_id in self._computed:
            content_hash, num_tokens_total = info
            self._evictor.add(
                block_id, content_hash, num_tokens_total, self._last_accessed[block_id]
            )
            return
        if info is not None:
            self._uncache(block_id)
        self._computed.discard(block_id)
        self._free.append(block_id)

    def _register(self, block_id: int, content_hash: bytes, num_tokens_total: int) -> None:
        self._cached[content_hash] = block_id
        self._cached_info[block_id] = (content_hash, num_tokens_total)

    def _uncache(self, block_id: int) -> None:
        content_hash, _ = self._cached_info.pop(block_id)
        del self._cached[content_hash]
        self._computed.discard(block_id)

    def _take_cached(self, block_id: int) -> None:
        """One more reference to a cached block, reviving it if it was evictable."""
        if self._refs.incr(block_id) == 1:
            self._evictor.remove(block_id)

    def _is_live(self, content_hash: bytes) -> bool:
        """Whether `content_hash` is cached in a block somebody references (a hit that needs
        no free block)."""
        block_id = self._cached.get(content_hash)
        return block_id is not None and self._refs.get(block_id) > 0

    def _handed_out(self, block: Block, block_id: int) -> Block:
        """Give `block` the allocator's view of physical block `block_id`."""
        block._block_id = block_id
        block._computed = block_id in self._computed
        block._last_accessed = self._last_accessed[block_id]
        return block

    def _rollback(self, taken: list[int]) -> None:
        for block_id in reversed(taken):
            self._release_id(block_id)

    # -- allocation ----------------------------------------------------------------------------

    def allocate_immutable_blocks(
        self, prev_block: Block | None, block_token_ids: Sequence[Sequence[int]]
    ) -> list[Block]:
        """A chain of full blocks after `prev_block`, sharing every cached one.

        Cached blocks are taken (revived if unused) before fresh ones are allocated, so that
        making room for the misses never evicts a block of this very chain. All or nothing:
        NoFreeBlocksError leaves the allocator unchanged.
        """
        prev_hash = self._check_prev(prev_block, need_hash=True)
        packed = self._pack_full_blocks(block_token_ids)
        hashes: list[bytes] = []
        for data in packed:
            prev_hash = hash_packed_tokens(prev_hash, data)
            hashes.append(prev_hash)
        needed = sum(1 for content_hash in hashes if not self._is_live(content_hash))
        if needed > self.get_num_free_blocks():
            raise self._no_free_blocks(needed)

        # -1: not assigned yet (block ids are >= 0)
        ids = [self._cached.get(content_hash, -1) for content_hash in hashes]
        taken: list[int] = []
        tokens_before = 0 if prev_block is None else prev_block.num_tokens_total
        try:
            for block_id in ids:
                if block_id >= 0:
                    self._take_cached(block_id)
                    taken.append(block_id)
            for index, content_hash in enumerate(hashes):
                if ids[index] < 0:
                    block_id = self._acquire_id()
                    taken.append(block_id)
                    total = tokens_before + (index + 1) * self._block_size
                    self._register(block_id, content_hash, total)
                    ids[index] = block_id
        except BaseException:
            self._rollback(taken)
            raise

        blocks: list[Block] = []
        prev = prev_block
        for token_ids, data, content_hash, block_id in zip(
            block_token_ids, packed, hashes, ids, strict=True
        ):
            block = self._new_block(prev, block_id)
            block._fill(token_ids, data, content_hash)
            blocks.append(self._handed_out(block, block_id))
            prev = block
        return blocks

    def promote_to_immutable_block(self, block: Block) -> int:
        """Cache the now-full `block` under its content hash, or, if an equal block is cached
        already, switch `block` to that one and release its own."""
        block_id = self._check_block(block, "promote", BlockStateError)
        content_hash = block.content_hash
        if content_hash is None:
            raise BlockStateError(
                f"cannot promote {block!r}: it has no content hash (not full, or it follows "
                "a block without one)"
            )
        cached_id = self._cached.get(content_hash)
        if cached_id is None:
            if block_id in self._cached_info:
                raise BlockStateError(f"block {block_id} is already cached as another prefix")
            self._register(block_id, content_hash, block.num_tokens_total)
            return block_id
        if cached_id != block_id:
            self._take_cached(cached_id)
            self._release_id(block_id)
            self._handed_out(block, cached_id)
        return cached_id

    # -- prefix-cache state ----------------------------------------------------------------------

    def mark_blocks_as_accessed(self, block_ids: Sequence[int], now: float) -> None:
        """Set the last access time of the in-use or evictable blocks `block_ids` to `now`,
        moving evictable ones in the LRU order. All or nothing."""
        if isinstance(now, bool) or not isinstance(now, int | float) or math.isnan(now):
            raise InvalidValueError(f"now must be a real number, got {now!r}")
        ids = self._check_ids(block_ids)
        for block_id in ids:
            if self._refs.get(block_id) == 0 and block_id not in self._evictor:
                raise BlockStateError(f"block {block_id} is free: neither in use nor cached")
        when = float(now)
        for block_id in ids:
            self._last_accessed[block_id] = when
            if block_id in self._evictor:
                self._evictor.update(block_id, when)

    def mark_blocks_as_computed(self, block_ids: Sequence[int]) -> None:
        """Record that the KV of blocks `block_ids` (in use, or already evictable) is computed.
        All or nothing."""
        ids = self._check_ids(block_ids)
        for block_id in ids:
            if self._refs.get(block_id) == 0 and block_id not in self._evictor:
                raise BlockStateError(f"block {block_id} is free: it holds no KV to mark")
        self._computed.update(ids)

    def block_is_computed(self, block_id: int) -> bool:
        """Whether `block_id` holds computed KV (every evictable block does)."""
        self._check_id(block_id)
        return block_id in self._computed

    def get_common_computed_block_ids(
        self, computed_seq_block_ids: Sequence[Sequence[int]]
    ) -> list[int]:
        """The longest common prefix of the given computed block id lists ([] if none)."""
        return common_prefix(computed_seq_block_ids)

    def find_cached_blocks_prefix(self, block_hashes: Sequence[bytes]) -> list[bytes]:
        """The leading hashes of `block_hashes` whose blocks are cached and computed here.

        A linear scan that stops at the first miss, O(hits + 1): LRU may evict a prefix block
        before its tail (they can have different access times), so the hit pattern is not
        guaranteed monotone and a binary search could report blocks that are gone.
        """
        found: list[bytes] = []
        for index, content_hash in enumerate(block_hashes):
            if not isinstance(content_hash, bytes):
                raise InvalidValueError(
                    f"block_hashes[{index}] must be bytes, got {type(content_hash).__name__}"
                )
            block_id = self._cached.get(content_hash)
            if block_id is None or block_id not in self._computed:
                break
            found.append(content_hash)
        return found

    def cached_block_id(self, content_hash: bytes) -> int | None:
        """The physical block caching prefix `content_hash` (in use or evictable), or None."""
        return self._cached.get(content_hash)

    def get_num_full_blocks_touched(self, blocks: Sequence[Block]) -> int:
        """How many physical blocks swapping `blocks` in would take: one per full block whose
        prefix is not cached in a block in use here (an evictable one still takes a slot),
        counting equal prefixes and blocks that share a physical block once."""
        groups = self._swap_in_groups(blocks, for_swap_in=False)
        return self._num_new_ids(groups, full_only=True)

    def _num_new_ids(self, groups: list[list[Block]], *, full_only: bool) -> int:
        count = 0
        seen: set[bytes] = set()
        for group in groups:
            first = group[0]
            if full_only and not first.is_full:
                continue
            content_hash = first.content_hash
            if content_hash is None:
                count += 1
            elif content_hash not in seen:
                seen.add(content_hash)
                count += not self._is_live(content_hash)
        return count

    # -- swapping --------------------------------------------------------------------------------

    def swap_in(self, blocks: Sequence[Block]) -> None:
        """A physical block here for each group of blocks that shared one where they come
        from; hashed blocks share cached blocks here too. A block marked computed makes its new
        block computed (the caller copies the bytes by the swap mapping). All or nothing."""
        groups = self._swap_in_groups(blocks)
        needed = self._num_new_ids(groups, full_only=False)
        if needed > self.get_num_free_blocks():
            raise self._no_free_blocks(needed)

        assigned = [-1] * len(groups)  # -1: not assigned yet (block ids are >= 0)
        taken: list[int] = []
        try:
            for index, group in enumerate(groups):  # hits first: never evict what we need
                cached_id = self._cached_id_of(group[0])
                if cached_id is not None:
                    for _ in group:
                        self._take_cached(cached_id)
                        taken.append(cached_id)
                    assigned[index] = cached_id
            for index, group in enumerate(groups):
                if assigned[index] >= 0:
                    continue
                first = group[0]
                cached_id = self._cached_id_of(first)  # an equal block earlier in this loop
                if cached_id is None:
                    new_id = self._acquire_id()
                    taken.append(new_id)
                    if first.content_hash is not None:
                        self._register(new_id, first.content_hash, first.num_tokens_total)
                    rest = group[1:]
                else:
                    new_id, rest = cached_id, group
                for _ in rest:
                    self._refs.incr(new_id)
                    taken.append(new_id)
                assigned[index] = new_id
        except BaseException:
            self._rollback(taken)
            raise

        for group, block_id in zip(groups, assigned, strict=True):
            if any(block.computed for block in group):
                self._computed.add(block_id)
            for block in group:
                block._allocator = self
                self._handed_out(block, block_id)

    def _cached_id_of(self, block: Block) -> int | None:
        content_hash = block.content_hash
        return None if content_hash is None else self._cached.get(content_hash)

    # -- checking --------------------------------------------------------------------------------

    def check(self) -> None:
        """Every block is exactly one of free / in use / evictable; the cache map and its
        inverse agree; evictable blocks are cached and computed; free blocks are neither."""
        problems: list[str] = []
        in_use = self._check_pool(problems)
        free = set(self._free)
        evictable = set(self._evictor.block_ids())
        if free & evictable:
            problems.append(f"blocks {sorted(free & evictable)} are free and evictable")
        if evictable & in_use.keys():
            problems.append(f"blocks {sorted(evictable & in_use.keys())} are in use and evictable")
        total = len(free) + len(evictable) + len(in_use)
        if total != self.get_num_total_blocks():
            problems.append(
                f"{len(free)} free + {len(evictable)} evictable + {len(in_use)} in use != "
                f"{self.get_num_total_blocks()} blocks"
            )
        if len(self._cached) != len(self._cached_info):
            problems.append("the cache map and its inverse differ in size")
        for content_hash, block_id in self._cached.items():
            info = self._cached_info.get(block_id)
            if info is None or info[0] != content_hash:
                problems.append(f"block {block_id}'s cache entries disagree")
        for block_id in evictable:
            if block_id not in self._computed or block_id not in self._cached_info:
                problems.append(f"evictable block {block_id} is not cached and computed")
            elif self._evictor.content_hash(block_id) != self._cached_info[block_id][0]:
                problems.append(f"evictable block {block_id} has a stale content hash")
        for block_id in free:
            if block_id in self._cached_info or block_id in self._computed:
                problems.append(f"free block {block_id} is still cached or computed")
        self._raise_problems(type(self).__name__, problems)
