"""`KvtierOffloadingWorker`: vLLM's worker-side `OffloadingWorker` made of kvtier's
`PagedKVHandler`s, copying between the engine's paged KV caches and vLLM's shared offload
region (the host tier every process maps).

`KvtierOffloadingSpec` uses it where vLLM has no worker of its own (a CPU-only engine; vLLM's
`CPUOffloadingWorker` runs only on CUDA-alike and XPU devices). The host layout is vLLM's:
row c of the region holds, for each worker, a cell of every canonical tensor's
`blocks_per_chunk` pages one after the other, which is also kvtier's `host_layout`, so the
bytes a store leaves in the region are the ones vLLM's worker would have left.

Its copies run on threads beside the engine's own Python (the scheduler, the model runner),
so the worker holds the kvtier config's `switch_interval_ms` from its creation to its
`shutdown` (`kvtier.chain.switch_interval`): at the interpreter's 5 ms, vLLM's CPU engine
answered a multi-turn workload from a cpu-only kvtier config at a TTFT p50 of 25 ms, at the
default 0.25 ms in 12 (`engine_ttft --parts turns`). A config with tiers below the host tier
opens a chain that holds it too; the lowest lease holds.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from vllm.v1.kv_offload.base import OffloadingWorker
from vllm.v1.kv_offload.base import TransferResult as VllmTransferResult
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

from kvtier.chain import switch_interval
from kvtier.embed.paged_kv import PagedKVHandler, chunk_bytes
from kvtier.errors import SpecError
from kvtier.integrations.vllm._compat import forget_unlinked_region
from kvtier.specs.base import CPULoadStoreSpec, GPULoadStoreSpec
from kvtier.specs.canonical import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor

UNSUPPORTED_LAYOUT_FIX = (
    "kvtier's worker (vLLM's CPU engines) copies one page per block row; serve this model "
    "on a GPU engine, where vLLM's own worker copies the blocks, or without "
    "KvtierOffloadingSpec"
)
"""The fix a refused KV-cache layout names: where vLLM's own worker runs, kvtier's is not
used (`KvtierOffloadingSpec.get_worker`)."""


def kvtier_caches(kv_caches: Any) -> CanonicalKVCaches:
    """vLLM's CanonicalKVCaches as kvtier's: each tensor seen as [num_blocks, page] bytes.

    SpecError, one line naming the tensor or group and the fix, where they are not that: a
    tensor whose rows are not one page each (a page size that does not divide a block's
    bytes would otherwise be read as other blocks' rows), a KV-cache group with nothing to
    copy (its blocks would be offloaded as bytes never written), a ref beyond its tensor.
    """
    tensors = []
    for index, item in enumerate(kv_caches.tensors):
        page = int(item.page_size_bytes)
        tensor = item.tensor
        row = tensor.shape[-1] * tensor.element_size() if tensor.dim() == 2 else None
        if row != page:
            raise SpecError(
                f"vLLM KV cache tensor {index} has shape {tuple(tensor.shape)} "
                f"({tensor.dtype}), not one page of {page} bytes per block: "
                f"{UNSUPPORTED_LAYOUT_FIX}"
            )
        if tensor.dtype not in (torch.int8, torch.uint8):
            tensor = tensor.view(torch.int8)
        tensors.append(CanonicalKVCacheTensor(tensor, page))
    groups = tuple(
        tuple(CanonicalKVCacheRef(int(ref.tensor_idx), int(ref.page_size_bytes)) for ref in refs)
        for refs in kv_caches.group_data_refs
    )
    try:
        return CanonicalKVCaches(tuple(tensors), groups)
    except SpecError as error:
        raise SpecError(f"vLLM's KV caches: {error}: {UNSUPPORTED_LAYOUT_FIX}") from None


def _gpu_spec(spec: Any) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(spec.block_ids, list(spec.group_sizes), list(spec.block_indices))


def _host_spec(spec: Any) -> CPULoadStoreSpec:
    return CPULoadStoreSpec(spec.block_ids)


class KvtierOffloadingWorker(OffloadingWorker):
    """Stores (GPU -> region), loads and expedited loads (region -> GPU), each on a
    `PagedKVHandler` of its own so an expedited load never queues behind a regular one."""

    def __init__(
        self,
        caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        host: torch.Tensor,
        region: SharedOffloadRegion | None = None,
        switch_interval_ms: float | Literal["keep"] = "keep",
    ) -> None:
        """`caches`: the engine's caches as kvtier's (`kvtier_caches` of vLLM's);
        `switch_interval_ms` held until `shutdown` ("keep": the process's own)."""
        self._region = region
        # store (GPU -> host), load, expedited load: the views of the region live only here.
        self._handlers = [
            PagedKVHandler(caches, host, blocks_per_chunk, gpu_to_host=direction)
            for direction in (True, False, False)
        ]
        self._release_switch_interval = switch_interval.hold(switch_interval_ms)

    @classmethod
    def for_spec(
        cls,
        spec: Any,
        kv_caches: Any,
        switch_interval_ms: float | Literal["keep"] = "keep",
    ) -> KvtierOffloadingWorker:
        """The worker of a tiering spec: this rank's cells of the spec's shared region."""
        config = spec.config
        if config.canonical_layout:
            raise SpecError(
                "canonical_layout is not supported by kvtier's worker (used where vLLM has "
                "none); remove canonical_layout from kv_connector_extra_config"
            )
        rank = 0 if spec.replicated_layout else config.parallel.rank
        region = SharedOffloadRegion(
            engine_id=spec._engine_id,
            num_chunks=spec.num_chunks,
            rank=rank,
            kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
            cpu_page_size=spec.cpu_page_size_per_worker,
        )
        try:
            caches = kvtier_caches(kv_caches)
            cell = chunk_bytes(caches, spec.blocks_per_chunk)
            if cell > spec.cpu_page_size_per_worker:
                raise SpecError(
                    f"the KV caches need {cell} bytes per chunk, the region's cell has "
                    f"{spec.cpu_page_size_per_worker}"
                )
            base = region.base_tensor
            host = torch.as_strided(
                base,
                size=(spec.num_chunks, cell),
                stride=(spec.kv_bytes_per_chunk, 1),
                storage_offset=rank * spec.cpu_page_size_per_worker,
            ).view(torch.uint8)
            return cls(caches, spec.blocks_per_chunk, host, region, switch_interval_ms)
        except BaseException:
            region.cleanup()
            raise

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        if not self._handlers:
            return False  # shut down
        return self._handlers[0].transfer_async(job_id, (_gpu_spec(src_spec), _host_spec(dst_spec)))

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
    ) -> bool:
        if not self._handlers:
            return False  # shut down
        handler = self._handlers[2 if expedited else 1]
        return handler.transfer_async(job_id, (_host_spec(src_spec), _gpu_spec(dst_spec)))

    def get_finished(self) -> list[VllmTransferResult]:
        finished = [result for handler in self._handlers for result in handler.get_finished()]
        return [VllmTransferResult(job_id=job_id, success=ok) for job_id, ok in finished]

    def wait(self, job_ids: set[int]) -> None:
        for handler in self._handlers:
            handler.wait(job_ids)

    def shutdown(self) -> None:
        """Finish every copy in flight, then give the region back (the handlers' views of it
        are dropped first, so vLLM can unmap it) and the switch interval."""
        try:
            for handler in self._handlers:
                handler.shutdown()
            self._handlers = []
            if self._region is not None:
                forget_unlinked_region(self._region)
                self._region.cleanup()
                self._region = None
        finally:
            self._release_switch_interval()
