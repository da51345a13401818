"""`BlockAllocatorTests` (the contract every BlockAllocator honours, as a pytest mixin) and
`PrefixCachingAllocatorMachine` (a hypothesis state machine over the prefix-caching allocator).

The machine keeps the Block objects of a few sequences as its model and checks after every
step: the allocator's own `check()`, reference counts equal to the number of live Block objects
per physical block, free blocks never referenced, a double free refused without change, blocks
that share a physical block holding the same tokens and hash, the hash of a shared block never
changing while it stays shared, and every content hash equal to a recomputation from its tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.allocator import (
    Block,
    BlockAllocator,
    NullBlock,
    PrefixCachingBlockAllocator,
    hash_block_tokens,
)
from kvtier.errors import BlockStateError, DoubleFreeError, InvalidValueError, NoFreeBlocksError


def snapshot(allocator: BlockAllocator) -> tuple[int, dict[int, int]]:
    """Free count and every reference count: what an all-or-nothing failure must not change."""
    refs = {block_id: allocator.refcount(block_id) for block_id in allocator.all_block_ids}
    return allocator.get_num_free_blocks(), refs


def expected_hash(block: Block) -> bytes | None:
    """`block`'s content hash recomputed from its tokens and its predecessors' (None when the
    block is not full or follows a block without one)."""
    if not block.is_full:
        return None
    prev = block.prev_block
    if prev is None:
        return hash_block_tokens(None, block.token_ids)
    prev_hash = expected_hash(prev)
    return None if prev_hash is None else hash_block_tokens(prev_hash, block.token_ids)


class BlockAllocatorTests:
    """Subclass and implement `make_allocator(num_blocks, block_size)`. Every test ends with
    the allocator's `check()`."""

    block_size = 4

    def make_allocator(self, num_blocks: int, block_size: int) -> BlockAllocator:
        raise NotImplementedError

    def new(self, num_blocks: int = 4) -> BlockAllocator:
        return self.make_allocator(num_blocks, self.block_size)

    def tokens(self, start: int) -> list[int]:
        """One full block of distinct token ids starting at `start`."""
        return list(range(start, start + self.block_size))

    # -- Block -------------------------------------------------------------------------------

    def test_mutable_block_starts_empty_and_fills(self) -> None:
        allocator = self.new()
        block = allocator.allocate_mutable_block(None)
        assert block.block_id is not None and block.num_token_ids == 0
        # compared as tuples: asserting `not block.is_full` would make mypy narrow the property
        assert (block.num_empty_slots, block.is_full) == (self.block_size, False)
        assert (block.content_hash, block.prev_block) == (None, None)
        block.append_token_ids([7])
        assert block.token_ids == (7,) and block.num_empty_slots == self.block_size - 1
        assert block.num_tokens_total == 1, (
            f"block.num_tokens_total: got {block.num_tokens_total!r}, expected {1!r}"
        )
        block.append_token_ids(list(range(self.block_size - 1)))
        assert block.is_full and block.num_empty_slots == 0
        assert block.content_hash == hash_block_tokens(None, block.token_ids)
        allocator.check()

    def test_num_tokens_total_counts_the_prefix(self) -> None:
        allocator = self.new()
        first = allocator.allocate_immutable_block(None, self.tokens(0))
        second = allocator.allocate_mutable_block(first)
        second.append_token_ids([1, 2])
        assert second.prev_block is first
        assert second.num_tokens_total == self.block_size + 2, (
            f"num_tokens_total: got {second.num_tokens_total!r}, expected {self.block_size + 2!r}"
        )

    def test_append_rejects_bad_token_ids_and_changes_nothing(self) -> None:
        allocator = self.new()
        block = allocator.allocate_mutable_block(None)
        block.append_token_ids([5])
        with pytest.raises(InvalidValueError, match="empty slots"):
            block.append_token_ids([1] * self.block_size)
        with pytest.raises(InvalidValueError, match=r"token_ids\[1\].*-3"):
            block.append_token_ids([1, -3])
        with pytest.raises(InvalidValueError, match=r"token_ids\[0\] must be an int"):
            block.append_token_ids(["x"])  # type: ignore[list-item]
        with pytest.raises(InvalidValueError, match="must be an int"):
            block.append_token_ids([1.5])  # type: ignore[list-item]
        assert block.token_ids == (5,)
        block.append_token_ids([])
        assert block.token_ids == (5,)
        allocator.check()

    def test_computed_and_last_accessed_are_settable(self) -> None:
        block = self.new().allocate_mutable_block(None)
        assert block.computed is False and block.last_accessed == -1.0
        block.computed = True
        block.last_accessed = 3
        assert block.computed is True and block.last_accessed == 3.0

    def test_equal_prefixes_get_equal_hashes(self) -> None:
        allocator = self.new(8)
        a = allocator.allocate_immutable_blocks(None, [self.tokens(0), self.tokens(10)])
        b = allocator.allocate_immutable_blocks(None, [self.tokens(0), self.tokens(10)])
        c = allocator.allocate_immutable_blocks(None, [self.tokens(1), self.tokens(10)])
        assert [x.content_hash for x in a] == [x.content_hash for x in b]
        assert a[1].content_hash != c[1].content_hash  # same tokens, different prefix
        assert all(x.content_hash == expected_hash(x) for x in a + c)

    # -- allocation --------------------------------------------------------------------------

    def test_immutable_block_needs_exactly_one_full_block(self) -> None:
        allocator = self.new()
        before = snapshot(allocator)
        with pytest.raises(InvalidValueError, match=r"block_token_ids\[1\] has 1"):
            allocator.allocate_immutable_blocks(None, [self.tokens(0), [1]])
        with pytest.raises(InvalidValueError, match="exactly"):
            allocator.allocate_immutable_block(None, [])
        assert snapshot(allocator) == before

    def test_immutable_block_must_follow_a_hashed_block(self) -> None:
        allocator = self.new()
        partial = allocator.allocate_mutable_block(None)
        with pytest.raises(BlockStateError, match="no content hash"):
            allocator.allocate_immutable_block(partial, self.tokens(0))
        with pytest.raises(InvalidValueError, match="prev_block must be a Block"):
            allocator.allocate_mutable_block("block")  # type: ignore[arg-type]

    def test_allocate_immutable_blocks_chains_them(self) -> None:
        allocator = self.new()
        blocks = allocator.allocate_immutable_blocks(None, [self.tokens(0), self.tokens(9)])
        assert blocks[0].prev_block is None and blocks[1].prev_block is blocks[0]
        assert all(block.is_full for block in blocks)
        assert blocks[1].num_tokens_total == 2 * self.block_size
        assert allocator.get_num_free_blocks() == 2
        allocator.check()

    def test_no_free_blocks_is_all_or_nothing(self) -> None:
        allocator = self.new(2)
        allocator.allocate_mutable_block(None)
        before = snapshot(allocator)
        with pytest.raises(NoFreeBlocksError, match=r"2 block.*1 free"):
            allocator.allocate_immutable_blocks(None, [self.tokens(0), self.tokens(5)])
        assert snapshot(allocator) == before
        allocator.allocate_mutable_block(None)
        with pytest.raises(NoFreeBlocksError):
            allocator.allocate_mutable_block(None)
        allocator.check()

    def test_construction_is_validated(self) -> None:
        with pytest.raises(InvalidValueError, match="block_size"):
            self.make_allocator(4, 0)
        with pytest.raises(InvalidValueError, match="num_blocks"):
            self.make_allocator(-1, 4)

    # -- free, fork, reference counts ----------------------------------------------------------

    def test_free_returns_the_block(self) -> None:
        allocator = self.new(2)
        block = allocator.allocate_mutable_block(None)
        block_id = block.block_id
        assert block_id is not None and allocator.refcount(block_id) == 1
        allocator.free(block)
        assert block.block_id is None and allocator.refcount(block_id) == 0
        assert allocator.get_num_free_blocks() == 2
        allocator.check()

    def test_double_free_raises_and_changes_nothing(self) -> None:
        allocator = self.new(2)
        block = allocator.allocate_mutable_block(None)
        allocator.free(block)
        before = snapshot(allocator)
        with pytest.raises(DoubleFreeError, match="holds no physical block"):
            allocator.free(block)
        assert snapshot(allocator) == before

    def test_free_rejects_a_block_of_another_allocator(self) -> None:
        allocator, other = self.new(), self.new()
        block = other.allocate_mutable_block(None)
        with pytest.raises(InvalidValueError, match="another allocator"):
            allocator.free(block)
        with pytest.raises(InvalidValueError, match="not a Block"):
            allocator.free("block")  # type: ignore[arg-type]

    def test_free_block_id_drops_one_reference(self) -> None:
        allocator = self.new(2)
        block = allocator.allocate_mutable_block(None)
        assert block.block_id is not None
        allocator.free_block_id(block.block_id)
        assert allocator.refcount(block.block_id) == 0
        with pytest.raises(DoubleFreeError):
            allocator.free_block_id(block.block_id)
        with pytest.raises(InvalidValueError, match="not in this pool"):
            allocator.free_block_id(99)

    def test_fork_shares_every_block_of_the_chain(self) -> None:
        allocator = self.new()
        first = allocator.allocate_immutable_block(None, self.tokens(0))
        last = allocator.allocate_mutable_block(first)
        last.append_token_ids([1])
        forked = allocator.fork(last)
        assert [b.block_id for b in forked] == [first.block_id, last.block_id]
        assert [b.token_ids for b in forked] == [first.token_ids, last.token_ids]
        assert forked[1].prev_block is forked[0] and forked[0] is not first
        assert forked[0].content_hash == first.content_hash
        assert all(allocator.refcount(b.block_id) == 2 for b in forked if b.block_id is not None)
        for block in [first, last, *forked]:
            allocator.free(block)
        assert allocator.get_num_free_blocks() == 4
        allocator.check()

    def test_fork_of_a_freed_block_raises(self) -> None:
        allocator = self.new()
        block = allocator.allocate_mutable_block(None)
        allocator.free(block)
        with pytest.raises(BlockStateError, match="holds no physical block"):
            allocator.fork(block)

    # -- copy-on-write ---------------------------------------------------------------------------

    def test_copy_on_write_after_fork(self) -> None:
        allocator = self.new()
        block = allocator.allocate_mutable_block(None)
        block.append_token_ids([1])
        (twin,) = allocator.fork(block)
        shared = block.block_id
        assert shared is not None
        twin.append_token_ids([2])
        assert twin.block_id not in (None, shared)
        assert allocator.clear_copy_on_writes() == [(shared, twin.block_id)]
        assert allocator.clear_copy_on_writes() == []
        assert block.token_ids == (1,) and twin.token_ids == (1, 2)
        assert allocator.refcount(shared) == 1
        block.append_token_ids([3])  # the only reference now: no copy
        assert block.block_id == shared and allocator.clear_copy_on_writes() == []
        allocator.check()

    def test_copy_on_write_without_a_free_block_changes_nothing(self) -> None:
        allocator = self.new(1)
        block = allocator.allocate_mutable_block(None)
        (twin,) = allocator.fork(block)
        before = snapshot(allocator)
        with pytest.raises(NoFreeBlocksError):
            twin.append_token_ids([1])
        assert twin.token_ids == () and twin.block_id == block.block_id
        assert snapshot(allocator) == before and allocator.clear_copy_on_writes() == []

    def test_cow_block_if_not_appendable_called_directly(self) -> None:
        allocator = self.new()
        block = allocator.allocate_mutable_block(None)
        assert allocator.cow_block_if_not_appendable(block) == block.block_id
        (twin,) = allocator.fork(block)
        new_id = allocator.cow_block_if_not_appendable(twin)
        assert twin.block_id == new_id != block.block_id
        allocator.check()

    def test_promote_needs_a_hashed_block(self) -> None:
        allocator = self.new()
        block = allocator.allocate_mutable_block(None)
        with pytest.raises(BlockStateError, match="no content hash"):
            allocator.promote_to_immutable_block(block)
        full = allocator.allocate_immutable_block(None, self.tokens(0))
        assert allocator.promote_to_immutable_block(full) == full.block_id

    # -- the null block ----------------------------------------------------------------------------

    def test_null_block_is_unique_and_never_freed(self) -> None:
        allocator = self.new(2)
        null = allocator.allocate_or_get_null_block()
        assert isinstance(null, NullBlock) and null.block_id is not None
        assert allocator.allocate_or_get_null_block() is null
        assert allocator.get_num_free_blocks() == 1
        allocator.free(null)
        assert null.block_id is not None and allocator.get_num_free_blocks() == 1
        with pytest.raises(BlockStateError, match="null block"):
            null.append_token_ids([1])
        with pytest.raises(BlockStateError, match="null block"):
            allocator.fork(null)
        with pytest.raises(BlockStateError, match="null block"):
            allocator.swap_out([null])
        with pytest.raises(BlockStateError, match="null block"):
            allocator.free_block_id(null.block_id)
        allocator.check()

    # -- ids and capacity --------------------------------------------------------------------------

    def test_ids_and_physical_indices(self) -> None:
        allocator = self.new(3)
        assert allocator.get_num_total_blocks() == 3
        assert allocator.all_block_ids == frozenset(range(3)), (
            f"all_block_ids: got {allocator.all_block_ids!r}, expected {frozenset(range(3))!r}"
        )
        assert [allocator.get_physical_block_id(i) for i in range(3)] == [0, 1, 2]
        with pytest.raises(InvalidValueError, match="not in this pool"):
            allocator.get_physical_block_id(3)
        with pytest.raises(InvalidValueError, match="not in this pool"):
            allocator.refcount(7)

    def test_mark_methods_reject_unknown_ids(self) -> None:
        allocator = self.new()
        with pytest.raises(InvalidValueError, match="99"):
            allocator.mark_blocks_as_accessed([99], 1.0)
        with pytest.raises(InvalidValueError, match="99"):
            allocator.mark_blocks_as_computed([99])
        with pytest.raises(InvalidValueError, match="99"):
            allocator.block_is_computed(99)

    # -- swapping ------------------------------------------------------------------------------

    def test_swap_out_then_in_keeps_the_contents(self) -> None:
        allocator = self.new()
        blocks = allocator.allocate_immutable_blocks(None, [self.tokens(0), self.tokens(4)])
        tail = allocator.allocate_mutable_block(blocks[-1])
        tail.append_token_ids([9])
        chain = [*blocks, tail]
        hashes = [b.content_hash for b in chain]
        allocator.swap_out(chain)
        assert all(b.block_id is None for b in chain)
        allocator.swap_in(chain)
        assert all(b.block_id is not None and b.allocator is allocator for b in chain)
        assert [b.content_hash for b in chain] == hashes and tail.token_ids == (9,)
        allocator.check()

    def test_swap_in_keeps_forks_sharing(self) -> None:
        source, target = self.new(), self.new()
        block = source.allocate_mutable_block(None)
        block.append_token_ids([1])
        (twin,) = source.fork(block)
        assert target.get_num_full_blocks_touched([block, twin]) == 0  # not full
        target.swap_in([block, twin])
        assert block.block_id is not None and block.block_id == twin.block_id
        assert target.refcount(block.block_id) == 2
        target.check()

    def test_swap_in_is_all_or_nothing(self) -> None:
        source, target = self.new(), self.new(1)
        blocks = source.allocate_immutable_blocks(None, [self.tokens(0), self.tokens(4)])
        ids = [b.block_id for b in blocks]
        assert target.get_num_full_blocks_touched(blocks) == 2
        before = snapshot(target)
        with pytest.raises(NoFreeBlocksError):
            target.swap_in(blocks)
        assert snapshot(target) == before
        assert [b.block_id for b in blocks] == ids and all(b.allocator is source for b in blocks)
        with pytest.raises(BlockStateError, match="already holds"):
            source.swap_in(blocks)

    def test_swap_out_validates_before_releasing(self) -> None:
        allocator = self.new()
        block = allocator.allocate_mutable_block(None)
        before = snapshot(allocator)
        with pytest.raises(InvalidValueError, match="twice"):
            allocator.swap_out([block, block])
        assert snapshot(allocator) == before


