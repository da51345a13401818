"""Canonical KV caches and the paged GPU <-> host handler (issue 10, item 1): layouts are
canonicalized as views, and blocks of every group and tensor round-trip bit for bit between
the engine's paged caches and kvtier's host pool, including offloaded blocks that hold
several GPU blocks and groups that start mid-chunk. CPU tensors stand in for the GPU; the
same test runs on CUDA when one is present."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from kvtier.embed import paged_kv as paged_kv_module
from kvtier.embed.paged_kv import PagedKVHandler, chunk_bytes, host_layout, paged_kv_handlers
from kvtier.errors import SpecError
from kvtier.specs.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.specs.canonical import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    canonicalize_kv_caches,
)

NUM_BLOCKS = 12

COPIES = pytest.mark.parametrize("copies", ["c", "numpy"])
"""A CPU job's copies: the compiled spans (`_copy_core`, when built) or numpy's."""


def use_copies(copies: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if copies == "numpy":
        monkeypatch.setattr(paged_kv_module, "_copy_core", None)
    elif paged_kv_module._copy_core is None:
        pytest.skip("the compiled core is not built (scripts/build-core)")


def engine_caches(device: str = "cpu") -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    """Two KV-cache groups: a full-attention group of two layers with a (num_blocks, ...)
    layout, the second aliasing the first, and a group of one (2, num_blocks, ...) layer."""
    generator = torch.Generator().manual_seed(0)
    full = torch.randn(NUM_BLOCKS, 2, 4, 8, generator=generator).to(torch.float16)
    split = torch.randn(2, NUM_BLOCKS, 4, 8, generator=generator).to(torch.bfloat16)
    layers = {"attn.0": full.to(device), "kv.1": split.to(device)}
    layers["attn.0.alias"] = layers["attn.0"]
    return layers, [["attn.0", "attn.0.alias"], ["kv.1"]]


# --------------------------------------------------------------------------------------------
# Canonicalization
# --------------------------------------------------------------------------------------------


def test_layouts_are_canonicalized_as_views_of_the_engines_memory() -> None:
    layers, groups = engine_caches()
    caches = canonicalize_kv_caches(layers, groups, NUM_BLOCKS, {"kv.1": 48})
    # attn.0 (and its alias): one tensor of 2*4*8 halfs per block; kv.1: K and V tensors.
    assert [t.page_size_bytes for t in caches.tensors] == [128, 64, 64]
    assert caches.group_data_refs == (
        (CanonicalKVCacheRef(0, 128), CanonicalKVCacheRef(0, 128)),
        (CanonicalKVCacheRef(1, 48), CanonicalKVCacheRef(2, 48)),
    )
    assert caches.bytes_per_block() == 256
    # A view: writing canonical bytes writes the engine's tensor.
    caches.tensors[2].pages[5].fill_(0)
    assert torch.count_nonzero(layers["kv.1"][1, 5]) == 0
    assert torch.count_nonzero(layers["kv.1"][0, 5]) > 0


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (torch.zeros(NUM_BLOCKS - 1, 16), "neither"),
        (torch.zeros(3, NUM_BLOCKS, 16), "neither"),
        (torch.zeros(16, NUM_BLOCKS).t(), "contiguous"),
    ],
)
def test_an_unknown_layout_names_the_layer(tensor: torch.Tensor, message: str) -> None:
    with pytest.raises(SpecError, match=rf"layer 'odd'.*{message}"):
        canonicalize_kv_caches({"odd": tensor}, [["odd"]], NUM_BLOCKS)


def test_malformed_canonical_caches_are_refused() -> None:
    pages = torch.zeros(NUM_BLOCKS, 64, dtype=torch.uint8)
    with pytest.raises(SpecError, match="tensor_idx 1"):
        CanonicalKVCaches((CanonicalKVCacheTensor(pages, 64),), ((CanonicalKVCacheRef(1, 8),),))
    with pytest.raises(SpecError, match=r"page_size_bytes 65 must be in \(0, 64\]"):
        CanonicalKVCaches((CanonicalKVCacheTensor(pages, 64),), ((CanonicalKVCacheRef(0, 65),),))
    with pytest.raises(SpecError, match="uint8/int8"):
        CanonicalKVCacheTensor(torch.zeros(NUM_BLOCKS, 16), 16)
    with pytest.raises(SpecError, match="group 1: layer 'missing'"):
        canonicalize_kv_caches({"a": torch.zeros(NUM_BLOCKS, 8)}, [["a"], ["missing"]], NUM_BLOCKS)


# --------------------------------------------------------------------------------------------
# The handler
# --------------------------------------------------------------------------------------------


def expected_host_bytes(
    caches: CanonicalKVCaches, per_chunk: int, gpu_block: int, group: int
) -> list[tuple[int, int, bytes]]:
    """(region offset, bytes, the GPU page's data) of each tensor a group's block copies."""
    regions = host_layout(caches, per_chunk)
    out = []
    widest: dict[int, int] = {}
    for ref in caches.group_data_refs[group]:
        widest[ref.tensor_idx] = max(widest.get(ref.tensor_idx, 0), ref.page_size_bytes)
    for tensor, nbytes in widest.items():
        page = caches.tensors[tensor].pages[gpu_block, :nbytes].cpu().numpy().tobytes()
        out.append((regions[tensor][0], caches.tensors[tensor].page_size_bytes, page))
    return out


def round_trip(device: str, per_chunk: int) -> None:
    layers, groups = engine_caches(device)
    caches = canonicalize_kv_caches(layers, groups, NUM_BLOCKS, {"kv.1": 48})
    pool = torch.zeros(10, chunk_bytes(caches, per_chunk), dtype=torch.uint8)
    if device == "cuda":
        pool = pool.pin_memory()
    (_, _, store), (_, _, load) = paged_kv_handlers(caches, pool, per_chunk)
    # Group 0: GPU blocks 3, 5, 6 at logical blocks 2, 3, 4; group 1: GPU block 1 at 0.
    first = 2
    gpu = GPULoadStoreSpec([3, 5, 6, 1], group_sizes=[3, 1], block_indices=[first, 0])
    chunks_0 = -(-(first % per_chunk + 3) // per_chunk)
    host_ids = [7, 2, 4, 9][: chunks_0 + 1]
    host = CPULoadStoreSpec(host_ids)
    assert store.transfer_async(1, (gpu, host))
    store.wait([1])
    assert store.get_finished() == [(1, True)]
    assert store.get_finished() == []  # each job once
    # Every copied page sits where the layout says.
    placed = [(0, 3, first), (0, 5, first + 1), (0, 6, first + 2), (1, 1, 0)]
    group_chunks = {0: host_ids[:chunks_0], 1: host_ids[chunks_0:]}
    for group, block, logical in placed:
        skip = (first if group == 0 else 0) % per_chunk
        sub = logical - (first if group == 0 else 0) + skip
        chunk = group_chunks[group][sub // per_chunk]
        position = sub % per_chunk
        for offset, page, data in expected_host_bytes(caches, per_chunk, block, group):
            start = offset + position * page
            assert pool[chunk, start : start + len(data)].numpy().tobytes() == data
    # Load them back into zeroed GPU pages: bit for bit.
    before = [t.pages.clone() for t in caches.tensors]
    for tensor in caches.tensors:
        tensor.pages.zero_()
    assert load.transfer_async(2, (host, gpu))
    load.wait([2])
    assert load.get_finished() == [(2, True)]
    for group, block, _ in placed:
        for ref in caches.group_data_refs[group]:
            got = caches.tensors[ref.tensor_idx].pages[block, : ref.page_size_bytes]
            want = before[ref.tensor_idx][block, : ref.page_size_bytes]
            assert torch.equal(got, want), (group, block, ref)
    untouched = [b for b in range(NUM_BLOCKS) if b not in (1, 3, 5, 6)]
    for tensor in caches.tensors:
        assert torch.count_nonzero(tensor.pages[untouched]) == 0
    store.shutdown()
    load.shutdown()


@COPIES
@pytest.mark.parametrize("per_chunk", [1, 2, 4])
def test_blocks_round_trip_bit_for_bit_through_the_host_pool(
    per_chunk: int, copies: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_copies(copies, monkeypatch)
    round_trip("cpu", per_chunk)


def pool_after_jobs(copies: str, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, bytes]:
    """A store of 40 scattered GPU blocks into 21 scattered chunks (two to a chunk, a ref
    narrower than its page), then a load of them into zeroed caches: the pool's and the
    caches' bytes afterwards, every byte, untouched ones included."""
    use_copies(copies, monkeypatch)
    generator = torch.Generator().manual_seed(5)
    blocks = 64
    layers = {
        "attn.0": torch.randn(blocks, 2, 4, 8, generator=generator).to(torch.float16),
        "kv.1": torch.randn(2, blocks, 4, 8, generator=generator).to(torch.bfloat16),
    }
    caches = canonicalize_kv_caches(layers, [["attn.0"], ["kv.1"]], blocks, {"kv.1": 40})
    pool = torch.zeros(48, chunk_bytes(caches, 2), dtype=torch.uint8)
    (_, _, store), (_, _, load) = paged_kv_handlers(caches, pool, 2)
    rng = np.random.default_rng(11)
    rows = rng.choice(blocks, 40, replace=False).tolist()
    chunks = rng.choice(48, 21, replace=False).tolist()
    gpu = GPULoadStoreSpec(rows, group_sizes=[20, 20], block_indices=[1, 0])
    host = CPULoadStoreSpec(chunks)
    try:
        assert store.transfer_async(1, (gpu, host))
        store.wait([1])
        assert store.get_finished() == [(1, True)]
        for tensor in caches.tensors:
            tensor.pages.zero_()
        assert load.transfer_async(2, (host, gpu))
        load.wait([2])
        assert load.get_finished() == [(2, True)]
    finally:
        store.shutdown()
        load.shutdown()
    engine = b"".join(t.pages.numpy().tobytes() for t in caches.tensors)
    return pool.numpy().tobytes(), engine


def test_the_compiled_copies_move_exactly_the_bytes_numpys_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a byte more or less: the pages' padding and the rows no job names stay zero."""
    with monkeypatch.context() as patch:
        pool_numpy, engine_numpy = pool_after_jobs("numpy", patch)
    pool_c, engine_c = pool_after_jobs("c", monkeypatch)
    assert pool_c == pool_numpy
    assert engine_c == engine_numpy
    assert pool_c.count(0) < len(pool_c)  # something was copied


def test_copy_spans_refuses_lists_of_different_lengths() -> None:
    core = paged_kv_module._copy_core
    if core is None:
        pytest.skip("the compiled core is not built (scripts/build-core)")
    one, two = np.zeros(1, dtype=np.int64), np.zeros(2, dtype=np.int64)
    with pytest.raises(ValueError, match="as many sources and sizes as targets"):
        core.copy_spans(one, two, one)


@pytest.mark.gpu
@pytest.mark.parametrize("per_chunk", [1, 4])
def test_blocks_round_trip_on_cuda(per_chunk: int) -> None:
    round_trip("cuda", per_chunk)


def handler(per_chunk: int = 2, gpu_to_host: bool = True) -> PagedKVHandler:
    layers, groups = engine_caches()
    caches = canonicalize_kv_caches(layers, groups, NUM_BLOCKS)
    pool = torch.zeros(6, chunk_bytes(caches, per_chunk), dtype=torch.uint8)
    return PagedKVHandler(caches, pool, per_chunk, gpu_to_host=gpu_to_host)


def test_jobs_finish_in_order_each_once() -> None:
    store = handler()
    for job in range(5):
        gpu = GPULoadStoreSpec([job, job + 1], group_sizes=[2, 0], block_indices=[0, 0])
        assert store.transfer_async(job, (gpu, CPULoadStoreSpec([job])))
    store.wait(range(5))
    assert store.get_finished() == [(job, True) for job in range(5)]
    store.shutdown()


def test_after_shutdown_a_job_is_refused_and_no_view_of_the_pool_is_kept() -> None:
    store = handler()
    gpu = GPULoadStoreSpec([0, 1], group_sizes=[2, 0], block_indices=[0, 0])
    assert store.transfer_async(0, (gpu, CPULoadStoreSpec([0])))
    store.shutdown()
    assert store.get_finished() == [(0, True)]  # the job in flight was finished, not lost
    assert store.transfer_async(1, (gpu, CPULoadStoreSpec([1]))) is False
    assert not store._host_pages and not store._gpu_pages  # the owner may free its memory


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ((CPULoadStoreSpec([0]), CPULoadStoreSpec([1])), "GPULoadStoreSpec and a host"),
        ((GPULoadStoreSpec([0]), CPULoadStoreSpec([1])), "1 group sizes for 2"),
        (
            (GPULoadStoreSpec([0, 1, 2], group_sizes=[3, 0]), CPULoadStoreSpec([1])),
            "need 2 host blocks",
        ),
        (
            (GPULoadStoreSpec([0], group_sizes=[1, 0]), CPULoadStoreSpec([1, 2])),
            "groups use 1 and 1",
        ),
        ((GPULoadStoreSpec([99], group_sizes=[1, 0]), CPULoadStoreSpec([1])), "GPU block ids"),
        ((GPULoadStoreSpec([0], group_sizes=[1, 0]), CPULoadStoreSpec([6])), "host block ids"),
        ("not a spec", "is \\(src_spec, dst_spec\\)"),
    ],
)
def test_a_malformed_job_is_a_spec_error_and_starts_nothing(spec: Any, message: str) -> None:
    store = handler()
    with pytest.raises(SpecError, match=message):
        store.transfer_async(1, spec)
    assert store.get_finished() == []
    store.shutdown()


@COPIES
def test_a_copy_that_fails_is_reported_failed_not_raised(
    copies: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_copies(copies, monkeypatch)
    store = handler()

    def broken(copies: Any) -> None:
        raise RuntimeError("device lost")

    monkeypatch.setattr(store, "_copy_cpu" if copies == "numpy" else "_copy_spans", broken)
    gpu = GPULoadStoreSpec([0], group_sizes=[1, 0], block_indices=[0, 0])
    assert store.transfer_async(7, (gpu, CPULoadStoreSpec([0])))
    store.wait([7])
    assert store.get_finished() == [(7, False)]
    store.shutdown()


def test_a_pool_of_the_wrong_shape_is_refused() -> None:
    layers, groups = engine_caches()
    caches = canonicalize_kv_caches(layers, groups, NUM_BLOCKS)
    with pytest.raises(SpecError, match=rf"\[num_chunks, {chunk_bytes(caches, 2)}\]"):
        PagedKVHandler(caches, torch.zeros(4, 10, dtype=torch.uint8), 2, gpu_to_host=True)
    assert chunk_bytes(caches, 2) == 2 * caches.bytes_per_block()
    assert np.diff([offset for offset, _ in host_layout(caches, 2)]).tolist() == [256, 128]
