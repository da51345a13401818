"""kvtier's vLLM worker (`KvtierOffloadingWorker`, what copies blocks on vLLM's CPU engines)
with hybrid-attention KV caches, and the KV-cache layouts it refuses (issue 35, item 3 and
"Bad input"), driven through vLLM 0.33's classes without an engine.

A hybrid model's KV caches come as several groups (full attention, sliding window, Mamba
state) whose layers share the canonical tensors, each group's blocks in rows of their own:
each group's blocks go to host chunks of their own and come back byte for byte, a Mamba
group's padded pages copying only their un-padded bytes. What kvtier cannot copy right is
refused when the worker starts, with one line naming the tensor or group and the fix: a
tensor whose rows are not one page each (a page size that is not the block's), a group with
nothing to copy, vLLM's canonical layout, pages larger than the region's cell. The region's
file is gone after a refusal (nothing left behind). A KV-cache layout vLLM names is never
interpreted, only bound into the namespace. tests/engine/test_vllm_hybrid_models.py serves
real hybrid models.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from kvtier.errors import SpecError
from kvtier.integrations.vllm import KvtierOffloadingSpec
from kvtier.integrations.vllm.config import vllm_namespace
from kvtier.integrations.vllm.testing import offloading_config
from kvtier.integrations.vllm.visible import region_path
from kvtier.integrations.vllm.worker import KvtierOffloadingWorker

PAGES = (512, 1536)
"""Two canonical tensors, each shared by a full-attention and a sliding-window layer (or a
Mamba layer, whose state is padded to the attention page)."""
GPU_BLOCKS = 16


def make_spec(block_bytes: int = sum(PAGES), **config: Any) -> KvtierOffloadingSpec:
    extra = {"kvtier_config": {"tiers": [{"name": "host", "medium": "cpu", "capacity": 8}]}}
    offloading = offloading_config(
        extra, block_bytes=block_bytes, engine_id=f"kvtier-hybrid-{uuid.uuid4().hex[:12]}"
    )
    return KvtierOffloadingSpec(dataclasses.replace(offloading, **config))


@pytest.fixture
def spec() -> Iterator[KvtierOffloadingSpec]:
    spec = make_spec()
    yield spec
    assert not os.path.exists(region_path(spec._engine_id))  # nothing left behind


def caches(second_group_pages: tuple[int, ...] = PAGES) -> tuple[CanonicalKVCaches, list[Any]]:
    """Hybrid caches: group 0 (full attention) and group 1 (sliding window, or Mamba with
    `second_group_pages` smaller than the tensors' pages) both over the two tensors."""
    generator = torch.Generator().manual_seed(7)
    tensors = [
        torch.randint(-128, 128, (GPU_BLOCKS, page), dtype=torch.int8, generator=generator)
        for page in PAGES
    ]
    full = [CanonicalKVCacheRef(index, page) for index, page in enumerate(PAGES)]
    second = [CanonicalKVCacheRef(index, page) for index, page in enumerate(second_group_pages)]
    return (
        CanonicalKVCaches(
            tensors=[CanonicalKVCacheTensor(t, p) for t, p in zip(tensors, PAGES, strict=True)],
            group_data_refs=[full, second],
        ),
        tensors,
    )


def run(worker: KvtierOffloadingWorker, job: int, store: bool, gpu: Any, host: Any) -> None:
    ok = worker.submit_store(job, gpu, host) if store else worker.submit_load(job, host, gpu)
    assert ok
    worker.wait({job})
    assert [(result.job_id, result.success) for result in worker.get_finished()] == [(job, True)]


@pytest.mark.parametrize(
    "second_group_pages",
    [PAGES, (300, 1000)],
    ids=["sliding-window", "mamba-padded-pages"],
)
def test_each_groups_blocks_round_trip_through_chunks_of_their_own(
    spec: KvtierOffloadingSpec, second_group_pages: tuple[int, ...]
) -> None:
    kv, tensors = caches(second_group_pages)
    worker = spec.get_worker(kv)
    assert isinstance(worker, KvtierOffloadingWorker)
    original = [tensor.clone() for tensor in tensors]
    # Group 0: logical blocks 0-2 in GPU blocks 3, 4, 5; group 1 (a window of its last
    # two blocks): logical blocks 1-2 in GPU blocks 9, 10. Host chunks 0-2, then 3-4.
    gpu = GPULoadStoreSpec([3, 4, 5, 9, 10], group_sizes=[3, 2], block_indices=[0, 1])
    host = CPULoadStoreSpec([0, 1, 2, 3, 4])
    try:
        run(worker, 0, True, gpu, host)
        for tensor in tensors:
            tensor.zero_()
        run(worker, 1, False, gpu, host)
    finally:
        worker.shutdown()
    for tensor, before in zip(tensors, original, strict=True):
        assert torch.equal(tensor[[3, 4, 5]], before[[3, 4, 5]])  # every byte of group 0's
    for tensor, before, page in zip(tensors, original, second_group_pages, strict=True):
        assert torch.equal(tensor[[9, 10], :page], before[[9, 10], :page])  # un-padded bytes
        assert not tensor[[9, 10], page:].any()  # the padding is not copied
    untouched = [row for row in range(GPU_BLOCKS) if row not in (3, 4, 5, 9, 10)]
    assert all(not tensor[untouched].any() for tensor in tensors)


def refused(spec: KvtierOffloadingSpec, kv: CanonicalKVCaches, message: str) -> None:
    with pytest.raises(SpecError, match=message) as raised:
        spec.get_worker(kv)
    assert "\n" not in str(raised.value)  # one line


def test_a_group_with_nothing_to_copy_is_refused_at_start(spec: KvtierOffloadingSpec) -> None:
    kv, _ = caches()
    empty = CanonicalKVCaches(kv.tensors, [kv.group_data_refs[0], []])
    refused(spec, empty, r"KV-cache group 1 has no layer's bytes to copy .*GPU engine")


@pytest.mark.parametrize(
    ("shape", "page"),
    [((GPU_BLOCKS, 1024), 512), ((GPU_BLOCKS, 2, 256), 512), ((GPU_BLOCKS, 512), 1000)],
    ids=["rows-of-two-pages", "not-2d", "page-not-the-row"],
)
def test_a_tensor_not_one_page_per_block_is_refused_at_start(
    spec: KvtierOffloadingSpec, shape: tuple[int, ...], page: int
) -> None:
    tensor = torch.zeros(shape, dtype=torch.int8)
    kv = CanonicalKVCaches(
        [CanonicalKVCacheTensor(tensor, page)], [[CanonicalKVCacheRef(0, min(page, 512))]]
    )
    refused(
        spec,
        kv,
        rf"vLLM KV cache tensor 0 has shape \({shape[0]}, .*not one page of {page} bytes per "
        r"block: .*GPU engine",
    )


def test_a_ref_beyond_its_tensor_is_refused_at_start(spec: KvtierOffloadingSpec) -> None:
    kv, _ = caches((512, 2000))
    refused(spec, kv, r"vLLM's KV caches: group 1: page_size_bytes 2000 must be in \(0, 1536\]")


def test_pages_larger_than_the_regions_cell_are_refused_at_start() -> None:
    small = make_spec(block_bytes=1024)
    refused(small, caches()[0], r"the KV caches need 2048 bytes per chunk, .* 1024")
    assert not os.path.exists(region_path(small._engine_id))


def test_vllms_canonical_layout_is_refused_at_start() -> None:
    canonical = make_spec(canonical_layout=True)
    refused(canonical, caches()[0], "canonical_layout is not supported by kvtier's worker")


def test_a_kv_cache_layout_is_bound_into_the_namespace_never_interpreted() -> None:
    """kvtier copies pages without reading them, so any layout vLLM names is served; blocks
    stored under one layout are never read under another (the namespace differs)."""
    base = offloading_config({})
    names = {
        vllm_namespace(dataclasses.replace(base, kv_cache_layout=layout))
        for layout in (None, "NHD", "HND", "some-future-layout")
    }
    assert len(names) == 4
    assert "some-future-layout" in " ".join(names)
