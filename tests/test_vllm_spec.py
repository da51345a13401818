"""`KvtierOffloadingSpec`: one kvtier config for vLLM 0.33's whole offloading stack (issue
10, item 2). The first (cpu) tier sizes vLLM's shared host region and picks its eviction
policy, the tiers below become one `KvtierSecondaryTier`; on a platform vLLM has no worker
for (this CPU machine) kvtier's `PagedKVHandler`s copy between the paged KV caches and the
region. Blocks go GPU -> host -> disk and come back bit for bit."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm_support import MODULE, Driver, key

from kvtier.errors import ConfigError
from kvtier.integrations.vllm import (
    KvtierARCCachePolicy,
    KvtierOffloadingSpec,
    KvtierSecondaryTier,
)
from kvtier.integrations.vllm.testing import offloading_config
from kvtier.integrations.vllm.worker import KvtierOffloadingWorker

PAGES = (1024, 3072)  # two canonical tensors (e.g. K and V of different widths)
BLOCK = sum(PAGES)
GPU_BLOCKS = 32


def kvtier_config(tmp_path: Path, host: Any = 4, disk: Any = 64) -> dict[str, Any]:
    return {
        "tiers": [
            {"name": "host", "medium": "cpu", "capacity": host, "policy": "arc"},
            {
                "name": "disk",
                "medium": "disk",
                "capacity": disk,
                "path": str(tmp_path / "d"),
                "fsync": False,
            },
        ]
    }


def make_spec(extra: dict[str, Any], blocks_per_chunk: int = 2) -> KvtierOffloadingSpec:
    config = offloading_config(
        {"kvtier_config": extra} if "tiers" in extra else extra,
        block_bytes=BLOCK,
        blocks_per_chunk=blocks_per_chunk,
        engine_id=f"kvtier-spec-{uuid.uuid4().hex[:12]}",
    )
    return KvtierOffloadingSpec(config)


def paged_caches(seed: int) -> tuple[CanonicalKVCaches, list[torch.Tensor]]:
    """vLLM canonical KV caches over CPU tensors standing in for the GPU."""
    generator = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randint(0, 256, (GPU_BLOCKS, page), dtype=torch.uint8, generator=generator).view(
            torch.int8
        )
        for page in PAGES
    ]
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(t, page) for t, page in zip(tensors, PAGES, strict=True)],
        group_data_refs=[[CanonicalKVCacheRef(i, page) for i, page in enumerate(PAGES)]],
    )
    return caches, tensors


def test_vllm_loads_the_spec_by_name_and_the_config_sets_the_stack(tmp_path: Path) -> None:
    assert (
        OffloadingSpecFactory.get_spec_cls(
            {"spec_name": "KvtierOffloadingSpec", "spec_module_path": MODULE}
        )
        is KvtierOffloadingSpec
    )
    spec = make_spec(kvtier_config(tmp_path, host=4))
    assert spec.num_chunks == 4
    assert spec.eviction_policy == "KvtierARCCachePolicy"
    manager = spec.get_manager()
    try:
        assert isinstance(manager, TieringOffloadingManager)
        assert isinstance(manager.primary_tier._policy, KvtierARCCachePolicy)
        (tier,) = manager.secondary_tiers
        assert isinstance(tier, KvtierSecondaryTier)
        assert [(t.name, t.num_blocks) for t in tier.hierarchy.tiers] == [("disk", 64)]
    finally:
        manager.shutdown()


def test_a_host_capacity_in_bytes_is_whole_chunks(tmp_path: Path) -> None:
    spec = make_spec(kvtier_config(tmp_path, host="40KiB"), blocks_per_chunk=2)
    assert spec.kv_bytes_per_chunk == 2 * BLOCK
    assert spec.num_chunks == (40 << 10) // (2 * BLOCK)


@pytest.mark.parametrize("given", ["cpu_bytes_to_use", "secondary_tiers", "eviction_policy"])
def test_settings_derived_from_the_kvtier_config_are_refused_by_hand(
    tmp_path: Path, given: str
) -> None:
    extra = {"kvtier_config": kvtier_config(tmp_path), given: 1}
    with pytest.raises(ConfigError, match=f"{given}: set from kvtier_config"):
        make_spec(extra)


def test_the_first_tier_must_be_host_memory(tmp_path: Path) -> None:
    config = kvtier_config(tmp_path)
    config["tiers"] = config["tiers"][1:]
    with pytest.raises(ConfigError, match="the first tier must have medium 'cpu'"):
        make_spec(config)


def test_blocks_round_trip_gpu_host_disk_host_gpu_bit_for_bit(tmp_path: Path) -> None:
    spec = make_spec(kvtier_config(tmp_path, host=4), blocks_per_chunk=2)
    manager = spec.get_manager()
    caches, gpu = paged_caches(seed=3)
    worker = spec.get_worker(caches)
    assert isinstance(worker, KvtierOffloadingWorker)
    driver = Driver(manager)
    original = [t.clone() for t in gpu]
    keys = [key(i) for i in range(8)]  # 8 chunks of 2 GPU blocks: twice the host tier
    job = 0
    try:
        for first in range(0, 8, 4):
            context = ReqContext(req_id=f"store{first}")
            with manager.lock:
                manager.on_new_request(context)
                out = manager.prepare_store(keys[first : first + 4], context)
            assert out is not None
            gpu_blocks = [b for i in range(first, first + 4) for b in (2 * i, 2 * i + 1)]
            source = GPULoadStoreSpec(gpu_blocks, group_sizes=[8], block_indices=[2 * first])
            assert worker.submit_store(job, source, out.store_spec)
            worker.wait({job})
            assert [r.success for r in worker.get_finished()] == [True]
            job += 1
            with manager.lock:
                manager.complete_store(out.keys_to_store, context)
                manager.on_request_finished(context)
            driver.settle()
        for t in gpu:
            t.zero_()  # the GPU forgot everything
        context = ReqContext(req_id="load")
        with manager.lock:
            manager.on_new_request(context)
        for index, k in enumerate(keys):
            assert driver.lookup(k, context) is LookupResult.HIT, index
            with manager.lock:
                host = manager.prepare_load([k], context)
            target = GPULoadStoreSpec(
                [2 * index, 2 * index + 1], group_sizes=[2], block_indices=[2 * index]
            )
            assert worker.submit_load(job, host, target, expedited=index % 2 == 1)
            worker.wait({job})
            assert [r.success for r in worker.get_finished()] == [True]
            job += 1
            with manager.lock:
                manager.complete_load([k], context)
        for t, expected in zip(gpu, original, strict=True):
            assert torch.equal(t[:16], expected[:16])  # the 16 GPU blocks of the 8 chunks
        where = manager.secondary_tiers[0].hierarchy.call(lambda h: [h.where(k) for k in keys])
        assert where == ["disk"] * 8
    finally:
        driver.close()
        worker.shutdown()
        manager.shutdown()


def readme_configs() -> list[dict[str, Any]]:
    import json
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", readme, re.DOTALL)]


def shipped(path: Path) -> dict[str, Any]:
    """A shipped TOML config as a dict, its capacities made tiny (the real ones would
    preallocate gigabytes here)."""
    import tomllib

    data = tomllib.loads(path.read_text())
    for tier in data["tiers"]:
        tier["capacity"] = 8 if tier["medium"] == "cpu" else 16
    return data


@pytest.mark.parametrize("name", ["vllm.toml", "vllm-cpu.toml", "vllm-disk.toml"])
def test_the_shipped_vllm_configs_are_valid_chains(name: str) -> None:
    from kvtier.integrations.vllm import chain_config_for_vllm

    config = Path(__file__).resolve().parent.parent / "configs" / name
    chain = chain_config_for_vllm(config, 2 * BLOCK)
    assert chain.block_size == 2 * BLOCK and chain.strict
    assert chain.tiers[-1].medium == "disk" and chain.tiers[-1].fsync


def test_the_readmes_three_configs_start_kvtier_in_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each README `--kv-transfer-config` builds its stack through vLLM's own spec factory
    (with the shipped TOML files, their disk directory moved to tmp_path)."""
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the configs. default path
    configs = readme_configs()
    assert len(configs) == 3
    repo = Path(__file__).resolve().parent.parent / "configs"
    kinds = []
    for transfer in configs:
        assert transfer["kv_connector"] == "OffloadingConnector"
        extra = dict(transfer["kv_connector_extra_config"])
        extra["cpu_bytes_to_use"] = extra.get("cpu_bytes_to_use") and 8 * 2 * BLOCK
        if "kvtier_config" in extra:
            extra["kvtier_config"] = shipped(repo / Path(extra["kvtier_config"]).name)
            extra.pop("cpu_bytes_to_use")
        for tier in extra.get("secondary_tiers", []):
            tier["config"] = shipped(repo / Path(tier["config"]).name)
        config = offloading_config(extra, block_bytes=BLOCK, blocks_per_chunk=2)
        spec = OffloadingSpecFactory.create_spec(config)
        manager = spec.get_manager()
        try:
            primary = manager.primary_tier if hasattr(manager, "primary_tier") else manager
            kinds.append(
                (
                    type(spec).__name__,
                    type(primary._policy).__name__,
                    [type(t).__name__ for t in getattr(manager, "secondary_tiers", [])],
                )
            )
        finally:
            manager.shutdown()
        assert isinstance(spec, CPUOffloadingSpec)
    assert kinds == [
        ("TieringOffloadingSpec", "LRUCachePolicy", ["KvtierSecondaryTier"]),
        ("KvtierOffloadingSpec", "KvtierARCCachePolicy", ["KvtierSecondaryTier"]),
        ("CPUOffloadingSpec", "KvtierARCCachePolicy", []),
    ]


