"""Keys, BlockStatus, LoadStoreSpecs and the slot-pool backend."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.blocks import BlockStatus
from kvtier.errors import (
    AllocationError,
    DoubleFreeError,
    InvalidValueError,
    KeyFormatError,
    KvtierError,
    SpecError,
)
from kvtier.keys import (
    get_offload_block_hash,
    get_offload_group_idx,
    key_from_int,
    make_offload_key,
    split_offload_key,
)
from kvtier.manager import SlotPoolBackend
from kvtier.specs import (
    CPULoadStoreSpec,
    DiskLoadStoreSpec,
    GPULoadStoreSpec,
    LoadStoreSpec,
    Medium,
)

# -- keys --------------------------------------------------------------------------------------


@given(st.binary(max_size=40), st.integers(0, 2**32 - 1))
def test_offload_key_round_trips(block_hash: bytes, group_idx: int) -> None:
    key = make_offload_key(block_hash, group_idx)
    assert split_offload_key(key) == (block_hash, group_idx)
    assert get_offload_block_hash(key) == block_hash
    assert get_offload_group_idx(key) == group_idx


def test_offload_key_layout_is_hash_then_big_endian_group() -> None:
    assert make_offload_key(b"\xab\xcd", 258) == b"\xab\xcd\x00\x00\x01\x02"
    assert key_from_int(5) == b"\x00" * 7 + b"\x05" + b"\x00" * 4


@pytest.mark.parametrize(
    ("block_hash", "group_idx"),
    [("abc", 0), (b"x", -1), (b"x", 2**32), (b"x", 1.0), (b"x", True)],
)
def test_bad_key_parts_are_rejected(block_hash: object, group_idx: object) -> None:
    with pytest.raises(KeyFormatError):
        make_offload_key(block_hash, group_idx)  # type: ignore[arg-type]


def test_split_rejects_short_or_non_bytes_keys() -> None:
    with pytest.raises(KeyFormatError):
        split_offload_key(b"abc")  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        split_offload_key("abcdef")  # type: ignore[arg-type]
    with pytest.raises(KeyFormatError):
        key_from_int(-1)


# -- BlockStatus -------------------------------------------------------------------------------


def test_block_status_layout_and_lifecycle() -> None:
    assert [name for name, _ in BlockStatus._fields_] == ["ref_cnt", "block_id"]
    assert BlockStatus._fields_[0][1] is ctypes.c_int32
    assert BlockStatus._fields_[1][1] is ctypes.c_int64
    block = BlockStatus(42)
    assert (block.ref_cnt, block.block_id, block.is_ready) == (-1, 42, False)
    block.ref_cnt = 0
    assert block.is_ready
    block.ref_cnt = 3
    assert block.is_ready
    assert "block_id=42" in repr(block)


# -- specs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec_type", "medium"),
    [(GPULoadStoreSpec, Medium.GPU), (CPULoadStoreSpec, Medium.CPU), (DiskLoadStoreSpec, "disk")],
)
def test_spec_medium_and_block_ids(spec_type: type, medium: str) -> None:
    spec = spec_type([3, 1, 2])
    assert isinstance(spec, LoadStoreSpec)
    assert spec.medium() == medium
    assert spec.block_ids.dtype == np.int64
    assert spec.block_ids.tolist() == [3, 1, 2]
    assert len(spec) == 3
    with pytest.raises(ValueError):
        spec.block_ids[0] = 9  # read-only: a spec is plain, shared data


def test_spec_accepts_arrays_ranges_and_empty() -> None:
    assert CPULoadStoreSpec(np.arange(3, dtype=np.int32)).block_ids.tolist() == [0, 1, 2]
    assert CPULoadStoreSpec(range(2)).block_ids.tolist() == [0, 1]
    assert len(CPULoadStoreSpec([])) == 0
    assert CPULoadStoreSpec([1, 2]) == CPULoadStoreSpec(np.array([1, 2]))
    assert CPULoadStoreSpec([1, 2]) != DiskLoadStoreSpec([1, 2])


@pytest.mark.parametrize("bad", [[[1, 2]], [1.5], [-1], ["a"]])
def test_spec_rejects_bad_block_ids(bad: list[object]) -> None:
    with pytest.raises(SpecError):
        CPULoadStoreSpec(bad)  # type: ignore[arg-type]


def test_gpu_spec_groups() -> None:
    spec = GPULoadStoreSpec([5, 6, 7, 8], group_sizes=[3, 1], block_indices=[0, 4])
    assert spec.group_sizes == (3, 1) and spec.block_indices == (0, 4)
    single = GPULoadStoreSpec([5, 6])
    assert single.group_sizes == (2,) and single.block_indices is None
    with pytest.raises(SpecError, match="sum\\(group_sizes\\)"):
        GPULoadStoreSpec([1, 2, 3], group_sizes=[1, 1])
    with pytest.raises(SpecError, match="len\\(block_indices\\)"):
        GPULoadStoreSpec([1, 2], group_sizes=[1, 1], block_indices=[0])
    with pytest.raises(SpecError, match="len\\(block_indices\\)"):
        GPULoadStoreSpec([1, 2], block_indices=[0, 1])
    assert GPULoadStoreSpec([1], block_indices=[7]) != GPULoadStoreSpec([1], block_indices=[8])


# -- backend -----------------------------------------------------------------------------------


def test_slot_pool_allocates_fresh_slots_then_reuses_freed_ones() -> None:
    backend = SlotPoolBackend(4, 128, Medium.CPU)
    blocks = backend.allocate_blocks([key_from_int(i) for i in range(3)])
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert all(b.ref_cnt == -1 for b in blocks)
    assert backend.get_num_free_blocks() == 1
    backend.free(blocks[1])
    assert backend.get_num_free_blocks() == 2
    again = backend.allocate_blocks([key_from_int(7), key_from_int(8)])
    assert sorted(b.block_id for b in again) == [1, 3]
    assert backend.get_num_free_blocks() == 0


def test_over_allocation_raises_and_allocates_nothing() -> None:
    backend = SlotPoolBackend(2, 128, Medium.DISK)
    backend.allocate_blocks([key_from_int(0)])
    with pytest.raises(AllocationError, match="asked for 2 blocks, only 1"):
        backend.allocate_blocks([key_from_int(1), key_from_int(2)])
    assert backend.get_num_free_blocks() == 1


def test_double_free_and_foreign_block_raise_and_change_nothing() -> None:
    backend = SlotPoolBackend(2, 128, Medium.GPU)
    (block,) = backend.allocate_blocks([key_from_int(0)])
    backend.free(block)
    with pytest.raises(DoubleFreeError, match="already free"):
        backend.free(block)
    with pytest.raises(DoubleFreeError, match="not a slot"):
        backend.free(BlockStatus(99))
    assert backend.get_num_free_blocks() == 2
    assert isinstance(DoubleFreeError("x"), KvtierError)


def test_backend_spec_type_follows_the_medium() -> None:
    backend = SlotPoolBackend(2, 128, Medium.GPU)
    blocks = backend.allocate_blocks([key_from_int(0), key_from_int(1)])
    spec = backend.get_load_store_spec([key_from_int(0), key_from_int(1)], blocks)
    assert isinstance(spec, GPULoadStoreSpec) and spec.block_ids.tolist() == [0, 1]


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 1), (1, 0), (-1, 4), (2.0, 4)])
def test_backend_rejects_bad_sizes(num_blocks: object, block_size: object) -> None:
    with pytest.raises(InvalidValueError):
        SlotPoolBackend(num_blocks, block_size, Medium.CPU)  # type: ignore[arg-type]


def test_specs_carry_no_per_instance_dict() -> None:
    """Specs are made per transfer: every class in their hierarchy declares `__slots__`, so
    none of them pays for a `__dict__` (one missing in a base would bring it back)."""
    specs = [
        CPULoadStoreSpec([1, 2]),
        GPULoadStoreSpec([1, 2], group_sizes=[2]),
        DiskLoadStoreSpec([3]),
    ]
    for spec in specs:
        assert not hasattr(spec, "__dict__"), type(spec).__mro__
        with pytest.raises(AttributeError):
            spec.extra = 1  # type: ignore[attr-defined]
