"""A serving engine's paged KV caches, as bytes per block: what a GPU <-> host handler copies.

An engine keeps its KV cache as tensors whose layouts differ by attention backend: one tensor
per layer of shape `(num_blocks, ...)`, or `(2, num_blocks, ...)` with K and V apart, layers
of one cache group sharing one tensor, pages padded for alignment. Offloading needs none of
that: only "the bytes of block b of this tensor". So the caches are first *canonicalized*:

- `CanonicalKVCacheTensor`: one tensor viewed as `[num_blocks, page_size_bytes]` uint8 (a
  view, never a copy: the handler writes into the engine's memory);
- `CanonicalKVCacheRef`: a layer's (or layer group's) use of one of those tensors, with its
  un-padded page size (only those bytes are offloaded);
- `CanonicalKVCaches`: the unique tensors, and per KV-cache group the refs of its layers.

`canonicalize_kv_caches` builds them from `{layer name: tensor}` and the layer names of each
group, splitting a K/V-first layout so that every tensor starts with num_blocks and sharing
one canonical tensor between layers that alias the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from kvtier.errors import SpecError


@dataclass(frozen=True)
class CanonicalKVCacheTensor:
    """A KV cache tensor viewed as `[num_blocks, page_size_bytes]` uint8: row b holds the
    bytes of block b (rows may be further apart than page_size_bytes)."""

    tensor: torch.Tensor
    page_size_bytes: int

    def __post_init__(self) -> None:
        tensor = self.tensor
        if not isinstance(tensor, torch.Tensor):
            raise SpecError(f"a canonical tensor must be a torch.Tensor, got {type(tensor)}")
        if tensor.dtype not in (torch.uint8, torch.int8) or tensor.dim() != 2:
            raise SpecError(
                "a canonical tensor is [num_blocks, page_size_bytes] uint8/int8, got "
                f"{tuple(tensor.shape)} {tensor.dtype}"
            )
        if tensor.shape[1] != self.page_size_bytes or tensor.stride(1) != 1:
            raise SpecError(
                f"a canonical tensor's rows must be {self.page_size_bytes} contiguous bytes, got "
                f"shape {tuple(tensor.shape)} strides {tensor.stride()}"
            )

    @property
    def num_blocks(self) -> int:
        return int(self.tensor.shape[0])

    @property
    def pages(self) -> torch.Tensor:
        """The rows as uint8 (an int8 tensor is reinterpreted, not copied)."""
        return self.tensor if self.tensor.dtype == torch.uint8 else self.tensor.view(torch.uint8)


@dataclass(frozen=True)
class CanonicalKVCacheRef:
    """One layer's (or layer group's) bytes in a canonical tensor: the tensor's index, and
    the un-padded page size (the first `page_size_bytes` of each row are the layer's data)."""

    tensor_idx: int
    page_size_bytes: int


@dataclass(frozen=True)
class CanonicalKVCaches:
    """The unique canonical tensors, and for each KV-cache group the refs of its layers."""

    tensors: tuple[CanonicalKVCacheTensor, ...]
    group_data_refs: tuple[tuple[CanonicalKVCacheRef, ...], ...]

    def __post_init__(self) -> None:
        if not self.tensors:
            raise SpecError("canonical KV caches need at least one tensor")
        blocks = {tensor.num_blocks for tensor in self.tensors}
        if len(blocks) != 1:
            raise SpecError(f"every canonical tensor must have the same num_blocks, got {blocks}")
        devices = {tensor.tensor.device for tensor in self.tensors}
        if len(devices) != 1:
            raise SpecError(f"every canonical tensor must be on one device, got {devices}")
        for group, refs in enumerate(self.group_data_refs):
            if not refs:
                raise SpecError(
                    f"KV-cache group {group} has no layer's bytes to copy (no refs): its "
                    "blocks would be offloaded without their KV"
                )
            for ref in refs:
                if not 0 <= ref.tensor_idx < len(self.tensors):
                    raise SpecError(
                        f"group {group}: tensor_idx {ref.tensor_idx} is not one of the "
                        f"{len(self.tensors)} tensors"
                    )
                page = self.tensors[ref.tensor_idx].page_size_bytes
                if not 0 < ref.page_size_bytes <= page:
                    raise SpecError(
                        f"group {group}: page_size_bytes {ref.page_size_bytes} must be in "
                        f"(0, {page}] (its tensor's page)"
                    )

    @property
    def num_blocks(self) -> int:
        """GPU blocks per tensor."""
        return self.tensors[0].num_blocks

    @property
    def device(self) -> torch.device:
        return self.tensors[0].tensor.device

    def bytes_per_block(self) -> int:
        """Bytes one GPU block holds across every canonical tensor (whole pages)."""
        return sum(tensor.page_size_bytes for tensor in self.tensors)


def _as_pages(tensor: torch.Tensor, num_blocks: int, what: str) -> torch.Tensor:
    """`tensor` (leading dimension num_blocks, each block's bytes contiguous) viewed as
    `[num_blocks, row bytes]` uint8 over the same memory."""
    if tensor.shape[0] != num_blocks:
        raise SpecError(
            f"{what}: expected {num_blocks} blocks first, got shape {tuple(tensor.shape)}"
        )
    block = tensor[0] if num_blocks else tensor
    if num_blocks and not block.is_contiguous():
        raise SpecError(f"{what}: the bytes of one block must be contiguous (a page)")
    item = tensor.element_size()
    page = block.numel() * item
    stride = tensor.stride(0) * item
    if stride < page:
        raise SpecError(f"{what}: blocks overlap (stride {stride} bytes < page {page} bytes)")
    offset = tensor.storage_offset() * item
    view = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return view.set_(tensor.untyped_storage(), offset, (num_blocks, page), (stride, 1))


def canonicalize_kv_caches(
    layers: Mapping[str, torch.Tensor],
    groups: Sequence[Sequence[str]],
    num_blocks: int,
    unpadded_page_bytes: Mapping[str, int] | None = None,
) -> CanonicalKVCaches:
    """The canonical form of an engine's KV caches.

    Args:
        layers: each layer's KV cache tensor: `(num_blocks, ...)`, or `(2, num_blocks, ...)`
            with K and V apart (split into two canonical tensors).
        groups: the layer names of each KV-cache group, in group order.
        num_blocks: GPU blocks per tensor.
        unpadded_page_bytes: per layer, the bytes of a page that hold data (per K or V half
            for a split layout); default the whole page.

    Layers whose tensors are the same bytes (same address and strides) share one canonical
    tensor. Raises SpecError naming the layer when a layout is not one of these.
    """
    tensors: list[CanonicalKVCacheTensor] = []
    by_region: dict[tuple[int, tuple[int, ...], torch.device], int] = {}
    refs_of: dict[str, list[CanonicalKVCacheRef]] = {}
    for name, tensor in layers.items():
        if not isinstance(tensor, torch.Tensor):
            raise SpecError(f"layer {name!r}: expected a torch.Tensor, got {type(tensor)}")
        if tensor.dim() >= 2 and tensor.shape[0] == 2 and tensor.shape[1] == num_blocks:
            parts = [tensor[0], tensor[1]]  # K, V
        elif tensor.dim() >= 1 and tensor.shape[0] == num_blocks:
            parts = [tensor]
        else:
            raise SpecError(
                f"layer {name!r}: shape {tuple(tensor.shape)} is neither (num_blocks={num_blocks}, "
                "...) nor (2, num_blocks, ...)"
            )
        refs: list[CanonicalKVCacheRef] = []
        for part in parts:
            pages = _as_pages(part, num_blocks, f"layer {name!r}")
            region = (pages.data_ptr(), pages.stride(), pages.device)
            index = by_region.get(region)
            if index is None:
                index = len(tensors)
                tensors.append(CanonicalKVCacheTensor(pages, int(pages.shape[1])))
                by_region[region] = index
            used = tensors[index].page_size_bytes
            if unpadded_page_bytes is not None and name in unpadded_page_bytes:
                used = unpadded_page_bytes[name]
            refs.append(CanonicalKVCacheRef(index, used))
        refs_of[name] = refs
    group_refs: list[tuple[CanonicalKVCacheRef, ...]] = []
    for group, names in enumerate(groups):
        refs = []
        for name in names:
            if name not in refs_of:
                raise SpecError(f"group {group}: layer {name!r} has no KV cache tensor")
            refs += refs_of[name]
        group_refs.append(tuple(refs))
    return CanonicalKVCaches(tuple(tensors), tuple(group_refs))
