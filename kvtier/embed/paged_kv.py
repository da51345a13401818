"""`PagedKVHandler`: copies blocks between an engine's paged KV caches (GPU) and kvtier's host
tier, in one direction, honouring KV-cache groups and offloaded blocks larger than GPU blocks.

**Layout.** The engine's caches are canonical tensors (`specs/canonical.py`): tensor t holds
GPU block b as row b, `page_t` bytes. An offloaded block (a host tier slot, a *chunk*) holds
`blocks_per_chunk` consecutive GPU blocks of every tensor: in a host row of
`sum_t(blocks_per_chunk * page_t)` bytes, tensor t's region starts at `offset_t` and holds
sub-block j at `offset_t + j * page_t` (`host_layout`). Only each ref's un-padded page bytes
are copied.

**Groups and partial chunks.** A `GPULoadStoreSpec` lists the GPU blocks of each group in
group order (`group_sizes`); `block_indices[g]` is the logical index (in GPU blocks, within
the request) of group g's first block. The group's first chunk may thus start mid-chunk: its
first `block_indices[g] % blocks_per_chunk` sub-blocks are skipped, and its last chunk may be
partly used. The host spec lists, group after group, the chunks those GPU blocks fall in.

**Asynchrony.** On CUDA each job is queued on the handler's stream (after the engine's
current stream, so a store reads finished KV) as one `copy_(non_blocking=True)` per (block,
ref) from or to pinned host memory, with an event per job; `transfer_async` never waits for
the copy. On CPU (tests, CPU engines) each job runs in one worker thread, so jobs end in
order and the caller's thread never copies: its rows as memcpy spans (computed by the caller,
from rows `_plan` checked) copied in one call without the GIL (`_copy_core.pyx`, with the
compiled core), else numpy's gathers and scatters. A job whose copy raises is reported
failed; it never raises into the caller.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from kvtier.embed.handler import OffloadingHandler, TransferResult, TransferSpec
from kvtier.errors import SpecError
from kvtier.specs.base import BlockIDsLoadStoreSpec, GPULoadStoreSpec
from kvtier.specs.canonical import CanonicalKVCaches

log = logging.getLogger("kvtier")

try:  # the compiled copies, present only when kvtier.compiled selected them
    import kvtier.embed._copy_core as _copy_core
except ImportError:
    _copy_core = None  # type: ignore[assignment]


def host_layout(kv_caches: CanonicalKVCaches, blocks_per_chunk: int) -> list[tuple[int, int]]:
    """(byte offset, bytes) of each canonical tensor's region in a host chunk; the chunk's
    size is the end of the last region."""
    regions = []
    offset = 0
    for tensor in kv_caches.tensors:
        size = blocks_per_chunk * tensor.page_size_bytes
        regions.append((offset, size))
        offset += size
    return regions


def chunk_bytes(kv_caches: CanonicalKVCaches, blocks_per_chunk: int) -> int:
    """Bytes of one host chunk (the host tier's block size) for these caches."""
    offset, size = host_layout(kv_caches, blocks_per_chunk)[-1]
    return offset + size


@dataclass(frozen=True)
class _Copy:
    """Rows of one canonical tensor to copy for one job: GPU rows, host chunks and the
    sub-block position in each chunk, and the bytes of each row."""

    tensor: int
    gpu_rows: np.ndarray
    chunks: np.ndarray
    positions: np.ndarray
    nbytes: int


@dataclass
class _Job:
    job_id: int
    future: Future[None] | None = None
    event: torch.cuda.Event | None = None


class PagedKVHandler(OffloadingHandler):
    """Copies jobs of one direction between `kv_caches` and a host pool.

    Args:
        kv_caches: the engine's canonical KV caches (on CUDA, or on CPU standing in for it).
        host_pool: `[num_chunks, chunk_bytes(kv_caches, blocks_per_chunk)]` uint8 on the CPU
            (pinned for asynchronous CUDA copies): kvtier's host tier.
        blocks_per_chunk: GPU blocks per host chunk (1: the same block size).
        gpu_to_host: the direction (a store is GPU -> host, a load host -> GPU).
    """

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        host_pool: torch.Tensor,
        blocks_per_chunk: int,
        *,
        gpu_to_host: bool,
    ) -> None:
        if isinstance(blocks_per_chunk, bool) or not isinstance(blocks_per_chunk, int):
            raise SpecError(f"blocks_per_chunk must be an int, got {blocks_per_chunk!r}")
        if blocks_per_chunk < 1:
            raise SpecError(f"blocks_per_chunk must be >= 1, got {blocks_per_chunk}")
        wanted = chunk_bytes(kv_caches, blocks_per_chunk)
        if (
            not isinstance(host_pool, torch.Tensor)
            or host_pool.dtype != torch.uint8
            or host_pool.dim() != 2
            or host_pool.shape[1] != wanted
            or host_pool.device.type != "cpu"
            or host_pool.stride(1) != 1
        ):
            shape = tuple(host_pool.shape) if isinstance(host_pool, torch.Tensor) else None
            raise SpecError(
                f"host_pool must be a CPU uint8 tensor [num_chunks, {wanted}] for these caches "
                f"and blocks_per_chunk={blocks_per_chunk}, got {shape}"
            )
        self.kv_caches = kv_caches
        self.blocks_per_chunk = blocks_per_chunk
        self.gpu_to_host = gpu_to_host
        self._gpu_pages = [tensor.pages for tensor in kv_caches.tensors]
        # Per tensor: the host pool seen as [num_chunks, blocks_per_chunk, page] (a view).
        self._num_chunks = int(host_pool.shape[0])
        self._host_pages = [
            host_pool[:, offset : offset + size].view(self._num_chunks, blocks_per_chunk, -1)
            for offset, size in host_layout(kv_caches, blocks_per_chunk)
        ]
        self._cuda = kv_caches.device.type == "cuda"
        self._stream: torch.cuda.Stream | None = None
        self._executor: ThreadPoolExecutor | None = None
        if self._cuda:
            self._stream = torch.cuda.Stream(device=kv_caches.device)  # type: ignore[no-untyped-call]
        else:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="kvtier-paged-kv")
        self._jobs: deque[_Job] = deque()
        self._by_id: dict[int, _Job] = {}

    # -- planning ----------------------------------------------------------------------------

    def _plan(self, spec: TransferSpec) -> list[_Copy]:
        """The copies of a job; SpecError when the specs do not describe one."""
        if not isinstance(spec, tuple) or len(spec) != 2:
            raise SpecError(f"a transfer spec is (src_spec, dst_spec), got {spec!r}")
        src, dst = spec
        gpu_spec, host_spec = (src, dst) if self.gpu_to_host else (dst, src)
        direction = "GPU -> host" if self.gpu_to_host else "host -> GPU"
        if (
            not isinstance(gpu_spec, GPULoadStoreSpec)
            or not isinstance(host_spec, BlockIDsLoadStoreSpec)
            or isinstance(host_spec, GPULoadStoreSpec)
        ):
            raise SpecError(
                f"a {direction} handler copies between a GPULoadStoreSpec and a host "
                f"spec, got {type(src).__name__} -> {type(dst).__name__}"
            )
        groups = self.kv_caches.group_data_refs
        sizes = gpu_spec.group_sizes
        if len(sizes) != len(groups):
            raise SpecError(f"{len(sizes)} group sizes for {len(groups)} KV-cache groups")
        indices = gpu_spec.block_indices or (0,) * len(sizes)
        gpu_ids = gpu_spec.block_ids
        host_ids = host_spec.block_ids
        if len(gpu_ids) and (gpu_ids.min() < 0 or gpu_ids.max() >= self.kv_caches.num_blocks):
            raise SpecError(f"GPU block ids must be in [0, {self.kv_caches.num_blocks})")
        if len(host_ids) and (host_ids.min() < 0 or host_ids.max() >= self._num_chunks):
            raise SpecError(f"host block ids must be in [0, {self._num_chunks})")
        per_chunk = self.blocks_per_chunk
        copies: list[_Copy] = []
        gpu_at = host_at = 0
        for group, (count, first) in enumerate(zip(sizes, indices, strict=True)):
            if count == 0:
                continue
            skip = first % per_chunk
            chunks = -(-(skip + count) // per_chunk)
            if gpu_at + count > len(gpu_ids) or host_at + chunks > len(host_ids):
                raise SpecError(
                    f"group {group}: {count} GPU blocks from logical index {first} need "
                    f"{chunks} host blocks; the specs hold {len(gpu_ids) - gpu_at} and "
                    f"{len(host_ids) - host_at} more"
                )
            subs = skip + np.arange(count, dtype=np.int64)
            rows = gpu_ids[gpu_at : gpu_at + count]
            chunk_ids = host_ids[host_at : host_at + chunks][subs // per_chunk]
            positions = subs % per_chunk
            # Per tensor, the widest un-padded page of the group's refs to it.
            widest: dict[int, int] = {}
            for ref in groups[group]:
                widest[ref.tensor_idx] = max(widest.get(ref.tensor_idx, 0), ref.page_size_bytes)
            for tensor, nbytes in widest.items():
                copies.append(_Copy(tensor, rows, chunk_ids, positions, nbytes))
            gpu_at += count
            host_at += chunks
        if gpu_at != len(gpu_ids) or host_at != len(host_ids):
            raise SpecError(
                f"the specs hold {len(gpu_ids)} GPU and {len(host_ids)} host blocks, but the "
                f"groups use {gpu_at} and {host_at}"
            )
        return copies

    # -- copying -----------------------------------------------------------------------------

    def _spans(self, copies: list[_Copy]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row copy of `copies` as (target address, source address, bytes), for
        `_copy_core.copy_spans`: rows of the handler's own tensors at ids `_plan` checked,
        `width` bytes at most a page (`CanonicalKVCaches` checks each ref's)."""
        gpu_at, host_at, sizes = [], [], []
        for copy in copies:
            gpu = self._gpu_pages[copy.tensor]
            host = self._host_pages[copy.tensor]
            gpu_at.append(gpu.data_ptr() + copy.gpu_rows.astype(np.int64) * gpu.stride(0))
            host_at.append(
                host.data_ptr()
                + copy.chunks.astype(np.int64) * host.stride(0)
                + copy.positions.astype(np.int64) * host.stride(1)
            )
            sizes.append(np.full(len(copy.gpu_rows), copy.nbytes, dtype=np.int64))
        gpu_spans, host_spans = np.concatenate(gpu_at), np.concatenate(host_at)
        if self.gpu_to_host:
            return host_spans, gpu_spans, np.concatenate(sizes)
        return gpu_spans, host_spans, np.concatenate(sizes)

    @staticmethod
    def _copy_spans(spans: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        _copy_core.copy_spans(*spans)

    def _copy_cpu(self, copies: list[_Copy]) -> None:
        """The copies as numpy gathers and scatters of whole rows (each row's bytes moved
        at memcpy speed): torch's advanced indexing on uint8 moves them byte by byte, on
        its intra-op threads (a 2,048-token load in vLLM's CPU engine: ~6 ms of a 14 ms
        TTFT). Used where the compiled core is not (`_copy_spans`: one call without the
        GIL). The views live only for the call."""
        for copy in copies:
            gpu = self._gpu_pages[copy.tensor].detach().numpy()
            host = self._host_pages[copy.tensor].detach().numpy()
            width = copy.nbytes
            if self.gpu_to_host:
                host[copy.chunks, copy.positions, :width] = gpu[copy.gpu_rows, :width]
            else:
                gpu[copy.gpu_rows, :width] = host[copy.chunks, copy.positions, :width]

    def _copy_cuda(self, copies: list[_Copy]) -> torch.cuda.Event:
        stream = self._stream
        if stream is None:  # pragma: no cover - set whenever the caches are on CUDA
            raise SpecError("no CUDA stream")
        stream.wait_stream(torch.cuda.current_stream(self.kv_caches.device))
        with torch.cuda.stream(stream):
            for copy in copies:
                gpu = self._gpu_pages[copy.tensor]
                host = self._host_pages[copy.tensor]
                width = copy.nbytes
                for row, chunk, position in zip(
                    copy.gpu_rows.tolist(),
                    copy.chunks.tolist(),
                    copy.positions.tolist(),
                    strict=True,
                ):
                    if self.gpu_to_host:
                        host[chunk, position, :width].copy_(gpu[row, :width], non_blocking=True)
                    else:
                        gpu[row, :width].copy_(host[chunk, position, :width], non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        return event

    # -- the handler interface ---------------------------------------------------------------

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Start job `job_id`; False when it could not be started (a copy that fails later
        is reported by `get_finished` as failed). SpecError when the specs are malformed
        (a bug in the caller, not a failure of the copy)."""
        if not self._host_pages:
            return False  # shut down
        if job_id in self._by_id:
            raise SpecError(f"job {job_id} is already in flight")
        copies = self._plan(spec)
        job = _Job(job_id)
        try:
            if self._cuda:
                job.event = self._copy_cuda(copies)
            else:
                executor = self._executor
                if executor is None:
                    return False  # shut down
                if _copy_core is not None and copies:
                    job.future = executor.submit(self._copy_spans, self._spans(copies))
                else:
                    job.future = executor.submit(self._copy_cpu, copies)
        except RuntimeError as error:
            log.error("paged KV job %d could not start: %r", job_id, error)
            return False
        self._jobs.append(job)
        self._by_id[job_id] = job
        return True

    def _done(self, job: _Job) -> bool:
        if job.future is not None:
            return job.future.done()
        return job.event is None or bool(job.event.query())  # type: ignore[no-untyped-call]

    def _succeeded(self, job: _Job) -> bool:
        if job.future is None:
            return True
        error = job.future.exception()
        if error is not None:
            log.error("paged KV job %d failed: %r", job.job_id, error)
        return error is None

    def get_finished(self) -> list[TransferResult]:
        finished: list[TransferResult] = []
        while self._jobs and self._done(self._jobs[0]):
            job = self._jobs.popleft()
            del self._by_id[job.job_id]
            finished.append((job.job_id, self._succeeded(job)))
        return finished

    def wait(self, job_ids: Collection[int]) -> None:
        for job_id in job_ids:
            job = self._by_id.get(job_id)
            if job is None:
                continue
            if job.future is not None:
                job.future.exception()  # waits; the error is reported by get_finished
            elif job.event is not None:
                job.event.synchronize()

    def shutdown(self) -> None:
        """Wait for every job in flight, then release the worker thread and the views of the
        host pool and the caches (so their owner can free or unmap them)."""
        self.wait(list(self._by_id))
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._host_pages = []
        self._gpu_pages = []


def paged_kv_handlers(
    kv_caches: CanonicalKVCaches, host_pool: torch.Tensor, blocks_per_chunk: int
) -> Sequence[tuple[type[GPULoadStoreSpec], type[BlockIDsLoadStoreSpec], PagedKVHandler]]:
    """The store (GPU -> host) and load (host -> GPU) handlers over one host pool, as an
    offloading spec yields them: (source spec type, destination spec type, handler)."""
    from kvtier.specs.base import CPULoadStoreSpec

    store = PagedKVHandler(kv_caches, host_pool, blocks_per_chunk, gpu_to_host=True)
    load = PagedKVHandler(kv_caches, host_pool, blocks_per_chunk, gpu_to_host=False)
    return [(GPULoadStoreSpec, CPULoadStoreSpec, store), (CPULoadStoreSpec, GPULoadStoreSpec, load)]  # type: ignore[list-item]
