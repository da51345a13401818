"""kvtier inside vLLM 0.33's real scheduler (issue 10, item 3): vLLM's `Scheduler` and its
`OffloadingConnector` (scheduler and worker roles) are built from a `kv_transfer_config`
naming `KvtierOffloadingSpec`; this test plays the model runner (it writes each scheduled
token's KV into the paged caches, on the CPU). A request is served, its blocks are offloaded
into kvtier, vLLM's prefix cache and its CPU tier are reset and the GPU caches wiped, and the
same prompt is served again: vLLM computes only the tail, the prefix's KV comes back from
kvtier's disk tier bit for bit. A second engine on the same directory (a restart) does the
same from what the first left on disk."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvtier.integrations.vllm import KvtierSecondaryTier

BLOCK = 16  # tokens per GPU block
HEADS, HEAD = 4, 16
NUM_BLOCKS = 64
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
PROMPT = list(range(1, 101))  # 6 full blocks (96 tokens) and a partial one
FULL = (len(PROMPT) // BLOCK) * BLOCK

pytestmark = pytest.mark.timeout(300)


def tiny_model(directory: Path) -> Path:
    """A Llama config without weights: the scheduler needs the model's shape only."""
    directory.mkdir()
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": HEADS * HEAD,
                "intermediate_size": 128,
                "num_attention_heads": HEADS,
                "num_key_value_heads": HEADS,
                "num_hidden_layers": len(LAYERS),
                "vocab_size": 1000,
                "max_position_embeddings": 2048,
                "torch_dtype": "float16",
            }
        )
    )
    return directory


def value(token: int) -> float:
    """The KV the fake model writes for a token (exact in float16)."""
    return float(token % 97) + 0.5


