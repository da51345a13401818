"""SGLang's real `HiCacheController` around kvtier's backend, for the SGLang lane's tests and
its node processes (sglang_node.py).

The controller is built without a device pool: only its storage side is used (attach through
SGLang's backend factory, the backup thread's `write_storage`, the prefetch thread's hit
query, the page transfer into host slots), which is SGLang's own code and runs on a CPU. The
host pool is `FakeHostPool` (tests/sglang_pages.py), SGLang's layer-first MHA host pool reduced
to what a storage backend uses.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from sglang_pages import PAGE, FakeHostPool, indices

from kvtier.sync import SyncHierarchy

MODEL = "tiny-llama"


def extra_config(config: Any) -> dict[str, Any]:
    """SGLang's `--hicache-storage-backend-extra-config` naming kvtier's backend (the
    README's), with `config` as the kvtier chain (a dict or a TOML path)."""
    return {
        "backend_name": "kvtier",
        "module_path": "kvtier.integrations.sglang",
        "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1,
        "kvtier_config": config,
    }


def new_controller(pool: FakeHostPool) -> Any:
    """SGLang's `HiCacheController` over `pool`, its storage side only (see the module)."""
    from sglang.srt.managers.cache_controller import HiCacheController

    controller = HiCacheController.__new__(HiCacheController)
    controller.mem_pool_host = pool
    controller.storage_host_pool = pool
    controller.page_size = PAGE
    controller.host_memory_mode = "default"
    controller.enable_storage = False
    controller.enable_storage_metrics = False
    controller.storage_stop_event = threading.Event()
    controller.tp_group = controller.attn_tp_group = controller.attn_cp_group = None
    controller.pp_group = None
    controller.mem_pool_device = object()
    return controller


@contextlib.contextmanager
def single_rank() -> Iterator[None]:
    """SGLang's parallel state of one rank (no TP, PP or context parallelism)."""
    from sglang.srt.runtime_context import get_parallel

    single = {"attn_dcp_size": 1, "attn_dcp_rank": 0, "tp_rank": 0, "tp_size": 1}
    with get_parallel().override(**single, pp_rank=0, pp_size=1):
        yield


@contextlib.contextmanager
def attached(pool: FakeHostPool, config: Any) -> Iterator[Any]:
    """A controller with kvtier attached as SGLang attaches a dynamic backend; detached
    (kvtier's chain closed, its cpu tier flushed to a persistent tier) on the way out."""
    controller = new_controller(pool)
    with single_rank():
        controller.attach_storage_backend(
            "dynamic", model_name=MODEL, storage_backend_extra_config=extra_config(config)
        )
        try:
            yield controller
        finally:
            controller.detach_storage_backend()


def hierarchy(controller: Any) -> SyncHierarchy:
    """kvtier's chain under the controller's backend."""
    chain = controller.storage_backend.store.hierarchy
    if chain is None:
        raise RuntimeError("kvtier's chain is not open")
    return chain


def page_keys(tokens: list[int]) -> list[str]:
    """SGLang's own page keys of `tokens` (what its radix cache hashes)."""
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    return list(get_storage_hash_str(tokens, None, page_size=PAGE))


def back_up(controller: Any, tokens: list[int], pages: list[int]) -> int:
    """Back the host pages `pages` up under `tokens`' keys on SGLang's backup thread; the
    tokens it reports done."""
    controller.write_storage(indices(pages), tokens, hash_value=page_keys(tokens))
    done = controller.ack_backup_queue.get(timeout=120)
    return int(done.completed_tokens)


def hit_query(controller: Any, request_id: str, tokens: list[int]) -> tuple[list[str], int]:
    """SGLang's prefetch-thread query: the keys found and the tokens they cover."""
    from sglang.srt.managers.cache_controller import PrefetchOperation

    found, hit_tokens = controller._storage_hit_query(PrefetchOperation(request_id, tokens))
    return list(found), int(hit_tokens)


def transfer(controller: Any, request_id: str, tokens: list[int], pages: list[int]) -> int:
    """SGLang's page transfer of `tokens`' pages from storage into host pages `pages`;
    the pages it loaded."""
    from sglang.srt.managers.cache_controller import StorageOperation

    operation = StorageOperation(indices(pages), tokens, hash_value=page_keys(tokens))
    operation.request_id = request_id
    operation.is_terminated = lambda: False
    return int(controller._page_transfer(operation))


def host_pages(pool: FakeHostPool, first: int, count: int) -> torch.Tensor:
    """Host pages first .. first + count - 1 of `pool` (every layer's K and V)."""
    return pool.kv_buffer[:, :, first * PAGE : (first + count) * PAGE].clone()
