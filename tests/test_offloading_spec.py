"""kvtier's own `OffloadingSpec` (issue 10, item 1), no vLLM: an engine with paged KV caches
plans with `get_manager()` and copies with the handlers of `get_handlers(kv_caches)`. Chunks
stored to the host tier spill to disk in the background, come back up on lookup, and reach
the GPU caches (CPU tensors here) bit for bit; a hierarchy that does not fit is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from kvtier import Hierarchy
from kvtier.embed.offloading_spec import OffloadingSpec
from kvtier.embed.paged_kv import chunk_bytes
from kvtier.errors import SpecError
from kvtier.keys import key_from_int
from kvtier.specs.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.specs.canonical import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor

PAGES = (256, 768)
GPU_BLOCKS = 48
PER_CHUNK = 2


def caches(seed: int) -> CanonicalKVCaches:
    generator = torch.Generator().manual_seed(seed)
    tensors = tuple(
        CanonicalKVCacheTensor(
            torch.randint(0, 256, (GPU_BLOCKS, page), dtype=torch.uint8, generator=generator),
            page,
        )
        for page in PAGES
    )
    refs = ((CanonicalKVCacheRef(0, PAGES[0]), CanonicalKVCacheRef(1, PAGES[1])),)
    return CanonicalKVCaches(tensors, refs)


def config(tmp_path: Path, block_size: int, top: str = "cpu") -> dict[str, Any]:
    return {
        "block_size": block_size,
        "tiers": [
            {"name": "host", "medium": top, "capacity": 8},
            {
                "name": "disk",
                "medium": "disk",
                "capacity": 64,
                "path": str(tmp_path / "d"),
                "fsync": False,
            },
        ],
    }


async def run(handler: Any, job: int, source: Any, target: Any) -> None:
    assert handler.transfer_async(job, (source, target))
    await asyncio.to_thread(handler.wait, [job])
    assert handler.get_finished() == [(job, True)]


async def test_chunks_go_to_disk_and_come_back_to_the_gpu_bit_for_bit(tmp_path: Path) -> None:
    kv = caches(seed=1)
    size = chunk_bytes(kv, PER_CHUNK)
    async with Hierarchy.from_config(config(tmp_path, size)) as h:
        spec = OffloadingSpec(h, blocks_per_chunk=PER_CHUNK)
        manager = spec.get_manager()
        (_, _, store), (_, _, load) = spec.get_handlers(kv)
        original = [t.tensor.clone() for t in kv.tensors]
        keys = [key_from_int(i) for i in range(20)]  # 20 chunks: the host tier holds 8
        for index, key in enumerate(keys):
            out = await manager.prepare_store([key])
            assert out is not None and out.keys_to_store == [key]
            gpu = GPULoadStoreSpec([2 * index, 2 * index + 1], [2], [2 * index])
            await run(store, index, gpu, out.store_spec)
            manager.complete_store([key])
        await h.drain()
        assert sum(h.where(k) == "disk" for k in keys) >= 12
        for t in kv.tensors:
            t.tensor.zero_()
        job = 100
        for index, key in enumerate(keys):
            for _ in range(200):
                answer = manager.lookup(key)
                if answer is not None:
                    break
                await h.drain()  # its promotion runs
            assert answer is True, index
            host = manager.prepare_load([key])
            assert isinstance(host, CPULoadStoreSpec)
            await run(
                load, job, host, GPULoadStoreSpec([2 * index, 2 * index + 1], [2], [2 * index])
            )
            manager.complete_load([key])
            job += 1
        for t, before in zip(kv.tensors, original, strict=True):
            assert torch.equal(t.tensor[:40], before[:40])
        store.shutdown()
        load.shutdown()
        h.check()


async def test_a_block_size_that_is_not_one_chunk_is_refused(tmp_path: Path) -> None:
    kv = caches(seed=2)
    async with Hierarchy.from_config(config(tmp_path, 4096)) as h:
        spec = OffloadingSpec(h, blocks_per_chunk=PER_CHUNK)
        with pytest.raises(SpecError, match=f"set block_size = {chunk_bytes(kv, PER_CHUNK)}"):
            list(spec.get_handlers(kv))


async def test_the_top_tier_must_be_host_memory(tmp_path: Path) -> None:
    async with Hierarchy.from_config(config(tmp_path, 4096, top="gpu")) as h:
        with pytest.raises(SpecError, match="must be host memory"):
            OffloadingSpec(h)
