"""kvtier's HiCache backend under SGLang 0.5.23's own code (issue 35, items 2 and 3; issue
32, item 6): SGLang's `StorageBackendFactory` loads it from the README's dynamic extra
config, and SGLang's `HiCacheController` attaches it, backs pages up on its backup thread,
queries them on its prefetch path and transfers them into host pages.

Lives in processes of their own (sglang_node.py), as a restart or a second server is:

1. store: a node backs 6 pages up into a cpu -> disk chain, then detaches (kvtier flushes
   its cpu tier to disk).
2. restart: a new process finds the 6 pages (SGLang's hit query) on kvtier's disk tier and
   loads them: bytes equal to what was backed up, counted as disk hits.
3. damaged: a byte of every block on disk is flipped; a new process: kvtier's checksums
   reject every page (counted corrupt), SGLang's transfer loads none, the host pages stay
   untouched: a miss, never damaged KV.
4. shared: over a Redis tier (scripts/redis.sh), one process backs pages up, a second one
   (another process with its own empty cpu tier) finds and loads them.

Hybrid models' extra host pools are refused at attach, naming the pool. The chain's KV events
(`[events]`, vLLM's wire format) are emitted for the pages SGLang backs up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from controller_kit import (
    attached,
    back_up,
    extra_config,
    hierarchy,
    hit_query,
    host_pages,
    page_keys,
    transfer,
)
from redis_helpers import PASSWORD_ENV, Server
from sglang_pages import PAGE, FakeHostPool, chain, hashes, indices, page

from kvtier.errors import InvalidValueError
from kvtier.integrations.sglang.store import page_key
from kvtier.testing.keyed import AUTH_KEY_ENV
from kvtier.tiers.disk.testing import damage_stored_blocks

HERE = Path(__file__).resolve().parent
NODE = HERE / "sglang_node.py"
NODE_TIMEOUT_S = 300
"""A node life's limit: a hang fails the test instead of eating CI's time."""

Life = dict[str, Any]


def run_node(role: str, config: dict[str, Any], work: Path, name: str) -> Life:
    """One life of sglang_node.py as a process of its own; its JSON result."""
    config_path = work / f"{name}.config.json"
    out = work / f"{name}.out.json"
    config_path.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, str(NODE), role, str(config_path), str(out)],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        env=os.environ.copy(),
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    result: Life = json.loads(out.read_text())
    return result


# -- in this process: the factory, the controller, hybrid pools, events ---------------------------


def test_sglangs_factory_loads_the_backend_from_the_dynamic_extra_config(tmp_path: Path) -> None:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
        model_name="llama", extra_config=extra_config(chain(tmp_path)),
    )  # fmt: skip
    pool = FakeHostPool()
    pool.fill(30)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    try:
        assert isinstance(backend, HiCacheStorage)
        backend.register_mem_pool_host(pool)
        keys = hashes(3)
        assert backend.batch_set_v1(keys, indices([0, 1, 2])) == [True] * 3
        assert backend.batch_exists(keys + hashes(1, "x")) == 3
        assert backend.batch_get_v1(keys, indices([5, 6, 7])) == [True] * 3
        assert torch.equal(pool.get_data_page(6 * PAGE), page(pool, 1))
        assert backend.exists(keys[0]) and not backend.exists(hashes(1, "x")[0])
        dummies = [pool.get_dummy_flat_data_page() for _ in keys]
        got = backend.batch_get(keys, dummies)
        assert got[2] is not None and torch.equal(got[2], page(pool, 2))
        assert backend.batch_set(hashes(2, "y"), [page(pool, 0), page(pool, 1)])
    finally:
        backend.close()


def test_sglangs_controller_backs_up_queries_and_prefetches_through_kvtier(tmp_path: Path) -> None:
    pool = FakeHostPool()
    pool.fill(40)
    with attached(pool, chain(tmp_path)) as controller:
        assert controller.page_get_func == controller._page_get_zero_copy  # interface_v1
        tokens = list(range(5 * PAGE))
        keys = page_keys(tokens)
        assert back_up(controller, tokens, [0, 1, 2, 3, 4]) == 5 * PAGE
        assert hit_query(controller, "r1", tokens) == (keys, 5 * PAGE)
        longer = tokens + list(range(100, 100 + 2 * PAGE))
        assert hit_query(controller, "r2", longer) == (keys, 5 * PAGE)
        assert transfer(controller, "r3", tokens, [8, 9, 10, 11, 12]) == 5
        assert torch.equal(host_pages(pool, 8, 5), host_pages(pool, 0, 5))


def test_a_hybrid_models_extra_host_pool_is_refused_at_attach_naming_it(tmp_path: Path) -> None:
    """SGLang's hybrid controller registers each extra pool (Mamba state, SWA KV, ...) with
    `register_mem_host_pool_v2` after the KV pool: kvtier accepts the KV pool and refuses
    another in one line naming it, and its chain is closed."""
    from sglang.srt.mem_cache.hicache_storage import PoolName

    pool = FakeHostPool()
    with attached(pool, chain(tmp_path)) as controller:
        backend = controller.storage_backend
        backend.register_mem_host_pool_v2(pool, PoolName.KV)  # the KV pool itself
        assert backend.store.hierarchy is not None
        with pytest.raises(InvalidValueError) as refused:
            backend.register_mem_host_pool_v2(FakeHostPool(), PoolName.MAMBA)
        message = str(refused.value)
        assert "'mamba'" in message and "FakeHostPool" in message and "\n" not in message
        assert backend.store.hierarchy is None  # closed: nothing half-cached


def test_the_pages_sglang_backs_up_are_announced_as_kv_events(tmp_path: Path) -> None:
    """Issue 32, item 6: the backend's chain publishes kvtier's events (`[events]` in its
    config, vLLM's wire format) for SGLang's pages: stored on cpu in SGLang's order, then,
    as the 2-page cpu tier fills, stored on disk before removed from cpu; AllBlocksCleared
    when SGLang detaches."""
    zmq = pytest.importorskip("zmq")
    from kvtier.fleet.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch

    config = chain(tmp_path)
    config["events"] = {"enabled": True, "endpoint": "tcp://127.0.0.1:0", "topic": "sglang-a"}
    pool = FakeHostPool()
    pool.fill(50)
    tokens = list(range(4 * PAGE))
    expected = [bytes(page_key(key)) for key in page_keys(tokens)]
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"sglang-a")
    sub.setsockopt(zmq.RCVTIMEO, 60_000)
    events: list[Any] = []
    try:
        with attached(pool, config) as controller:
            publisher = hierarchy(controller)._hierarchy._publisher  # the endpoint it bound
            assert publisher is not None
            sub.connect(publisher.endpoint)
            wait_for_subscription(publisher, sub, zmq)
            assert back_up(controller, tokens, [0, 1, 2, 3]) == 4 * PAGE
            hierarchy(controller).drain()
        while not events or not isinstance(events[-1], AllBlocksCleared):
            _, _, payload = sub.recv_multipart()
            events.extend(decode_batch(payload).events)
    finally:
        sub.close(linger=0)
        context.term()
    stored = {
        tier: [k for e in events if isinstance(e, BlockStored) and e.ownership == tier
               for k in e.block_hashes if k in expected]
        for tier in ("cpu", "disk")
    }  # fmt: skip
    removed = [
        k
        for e in events
        if isinstance(e, BlockRemoved) and e.ownership == "cpu"
        for k in e.block_hashes
    ]
    assert stored["cpu"] == expected  # every page, in SGLang's order
    assert set(stored["disk"]) >= set(removed) and len(removed) >= 2  # cpu holds 2
    for key in removed:  # each move down: the store below came first
        first_disk = next(
            i for i, e in enumerate(events)
            if isinstance(e, BlockStored) and e.ownership == "disk" and key in e.block_hashes
        )  # fmt: skip
        cpu_removal = next(
            i for i, e in enumerate(events)
            if isinstance(e, BlockRemoved) and e.ownership == "cpu" and key in e.block_hashes
        )  # fmt: skip
        assert first_disk < cpu_removal
    disk_stored = next(e for e in events if isinstance(e, BlockStored) and e.ownership == "disk")
    assert disk_stored.medium == "DISK"


def wait_for_subscription(publisher: Any, sub: Any, zmq: Any) -> None:
    """Offer probe events until the SUB socket receives one (a PUB drops what it sends
    before a subscription arrives); the probes name no real page."""
    from kvtier.manager.base import OffloadingEvent

    probe = OffloadingEvent((b"probe",), 1, "cpu", True, "cpu")
    sub.setsockopt(zmq.RCVTIMEO, 50)
    for _ in range(1200):
        publisher.offer(probe)
        try:
            sub.recv_multipart()
        except zmq.Again:
            continue
        break
    else:
        raise AssertionError("the subscriber never connected")
    sub.setsockopt(zmq.RCVTIMEO, 60_000)
    while True:  # drain the probes in flight
        sub.setsockopt(zmq.RCVTIMEO, 200)
        try:
            sub.recv_multipart()
        except zmq.Again:
            break
    sub.setsockopt(zmq.RCVTIMEO, 60_000)


# -- lives in processes of their own: restart, damage ---------------------------------------------


@pytest.fixture(scope="module")
def disk_lives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Life]:
    work = tmp_path_factory.mktemp("sglang-disk")
    config = chain(work / "disk")
    lives = {"store": run_node("store", config, work, "store")}
    lives["restart"] = run_node("serve", config, work, "restart")
    # a byte in every 256 of every stored block (whatever the layout): every 512-byte page
    assert damage_stored_blocks(work / "disk", step=256, at=0) > 0, "no stored block to damage"
    lives["damaged"] = run_node("serve", config, work, "damaged")
    return lives


def test_a_node_backs_pages_up_into_kvtier(disk_lives: dict[str, Life]) -> None:
    life = disk_lives["store"]
    assert life["backed_up_tokens"] == 6 * PAGE
    assert set(life["held_on"]) <= {"cpu", "disk"} and None not in life["held_on"]
    assert life["activity"]["cpu"]["stored"] == 6


def test_a_restarted_node_serves_every_page_from_kvtiers_disk_tier(
    disk_lives: dict[str, Life], report: Callable[[str], None]
) -> None:
    life = disk_lives["restart"]
    assert life["held_before_read"] == ["disk"] * 6
    assert (life["found_pages"], life["hit_tokens"]) == (6, 6 * PAGE)
    assert life["loaded_pages"] == 6 and life["equal"] == [True] * 6
    assert life["activity"]["disk"]["hits"] >= 6 and life["activity"]["disk"]["corrupt"] == 0
    report(
        f"restart: SGLang's hit query found {life['found_pages']} of 6 pages, its transfer "
        f"loaded {life['loaded_pages']} from kvtier's disk tier, bytes equal"
    )


def test_damaged_pages_are_misses_and_never_reach_the_host_pool(
    disk_lives: dict[str, Life], report: Callable[[str], None]
) -> None:
    life = disk_lives["damaged"]
    assert life["loaded_pages"] == 0
    assert life["untouched"] == [True] * 6  # no damaged byte was copied into host memory
    assert life["activity"]["disk"]["corrupt"] >= 1
    report(
        f"damaged disk: SGLang's transfer loaded {life['loaded_pages']} pages, kvtier counted "
        f"{life['activity']['disk']['corrupt']} corrupt"
    )


# -- two SGLang processes over a shared Redis tier ------------------------------------------------


def redis_chain(server: Server) -> dict[str, Any]:
    return {
        "block_size": 4096,
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": 2},
            {
                "name": "fleet",
                "medium": "redis",
                "capacity": 256,
                "url": server.url,
                "password_env": PASSWORD_ENV,
                "auth_key_env": AUTH_KEY_ENV,
                "timeout_ms": 10_000,
            },
        ],
    }


@pytest.mark.usefixtures("redis_clean")
def test_a_second_sglang_process_serves_the_pages_the_first_stored_in_redis(
    server: Server, tmp_path: Path, report: Callable[[str], None]
) -> None:
    config = redis_chain(server)
    start = time.monotonic()
    first = run_node("store", config, tmp_path, "node-a")
    assert first["backed_up_tokens"] == 6 * PAGE
    second = run_node("serve", config, tmp_path, "node-b")
    elapsed = time.monotonic() - start
    assert (second["found_pages"], second["hit_tokens"]) == (6, 6 * PAGE)
    assert second["loaded_pages"] == 6 and second["equal"] == [True] * 6
    assert second["activity"]["fleet"]["hits"] >= 6
    report(
        f"shared Redis tier: the second process found {second['found_pages']} of 6 pages "
        f"the first stored and loaded {second['loaded_pages']}, bytes equal "
        f"({elapsed:.1f} s for both lives)"
    )
