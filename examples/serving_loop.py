"""A small serving loop: kvtier's prefix-caching GPU block allocator, demoting the blocks it
evicts into a kvtier hierarchy and loading them back when a later request needs them.

Requests come from the Mooncake conversation trace shipped with kvtier; each trace hash id
becomes one full block of synthesized token ids (equal hash-id prefixes give equal token
prefixes, hence equal content hashes). The "model" is a pure function of a block's content
hash: computing a block writes `kv_for(content_hash)` into its row of the KV tensor. So every
block that comes back from a lower tier can be checked bit for bit.

For each request:

1. demote: the bytes the allocator's eviction listener copied out are `put` into the
   hierarchy, keyed by `make_offload_key(content_hash)`;
2. look up: `find_cached_blocks_prefix` on the GPU, then `Hierarchy.lookup` for the rest;
3. allocate the prompt's blocks (cached ones are shared and cost nothing);
4. fill the blocks that are not already computed on the GPU: those the hierarchy holds are
   loaded with `Hierarchy.get` and verified against `kv_for`, the others are "computed";
5. mark them computed and accessed, decode a few tokens into a mutable block, free the request.

Run: `.venv/bin/python examples/serving_loop.py --limit 200` (needs torch; uses CUDA for the
KV tensor when available).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvtier.allocator import Block, PrefixCachingBlockAllocator, hash_token_blocks
from kvtier.hierarchy import Hierarchy
from kvtier.keys import OffloadKey, make_offload_key
from kvtier_tools.workloads.traces import TraceRequest, read_mooncake


def kv_for(content_hash: bytes, block_bytes: int) -> torch.Tensor:
    """The KV bytes of the block whose content hash is `content_hash` (the stand-in model)."""
    data = hashlib.shake_128(content_hash).digest(block_bytes)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def block_tokens(hash_id: int, block_tokens: int) -> list[int]:
    """The token ids synthesized for trace block `hash_id`: distinct ids per hash id."""
    return [hash_id * block_tokens + offset for offset in range(block_tokens)]


def tier_config(
    disk_dir: Path, block_bytes: int, cpu_blocks: int, disk_blocks: int
) -> dict[str, Any]:
    """A small CPU -> disk hierarchy for the demoted blocks."""
    return {
        "block_size": block_bytes,
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": cpu_blocks, "pin_memory": False},
            {
                "name": "disk",
                "medium": "disk",
                "capacity": disk_blocks,
                "path": str(disk_dir),
                "fsync": False,
            },
        ],
    }


@dataclass
class LoopStats:
    """What the loop did, in blocks (except `requests`)."""

    requests: int = 0
    prompt_blocks: int = 0
    gpu_hits: int = 0
    lower_tier_hits: int = 0
    computed: int = 0
    evicted: int = 0
    demoted: int = 0
    verified: int = 0
    mismatches: int = 0
    truncated_requests: int = 0
    hierarchy: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [
            f"requests            {self.requests} ({self.truncated_requests} truncated to fit)",
            f"prompt blocks       {self.prompt_blocks}",
            f"  GPU cache hits    {self.gpu_hits}",
            f"  lower-tier hits   {self.lower_tier_hits} (loaded back, verified bit-exact: "
            f"{self.verified}, mismatches: {self.mismatches})",
            f"  computed          {self.computed}",
            f"evicted from GPU    {self.evicted} (demoted into the hierarchy: {self.demoted})",
        ]
        lines += [f"hierarchy {name:<10}{value}" for name, value in self.hierarchy.items()]
        return "\n".join(lines)


class ServingLoop:
    """The GPU allocator, its KV tensor, and the hierarchy below it."""

    def __init__(
        self,
        hierarchy: Hierarchy,
        *,
        gpu_blocks: int,
        block_tokens: int,
        block_bytes: int,
        decode_tokens: int,
        device: torch.device,
    ) -> None:
        self.hierarchy = hierarchy
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.decode_tokens = decode_tokens
        self.device = device
        self.kv = torch.zeros((gpu_blocks, block_bytes), dtype=torch.uint8, device=device)
        self.gpu = PrefixCachingBlockAllocator(gpu_blocks, block_tokens, on_evict=self._on_evict)
        self.pending: dict[bytes, torch.Tensor] = {}
        self.stats = LoopStats()
        self.clock = 0.0

    def _row(self, block_id: int) -> int:
        return self.gpu.get_physical_block_id(block_id)

    def _on_evict(self, content_hash: bytes, block_id: int) -> None:
        """The allocator is about to reuse `block_id`: copy its KV out while it is intact."""
        self.pending[content_hash] = self.kv[self._row(block_id)].to("cpu", copy=True)
        self.stats.evicted += 1

    async def demote(self) -> None:
        """Put the evicted blocks' bytes into the hierarchy (its top tier spills to disk)."""
        if not self.pending:
            return
        hashes = list(self.pending)
        keys: list[OffloadKey] = [make_offload_key(content_hash) for content_hash in hashes]
        blocks = torch.stack([self.pending[content_hash] for content_hash in hashes])
        self.pending.clear()
        for content_hash, row in zip(hashes, blocks, strict=True):
            if not torch.equal(row, kv_for(content_hash, self.block_bytes)):
                self.stats.mismatches += 1  # the GPU copy was already wrong
        self.stats.demoted += await self.hierarchy.put(keys, blocks)

    async def serve(self, request: TraceRequest) -> None:
        """Prefill `request`'s prompt (loading what the hierarchy holds), decode, free."""
        await self.demote()
        hash_ids = request.hash_ids
        limit = self.gpu.get_num_total_blocks() - 1  # room for the decode block
        if len(hash_ids) > limit:
            hash_ids = hash_ids[:limit]
            self.stats.truncated_requests += 1
        chunks = [block_tokens(hash_id, self.block_tokens) for hash_id in hash_ids]
        token_ids = [token for chunk in chunks for token in chunk]
        hashes = hash_token_blocks(token_ids, self.block_tokens)

        on_gpu = len(self.gpu.find_cached_blocks_prefix(hashes))
        lower_keys = [make_offload_key(content_hash) for content_hash in hashes[on_gpu:]]
        in_lower = self.hierarchy.lookup(lower_keys)

        blocks = self.gpu.allocate_immutable_blocks(None, chunks)
        loaded = await self.hierarchy.get(lower_keys[:in_lower]) if in_lower else None
        for index, (block, content_hash) in enumerate(zip(blocks, hashes, strict=True)):
            self._fill(index, block, content_hash, on_gpu, loaded)

        ids = [self._id(block) for block in blocks]
        self.clock += 1.0
        self.gpu.mark_blocks_as_computed(ids)
        self.gpu.mark_blocks_as_accessed(ids, self.clock)
        self.stats.requests += 1
        self.stats.prompt_blocks += len(blocks)

        tail = self.gpu.allocate_mutable_block(blocks[-1] if blocks else None)
        room = min(self.decode_tokens, tail.num_empty_slots)
        tail.append_token_ids([(self.stats.requests << 20) + i for i in range(room)])
        for block in [*blocks, tail][::-1]:
            self.gpu.free(block)

    def _fill(
        self,
        index: int,
        block: Block,
        content_hash: bytes,
        on_gpu: int,
        loaded: torch.Tensor | None,
    ) -> None:
        """Give prompt block `index` its KV: already there, loaded (verified), or computed."""
        row = self._row(self._id(block))
        if block.computed:
            self.stats.gpu_hits += 1
            return
        position = index - on_gpu
        if loaded is not None and 0 <= position < loaded.shape[0]:
            data = loaded[position]
            if torch.equal(data, kv_for(content_hash, self.block_bytes)):
                self.stats.verified += 1
            else:
                self.stats.mismatches += 1
            self.kv[row].copy_(data.to(self.device))
            self.stats.lower_tier_hits += 1
            return
        self.kv[row].copy_(kv_for(content_hash, self.block_bytes).to(self.device))
        self.stats.computed += 1

    @staticmethod
    def _id(block: Block) -> int:
        if block.block_id is None:
            raise RuntimeError(f"{block!r} holds no block")
        return block.block_id


