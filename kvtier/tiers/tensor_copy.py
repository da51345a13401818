"""Row copies between torch tensors of blocks, without blocking the event loop.

A block is one row of a `[num_blocks, block_size]` uint8 tensor. Copies between host tensors
run in a worker thread once they are large enough to matter (torch releases the GIL while it
copies). Copies that touch a CUDA device are queued on a dedicated stream per device, after
the work already queued on the current stream (so a freshly computed tensor is complete), and
awaited by polling a CUDA event: the event loop never blocks on the GPU.

Contiguous runs of slots are coalesced into one copy each; scattered slots use one gather and
one scatter, which beats many tiny copies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

THREAD_THRESHOLD_BYTES = 1 << 20
"""Host copies smaller than this run inline: a thread hop costs more than the copy."""

_POLL_FIRST_S = 20e-6
_POLL_MAX_S = 1e-3


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
        """`dst[dst_ids[i]] = src[src_ids[i]]` for every i; returns when the bytes are there."""
        s_ids = np.asarray(src_ids, dtype=np.int64)
        d_ids = np.asarray(dst_ids, dtype=np.int64)
        if len(s_ids) != len(d_ids):
            raise ValueError(f"{len(s_ids)} source rows but {len(d_ids)} destination rows")
        if len(s_ids) == 0:
            return
        cuda = src.device.type == "cuda" or dst.device.type == "cuda"
        if not cuda:
            nbytes = len(s_ids) * src.shape[1]
            if nbytes < THREAD_THRESHOLD_BYTES:
                _copy_now(src, s_ids, dst, d_ids, non_blocking=False)
            else:
                await asyncio.to_thread(_copy_now, src, s_ids, dst, d_ids, False)
            return
        device = dst.device if dst.device.type == "cuda" else src.device
        stream = self._stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            _copy_now(src, s_ids, dst, d_ids, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        # src and dst stay referenced by this frame until the copy is done, so their memory
        # cannot be reused under it.
        await wait_event(event)


async def wait_event(event: torch.cuda.Event) -> None:
    """Wait for a CUDA event without blocking the event loop (polling with backoff)."""
    delay = _POLL_FIRST_S
    while not event.query():  # type: ignore[no-untyped-call]
        await asyncio.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_S)
