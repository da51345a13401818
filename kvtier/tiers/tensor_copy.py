"""Row copies between torch tensors of blocks, without blocking the event loop.

A block is one row of a `[num_blocks, block_size]` uint8 tensor. Copies between host tensors
run in worker threads once they are large enough to matter (numpy releases the GIL while it
copies), split across as many threads as torch's own `copy_` would use when they are large.
Copies that touch a CUDA device are queued on a dedicated stream per device, after the work
already queued on the current stream (so a freshly computed tensor is complete), and awaited
by polling a CUDA event: the event loop never blocks on the GPU.

Contiguous runs of slots are coalesced into one copy each. Between two host tensors every run
is one numpy copy (a plain memcpy that releases the GIL): torch's `index_select` /
`index_copy_` on rows of uint8 run at a small fraction of memory bandwidth on the CPU. Only
rows too small for a per-run loop to pay use one numpy gather-scatter instead. A copy between
a GPU and the host with scattered slots leaves the scattering to the GPU (one `index_select`
or `index_copy_` there) and takes the host rows in ascending order, so the host side is runs
of consecutive rows: DMAs straight to or from a pinned pool when they are few, else one copy
per run through pinned staging (measured on an H200 before this: 11-31 % of one whole-pool
copy's GB/s for a permutation of 64 KiB-2 MiB rows, the host scatter being the cost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

THREAD_THRESHOLD_BYTES = 1 << 20
"""Host copies smaller than this run inline: a thread hop costs more than the copy."""

HOST_TORCH_RUN_BYTES = 4 << 20
"""A host run at least this long is copied by torch's `copy_`, which spreads one call over
torch's intra-op threads; shorter runs are copied by numpy, which costs less per call, in
parallel threads when there are many (`HOST_SPLIT_BYTES`). Measured on a 2-core VM: one
256 MiB run, torch 14.1 GB/s, numpy 10.9; 128 scattered 2 MiB rows, numpy in 2 threads 13.0,
torch row by row 10.1; 4096 scattered 64 KiB rows, numpy 10.5 (one thread), torch 6.8."""

HOST_SPLIT_BYTES = 8 << 20
"""A host copy of short runs (scattered rows) of at least twice this size is split into
parts of at least this size, one per torch intra-op thread, copied in parallel threads."""

HOST_RUN_MIN_BYTES = 2048
"""Host copies whose rows are at least this long copy run by run; below it one numpy
gather-scatter is faster than a Python loop over rows (measured on a 2-core VM: a loop
over 4 KiB rows ~1.4x faster, over 512 B rows ~1.4x slower)."""

DIRECT_RUNS_MAX = 16
"""A scattered GPU <-> pinned host copy whose rows, sorted on the host side, make at most this
many runs of consecutive rows is issued run by run, one DMA each, with no staging."""

_POLL_FIRST_S = 20e-6
_POLL_MAX_S = 1e-3


def cuda_available() -> bool:
    """Whether torch sees a usable CUDA device."""
    return bool(torch.cuda.is_available())


def coalesce(
    src_ids: npt.NDArray[np.int64], dst_ids: npt.NDArray[np.int64]
) -> list[tuple[int, int, int]]:
    """Runs `(src_start, dst_start, length)` where both id lists advance by one together."""
    n = len(src_ids)
    if n == 0:
        return []
    breaks = np.flatnonzero((np.diff(src_ids) != 1) | (np.diff(dst_ids) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [n]))
    return [
        (int(src_ids[s]), int(dst_ids[s]), int(e - s)) for s, e in zip(starts, ends, strict=True)
    ]


def _copy_now(
    src: torch.Tensor,
    src_ids: npt.NDArray[np.int64],
    dst: torch.Tensor,
    dst_ids: npt.NDArray[np.int64],
    non_blocking: bool,
) -> None:
    runs = coalesce(src_ids, dst_ids)
    if len(runs) * 4 <= len(src_ids) or len(runs) <= 2:
        for s, d, n in runs:
            dst[d : d + n].copy_(src[s : s + n], non_blocking=non_blocking)
        return
    index_src = torch.from_numpy(np.array(src_ids, dtype=np.int64)).to(
        src.device, non_blocking=True
    )
    gathered = src.index_select(0, index_src)
    if gathered.device != dst.device:
        gathered = gathered.to(dst.device, non_blocking=non_blocking)
    index_dst = torch.from_numpy(np.array(dst_ids, dtype=np.int64)).to(
        dst.device, non_blocking=True
    )
    dst.index_copy_(0, index_dst, gathered)


def run_count(src_ids: npt.NDArray[np.int64], dst_ids: npt.NDArray[np.int64]) -> int:
    """How many runs `coalesce` would find (without building them)."""
    if len(src_ids) == 0:
        return 0
    return 1 + int(np.count_nonzero((np.diff(src_ids) != 1) | (np.diff(dst_ids) != 1)))


def _copy_host(
    src: torch.Tensor,
    src_ids: npt.NDArray[np.int64],
    dst: torch.Tensor,
    dst_ids: npt.NDArray[np.int64],
) -> None:
    """`dst[dst_ids] = src[src_ids]` between two host tensors, at memcpy speed (uint8 blocks;
    any other dtype takes torch's path)."""
    if src.dtype != torch.uint8 or dst.dtype != torch.uint8:
        _copy_now(src, src_ids, dst, dst_ids, non_blocking=False)
        return
    source, target = src.numpy(), dst.numpy()
    row_bytes = src.shape[1]
    runs = coalesce(src_ids, dst_ids)
    if len(runs) * 4 > len(src_ids) and row_bytes < HOST_RUN_MIN_BYTES:
        target[dst_ids] = source[src_ids]
        return
    for s, d, n in runs:
        if n * row_bytes >= HOST_TORCH_RUN_BYTES:
            dst[d : d + n].copy_(src[s : s + n])
        else:
            target[d : d + n] = source[s : s + n]


class TensorCopier:
    """Copies rows between block tensors on any devices; one CUDA stream per device."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = self._streams.get(device)
        if stream is None:
            stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
            self._streams[device] = stream
        return stream

    async def copy(
        self,
        src: torch.Tensor,
        src_ids: Sequence[int] | npt.NDArray[np.int64],
        dst: torch.Tensor,
        dst_ids: Sequence[int] | npt.NDArray[np.int64],
    ) -> None:
        """`dst[dst_ids[i]] = src[src_ids[i]]` for every i; returns when the bytes are there.

        `src` and `dst` are different tensors and `dst_ids` are distinct: rows may be copied
        run by run and in parallel, not as one gather then one scatter."""
        s_ids = np.asarray(src_ids, dtype=np.int64)
        d_ids = np.asarray(dst_ids, dtype=np.int64)
        if len(s_ids) != len(d_ids):
            raise ValueError(f"{len(s_ids)} source rows but {len(d_ids)} destination rows")
        if len(s_ids) == 0:
            return
        cuda = src.device.type == "cuda" or dst.device.type == "cuda"
        if not cuda:
            await self._copy_host_async(src, s_ids, dst, d_ids)
            return
        await self._copy_cuda(src, s_ids, dst, d_ids)

    async def _copy_host_async(
        self,
        src: torch.Tensor,
        s_ids: npt.NDArray[np.int64],
        dst: torch.Tensor,
        d_ids: npt.NDArray[np.int64],
    ) -> None:
        """A host-to-host copy: inline when small, else in worker threads."""
        nbytes = len(s_ids) * src.shape[1]
        if nbytes < THREAD_THRESHOLD_BYTES:
            _copy_host(src, s_ids, dst, d_ids)
            return
        # Long runs: one thread, torch spreads each run over its intra-op threads. Short
        # runs (scattered rows): one part per intra-op thread, each part at least
        # HOST_SPLIT_BYTES, copied by numpy in parallel threads. Both off the event loop.
        ways = 1
        if nbytes < run_count(s_ids, d_ids) * HOST_TORCH_RUN_BYTES:
            ways = min(torch.get_num_threads(), nbytes // HOST_SPLIT_BYTES, len(s_ids))
        ways = max(1, ways)
        parts = zip(np.array_split(s_ids, ways), np.array_split(d_ids, ways), strict=True)
        await asyncio.gather(*(asyncio.to_thread(_copy_host, src, s, dst, d) for s, d in parts))

    async def _copy_cuda(
        self,
        src: torch.Tensor,
        s_ids: npt.NDArray[np.int64],
        dst: torch.Tensor,
        d_ids: npt.NDArray[np.int64],
    ) -> None:
        """A copy that touches a GPU, on the device's side stream, awaited by its event.

        Runs of consecutive rows, and device-to-device copies, are issued directly. Scattered
        rows between a GPU and the host are sorted by their host rows, so the GPU does the
        scattering and the host sees runs: one DMA per run when the host tensor is pinned and
        the runs are few, else through pinned staging, whose host half runs in worker threads
        and never touches the staging buffer before the device half's event says the bytes
        are there."""
        device = dst.device if dst.device.type == "cuda" else src.device
        stream = self._stream(device)
        runs = run_count(s_ids, d_ids)
        both_on_device = src.device.type == "cuda" and dst.device.type == "cuda"
        if both_on_device or runs * 4 <= len(s_ids) or runs <= 2:
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                _copy_now(src, s_ids, dst, d_ids, non_blocking=True)
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(stream)
            # src and dst stay referenced by this frame until the copy is done, so their
            # memory cannot be reused under it.
            await wait_event(event)
            return
        if src.device.type == "cuda":
            await self._device_to_host(stream, src, s_ids, dst, d_ids)
        else:
            await self._host_to_device(stream, src, s_ids, dst, d_ids)

    async def _device_to_host(
        self,
        stream: torch.cuda.Stream,
        src: torch.Tensor,
        s_ids: npt.NDArray[np.int64],
        dst: torch.Tensor,
        d_ids: npt.NDArray[np.int64],
    ) -> None:
        """Scattered rows from a GPU to the host: gathered on the device in the order of their
        destination rows, so the host side is runs of consecutive rows. Into pinned memory
        with few runs, each run is one DMA from the gathered rows; otherwise through pinned
        staging and a host copy run by run."""
        device = src.device
        by_dst = np.argsort(d_ids, kind="stable")
        s_sorted, d_sorted = s_ids[by_dst], d_ids[by_dst]
        runs = _runs(d_sorted)
        direct = dst.is_pinned() and _few(len(runs), len(d_sorted))
        staging = None if direct else _pinned_like(len(d_sorted), src)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            index = torch.from_numpy(s_sorted).to(device, non_blocking=True)
            gathered = src.index_select(0, index)
            if staging is None:
                for at, d, length in runs:
                    dst[d : d + length].copy_(gathered[at : at + length], non_blocking=True)
            else:
                staging.copy_(gathered, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        # `gathered`, `index` and the tensors stay referenced by this frame until the event.
        await wait_event(event)
        if staging is not None:
            order = np.arange(len(d_sorted), dtype=np.int64)
            await self._copy_host_async(staging, order, dst, d_sorted)

    async def _host_to_device(
        self,
        stream: torch.cuda.Stream,
        src: torch.Tensor,
        s_ids: npt.NDArray[np.int64],
        dst: torch.Tensor,
        d_ids: npt.NDArray[np.int64],
    ) -> None:
        """Scattered rows from the host to a GPU: read in the order of their source rows (runs
        of consecutive rows), moved to the device as one block, scattered there. From pinned
        memory with few runs, each run is one DMA; otherwise gathered on the host into pinned
        staging first."""
        device = dst.device
        by_src = np.argsort(s_ids, kind="stable")
        s_sorted, d_sorted = s_ids[by_src], d_ids[by_src]
        runs = _runs(s_sorted)
        staging = None
        if not (src.is_pinned() and _few(len(runs), len(s_sorted))):
            staging = _pinned_like(len(s_sorted), src)
            order = np.arange(len(s_sorted), dtype=np.int64)
            await self._copy_host_async(src, s_sorted, staging, order)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            if staging is None:
                moved = torch.empty((len(s_sorted), src.shape[1]), dtype=src.dtype, device=device)
                for at, s, length in runs:
                    moved[at : at + length].copy_(src[s : s + length], non_blocking=True)
            else:
                moved = staging.to(device, non_blocking=True)
            index = torch.from_numpy(d_sorted).to(device, non_blocking=True)
            dst.index_copy_(0, index, moved)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        await wait_event(event)


def _runs(ids: npt.NDArray[np.int64]) -> list[tuple[int, int, int]]:
    """Runs `(position, first id, length)` of consecutive ids in ascending `ids`."""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [len(ids)])))
    return [(int(at), int(ids[at]), int(n)) for at, n in zip(starts, lengths, strict=True)]


def _few(runs: int, rows: int) -> bool:
    """Whether `runs` copies of consecutive rows beat staging `rows` rows: one DMA per run
    when the runs average 4 rows or more (as `_copy_now` decides), or there are at most
    DIRECT_RUNS_MAX of them."""
    return runs * 4 <= rows or runs <= DIRECT_RUNS_MAX


def _pinned_like(rows: int, like: torch.Tensor) -> torch.Tensor:
    """Pinned host rows of `like`'s width and dtype (torch's pinned allocator caches them)."""
    return torch.empty((rows, like.shape[1]), dtype=like.dtype, pin_memory=True)


async def wait_event(event: torch.cuda.Event) -> None:
    """Wait for a CUDA event without blocking the event loop (polling with backoff)."""
    delay = _POLL_FIRST_S
    while not event.query():  # type: ignore[no-untyped-call]
        await asyncio.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_S)