async def run(
    requests: Sequence[TraceRequest],
    config: dict[str, Any] | Path,
    *,
    gpu_blocks: int = 128,
    block_tokens: int = 16,
    decode_tokens: int = 4,
    device: str | None = None,
) -> LoopStats:
    """Serve `requests` against a hierarchy opened from `config`; returns the counters."""
    hierarchy = Hierarchy.from_config(config)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    async with hierarchy as h:
        loop = ServingLoop(
            h,
            gpu_blocks=gpu_blocks,
            block_tokens=block_tokens,
            block_bytes=h.block_size,
            decode_tokens=decode_tokens,
            device=torch.device(device),
        )
        for request in requests:
            await loop.serve(request)
        await loop.demote()
        h.check()
        loop.gpu.check()
        stats = h.stats()
        loop.stats.hierarchy = {
            "put": stats.calls.put_blocks,
            "stored": stats.calls.put_stored,
            "get": stats.calls.get_blocks,
            "served": stats.calls.get_served,
        }
        for (src, dst), (moved, _, _) in sorted(stats.pairs.items()):
            loop.stats.hierarchy[f"{src}->{dst}"] = moved
        return loop.stats


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, run the loop, print the counters; 1 if any block failed verification."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--limit", type=int, default=200, help="requests to serve (default 200)")
    parser.add_argument("--gpu-blocks", type=int, default=128, help="GPU allocator blocks")
    parser.add_argument("--block-tokens", type=int, default=16, help="tokens per block")
    parser.add_argument("--block-bytes", type=int, default=4096, help="KV bytes per block")
    parser.add_argument("--cpu-blocks", type=int, default=64, help="CPU tier blocks")
    parser.add_argument("--disk-blocks", type=int, default=16384, help="disk tier blocks")
    parser.add_argument("--disk-dir", type=Path, help="disk tier directory (default: a temp dir)")
    parser.add_argument("--config", type=Path, help="a kvtier TOML config instead of cpu+disk")
    parser.add_argument("--decode-tokens", type=int, default=4, help="tokens decoded per request")
    parser.add_argument("--device", help="device of the KV tensor (default: cuda if available)")
    args = parser.parse_args(argv)
    if args.limit < 0:
        parser.error(f"--limit must be >= 0, got {args.limit}")
    requests = list(itertools.islice(read_mooncake(), args.limit))

    with tempfile.TemporaryDirectory(prefix="kvtier-serving-") as scratch:
        disk_dir = args.disk_dir or Path(scratch)
        config: dict[str, Any] | Path = args.config or tier_config(
            disk_dir, args.block_bytes, args.cpu_blocks, args.disk_blocks
        )
        stats = asyncio.run(
            run(
                requests,
                config,
                gpu_blocks=args.gpu_blocks,
                block_tokens=args.block_tokens,
                decode_tokens=args.decode_tokens,
                device=args.device,
            )
        )
    print(stats.summary())
    return 1 if stats.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