@pytest.mark.parametrize(("given", "held"), [({}, 0.25), ({"switch_interval_ms": "keep"}, "keep")])
def test_under_vllm_the_chain_holds_kvtiers_switch_interval_unless_kept(
    given: dict[str, Any], held: float | str
) -> None:
    """vLLM's engine thread runs Python beside kvtier's threads: the chain vLLM opens takes
    kvtier's default `switch_interval_ms` (a config may say "keep"), shipped configs too."""
    from kvtier.integrations.vllm import chain_config_for_vllm

    tiers = [{"name": "disk", "medium": "disk", "capacity": 16, "path": "/tmp/x"}]
    assert chain_config_for_vllm({"tiers": tiers, **given}, 8192).switch_interval_ms == held
    shipped = Path(__file__).resolve().parent.parent / "configs" / "vllm-disk.toml"
    assert chain_config_for_vllm(shipped, 8192).switch_interval_ms == 0.25


@pytest.mark.parametrize(
    ("given", "held"),
    [({}, 0.25e-3), ({"switch_interval_ms": 0.5}, 0.5e-3), ({"switch_interval_ms": "keep"}, None)],
)
def test_kvtiers_worker_holds_the_switch_interval_with_no_tier_below(
    given: dict[str, Any], held: float | None
) -> None:
    """A cpu-only config opens no chain, but kvtier's worker copies on threads beside the
    engine's Python (vLLM's CPU engine): the worker holds the config's interval from
    `get_worker` to `shutdown`, "keep" none, and the interpreter's is back after."""
    from kvtier.chain import switch_interval

    before = sys.getswitchinterval()
    spec = make_spec({"tiers": [{"name": "host", "medium": "cpu", "capacity": 4}], **given})
    manager = spec.get_manager()
    assert not manager.secondary_tiers  # no chain: nothing else holds it
    assert switch_interval.held() is None
    worker = spec.get_worker(paged_caches(seed=1)[0])
    try:
        assert switch_interval.held() == held
        assert sys.getswitchinterval() == pytest.approx(held or before)
    finally:
        worker.shutdown()
        manager.shutdown()
    assert switch_interval.held() is None
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize(
    ("top", "line"),
    [
        (
            {"switch_interval_ms": "0.5ms"},
            'switch_interval_ms: expected a number of ms like 0.25, or "keep", got "0.5ms"',
        ),
        ({"switch_intervall_ms": 0.5}, "switch_intervall_ms: unknown key"),
    ],
)
def test_a_cpu_only_config_is_validated_whole(top: dict[str, Any], line: str) -> None:
    """With no tier below the host tier no chain validates the config: the spec does, so
    a bad or misspelt top-level key is refused, not ignored."""
    with pytest.raises(ConfigError) as caught:
        make_spec({"tiers": [{"name": "host", "medium": "cpu", "capacity": 4}], **top})
    assert line in str(caught.value)


def test_under_vllm_a_configured_model_id_narrows_the_derived_namespace() -> None:
    """Two models under one configured `model_id` (a base model and its fine-tune) keep
    separate namespaces: the configured id is added, it does not replace the derived one."""
    from kvtier.integrations.vllm import chain_config_for_vllm

    configured = {
        "model_id": "shared-name",
        "tiers": [{"name": "disk", "medium": "disk", "capacity": 16, "path": "/tmp/x"}],
    }
    base = chain_config_for_vllm(dict(configured), 8192, "vllm:base:bf16")
    tuned = chain_config_for_vllm(dict(configured), 8192, "vllm:tuned:bf16")
    assert base.model_id != tuned.model_id
    assert "vllm:base:bf16" in base.model_id and "shared-name" in base.model_id
    plain = dict(configured)
    del plain["model_id"]
    assert chain_config_for_vllm(plain, 8192, "vllm:base:bf16").model_id == "vllm:base:bf16"
