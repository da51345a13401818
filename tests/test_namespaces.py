"""Namespaces (issue 19, item 2): what makes a block's bytes mean the same KV (model, block
size, tenant) is bound into every block; a shared tier without a model identity is refused;
under vLLM a configured `model_id` narrows the derived namespace, never replaces it
(tests/test_vllm_spec.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvtier.config import parse_config
from kvtier.errors import ConfigError
from kvtier.namespaces import block_namespace, combined_model_id, namespace_fingerprint
from kvtier.tiers.redis.storage import key_prefix
from kvtier.tiers.registry import TierContext, tier_kind


def shared_chain(**top: Any) -> dict[str, Any]:
    return {
        "block_size": 4096,
        **top,
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": 8},
            {"name": "fleet", "medium": "shared-fs", "capacity": 64, "path": "/tmp/never-opened"},
        ],
    }


def test_every_part_of_a_namespace_separates_blocks() -> None:
    base = block_namespace("m", 4096, "")
    others = [
        block_namespace("m2", 4096, ""),
        block_namespace("m", 8192, ""),
        block_namespace("m", 4096, "t"),
        # Parts that would meet if they were joined with a separator:
        block_namespace("m/4096", 4096, ""),
    ]
    assert len({base, *others}) == 5
    assert block_namespace("a/b", 1, "c") != block_namespace("a", 1, "b/c")
    assert json.loads(base)[2:] == ["m", 4096, ""]
    assert len({namespace_fingerprint(n) for n in [base, *others]}) == 5


def test_the_shared_tiers_declare_themselves_shared() -> None:
    assert tier_kind("redis").shared and tier_kind("shared-fs").shared
    assert not any(tier_kind(m).shared for m in ("gpu", "cpu", "disk"))


def test_a_shared_tier_without_a_model_identity_is_refused_naming_model_id() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(shared_chain())
    message = str(raised.value)
    assert "model_id" in message and '"fleet"' in message and "shared-fs" in message
    parse_config(shared_chain(model_id="llama-3-8b@main:bf16"))  # named: fine


def test_a_disabled_shared_tier_needs_no_model_identity() -> None:
    data = shared_chain()
    data["tiers"][1]["enabled"] = False
    parse_config(data)


def test_the_tenant_is_part_of_the_namespace_every_opener_gets() -> None:
    config = parse_config(shared_chain(model_id="m", tenant="acme"))
    assert config.namespace == block_namespace("m", 4096, "acme")
    assert config.namespace != parse_config(shared_chain(model_id="m")).namespace
    context = TierContext(4096, "m", tenant="acme")
    assert context.namespace == config.namespace
    assert "tenant" in config.describe() and "acme" in config.describe()


def test_a_custom_key_prefix_always_ends_with_the_namespace_fingerprint() -> None:
    a = block_namespace("m", 4096, "a")
    b = block_namespace("m", 4096, "b")
    assert key_prefix(a) == b"kvtier:" + namespace_fingerprint(a).encode() + b":"
    assert key_prefix(a, "team:") == b"team:" + namespace_fingerprint(a).encode() + b":"
    # Two tenants that chose the same (or overlapping) prefixes still get disjoint key spaces.
    assert key_prefix(a, "x") != key_prefix(b, "x")
    assert not key_prefix(b, "xy").startswith(key_prefix(a, "x"))
    assert not key_prefix(a, "x").startswith(key_prefix(b, "xy"))


def test_a_configured_model_id_is_added_to_a_derived_one() -> None:
    assert combined_model_id("d", "") == "d"
    assert combined_model_id("d", "c") != combined_model_id("d", "")
    assert combined_model_id("d", "c") != combined_model_id("e", "c")
