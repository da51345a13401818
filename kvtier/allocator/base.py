"""`PooledBlockAllocator`: what the naive and the prefix-caching allocators share.

A pool of physical block ids, a free list, reference counts, the copy-on-write log, the null
block, fork, free and swap-out. Subclasses decide what happens to a block id that loses its
last reference (back to the free list, or into the evictor) and where a new id comes from
when the free list is empty (nowhere, or the evictor).
"""

from __future__ import annotations

from abc import abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence

from kvtier.allocator.block import Block, NullBlock
from kvtier.allocator.hashing import pack_token_ids
from kvtier.allocator.interfaces import BlockAllocator
from kvtier.allocator.refcount import CopyOnWriteTracker, RefCounter
from kvtier.errors import BlockStateError, DoubleFreeError, InvalidValueError, NoFreeBlocksError


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def common_prefix(lists: Sequence[Sequence[int]]) -> list[int]:
    """The longest list that starts every list of `lists` ([] for no lists). O(total size)."""
    if not lists:
        return []
    prefix = list(lists[0])
    for ids in lists[1:]:
        limit = min(len(prefix), len(ids))
        end = 0
        while end < limit and prefix[end] == ids[end]:
            end += 1
        del prefix[end:]
    return prefix


class PooledBlockAllocator(BlockAllocator):
    """Shared machinery of kvtier's block allocators (not usable on its own).

    `num_blocks` physical blocks of `block_size` tokens, with global ids `block_ids` (default
    `range(num_blocks)`; a device-aware allocator gives each pool a disjoint range).
    """

    def __init__(
        self, num_blocks: int, block_size: int, block_ids: Iterable[int] | None = None
    ) -> None:
        _check_count("num_blocks", num_blocks, 0)
        self._block_size = _check_count("block_size", block_size, 1)
        ids = list(range(num_blocks)) if block_ids is None else list(block_ids)
        for block_id in ids:
            _check_count("every block id", block_id, 0)
        if len(ids) != num_blocks:
            raise InvalidValueError(f"got {len(ids)} block ids for num_blocks={num_blocks}")
        if len(set(ids)) != len(ids):
            raise InvalidValueError("block_ids contains duplicates")
        self._all_block_ids = frozenset(ids)
        self._index_of = {block_id: index for index, block_id in enumerate(sorted(ids))}
        self._free: deque[int] = deque(ids)
        self._refs = RefCounter(ids)
        self._cows = CopyOnWriteTracker()
        self._null_block: NullBlock | None = None

    # -- what subclasses decide ----------------------------------------------------------------

    def _reclaim_id(self) -> int:
        """An unreferenced id to reuse when the free list is empty; NoFreeBlocksError if none.
        Called with nothing changed yet; must leave the id unreferenced and off every list."""
        raise self._no_free_blocks(1)

    @abstractmethod
    def _on_unreferenced(self, block_id: int) -> None:
        """`block_id` just lost its last reference: put it where it can be reused."""

    def _on_acquired(self, block_id: int) -> None:
        """`block_id` was just taken for new contents (hook for per-block trackers)."""

    # -- allocation ----------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    def allocate_mutable_block(self, prev_block: Block | None) -> Block:
        """A new empty block after `prev_block`. NoFreeBlocksError when none is free."""
        self._check_prev(prev_block, need_hash=False)
        block_id = self._acquire_id()
        return self._new_block(prev_block, block_id)

    def allocate_immutable_block(self, prev_block: Block | None, token_ids: Sequence[int]) -> Block:
        """A full block of `token_ids` after `prev_block` (see `allocate_immutable_blocks`)."""
        return self.allocate_immutable_blocks(prev_block, [token_ids])[0]

    def allocate_or_get_null_block(self) -> Block:
        """The one null block of this allocator, allocated on first use; never freed."""
        if self._null_block is None:
            block_id = self._acquire_id()
            self._null_block = NullBlock(self, self._block_size, None, block_id)
        return self._null_block

    def _acquire_id(self) -> int:
        """Take an id for new contents, with one reference."""
        block_id = self._free.popleft() if self._free else self._reclaim_id()
        self._refs.incr(block_id)
        self._on_acquired(block_id)
        return block_id

    def _release_id(self, block_id: int) -> None:
        """Drop one reference; hand the id to `_on_unreferenced` when it was the last."""
        if self._refs.decr(block_id) == 0:
            self._on_unreferenced(block_id)

    def _new_block(self, prev_block: Block | None, block_id: int) -> Block:
        return Block(self, self._block_size, prev_block, block_id)

    def _pack_full_blocks(self, block_token_ids: Sequence[Sequence[int]]) -> list[bytes]:
        """Validate that each entry is exactly one full block of token ids; pack them."""
        packed: list[bytes] = []
        for index, token_ids in enumerate(block_token_ids):
            if len(token_ids) != self._block_size:
                raise InvalidValueError(
                    f"an immutable block holds exactly block_size={self._block_size} token "
                    f"ids; block_token_ids[{index}] has {len(token_ids)}"
                )
            packed.append(pack_token_ids(token_ids))
        return packed

    def _no_free_blocks(self, wanted: int) -> NoFreeBlocksError:
        return NoFreeBlocksError(
            f"{type(self).__name__}: {wanted} block(s) wanted, "
            f"{self.get_num_free_blocks()} free or evictable of {self.get_num_total_blocks()}"
        )

    # -- references ----------------------------------------------------------------------------

    def free(self, block: Block) -> None:
        """Drop `block`'s reference; the block then holds no physical block. A no-op for the
        null block; DoubleFreeError for a block that holds none (nothing changes)."""
        if block is self._null_block:
            return
        block_id = self._check_block(block, "free", DoubleFreeError)
        self._release_id(block_id)
        block._block_id = None

    def free_block_id(self, block_id: int) -> None:
        """Drop one reference to `block_id` (DoubleFreeError if it has none)."""
        self._check_id(block_id)
        if self._null_block is not None and block_id == self._null_block.block_id:
            raise BlockStateError(f"block {block_id} is the null block, which is never freed")
        self._release_id(block_id)

    def fork(self, last_block: Block) -> list[Block]:
        """New Block objects for the chain ending at `last_block`, sharing its physical blocks.
        The null block, where it appears in the chain, is shared as is (it is not counted)."""
        if last_block is self._null_block:
            raise BlockStateError("the null block cannot be forked")
        chain = self._chain(last_block)
        ids = [
            None if block is self._null_block else self._check_block(block, "fork", BlockStateError)
            for block in chain
        ]
        forked: list[Block] = []
        prev: Block | None = None
        for block, block_id in zip(chain, ids, strict=True):
            if block_id is None:  # the null block
                twin: Block = block
            else:
                self._refs.incr(block_id)
                twin = block._clone(prev)
            forked.append(twin)
            prev = twin
        return forked

    def refcount(self, block_id: int) -> int:
        """How many Block objects reference `block_id`."""
        return self._refs.get(block_id)

    @staticmethod
    def _chain(last_block: Block) -> list[Block]:
        """Every block from the first of `last_block`'s sequence to `last_block` (iterative, so
        a long sequence cannot exhaust the stack)."""
        if not isinstance(last_block, Block):
            raise InvalidValueError(f"expected a Block, got {type(last_block).__name__}")
        chain: list[Block] = []
        block: Block | None = last_block
        while block is not None:
            chain.append(block)
            block = block.prev_block
        chain.reverse()
        return chain

    # -- capacity and ids ------------------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        """Blocks on the free list (subclasses add evictable ones)."""
        return len(self._free)

    def get_num_total_blocks(self) -> int:
        """Blocks in the pool."""
        return len(self._all_block_ids)

    def get_physical_block_id(self, absolute_id: int) -> int:
        """The zero-based rank of `absolute_id` among this pool's ids. O(1)."""
        try:
            return self._index_of[absolute_id]
        except (KeyError, TypeError):
            raise InvalidValueError(f"block id {absolute_id!r} is not in this pool") from None

    @property
    def all_block_ids(self) -> frozenset[int]:
        """Every global block id of this pool."""
        return self._all_block_ids

    # -- copy-on-write ---------------------------------------------------------------------------

    def cow_block_if_not_appendable(self, block: Block) -> int:
        """`block`'s own physical block if it is the only reference, else a fresh one (taken
        before the shared one is released, so NoFreeBlocksError changes nothing)."""
        src = self._check_block(block, "copy-on-write", BlockStateError)
        if self._refs.get(src) <= 1:
            return src
        dst = self._acquire_id()
        self._refs.decr(src)  # stays >= 1: others share it
        self._cows.record(src, dst)
        block._block_id = dst
        return dst

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """The (source, destination) pairs recorded since the last call; forgets them."""
        return self._cows.clear()

    # -- swapping --------------------------------------------------------------------------------

    def swap_out(self, blocks: Sequence[Block]) -> None:
        """Release each block's physical block, keeping the Block objects (tokens, hash, and
        `computed` as this allocator knew it) for `swap_in` elsewhere. All or nothing."""
        ids = self._check_distinct_blocks(blocks, "swap out")
        for block, block_id in zip(blocks, ids, strict=True):
            block._computed = block._computed or self.block_is_computed(block_id)
            self._release_id(block_id)
            block._block_id = None

    def _check_distinct_blocks(self, blocks: Sequence[Block], action: str) -> list[int]:
        ids: list[int] = []
        seen: set[int] = set()
        for block in blocks:
            if block is self._null_block:
                raise BlockStateError(f"cannot {action} the null block")
            ids.append(self._check_block(block, action, BlockStateError))
            if id(block) in seen:
                raise InvalidValueError(f"{block!r} appears twice in the blocks to {action}")
            seen.add(id(block))
        return ids

    def _swap_in_groups(
        self, blocks: Sequence[Block], *, for_swap_in: bool = True
    ) -> list[list[Block]]:
        """`blocks` grouped by the physical block they share where they come from (a block
        that holds none is a group of its own), in first-appearance order. Validates them;
        `for_swap_in` also refuses blocks that already hold a block of this allocator."""
        groups: dict[object, list[Block]] = {}
        seen: set[int] = set()
        for block in blocks:
            if not isinstance(block, Block):
                raise InvalidValueError(f"expected a Block, got {type(block).__name__}")
            if isinstance(block, NullBlock):
                raise BlockStateError("a null block cannot be swapped in")
            if for_swap_in and block._allocator is self and block._block_id is not None:
                raise BlockStateError(f"{block!r} already holds a block of this allocator")
            if id(block) in seen:
                raise InvalidValueError(f"{block!r} appears twice in the blocks to swap in")
            seen.add(id(block))
            source: object = (
                ("object", id(block))
                if block._block_id is None
                else ("shared", id(block._allocator), block._block_id)
            )
            groups.setdefault(source, []).append(block)
        return list(groups.values())

    # -- validation ------------------------------------------------------------------------------

    def _check_id(self, block_id: int) -> None:
        if block_id not in self._refs:
            raise InvalidValueError(f"block id {block_id!r} is not in this pool")

    def _check_block(self, block: Block, action: str, unallocated: type[Exception]) -> int:
        """`block`'s physical id, after checking it is a Block of this allocator holding one;
        `unallocated` is raised (naming the block) when it holds none."""
        if not isinstance(block, Block):
            raise InvalidValueError(f"cannot {action} a {type(block).__name__}: not a Block")
        if block._allocator is not self:
            raise InvalidValueError(f"cannot {action} {block!r}: it belongs to another allocator")
        if block._block_id is None:
            raise unallocated(
                f"cannot {action} {block!r}: it holds no physical block (freed or swapped out)"
            )
        return block._block_id

    def _check_prev(self, prev_block: Block | None, *, need_hash: bool) -> bytes | None:
        """Validate `prev_block`; returns its content hash. With `need_hash`, a prev_block
        without one (not full, or after such a block) is a BlockStateError."""
        if prev_block is None:
            return None
        if not isinstance(prev_block, Block):
            raise InvalidValueError(
                f"prev_block must be a Block or None, got {type(prev_block).__name__}"
            )
        if need_hash and prev_block.content_hash is None:
            raise BlockStateError(
                f"an immutable block must follow a hashed full block; prev_block {prev_block!r} "
                "has no content hash"
            )
        return prev_block.content_hash

    def _check_ids(self, block_ids: Sequence[int]) -> list[int]:
        ids = list(block_ids)
        for block_id in ids:
            self._check_id(block_id)
        return ids

    def _check_pool(self, problems: list[str]) -> dict[int, int]:
        """Base invariants (appended to `problems`); returns the in-use ids with counts."""
        in_use = self._refs.in_use()
        free = list(self._free)
        if len(set(free)) != len(free):
            problems.append("a block id is on the free list twice")
        both = set(free) & in_use.keys()
        if both:
            problems.append(f"blocks {sorted(both)} are both free and in use")
        if not set(free) <= self._all_block_ids:
            problems.append("the free list holds an id not in the pool")
        if self._null_block is not None:
            null_id = self._null_block.block_id
            if null_id is None or in_use.get(null_id, 0) < 1:
                problems.append(f"the null block (block {null_id}) lost its reference")
        return in_use

    @staticmethod
    def _raise_problems(name: str, problems: list[str]) -> None:
        if problems:
            raise BlockStateError(f"{name}: " + "; ".join(problems))
