"""kvtier inside SGLang (`pip install 'kvtier[sglang]'`): `KvtierHiCacheStorage`, a HiCache L3
storage backend over a kvtier chain, loaded by SGLang's own backend factory:

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.integrations.sglang", "class_name": "KvtierHiCacheStorage",
            "interface_v1": 1, "kvtier_config": "/etc/kvtier/sglang.toml"}'

The backend class is loaded lazily (it subclasses SGLang's `HiCacheStorage`, so importing it
imports SGLang); the page store under it (`kvtier.integrations.sglang.store`) does not need
SGLang.
"""

from __future__ import annotations

from typing import Any

from kvtier.integrations.sglang.store import (
    PageStore,
    ShardIdentity,
    chain_config_for_sglang,
    page_key,
    sglang_namespace,
)

__all__ = [
    "KvtierHiCacheStorage",
    "PageStore",
    "ShardIdentity",
    "chain_config_for_sglang",
    "page_key",
    "sglang_namespace",
]


def __getattr__(name: str) -> Any:
    """`KvtierHiCacheStorage`, imported (with SGLang) on first use."""
    if name == "KvtierHiCacheStorage":
        from kvtier.integrations.sglang.backend import KvtierHiCacheStorage

        return KvtierHiCacheStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
