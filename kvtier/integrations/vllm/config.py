"""The kvtier config of a tier chain that vLLM drives: a TOML file or a dict of the same
schema, with the block size taken from vLLM.

vLLM decides how many bytes one offloaded chunk holds (its CPU tier's row), so a kvtier block
is exactly one chunk row: a `block_size` in the config is replaced by it, and a different one
is logged (a config written for another model or chunk size still works, its capacities given
in bytes keep their meaning). vLLM's GPU memory is above these tiers, so a `gpu` tier is
refused.
"""

from __future__ import annotations

import logging
from typing import Any

from kvtier.config import (
    HierarchyConfig,
    parse_config,
    parse_size,
)
from kvtier.errors import ConfigError, InvalidValueError
from kvtier.integrations.engine_config import ConfigSource, read_engine_config, refuse_gpu_tiers
from kvtier.namespaces import combined_model_id

log = logging.getLogger("kvtier.integrations.vllm")


def read_config_data(config: ConfigSource) -> tuple[dict[str, Any], str]:
    """The raw config data and where it came from (see `read_engine_config`)."""
    return read_engine_config(config, "vLLM", "the kvtier config")


def vllm_namespace(offloading_config: Any) -> str:
    """What makes a chunk's bytes mean the same KV to another vLLM: the model, the KV dtype
    and layout, and how many workers' cells a chunk row holds. Block hashes come from tokens
    alone, so without this two models with the same chunk size would read each other's KV."""
    model = offloading_config.model
    parallel = offloading_config.parallel
    layout = (
        "canonical"
        if offloading_config.canonical_layout
        else (offloading_config.kv_cache_layout or "default")
    )
    copies = 1 if offloading_config.replicated_layout else parallel.world_size
    return (
        f"vllm:{model.name}:{model.dtype}:{layout}:workers={copies}:"
        f"blocks_per_chunk={offloading_config.cache.blocks_per_chunk}"
    )


def chain_config_for_vllm(
    config: ConfigSource, chunk_bytes: int, namespace: str | None = None
) -> HierarchyConfig:
    """The validated chain for `config` with `block_size` = vLLM's `chunk_bytes`; a
    ConfigError names the source and every problem. `namespace` (see `vllm_namespace`)
    is the `model_id`; a `model_id` the config sets is added to it
    (`kvtier.namespaces.combined_model_id`), never replaces it, so a base model and its
    fine-tune under one configured `model_id` still never share blocks."""
    data, source = read_config_data(config)
    if namespace is not None:
        configured = data.get("model_id", "")
        if not isinstance(configured, str):
            raise ConfigError([f"{source}: model_id must be a string, got {configured!r}"])
        data["model_id"] = combined_model_id(namespace, configured)
    if config is None:
        data["tiers"] = [tier for tier in data["tiers"] if tier.get("medium") == "disk"]
        source = source.replace("without its gpu tier", "its disk tier")
    given = data.get("block_size")
    if given is not None:
        try:
            given_bytes: int | None = parse_size(given)
        except (InvalidValueError, TypeError):
            given_bytes = None
        if given_bytes != chunk_bytes:
            log.warning(
                "%s sets block_size = %r; vLLM's offloaded chunk is %d bytes, so kvtier's "
                "blocks are %d bytes (capacities given as block counts change their size)",
                source,
                given,
                chunk_bytes,
                chunk_bytes,
            )
    data["block_size"] = chunk_bytes
    refuse_gpu_tiers(data, source, "vLLM", "vLLM's own GPU and CPU memory are")
    return parse_config(data, source=source)
