"""examples/memory_kv_tier.py: a tier that owns its index, plugged in through the registry,
certified by the KeyedStorageTests conformance suite and run in a chain."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, content, key

from kvtier import Hierarchy
from kvtier.config import parse_config
from kvtier.errors import ConfigError
from kvtier.keys import OffloadKey
from kvtier.testing.keyed import KeyedStorageTests
from kvtier.tiers.keyed import KeyedStorage
from kvtier.tiers.registry import register_tier, tier_kind, unregister_tier

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "memory_kv_tier.py"


def load_example() -> ModuleType:
    module = sys.modules.get("memory_kv_tier")
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location("memory_kv_tier", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the registry's opener path names this module
    spec.loader.exec_module(module)
    return module


memkv = load_example()
unregister_tier(memkv.MEDIUM)  # registered only while this module's tests run (fixture below)


@pytest.fixture(autouse=True, scope="module")
def memkv_registered() -> Iterator[None]:
    """The example's medium, for this module only: other tests see the built-in media."""
    register_tier(memkv.KIND, replace=True)
    try:
        yield
    finally:
        unregister_tier(memkv.MEDIUM)


class TestMemoryKVStorage(KeyedStorageTests):
    def make_storage(self, num_blocks: int, block_size: int, tmp_path: Path) -> KeyedStorage:
        server = memkv.MemoryKVServer(capacity=10_000, latency_s=0.0005)
        return memkv.MemoryKVStorage(
            server, block_size=block_size, num_blocks=num_blocks, namespace=str(tmp_path)
        )

    def _name(self, storage: KeyedStorage, key: OffloadKey) -> bytes:
        return bytes(storage.prefix) + key  # type: ignore[attr-defined]

    def backdoor_delete(self, storage: KeyedStorage, key: OffloadKey) -> None:
        del storage.server.raw()[self._name(storage, key)]  # type: ignore[attr-defined]

    def backdoor_damage(self, storage: KeyedStorage, key: OffloadKey) -> None:
        values = storage.server.raw()  # type: ignore[attr-defined]
        value = bytearray(values[self._name(storage, key)])
        value[-10] ^= 0xFF
        values[self._name(storage, key)] = bytes(value)

    def backdoor_move(self, storage: KeyedStorage, src: OffloadKey, dst: OffloadKey) -> None:
        values = storage.server.raw()  # type: ignore[attr-defined]
        values[self._name(storage, dst)] = values[self._name(storage, src)]


def memkv_config(server: str, *, known: int = 256, cpu: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "block_size": BLOCK,
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": cpu},
            {"name": "shared", "medium": "memkv", "capacity": known, "server": server, **extra},
        ],
    }


def test_the_example_registers_its_medium_with_its_declarations() -> None:
    kind = tier_kind("memkv")
    assert kind.owns_index and kind.volatile and kind.config_class is memkv.MemoryKVTierConfig
    config = parse_config(memkv_config("s0", latency_ms=1.5))
    assert config.tiers[1].latency_ms == 1.5
    with pytest.raises(ConfigError, match=r"tiers\[1\]\.latency_ms"):
        parse_config(memkv_config("s0", latency_ms=-1))
    with pytest.raises(ConfigError, match=r"tiers\[1\]\.path: unknown key"):
        parse_config(memkv_config("s0", path="/tmp"))


async def test_a_chain_over_the_example_tier_spills_and_promotes() -> None:
    async with Hierarchy.from_config(memkv_config("chain")) as h:
        assert h.tiers[1].policy == "own"
        ks = [key(i) for i in range(32)]
        for k in ks:
            assert await h.put([k], blocks_of([k])) == 1
        await h.drain()
        assert h.where(ks[0]) == "shared"
        out = await h.get(ks[:4])
        assert torch.equal(out.cpu(), blocks_of(ks[:4]))
        await h.drain()
        for tier in h.stats().tiers:
            assert (tier.pending, tier.pinned, tier.draining) == (0, 0, 0)
        h.check()


async def test_two_nodes_share_blocks_through_the_store() -> None:
    """Node A puts; node B, which never saw these keys, looks them up (ask again while the
    store is asked), then loads them, verified."""
    ks = [key(100 + i) for i in range(6)]
    async with Hierarchy.from_config(memkv_config("fleet", latency_ms=1)) as a:
        await a.put(ks, blocks_of(ks))
        await a.flush()  # the cpu tier's blocks go down to the shared store too
    async with Hierarchy.from_config(memkv_config("fleet", latency_ms=1)) as b:
        assert b.where(ks[0]) is None  # B has not asked yet
        out = await b.get(ks, timeout_s=5)
        assert torch.equal(out.cpu(), blocks_of(ks))
        assert b.stats().chain.hits[1] >= len(ks)


async def test_a_value_the_store_lost_or_damaged_is_a_miss_not_data() -> None:
    async with Hierarchy.from_config(memkv_config("lossy", cpu=4)) as h:
        ks = [key(200 + i) for i in range(12)]
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()
        storage = h.storages[1]
        values = storage.server.raw()  # type: ignore[attr-defined]
        prefix = storage.prefix  # type: ignore[attr-defined]
        del values[prefix + ks[0]]
        damaged = bytearray(values[prefix + ks[1]])
        damaged[-1] ^= 1
        values[prefix + ks[1]] = bytes(damaged)
        assert len(await h.get(ks[:1], timeout_s=2)) == 0
        assert len(await h.get(ks[1:2], timeout_s=2)) == 0
        out = await h.get(ks[2:3], timeout_s=2)
        assert torch.equal(out[0].cpu(), content(ks[2]))
        await h.drain()
        stats = h.stats()
        assert stats.corrupt_blocks == 1  # the damaged value
        assert stats.gone_blocks == 1  # the lost one: a miss, not damage
        assert h.where(ks[0]) is None and h.where(ks[1]) is None
        h.check()


async def test_a_store_that_answers_slowly_makes_gets_wait_not_fail() -> None:
    async with Hierarchy.from_config(memkv_config("slow", latency_ms=20)) as h:
        ks = [key(300 + i) for i in range(4)]
        await h.put(ks, blocks_of(ks))
        await h.flush()
        out = await asyncio.wait_for(h.get(ks), 5)
        assert len(out) == 4
