"""kvtier's SGLang HiCache backend (`kvtier.integrations.sglang`).

The page store's logic, which needs no SGLang: key mapping, namespaces, pages round-tripped
through a cpu -> disk chain from and into a host pool that mirrors SGLang's
`MHATokenToKVPoolHost` (layer-first layout, its page copy functions), restart from disk,
failure as a miss, tensor-parallel ranks over one shared tier. SGLang's own classes driving
the backend (its `StorageBackendFactory`, `HiCacheController`, two SGLang processes over Redis)
are the SGLang lane's (tests/sglang_lane/, in `.venv-sglang`: `scripts/test --sglang`).
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang_pages import PAGE, FakeHostPool, chain, hashes, indices, page

from kvtier.errors import ConfigError, InvalidValueError
from kvtier.integrations.sglang.store import PageStore, ShardIdentity, page_key, sglang_namespace
from kvtier.testing.keyed import AUTH_KEY_ENV, fixed_key_hex

os.environ.setdefault(AUTH_KEY_ENV, fixed_key_hex())


@pytest.fixture
def open_stores() -> Iterator[list[PageStore]]:
    stores: list[PageStore] = []
    yield stores
    for store in stores:
        store.close()


def opened(stores: list[PageStore], config: Any, pool: FakeHostPool, **shard: Any) -> PageStore:
    store = PageStore(config, ShardIdentity(**{"model_name": "llama", **shard}), timeout_s=5.0)
    stores.append(store)
    store.attach(pool)
    return store


# -- keys and namespaces -------------------------------------------------------------------------


def test_page_keys_are_deterministic_and_keep_hex_digests_and_other_strings_apart() -> None:
    digest = hashes(1)[0]
    assert page_key(digest) == page_key(str(digest))
    assert page_key(digest)[1:33] == bytes.fromhex(digest)
    assert page_key(digest) != page_key(digest.upper())  # not SGLang's form: hashed instead
    assert page_key("a.mamba") != page_key("a.swa")
    assert len({page_key(h) for h in hashes(100)}) == 100
    with pytest.raises(InvalidValueError):
        page_key(b"bytes")  # type: ignore[arg-type]


def test_the_namespace_names_model_dtype_layout_page_size_and_shard() -> None:
    pool = FakeHostPool()
    base = sglang_namespace(ShardIdentity("llama", tp_rank=0, tp_size=2), pool)
    others = [
        sglang_namespace(ShardIdentity("mistral", tp_rank=0, tp_size=2), pool),
        sglang_namespace(ShardIdentity("llama", tp_rank=1, tp_size=2), pool),
        sglang_namespace(ShardIdentity("llama", tp_rank=0, tp_size=4), pool),
        sglang_namespace(ShardIdentity("llama", tp_rank=0, tp_size=2, pp_size=2), pool),
        sglang_namespace(
            ShardIdentity("llama", tp_rank=0, tp_size=2), FakeHostPool(dtype=torch.float16)
        ),
    ]
    first_layout = FakeHostPool()
    first_layout.layout = "page_first"
    others.append(sglang_namespace(ShardIdentity("llama", tp_rank=0, tp_size=2), first_layout))
    assert len({base, *others}) == len(others) + 1
    assert "bfloat16" in base and "layer_first" in base and "page=4" in base and "bytes=512" in base
    mla = [ShardIdentity("ds", tp_rank=r, tp_size=4, replicated=True) for r in range(4)]
    assert len({sglang_namespace(shard, pool) for shard in mla}) == 1


def test_a_gpu_tier_is_refused(tmp_path: Path, open_stores: list[PageStore]) -> None:
    config = chain(tmp_path)
    config["tiers"].insert(0, {"name": "gpu", "medium": "gpu", "capacity": 4})
    with pytest.raises(ConfigError, match="gpu"):
        opened(open_stores, config, FakeHostPool())


# -- pages through a cpu -> disk chain -----------------------------------------------------------


def test_pages_round_trip_through_the_chain_into_other_host_slots(
    tmp_path: Path, open_stores: list[PageStore]
) -> None:
    source = FakeHostPool()
    source.fill(1)
    store = opened(open_stores, chain(tmp_path), source)
    keys = hashes(6)
    assert store.set_pages(keys, indices([0, 1, 2, 3, 4, 5])) == [True] * 6
    assert store.exists_prefix(keys) == 6
    hierarchy = store.hierarchy
    assert hierarchy is not None
    hierarchy.drain()
    assert {hierarchy.where(page_key(k)) for k in keys} == {"cpu", "disk"}  # cpu holds 2
    # Read back into other host slots (as a prefetch does), through the promotions.
    store.attach(source)  # attaching again to the same pool changes nothing
    assert store.get_pages(keys, indices([10, 11, 12, 13, 14, 15])) == [True] * 6
    for p in range(6):
        assert torch.equal(source.get_data_page((10 + p) * PAGE), page(source, p))


def test_only_a_leading_prefix_exists_and_is_read(
    tmp_path: Path, open_stores: list[PageStore]
) -> None:
    pool = FakeHostPool()
    pool.fill(2)
    store = opened(open_stores, chain(tmp_path, cpu_blocks=8), pool)
    keys = hashes(4)
    assert store.set_pages([keys[0], keys[1], keys[3]], indices([0, 1, 3])) == [True] * 3
    assert store.exists_prefix(keys) == 2
    assert store.exists_prefix(keys[2:]) == 0
    assert store.get_pages(keys, indices([4, 5, 6, 7])) == [True, True, False, False]
    assert torch.equal(pool.get_data_page(5 * PAGE), page(pool, 1))


def test_a_restart_finds_the_pages_on_disk_and_another_model_does_not(
    tmp_path: Path, open_stores: list[PageStore]
) -> None:
    pool = FakeHostPool()
    pool.fill(3)
    keys = hashes(5)
    first = opened(open_stores, chain(tmp_path), pool)
    assert all(first.set_pages(keys, indices([0, 1, 2, 3, 4])))
    first.close()  # flushes the cpu tier to disk
    other_model = opened(open_stores, chain(tmp_path), pool, model_name="mistral")
    assert other_model.exists_prefix(keys) == 0
    other_model.close()
    again = opened(open_stores, chain(tmp_path), FakeHostPool())
    assert again.exists_prefix(keys) == 5
    fresh = FakeHostPool()
    again.attach(fresh)  # a new pool: the chain reopens for it
    assert again.get_pages(keys, indices([0, 1, 2, 3, 4])) == [True] * 5
    assert torch.equal(fresh.kv_buffer[:, :, : 5 * PAGE], pool.kv_buffer[:, :, : 5 * PAGE])


def test_legacy_pages_wrong_sizes_and_duplicates(
    tmp_path: Path, open_stores: list[PageStore]
) -> None:
    pool = FakeHostPool()
    pool.fill(4)
    store = opened(open_stores, chain(tmp_path, cpu_blocks=8), pool)
    keys = hashes(3)
    pages = [page(pool, 0), page(pool, 1)[:-1], page(pool, 0)]
    assert store.put_pages([keys[0], keys[1], keys[0]], pages) == [True, False, True]
    target = pool.get_dummy_flat_data_page()
    assert store.get_page(keys[0], target) is target and torch.equal(target, page(pool, 0))
    assert store.get_page(keys[1], target) is None
    assert store.get_page(keys[0], torch.zeros(3)) is None  # a target of the wrong size
    raw = store.get_page(keys[0], None)
    assert raw is not None and torch.equal(raw.view(torch.bfloat16), page(pool, 0))


# -- every failure is a miss -----------------------------------------------------------------------


def test_before_attach_and_after_close_every_call_is_a_miss(
    tmp_path: Path, open_stores: list[PageStore]
) -> None:
    keys = hashes(2)
    store = PageStore(chain(tmp_path), ShardIdentity("llama"))
    open_stores.append(store)
    assert store.exists_prefix(keys) == 0
    assert store.set_pages(keys, indices([0, 1])) == [False, False]
    assert store.get_pages(keys, indices([0, 1])) == [False, False]
    assert store.get_page(keys[0], None) is None
    store.attach(FakeHostPool())
    assert store.set_pages(keys, indices([0, 1])) == [True, True]
    hierarchy = store.hierarchy
    assert hierarchy is not None
    hierarchy.close()  # closed under the store: answers are misses, not errors
    assert store.exists_prefix(keys) == 0
    assert store.get_pages(keys, indices([0, 1])) == [False, False]
    assert store.set_pages(keys, indices([0, 1])) == [False, False]


def test_bad_arguments_and_failing_pools_are_misses(
    tmp_path: Path, open_stores: list[PageStore]
) -> None:
    pool = FakeHostPool()
    pool.fill(5)
    store = opened(open_stores, chain(tmp_path, cpu_blocks=8), pool)
    keys = hashes(3)
    assert store.set_pages(keys, indices([0, 1])) == [False] * 3  # too few host indices
    assert store.set_pages(keys, indices([0, 1, 2]).reshape(3, 4)) == [False] * 3
    assert store.exists_prefix([keys[0], 7]) == 0  # type: ignore[list-item]
    assert store.set_pages(keys, indices([0, 1, 2])) == [True] * 3
    assert store.get_pages([keys[0], keys[0]], indices([3, 4])) == [False, False]
    pool.fail_writes = True
    assert store.get_pages(keys, indices([3, 4, 5])) == [False] * 3


def test_a_tier_error_or_a_late_answer_is_a_miss(
    tmp_path: Path, open_stores: list[PageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = FakeHostPool()
    store = PageStore(chain(tmp_path), ShardIdentity("llama"), timeout_s=0.05)
    open_stores.append(store)
    store.attach(pool)
    keys = hashes(2)
    hierarchy = store.hierarchy
    assert hierarchy is not None

    def failing(work: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_exception(OSError("EIO"))
        return future

    monkeypatch.setattr(hierarchy, "submit", failing)
    assert store.set_pages(keys, indices([0, 1])) == [False, False]
    assert store.exists_prefix(keys) == 0
    never: concurrent.futures.Future[Any] = concurrent.futures.Future()
    monkeypatch.setattr(hierarchy, "submit", lambda work: never)
    assert store.get_pages(keys, indices([0, 1])) == [False, False]  # after the deadline
    assert never.cancelled()


# -- tensor-parallel ranks -----------------------------------------------------------------------


def shared_chain(path: Path) -> dict[str, Any]:
    return {
        "block_size": 4096,
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": 2},
            {
                "name": "shared",
                "medium": "shared-fs",
                "capacity": 64,
                "path": str(path),
                "sweep_interval_s": None,
                "auth_key_env": AUTH_KEY_ENV,
            },
        ],
    }


def test_tp_ranks_keep_their_shards_apart_and_agree_on_what_is_held(
    tmp_path: Path, open_stores: list[PageStore]
) -> None:
    keys = hashes(4)
    pools = [FakeHostPool(), FakeHostPool()]
    for rank, pool in enumerate(pools):
        pool.fill(10 + rank)
    ranks = [
        opened(open_stores, chain(tmp_path / f"rank{r}"), pools[r], tp_rank=r, tp_size=2)
        for r in range(2)
    ]
    assert ranks[0].namespace != ranks[1].namespace
    assert all(ranks[0].set_pages(keys, indices([0, 1, 2, 3])))
    assert all(ranks[1].set_pages(keys[:3], indices([0, 1, 2])))
    answers = [store.exists_prefix(keys) for store in ranks]
    assert answers == [4, 3]
    assert min(answers) == 3  # SGLang's MIN all-reduce: every rank loads 3 pages
    for rank, store in enumerate(ranks):
        assert store.get_pages(keys[:3], indices([8, 9, 10])) == [True] * 3
        assert torch.equal(pools[rank].get_data_page(8 * PAGE), page(pools[rank], 0))


def test_mla_ranks_share_one_namespace_through_a_shared_tier(
    tmp_path: Path, open_stores: list[PageStore]
) -> None:
    keys = hashes(3)
    writer_pool, reader_pool = FakeHostPool(), FakeHostPool()
    writer_pool.fill(20)
    writer = opened(
        open_stores, shared_chain(tmp_path), writer_pool, tp_rank=0, tp_size=2, replicated=True
    )
    assert all(writer.set_pages(keys, indices([0, 1, 2])))
    writer.close()
    reader = opened(
        open_stores, shared_chain(tmp_path), reader_pool, tp_rank=1, tp_size=2, replicated=True
    )
    # A page only another node stored is found by exists() (as SGLang asks, once per
    # request, before any read): it awaits the shared tier's answer within the deadline.
    assert reader.exists_prefix(keys + hashes(1, "absent")) == 3
    assert reader.get_pages(keys, indices([0, 1, 2])) == [True] * 3
    assert torch.equal(
        reader_pool.kv_buffer[:, :, : 3 * PAGE], writer_pool.kv_buffer[:, :, : 3 * PAGE]
    )