class PrefixCachingAllocatorMachine(RuleBasedStateMachine):
    """Random sequences over a 3-token alphabet (so prefixes are shared often) on a small
    prefix-caching allocator; see the module docstring for what is checked."""

    num_blocks = 8
    block_size = 2

    def __init__(self) -> None:
        super().__init__()
        self.allocator = PrefixCachingBlockAllocator(self.num_blocks, self.block_size)
        self.seqs: dict[int, list[Block]] = {}
        self.freed: list[Block] = []
        self.next_seq = 0
        self.clock = 0.0
        self.shared_hash: dict[int, bytes | None] = {}

    # -- helpers ----------------------------------------------------------------------------

    def live_blocks(self) -> list[Block]:
        return [block for blocks in self.seqs.values() for block in blocks]

    def _allocate(self, token_ids: Sequence[int]) -> list[Block]:
        size = self.block_size
        full = len(token_ids) // size
        chunks = [token_ids[i * size : (i + 1) * size] for i in range(full)]
        blocks = self.allocator.allocate_immutable_blocks(None, chunks)
        rest = token_ids[full * size :]
        if rest or not blocks:
            try:
                tail = self.allocator.allocate_mutable_block(blocks[-1] if blocks else None)
            except NoFreeBlocksError:
                for block in blocks:
                    self.allocator.free(block)
                raise
            tail.append_token_ids(rest)
            blocks.append(tail)
        return blocks

    # -- rules ------------------------------------------------------------------------------

    @rule(token_ids=st.lists(st.integers(0, 2), max_size=7))
    def new_sequence(self, token_ids: list[int]) -> None:
        before = snapshot(self.allocator)
        try:
            blocks = self._allocate(token_ids)
        except NoFreeBlocksError:
            assert snapshot(self.allocator)[1] == before[1], "a failed allocation leaked"
            return
        assert [t for b in blocks for t in b.token_ids] == token_ids
        self.seqs[self.next_seq] = blocks
        self.next_seq += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), token_ids=st.lists(st.integers(0, 2), min_size=1, max_size=3))
    def append(self, data: st.DataObject, token_ids: list[int]) -> None:
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        blocks = self.seqs[seq]
        for token in token_ids:
            last = blocks[-1]
            before = snapshot(self.allocator)
            tokens_before = last.token_ids
            try:
                if last.is_full:
                    new = self.allocator.allocate_mutable_block(last)
                    blocks.append(new)
                    last = new
                last.append_token_ids([token])
            except NoFreeBlocksError:
                assert last.token_ids == tokens_before, "a failed append changed the block"
                assert snapshot(self.allocator)[1] == before[1], "a failed append leaked"
                return

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        self.seqs[self.next_seq] = self.allocator.fork(self.seqs[seq][-1])
        self.next_seq += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free_sequence(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        blocks = self.seqs.pop(seq)
        for block in reversed(blocks):
            self.allocator.free(block)
        self.freed.extend(blocks)
        del self.freed[:-10]

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def double_free_is_refused(self, data: st.DataObject) -> None:
        block = data.draw(st.sampled_from(self.freed))
        before = snapshot(self.allocator)
        try:
            self.allocator.free(block)
        except DoubleFreeError:
            pass
        else:
            raise AssertionError(f"freeing {block!r} twice was accepted")
        assert snapshot(self.allocator) == before

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def mark_computed_and_accessed(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        ids = [b.block_id for b in self.seqs[seq] if b.block_id is not None]
        self.clock += data.draw(st.sampled_from([0.0, 1.0]))  # ties happen
        self.allocator.mark_blocks_as_computed(ids)
        self.allocator.mark_blocks_as_accessed(ids, self.clock)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def swap_out_and_in(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        blocks = self.seqs[seq]
        hashes = [b.content_hash for b in blocks]
        self.allocator.swap_out(blocks)
        try:
            self.allocator.swap_in(blocks)
        except NoFreeBlocksError:
            del self.seqs[seq]  # detached: they hold no block, nothing to free
            return
        assert [b.content_hash for b in blocks] == hashes

    @rule(token_ids=st.lists(st.integers(0, 2), max_size=8))
    def find_cached_prefix(self, token_ids: list[int]) -> None:
        size = self.block_size
        hashes: list[bytes] = []
        prev: bytes | None = None
        for start in range(0, len(token_ids) - size + 1, size):
            prev = hash_block_tokens(prev, token_ids[start : start + size])
            hashes.append(prev)
        found = self.allocator.find_cached_blocks_prefix(hashes)
        assert found == hashes[: len(found)], (
            f"found: got {found!r}, expected {hashes[: len(found)]!r}"
        )
        for content_hash in found:
            block_id = self.allocator.cached_block_id(content_hash)
            assert block_id is not None and self.allocator.block_is_computed(block_id)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def bookkeeping_is_consistent(self) -> None:
        self.allocator.check()

    @invariant()
    def refcounts_are_exact(self) -> None:
        live = Counter(b.block_id for b in self.live_blocks() if b.block_id is not None)
        for block_id in self.allocator.all_block_ids:
            assert self.allocator.refcount(block_id) == live.get(block_id, 0), block_id
        free = self.allocator.get_num_free_blocks()
        assert free == self.num_blocks - len(live), "a block is both free and in use"

    @invariant()
    def shared_blocks_agree_and_keep_their_hash(self) -> None:
        holders: dict[int, list[Block]] = {}
        for block in self.live_blocks():
            if block.block_id is not None:
                holders.setdefault(block.block_id, []).append(block)
        shared_now: dict[int, bytes | None] = {}
        for block_id, blocks in holders.items():
            assert len({b.token_ids for b in blocks}) == 1, f"block {block_id}: tokens differ"
            assert len({b.content_hash for b in blocks}) == 1, f"block {block_id}: hashes differ"
            if len(blocks) > 1:
                shared_now[block_id] = blocks[0].content_hash
        for block_id, content_hash in shared_now.items():
            if block_id in self.shared_hash:
                assert self.shared_hash[block_id] == content_hash, (
                    f"block {block_id}'s hash changed while shared"
                )
        self.shared_hash = shared_now

    @invariant()
    def hashes_are_right_and_cached(self) -> None:
        for block in self.live_blocks():
            assert block.content_hash == expected_hash(block), (
                f"block.content_hash: got {block.content_hash!r}, expected {expected_hash(block)!r}"
            )
            if block.content_hash is not None and block.block_id is not None:
                assert self.allocator.cached_block_id(block.content_hash) == block.block_id
