"""kvtier's cache policies as the eviction policy of vLLM 0.33's CPU tier (issue 10, item
2), run by vLLM's own `CPUOffloadingManager`: loaded by class name and module path, LRU
evicts the least recently used chunk, ARC keeps a reused chunk through a scan, a chunk vLLM
has pinned is never evicted, and under random traffic the kvtier policy and vLLM's manager
agree on every resident chunk."""

from __future__ import annotations

import random

import pytest
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
from vllm_support import MODULE, key

from kvtier.integrations.vllm import (
    KvtierARCCachePolicy,
    KvtierCachePolicy,
    KvtierLCTCachePolicy,
    KvtierLRUCachePolicy,
)
from kvtier.policies import ARCCachePolicy, LCTCachePolicy, LRUCachePolicy


def manager(policy: str, chunks: int = 4) -> CPUOffloadingManager:
    return CPUOffloadingManager(
        num_chunks=chunks, cache_policy=policy, cache_policy_module_path=MODULE
    )


def store(m: CPUOffloadingManager, keys: list[bytes], request: str = "r") -> list[bytes]:
    """Store keys as one request would; the keys evicted for them."""
    context = ReqContext(req_id=request)
    out = m.prepare_store(keys, context)
    assert out is not None
    m.complete_store(out.keys_to_store, context)
    return list(out.evicted_keys)


def resident(m: CPUOffloadingManager) -> set[bytes]:
    return set(m._policy._chunks)


@pytest.mark.parametrize(
    ("name", "cls", "inner"),
    [
        ("KvtierLRUCachePolicy", KvtierLRUCachePolicy, LRUCachePolicy),
        ("KvtierARCCachePolicy", KvtierARCCachePolicy, ARCCachePolicy),
        ("KvtierLCTCachePolicy", KvtierLCTCachePolicy, LCTCachePolicy),
        ("KvtierCachePolicy", KvtierCachePolicy, LRUCachePolicy),
    ],
)
def test_vllm_loads_kvtier_policies_by_name(name: str, cls: type, inner: type) -> None:
    assert CachePolicyFactory.get_cache_policy_cls(name, MODULE) is cls
    m = manager(name)
    assert isinstance(m._policy, cls) and isinstance(m._policy.policy, inner)


def test_lru_evicts_the_least_recently_used_chunk() -> None:
    m = manager("KvtierLRUCachePolicy")
    keys = [key(i) for i in range(5)]
    for index in range(4):
        store(m, [keys[index]], f"r{index}")
    m.touch([keys[0]], ReqContext(req_id="t"))
    assert store(m, [keys[4]]) == [keys[1]]
    assert resident(m) == {keys[0], keys[2], keys[3], keys[4]}


def test_arc_keeps_a_reused_chunk_through_a_scan_lru_does_not() -> None:
    kept = {}
    for name in ("KvtierARCCachePolicy", "KvtierLRUCachePolicy"):
        m = manager(name, chunks=8)
        hot = key(1000)
        store(m, [hot], "first")
        m.touch([hot], ReqContext(req_id="again"))  # seen twice: frequent
        for index in range(16):  # a scan of chunks seen once
            store(m, [key(index)], f"scan{index}")
        kept[name] = hot in resident(m)
    assert kept == {"KvtierARCCachePolicy": True, "KvtierLRUCachePolicy": False}


def test_a_chunk_vllm_pinned_is_never_evicted() -> None:
    m = manager("KvtierARCCachePolicy", chunks=2)
    store(m, [key(0)], "a")
    store(m, [key(1)], "b")
    reader = ReqContext(req_id="reader")
    m.prepare_load([key(0)], reader)  # vLLM pins it (ref_cnt 1) for a load to the GPU
    assert store(m, [key(2)]) == [key(1)]
    assert m.prepare_store([key(3), key(4)], ReqContext(req_id="c")) is None  # all pinned
    m.complete_load([key(0)], reader)
    assert store(m, [key(5)]) == [key(0)]


@pytest.mark.parametrize(
    "name", ["KvtierLRUCachePolicy", "KvtierARCCachePolicy", "KvtierLCTCachePolicy"]
)
def test_random_traffic_keeps_policy_and_manager_in_step(name: str) -> None:
    rng = random.Random(7)
    m = manager(name, chunks=16)
    pinned: dict[bytes, ReqContext] = {}
    for step in range(3000):
        keys = [key(rng.randrange(64)) for _ in range(rng.randrange(1, 4))]
        keys = list(dict.fromkeys(keys))
        action = rng.random()
        context = ReqContext(req_id=f"s{step}")
        if action < 0.6:
            out = m.prepare_store(keys, context)
            if out is not None:
                assert not set(out.evicted_keys) & set(pinned), "a pinned chunk was evicted"
                m.complete_store(out.keys_to_store, context, success=rng.random() > 0.05)
        elif action < 0.8:
            ready = [k for k in keys if m.lookup(k, context).name == "HIT" and k not in pinned]
            if ready:
                m.prepare_load(ready, context)
                pinned.update(dict.fromkeys(ready, context))
        elif pinned:
            k = rng.choice(list(pinned))
            m.complete_load([k], pinned.pop(k))
        policy = m._policy
        assert len(policy.policy) == len(policy._chunks) <= 16
        assert {k for k, _ in policy.policy.items()} == set(policy._chunks)
        for k, chunk in policy._chunks.items():
            assert policy.policy.get(k).ref_cnt == chunk.ref_cnt  # one record, two views
