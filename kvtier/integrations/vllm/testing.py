"""vLLM's normalized `OffloadingConfig` without an engine: one worker, one KV-cache group,
for driving vLLM's offloading classes directly (kvtier's tests and benchmarks)."""

from __future__ import annotations

import uuid
from typing import Any

from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)


def offloading_config(
    extra: dict[str, Any],
    *,
    block_bytes: int = 4096,
    blocks_per_chunk: int = 1,
    events: bool = True,
    engine_id: str | None = None,
    model: str = "kvtier-test",
) -> OffloadingConfig:
    """The config vLLM builds for `kv_connector_extra_config = extra`, one worker holding
    `block_bytes` per GPU block (an engine id of its own unless given)."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=events,
        extra_config=extra,
        engine_id=engine_id or f"kvtier-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )
