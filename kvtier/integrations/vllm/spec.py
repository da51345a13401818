"""`KvtierOffloadingSpec`: one kvtier config for vLLM's whole offloading stack.

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "KvtierOffloadingSpec",
        "spec_module_path": "kvtier.integrations.vllm",
        "kvtier_config": "/etc/kvtier/vllm.toml"}}'

The kvtier config's first tier must be a `cpu` tier: it becomes the host tier GPU blocks are
offloaded to, sized by its `capacity` and evicted by its `policy` (kvtier's LRU or ARC,
through `KvtierCachePolicy`). That memory is vLLM's shared offload region, so vLLM's worker
processes and the scheduler see the same bytes. The tiers after it (disk now, remote tiers
later) become one `KvtierSecondaryTier` below it: stores cascade down, loads are promoted up,
and the disk tier keeps its blocks across a restart.

The GPU <-> host copies are vLLM's `CPUOffloadingWorker` where vLLM has one (CUDA, ROCm,
XPU); on a platform it does not support (a CPU-only engine, tests) they are kvtier's
`PagedKVHandler` over the same region (`worker.py`), whose copy thread runs beside the
engine's Python: that worker holds the config's `switch_interval_ms` while it is open, a
config with no tier below the host tier included (no chain is opened for it).

The keys vLLM sets from this config (`cpu_bytes_to_use`, `eviction_policy`,
`cache_policy_module_path`, `secondary_tiers`) are refused when also given by hand, so the
config has one source of truth. `kvtier_metrics_port` (beside `kvtier_config`) serves the
chain's metrics on that port; kvtier's log lines join vLLM's log, and vLLM's shared region
file is removed when the process exits (`visible`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from vllm.platforms import current_platform
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.config import parse_config, parse_size
from kvtier.errors import ConfigError, InvalidValueError
from kvtier.integrations.engine_config import ConfigSource
from kvtier.integrations.vllm.config import read_config_data
from kvtier.integrations.vllm.visible import (
    join_vllm_logging,
    metrics_port,
    region_path,
    remove_region,
    remove_region_at_exit,
)

SET_BY_KVTIER = (
    "cpu_bytes_to_use",
    "eviction_policy",
    "cache_policy_module_path",
    "secondary_tiers",
)
"""vLLM settings that `KvtierOffloadingSpec` derives from the kvtier config."""

POLICY_CLASSES = {"lru": "KvtierLRUCachePolicy", "arc": "KvtierARCCachePolicy"}
"""kvtier policy name -> the vLLM CachePolicy class of `kvtier.integrations.vllm`."""

MODULE = "kvtier.integrations.vllm"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class SpecSettings(NamedTuple):
    """What `KvtierOffloadingSpec` takes from its kvtier config."""

    extra: dict[str, Any]
    """The `kv_connector_extra_config` entries vLLM's tiering spec is given."""
    switch_interval_ms: float | Literal["keep"]
    """Held by kvtier's worker while it copies (see `KvtierOffloadingWorker`)."""


def vllm_settings(
    config: Any, kvtier_config: ConfigSource, metrics_port: int | None = None
) -> SpecSettings:
    """What makes vLLM's tiering spec run the chain of `kvtier_config` (`config`: vLLM's
    OffloadingConfig, for the chunk size); the chain's metrics served on `metrics_port`
    where given. The whole config is validated here (the host tier and the top-level keys
    too, which only this spec reads): a ConfigError names the source and every problem."""
    data, source = read_config_data(kvtier_config)
    tiers = data.get("tiers")
    if not isinstance(tiers, list) or not tiers or not isinstance(tiers[0], Mapping):
        raise ConfigError(["tiers: at least one tier, the first a cpu tier"], source=source)
    host, below = tiers[0], tiers[1:]
    name = host.get("name", "0")
    if host.get("medium") != "cpu":
        raise ConfigError(
            [
                f"tier {name!r}: the first tier must have medium 'cpu' (vLLM's host memory, "
                f"which GPU blocks are offloaded to), got {host.get('medium')!r}"
            ],
            source=source,
        )
    policy = host.get("policy", "lru")
    if policy not in POLICY_CLASSES:
        raise ConfigError(
            [f"tier {name!r}: policy must be one of {sorted(POLICY_CLASSES)}, got {policy!r}"],
            source=source,
        )
    copies = 1 if config.replicated_layout else max(1, config.parallel.world_size)
    chunk = _round_up(
        config.worker_kv_bytes_per_block * copies * config.cache.blocks_per_chunk,
        TieringOffloadingSpec.BLOCK_SIZE_ALIGNMENT,
    )
    capacity = host.get("capacity")
    try:
        if isinstance(capacity, int) and not isinstance(capacity, bool):
            host_bytes = capacity * chunk  # a block count
        elif isinstance(capacity, str):
            host_bytes = parse_size(capacity)
        else:
            raise InvalidValueError(f"a block count or a size string, got {capacity!r}")
        if host_bytes < chunk:
            raise InvalidValueError(f"less than one chunk of {chunk} bytes ({capacity!r})")
    except InvalidValueError as error:
        raise ConfigError([f"tier {name!r}: capacity: {error}"], source=source) from None
    whole = parse_config({**data, "block_size": chunk}, source=source)
    settings: dict[str, Any] = {
        "cpu_bytes_to_use": host_bytes,
        "eviction_policy": POLICY_CLASSES[policy],
        "cache_policy_module_path": MODULE,
        "secondary_tiers": [],
    }
    if below:
        chain = {key: value for key, value in data.items() if key != "tiers"}
        chain["tiers"] = [dict(tier) for tier in below]
        tier: dict[str, Any] = {
            "type": "KvtierSecondaryTier",
            "module_path": MODULE,
            "config": chain,
        }
        if metrics_port is not None:
            tier["metrics_port"] = metrics_port
        settings["secondary_tiers"] = [tier]
    return SpecSettings(settings, whole.switch_interval_ms)


class KvtierOffloadingSpec(TieringOffloadingSpec):
    """vLLM's tiering spec, configured whole by one kvtier config (`kvtier_config` in
    `kv_connector_extra_config`: a TOML path or a dict; None: the embedded default's cpu and
    disk tiers)."""

    switch_interval_ms: float | Literal["keep"]
    """The config's `switch_interval_ms`, held by kvtier's worker where it runs."""

    def __init__(self, config: Any) -> None:
        join_vllm_logging()
        extra = dict(config.extra_config)
        given = [key for key in SET_BY_KVTIER if key in extra]
        if given:
            raise ConfigError(
                [
                    f"{key}: set from kvtier_config by KvtierOffloadingSpec; remove it from "
                    "kv_connector_extra_config (or use vLLM's TieringOffloadingSpec with a "
                    "KvtierSecondaryTier)"
                    for key in given
                ],
                source="kv_connector_extra_config",
            )
        port = metrics_port(extra.pop("kvtier_metrics_port", None))
        settings = vllm_settings(config, extra.get("kvtier_config"), port)
        extra.update(settings.extra)
        self.switch_interval_ms = settings.switch_interval_ms
        super().__init__(dataclasses.replace(config, extra_config=extra))
        # vLLM unlinks its shared region only in the cleanup of the process that created
        # it, which an interrupted `vllm serve` often never reaches: see `visible`.
        remove_region_at_exit(self._engine_id)

    def get_manager(self) -> Any:
        """vLLM's tiering manager; on a CPU-only engine with one worker, the region file is
        unlinked as soon as the scheduler has mapped it (see `_unlink_region_early`)."""
        if self._manager is not None:
            return self._manager
        path = region_path(self._engine_id)
        created_by_a_worker = os.path.exists(path)
        manager = super().get_manager()
        if created_by_a_worker and self._unlink_region_early():
            remove_region(path)
        return manager

    def _unlink_region_early(self) -> bool:
        """Whether every process that maps the region has it once the scheduler has mapped
        it after a worker: one worker (so the worker that created the file is the only
        other one) and kvtier's worker (which expects the name gone at its close; vLLM's own
        worker would log its unlink as failed). Then no exit, SIGKILL included (`vllm
        serve` kills its engine core at once on Ctrl-C), can leave the file behind."""
        cpu_engine = not (current_platform.is_cuda_alike() or current_platform.is_xpu())
        return cpu_engine and int(self.config.parallel.world_size) == 1

    def get_worker(self, kv_caches: Any) -> Any:
        """vLLM's GPU <-> host worker where vLLM has one, else kvtier's."""
        if current_platform.is_cuda_alike() or current_platform.is_xpu():
            return super().get_worker(kv_caches)
        worker: Any = getattr(self, "_worker", None)
        if worker is None:
            from kvtier.integrations.vllm.worker import KvtierOffloadingWorker

            worker = self._worker = KvtierOffloadingWorker.for_spec(
                self, kv_caches, self.switch_interval_ms
            )
        return worker
