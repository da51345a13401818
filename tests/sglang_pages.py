"""What the tests of kvtier's SGLang backend share (the main suite's
tests/test_sglang_backend.py and the SGLang lane's tests/sglang_lane/): a host pool that
mirrors SGLang's `MHATokenToKVPoolHost`, SGLang-style page keys, host indices and a chain."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

LAYERS, HEADS, HEAD_DIM, PAGE = 2, 2, 8, 4
"""A host pool of 2 layers x 2 heads x 8 dims, 4 tokens a page: 512-byte pages in bf16."""


class FakeHostPool:
    """SGLang's `MHATokenToKVPoolHost` in its layer-first layout, reduced to what a storage
    backend uses: `kv_buffer[2, layers, tokens, heads, head_dim]` and its page functions."""

    def __init__(self, tokens: int = 64, dtype: torch.dtype = torch.bfloat16) -> None:
        self.page_size = PAGE
        self.layout = "layer_first"
        self.storage_format_tag: str | None = None
        self.logical_size = tokens
        self.dtype = dtype
        self.kv_buffer = torch.zeros((2, LAYERS, tokens, HEADS, HEAD_DIM), dtype=dtype)
        self.fail_writes = False

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[:, :, index : index + self.page_size, :, :]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros((2, LAYERS, self.page_size, HEADS, HEAD_DIM), dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        if self.fail_writes:
            raise RuntimeError("host pool write failed")
        shape = (2, LAYERS, self.page_size, HEADS, HEAD_DIM)
        self.kv_buffer[:, :, index : index + self.page_size, :, :] = data_page.reshape(shape)

    def fill(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.kv_buffer.copy_(torch.randn(self.kv_buffer.shape, generator=generator))


def hashes(n: int, salt: str = "") -> list[str]:
    """n SGLang-style page keys (64 hex digits)."""
    return [hashlib.sha256(f"{salt}page-{i}".encode()).hexdigest() for i in range(n)]


def indices(pages: list[int]) -> torch.Tensor:
    """Host indices of the token slots of `pages` (page p is tokens p*PAGE .. p*PAGE+3)."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def chain(disk: Path, cpu_blocks: int = 2) -> dict[str, Any]:
    """A cpu -> disk chain of kvtier (its block size is set to SGLang's page size)."""
    return {
        "block_size": 4096,  # replaced by SGLang's page size
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": cpu_blocks},
            {"name": "disk", "medium": "disk", "capacity": 64, "path": str(disk)},
        ],
    }


def page(pool: FakeHostPool, p: int) -> torch.Tensor:
    """A copy of page `p` of `pool`, flat."""
    return pool.get_data_page(p * PAGE).clone()
