"""The bookkeeping fast paths give what their plain counterparts give.

`pending_blocks` against `BlockStatus(id)`, `from_valid_ids` against the validating
constructor, the batch backend calls against `allocate_blocks` / `free` /
`get_load_store_spec`, and the policies' `getter` / `insert_many` against `get` / `insert`,
including every error path (all or nothing).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.blocks import BlockStatus, pending_blocks
from kvtier.errors import BlockStateError, DoubleFreeError, InvalidValueError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager import SlotPoolBackend
from kvtier.manager.backend import Backend
from kvtier.manager.tier import make_tier_manager
from kvtier.policies import POLICIES, CachePolicy
from kvtier.specs import (
    BlockIDsLoadStoreSpec,
    CPULoadStoreSpec,
    DiskLoadStoreSpec,
    GPULoadStoreSpec,
    Medium,
)
from kvtier.testing.policy import ready_block

SPEC_TYPES = [CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec]


def _keys(*ids: int) -> list[OffloadKey]:
    return [key_from_int(i) for i in ids]


# -- blocks and specs --------------------------------------------------------------------------


@given(st.lists(st.integers(0, 2**63 - 1), max_size=20))
def test_pending_blocks_are_what_the_constructor_makes(ids: list[int]) -> None:
    blocks = pending_blocks(ids)
    assert all(type(block) is BlockStatus for block in blocks)
    assert [(block.ref_cnt, block.block_id) for block in blocks] == [(-1, i) for i in ids]
    assert [bytes(block) for block in blocks] == [bytes(BlockStatus(i)) for i in ids]
    assert all(ctypes.sizeof(block) == ctypes.sizeof(BlockStatus) for block in blocks)


def test_pending_blocks_own_their_memory() -> None:
    first, second = pending_blocks([1, 2])
    first.ref_cnt = 5
    assert (first.ref_cnt, second.ref_cnt) == (5, -1)


@pytest.mark.parametrize("spec_type", SPEC_TYPES)
@given(ids=st.lists(st.integers(0, 2**63 - 1), max_size=20))
def test_from_valid_ids_equals_the_constructor(
    spec_type: type[BlockIDsLoadStoreSpec], ids: list[int]
) -> None:
    fast, checked = spec_type.from_valid_ids(ids), spec_type(ids)
    assert type(fast) is spec_type
    assert fast == checked and hash(fast) == hash(checked) and repr(fast) == repr(checked)
    assert fast.block_ids.dtype == np.int64 and fast.block_ids.ndim == 1
    assert not fast.block_ids.flags.writeable
    if ids:
        with pytest.raises(ValueError):
            fast.block_ids[0] = 1  # read-only: a spec is plain, shared data


def test_from_valid_ids_copies_its_input() -> None:
    ids = [3, 4]
    spec = CPULoadStoreSpec.from_valid_ids(ids)
    ids[0] = 9
    assert spec.block_ids.tolist() == [3, 4]


def test_a_fast_gpu_spec_is_one_group() -> None:
    spec = GPULoadStoreSpec.from_valid_ids([5, 6])
    assert spec.group_sizes == (2,) and spec.block_indices is None


# -- backend -----------------------------------------------------------------------------------


class _PlainBackend(SlotPoolBackend):
    """A slot pool that only has the abstract methods: the batch calls take the defaults of
    `Backend` (one `free` / `allocate_blocks` / `get_load_store_spec` at a time)."""

    free_blocks = Backend.free_blocks
    allocate_with_spec = Backend.allocate_with_spec
    evict_blocks = Backend.evict_blocks


@pytest.mark.parametrize("backend_type", [SlotPoolBackend, _PlainBackend])
def test_batch_calls_match_the_one_block_calls(backend_type: type[SlotPoolBackend]) -> None:
    batch, plain = backend_type(6, 64, Medium.CPU), SlotPoolBackend(6, 64, Medium.CPU)
    blocks, spec = batch.allocate_with_spec(_keys(0, 1, 2, 3))
    reference = plain.allocate_blocks(_keys(0, 1, 2, 3))
    assert [b.block_id for b in blocks] == [b.block_id for b in reference] == [0, 1, 2, 3]
    assert all(block.ref_cnt == -1 for block in blocks)
    assert spec == plain.get_load_store_spec(_keys(0, 1, 2, 3), reference)
    evicted = batch.evict_blocks(_keys(2, 0), [blocks[2], blocks[0]])
    assert evicted == CPULoadStoreSpec([2, 0])
    for block in (reference[2], reference[0]):
        plain.free(block)
    batch.free_blocks([blocks[3]])
    plain.free(reference[3])
    # freed slots are reused last freed first, as `free` one by one leaves them
    again, spec = batch.allocate_with_spec(_keys(4, 5, 6, 7))
    assert [b.block_id for b in again] == [
        b.block_id for b in plain.allocate_blocks(_keys(4, 5, 6, 7))
    ]
    assert spec.block_ids.tolist() == [4, 5, 3, 0]  # fresh slots first
    assert batch.get_num_free_blocks() == 1  # slot 2, freed first, is reused last


def test_batch_free_checks_every_slot_before_freeing_any() -> None:
    backend = SlotPoolBackend(4, 64, Medium.DISK)
    blocks = backend.allocate_blocks(_keys(0, 1, 2))
    backend.free(blocks[1])
    for bad, message in [
        ([blocks[0], blocks[1]], "already free"),  # one slot is free already
        ([blocks[0], blocks[2], blocks[0]], "already free"),  # the same slot twice
        ([blocks[0], BlockStatus(99)], "not a slot"),
        ([blocks[0], BlockStatus(-1)], "not a slot"),
    ]:
        with pytest.raises(DoubleFreeError, match=message):
            backend.free_blocks(bad)
        with pytest.raises(DoubleFreeError, match=message):
            backend.evict_blocks(_keys(*range(len(bad))), bad)
        assert backend.get_num_free_blocks() == 2  # nothing was freed
    backend.free_blocks([])
    assert backend.evict_blocks([], []) == DiskLoadStoreSpec([])
    backend.free_blocks([blocks[2], blocks[0]])
    assert backend.get_num_free_blocks() == 4


def test_over_allocation_with_spec_allocates_nothing() -> None:
    backend = SlotPoolBackend(2, 64, Medium.GPU)
    backend.allocate_with_spec(_keys(0))
    with pytest.raises(Exception, match="asked for 2 blocks, only 1"):
        backend.allocate_with_spec(_keys(1, 2))
    assert backend.get_num_free_blocks() == 1


# -- policies ----------------------------------------------------------------------------------


@pytest.fixture(params=sorted(POLICIES))
def policy(request: pytest.FixtureRequest) -> CachePolicy:
    return POLICIES[request.param](8)


def test_getter_is_get(policy: CachePolicy) -> None:
    get = policy.getter()
    block = ready_block(3)
    policy.insert(key_from_int(3), block)
    assert get(key_from_int(3)) is block is policy.get(key_from_int(3))
    assert get(key_from_int(4)) is None
    policy.clear()  # the getter stays valid: it reads the policy's live state
    assert get(key_from_int(3)) is None
    policy.insert(key_from_int(3), block)
    assert get(key_from_int(3)) is block


def _contents(policy: CachePolicy) -> list[tuple[OffloadKey, int, int]]:
    return sorted((key, block.block_id, block.ref_cnt) for key, block in policy.items())


def _insert_one_by_one(policy: CachePolicy, keys: Sequence[OffloadKey]) -> None:
    for i, key in enumerate(keys):
        policy.insert(key, ready_block(i))


@pytest.mark.parametrize("name", sorted(POLICIES))
@given(
    program=st.lists(
        st.tuples(st.lists(st.integers(0, 11), max_size=5, unique=True), st.integers(0, 3)),
        max_size=12,
    )
)
def test_insert_many_equals_inserting_one_by_one(
    name: str, program: list[tuple[list[int], int]]
) -> None:
    batch, single = POLICIES[name](6), POLICIES[name](6)
    for ids, evictions in program:
        keys = [key for key in _keys(*ids) if single.get(key) is None]
        for policy in (batch, single):
            policy.on_store_miss(keys)
            policy.evict(min(evictions, len(policy)))
        room = 6 - len(single)
        keys = keys[:room]
        batch.insert_many(keys, [ready_block(i) for i in range(len(keys))])
        _insert_one_by_one(single, keys)
        assert _contents(batch) == _contents(single)
        if hasattr(single, "lists"):
            assert batch.lists() == single.lists()  # type: ignore[attr-defined]
            assert batch.target_t1_size == single.target_t1_size  # type: ignore[attr-defined]
        if hasattr(single, "lru_order"):
            assert batch.lru_order() == single.lru_order()  # type: ignore[attr-defined]


def test_insert_many_is_all_or_nothing(policy: CachePolicy) -> None:
    policy.insert(key_from_int(1), ready_block(1))
    before = sorted((key, block.block_id) for key, block in policy.items())
    with pytest.raises(BlockStateError, match="already resident"):
        policy.insert_many(_keys(2, 1), [ready_block(2), ready_block(3)])
    with pytest.raises(BlockStateError, match="twice"):
        policy.insert_many(_keys(2, 2), [ready_block(2), ready_block(3)])
    with pytest.raises(InvalidValueError):
        policy.insert_many(_keys(2, 3), [ready_block(2)])
    assert sorted((key, block.block_id) for key, block in policy.items()) == before
    policy.insert_many([], [])
    assert len(policy) == 1


def test_the_base_class_defaults_serve_a_policy_without_fast_paths() -> None:
    """A policy that overrides neither `getter` nor `insert_many` gets `get` and a loop of
    `insert`, with the same checks."""
    lru = POLICIES["lru"]

    class Plain(lru):  # type: ignore[valid-type,misc]
        name = "plain"
        getter = CachePolicy.getter
        insert_many = CachePolicy.insert_many

    policy = Plain(4)
    assert policy.getter() == policy.get
    policy.insert_many(_keys(1, 2), [ready_block(1), ready_block(2)])
    assert policy.lru_order() == _keys(1, 2)
    with pytest.raises(BlockStateError):
        policy.insert_many(_keys(3, 1), [ready_block(3), ready_block(1)])
    assert policy.lru_order() == _keys(1, 2)


# -- tier --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_complete_store_of_repeated_and_mixed_keys(name: str) -> None:
    """The all-pending batch path and the general one agree on what a call makes ready."""
    tier = make_tier_manager(4, 16, "cpu", name)
    out = tier.prepare_store(_keys(1, 2, 3))
    assert out is not None
    tier.complete_store(_keys(2, 1, 2))  # pending keys, one given twice
    tier.complete_store(_keys(3, 1))  # one pending, one ready already
    tier.complete_store(_keys(1, 3))  # nothing pending: no event
    assert [(event.keys, event.removed) for event in tier.take_events()] == [
        (tuple(_keys(2, 1)), False),
        (tuple(_keys(3)), False),
    ]
    assert tier.stats().pending == 0 and tier.stats().evictable == 3
    assert all(tier.lookup(key) for key in _keys(1, 2, 3))
    tier.check()
