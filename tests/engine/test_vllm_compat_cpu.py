"""kvtier's adapter on the vLLM release of this environment, vLLM's CPU build 0.32.0: it is
accepted, and the two interfaces that differ from 0.33 (see `_compat`) fit as bridged."""

from __future__ import annotations

import inspect
from contextlib import nullcontext


def test_the_cpu_build_is_a_supported_release() -> None:
    from kvtier.integrations.vllm import SUPPORTED_VLLM, VLLM_VERSION, _compat

    assert _compat.release(VLLM_VERSION) == "0.32.0"
    assert _compat.release(VLLM_VERSION) in SUPPORTED_VLLM


def test_policy_insert_fits_the_call_of_vllm_0_32() -> None:
    """0.32's CachePolicy.insert has no req_context: vLLM calls insert(key, chunk)."""
    from vllm.v1.kv_offload.base import make_offload_key
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus

    from kvtier.integrations.vllm import KvtierARCCachePolicy

    assert "req_context" not in inspect.signature(CachePolicy.insert).parameters
    policy = KvtierARCCachePolicy(4)
    key = make_offload_key(b"k" * 32, 0)
    policy.insert(key, ChunkStatus(0))
    assert policy.get(key) is not None


def test_managers_of_vllm_0_32_have_no_lock() -> None:
    from vllm.v1.kv_offload.base import OffloadingManager

    from kvtier.integrations.vllm import _compat

    assert not hasattr(OffloadingManager, "lock")
    assert isinstance(_compat.manager_lock(object()), nullcontext)