class Engine:
    """vLLM's scheduler and both roles of its OffloadingConnector; `step()` is one engine
    step with this test as the model runner."""

    def __init__(self, model: Path, kvtier_config: dict[str, Any]) -> None:
        extra = {
            "spec_name": "KvtierOffloadingSpec",
            "spec_module_path": "kvtier.integrations.vllm",
            "kvtier_config": kvtier_config,
        }
        config = VllmConfig(
            model_config=ModelConfig(
                model=str(model), skip_tokenizer_init=True, dtype="float16", max_model_len=512
            ),
            cache_config=CacheConfig(
                block_size=BLOCK, enable_prefix_caching=True, num_gpu_blocks_override=NUM_BLOCKS
            ),
            scheduler_config=SchedulerConfig(
                max_num_seqs=4,
                max_num_batched_tokens=512,
                max_model_len=512,
                is_encoder_decoder=False,
            ),
            kv_transfer_config=KVTransferConfig(
                kv_connector="OffloadingConnector",
                kv_role="kv_both",
                kv_connector_extra_config=extra,
            ),
            device_config=DeviceConfig("cpu"),
        )
        config.cache_config.num_gpu_blocks = NUM_BLOCKS
        spec = FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16
        )
        page = spec.page_size_bytes
        kv_cache_config = KVCacheConfig(
            num_blocks=NUM_BLOCKS,
            kv_cache_tensors=[
                KVCacheTensor(
                    size=page * NUM_BLOCKS * len(LAYERS),
                    layers=LAYERS,
                    layer_stride=page * NUM_BLOCKS,
                    block_stride=page,
                )
            ],
            kv_cache_groups=[KVCacheGroupSpec(LAYERS, spec)],
        )
        self.scheduler = Scheduler(
            vllm_config=config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=BLOCK,
            log_stats=True,
        )
        self.worker = OffloadingConnector(config, KVConnectorRole.WORKER, kv_cache_config)
        self.kv = {
            layer: torch.zeros((NUM_BLOCKS, 2, BLOCK, HEADS, HEAD), dtype=torch.float16)
            for layer in LAYERS
        }
        self.worker.register_kv_caches(self.kv)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.computed: dict[str, int] = {}  # tokens vLLM did not compute (prefix hits)
        self.blocks: dict[str, list[int]] = {}

    @property
    def tier(self) -> KvtierSecondaryTier:
        (tier,) = self.scheduler.connector.scheduler.manager.secondary_tiers
        assert isinstance(tier, KvtierSecondaryTier)
        return tier

    def step(self) -> None:
        out = self.scheduler.schedule()
        worker = self.worker
        worker.handle_preemptions(out.kv_connector_metadata)
        worker.bind_connector_metadata(out.kv_connector_metadata)
        worker.start_load_kv(None)
        for new in out.scheduled_new_reqs:
            request = self.scheduler.requests[new.req_id]
            (blocks,) = new.block_ids
            self.computed[new.req_id] = new.num_computed_tokens
            self.blocks[new.req_id] = list(blocks)
            first = new.num_computed_tokens
            for position in range(first, first + out.num_scheduled_tokens[new.req_id]):
                for layer in LAYERS:  # the model computes this token's K and V
                    block = blocks[position // BLOCK]
                    self.kv[layer][block, :, position % BLOCK] = value(
                        request.all_token_ids[position]
                    )
        worker.wait_for_save()
        sending, receiving = worker.get_finished(out.finished_req_ids)
        meta = worker.build_connector_worker_meta()
        worker.clear_connector_metadata()
        ids = list(out.num_scheduled_tokens)
        self.scheduler.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={req_id: i for i, req_id in enumerate(ids)},
                sampled_token_ids=[[7] for _ in ids],
                kv_connector_output=KVConnectorOutput(
                    finished_sending=sending,
                    finished_recving=receiving,
                    kv_connector_worker_meta=meta,
                ),
            ),
        )

    def serve(self, request_id: str, timeout_s: float = 60.0) -> None:
        """Serve one request of PROMPT and step until vLLM holds nothing more for it."""
        self.scheduler.add_request(
            Request(
                request_id, PROMPT, SamplingParams(max_tokens=1), None, block_hasher=self.hasher
            )
        )
        deadline = time.monotonic() + timeout_s
        while self.scheduler.has_requests() or self.tier.has_pending_work():
            assert time.monotonic() < deadline, "the request did not finish"
            self.step()
            time.sleep(0.005)

    def prefix_is_intact(self, request_id: str) -> bool:
        blocks = self.blocks[request_id]
        return all(
            bool((self.kv[layer][blocks[pos // BLOCK], :, pos % BLOCK] == value(PROMPT[pos])).all())
            for layer in LAYERS
            for pos in range(FULL)
        )

    def forget(self) -> None:
        """Reset vLLM's prefix cache and its CPU tier, and wipe the GPU caches."""
        assert self.scheduler.reset_prefix_cache(reset_connector=True)
        for tensor in self.kv.values():
            tensor.zero_()

    def shutdown(self) -> None:
        self.worker.shutdown()
        self.scheduler.shutdown()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return tiny_model(tmp_path / "model")


def chain(tmp_path: Path) -> dict[str, Any]:
    return {
        "tiers": [
            {"name": "host", "medium": "cpu", "capacity": 16, "policy": "arc"},
            {
                "name": "disk",
                "medium": "disk",
                "capacity": 64,
                "path": str(tmp_path / "kv"),
                "fsync": False,
            },
        ]
    }


def test_a_prefix_served_again_comes_back_from_kvtier(model: Path, tmp_path: Path) -> None:
    engine = Engine(model, chain(tmp_path))
    try:
        engine.serve("first")
        assert engine.computed["first"] == 0
        assert engine.tier.hierarchy.call(lambda h: h.stats().tiers[0].used) == FULL // BLOCK
        engine.forget()
        engine.serve("again")
        assert engine.computed["again"] == FULL  # only the partial block is recomputed
        assert engine.prefix_is_intact("again")
        calls = engine.tier.hierarchy.stats().calls
        assert calls.get_served == FULL // BLOCK  # promoted from kvtier's disk tier
    finally:
        engine.shutdown()


def test_a_restarted_engine_serves_the_prefix_from_kvtiers_disk(
    model: Path, tmp_path: Path
) -> None:
    engine = Engine(model, chain(tmp_path))
    try:
        engine.serve("first")
    finally:
        engine.shutdown()
    engine = Engine(model, chain(tmp_path))  # a new vLLM process on the same disk tier
    try:
        engine.serve("after-restart")
        assert engine.computed["after-restart"] == FULL
        assert engine.prefix_is_intact("after-restart")
    finally:
        engine.shutdown()
