"""`KvtierHiCacheStorage`: SGLang's HiCache L3 storage backend over a kvtier chain (the only
module of kvtier that imports SGLang).

SGLang loads it with `--hicache-storage-backend dynamic` and an extra config naming this
module and class (see the README); the extra config's `kvtier_config` names the kvtier TOML
(default: the embedded default chain without its GPU tier) and `kvtier_timeout_s` the deadline
of each call (default 5 s). `"interface_v1": 1` makes SGLang's controller use the zero-copy
interface (`batch_get_v1` / `batch_set_v1`, pages addressed in its host pool); without it, the
legacy one (`batch_get` / `batch_set` of page tensors). Both are served.

Every method answers a miss or False on any failure and never raises, except a bad kvtier
config at start-up, which fails SGLang's start with the message.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from kvtier.errors import InvalidValueError
from kvtier.integrations.sglang.store import DEFAULT_TIMEOUT_S, PageStore, ShardIdentity

log = logging.getLogger("kvtier.integrations.sglang")


def shard_identity(config: HiCacheStorageConfig) -> ShardIdentity:
    """The rank's part of the KV, from SGLang's storage config. MLA KV (`is_mla_model`) is
    the same on every TP rank, so it is one shard; other models' pages hold one TP rank's
    heads each."""
    return ShardIdentity(
        model_name=config.model_name or "",
        tp_rank=config.tp_rank,
        tp_size=config.tp_size,
        pp_rank=config.pp_rank,
        pp_size=config.pp_size,
        cp_rank=config.attn_cp_rank,
        cp_size=config.attn_cp_size,
        dp_rank=getattr(config, "dp_rank", 0),
        replicated=config.is_mla_model,
    )


class KvtierHiCacheStorage(HiCacheStorage):
    """HiCache L3 pages in a kvtier chain (memory, disk, shared tiers), each page bound to
    the model, KV dtype, layout, page size and shard, verified on every read."""

    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None
    ) -> None:
        extra = dict(storage_config.extra_config or {})
        timeout_s = extra.get("kvtier_timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
            raise InvalidValueError(f"kvtier_timeout_s must be a number, got {timeout_s!r}")
        self.store = PageStore(
            extra.get("kvtier_config"), shard_identity(storage_config), timeout_s=timeout_s
        )

    # -- set-up ---------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """SGLang's host pool is known: the page size is, so the chain opens here."""
        super().register_mem_pool_host(mem_pool_host)
        self.store.attach(mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang's hybrid models (Mamba / linear-attention state, sliding-window KV, DSA
        indexer and DeepSeek V4's compressed pools) register their extra host pools here
        and move their pages with `batch_*_v2`, which kvtier does not serve: such a pool is
        refused in one line naming it, so the server fails at start instead of caching
        half of each page's state. The KV pool itself (`kv`, already registered) is fine."""
        name = str(getattr(host_pool_name, "value", host_pool_name))
        if name == "kv" and host_pool is self.store.pool:
            return
        self.store.close()
        raise InvalidValueError(
            f"kvtier's SGLang backend stores the KV pool only; SGLang registered the "
            f"{name!r} host pool ({type(host_pool).__name__}) of a hybrid model, whose "
            f"batch_*_v2 pages kvtier does not serve: use another --hicache-storage-backend "
            f"for this model"
        )

    def close(self) -> None:
        """Close the chain (SGLang calls it on detach)."""
        self.store.close()

    def clear(self) -> None:
        """Nothing is dropped: a kvtier chain is bounded and evicts by its own policy, and its
        shared tiers may serve other servers."""

    # -- the zero-copy interface ----------------------------------------------------------------

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many leading pages are held."""
        return self.store.exists_prefix(keys)

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Read pages into the host pool; True for each leading page read (named by the
        request's session when `extra_info` gives one: `PageStore.session_of`)."""
        return self.store.get_pages(keys, host_indices, extra_info)

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Store pages of the host pool; True for each page held afterwards (with the
        request's session hints when `extra_info` gives them)."""
        return self.store.set_pages(keys, host_indices, extra_info)

    # -- the legacy interface -------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        """Whether the page is held."""
        return self.store.exists_prefix([key]) == 1

    def get(
        self, key: str, target_location: Any | None = None, target_sizes: Any | None = None
    ) -> torch.Tensor | None:
        """One page, copied into `target_location` when it is a tensor; None for a miss."""
        target = target_location if isinstance(target_location, torch.Tensor) else None
        return self.store.get_page(key, target)

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> list[torch.Tensor | None]:
        """Pages one by one into `target_locations`; None from the first miss on (SGLang
        uses only the leading pages)."""
        targets = list(target_locations) if target_locations is not None else []
        found: list[torch.Tensor | None] = []
        for index, key in enumerate(keys):
            target = targets[index] if index < len(targets) else None
            page = self.get(key, target)
            found.append(page)
            if page is None:
                return found + [None] * (len(keys) - len(found))
        return found

    def set(
        self,
        key: str,
        value: Any | None = None,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Store one page tensor."""
        if not isinstance(value, torch.Tensor):
            return False
        return self.store.put_pages([key], [value]) == [True]

    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Store page tensors; True when every page is held afterwards."""
        pages = list(values) if values is not None else []
        if len(pages) != len(keys) or not all(isinstance(page, torch.Tensor) for page in pages):
            return False
        return all(self.store.put_pages(keys, pages))
