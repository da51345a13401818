"""The Redis tier (issue 11, item 1) against a real Redis started by `scripts/redis.sh` on
loopback with a password: the KeyedStorageTests conformance suite, chains that spill into
Redis and read back bit for bit, two hierarchies sharing one Redis, garbage and foreign
values read as misses, a wrong password, Redis down at start / killed mid-run / restarted,
a full Redis, and Redis Cluster."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, key
from redis_helpers import CLUSTER_PORT, PASSWORD_ENV, Server

from kvtier import Hierarchy
from kvtier.errors import TierConnectionError
from kvtier.keys import OffloadKey
from kvtier.testing.keyed import AUTH_KEY_ENV, KeyedStorageTests, fixed_key_hex, keyed_auth
from kvtier.tiers.codec import BlockCodec
from kvtier.tiers.keyed import KeyedStorage
from kvtier.tiers.redis.storage import CircuitBreaker, RedisStorage, key_prefix
from kvtier.tiers.shared.auth import ValueAuth

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("redis_clean")]

os.environ[AUTH_KEY_ENV] = fixed_key_hex()  # the key every test chain names (auth_key_env)


def chain(server: Server, *, cpu: int = 4, capacity: int = 256, **redis_options: Any) -> dict:
    tier = {
        "name": "fleet",
        "medium": "redis",
        "capacity": capacity,
        "url": server.url,
        "password_env": PASSWORD_ENV,
        "auth_key_env": AUTH_KEY_ENV,
        # A busy machine's slow round trip is not what these tests are about: the tests of
        # a deadline (a stalled or stopped server) pass their own.
        "timeout_ms": 10_000,
        "breaker_cooldown_s": 0.2,
        **redis_options,
    }
    return {
        "block_size": BLOCK,
        "model_id": "test-model",
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": cpu}, tier],
    }


def redis_storage(h: Hierarchy) -> RedisStorage:
    storage = h.storages[-1]
    assert isinstance(storage, RedisStorage)
    return storage


async def until_it_answers(storage: RedisStorage, timeout_s: float = 10.0) -> None:
    """Write a probe block until a write succeeds: the breaker's trial went through and
    redis-py reconnected (as it does on its own for the tier's next round trips)."""
    import numpy as np

    deadline = time.perf_counter() + timeout_s
    probe = np.zeros(storage.block_size, dtype=np.uint8)
    while await storage.write([b"probe-key"], [0], [probe]) != [None]:
        assert time.perf_counter() < deadline, "the tier did not come back"
        await asyncio.sleep(0.05)


async def settle(h: Hierarchy) -> None:
    await h.drain()


async def fill(h: Hierarchy, ids: range) -> list[OffloadKey]:
    keys = [key(i) for i in ids]
    for first in range(0, len(keys), 4):
        await h.put(keys[first : first + 4], blocks_of(keys[first : first + 4]))
    await h.flush()
    await settle(h)
    return keys


# --------------------------------------------------------------------------------------------
# Conformance
# --------------------------------------------------------------------------------------------


class TestRedisStorage(KeyedStorageTests):
    shared = True

    @pytest.fixture(autouse=True)
    def _server(self, server: Server) -> None:
        self.server = server

    def make_storage(self, num_blocks: int, block_size: int, tmp_path: Path) -> KeyedStorage:
        namespace = self.shared_namespace()
        return self.open_shared(tmp_path, namespace, keyed_auth(namespace))

    def open_shared(self, tmp_path: Path, namespace: str, auth: ValueAuth | None) -> KeyedStorage:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.server.url, password=self.server.password)
        return RedisStorage(
            client,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            namespace=namespace,
            prefix=f"test:{tmp_path.name}:".encode() + key_prefix(namespace),
            timeout_s=30.0,  # a loaded machine's round trip; no conformance test is a deadline
            batch_keys=7,  # several round trips per batch
            auth=auth,
        )

    def backdoor_get_raw(self, storage: KeyedStorage, key: OffloadKey) -> bytes | None:
        with self.server.client() as client:
            value: bytes | None = client.get(self._name(storage, key))
            return value

    def backdoor_put_raw(self, storage: KeyedStorage, key: OffloadKey, value: bytes) -> None:
        with self.server.client() as client:
            client.set(self._name(storage, key), value)

    def _name(self, storage: KeyedStorage, key: OffloadKey) -> bytes:
        assert isinstance(storage, RedisStorage)
        return storage.prefix + key

    def backdoor_delete(self, storage: KeyedStorage, key: OffloadKey) -> None:
        with self.server.client() as client:
            client.delete(self._name(storage, key))

    def backdoor_damage(self, storage: KeyedStorage, key: OffloadKey) -> None:
        with self.server.client() as client:
            value = bytearray(client.get(self._name(storage, key)) or b"")
            value[-5] ^= 0x40
            client.set(self._name(storage, key), bytes(value))

    def backdoor_move(self, storage: KeyedStorage, src: OffloadKey, dst: OffloadKey) -> None:
        with self.server.client() as client:
            client.set(self._name(storage, dst), client.get(self._name(storage, src)) or b"")


# --------------------------------------------------------------------------------------------
# In a chain
# --------------------------------------------------------------------------------------------


async def test_blocks_spill_into_redis_and_come_back_bit_for_bit(server: Server) -> None:
    async with Hierarchy.from_config(chain(server)) as h:
        keys = await fill(h, range(24))
        assert sum(h.where(k) == "fleet" for k in keys) >= 20
        out = await h.get(keys)
        assert out.shape[0] == 24 and torch.equal(out, blocks_of(keys))
        assert redis_storage(h).stats.round_trips > 0
        h.check()


async def test_two_nodes_share_one_redis(server: Server) -> None:
    """Node B (its own process in production; its own hierarchy here) loads what node A
    stored, verified, without having stored it."""
    async with Hierarchy.from_config(chain(server)) as a:
        keys = await fill(a, range(12))
    async with Hierarchy.from_config(chain(server)) as b:
        assert b.lookup(keys) == 0  # a lookup starts nothing: B has not asked Redis yet
        out = await b.get(keys)  # the get asks Redis, and waits for the answer
        assert torch.equal(out, blocks_of(keys))


async def test_another_model_never_reads_these_values(server: Server) -> None:
    async with Hierarchy.from_config(chain(server)) as a:
        keys = await fill(a, range(8))
    other = chain(server)
    other["model_id"] = "another-model"
    async with Hierarchy.from_config(other) as b:
        await asyncio.sleep(0.05)
        assert (await b.get(keys[:1])).shape[0] == 0


async def test_garbage_and_foreign_values_are_misses_never_data(server: Server) -> None:
    config = chain(server, key_prefix="shared:")
    async with Hierarchy.from_config(config) as h:
        keys = await fill(h, range(12))
        storage = redis_storage(h)
        with server.client() as client:
            client.set(storage.prefix + keys[0], b"not a kvtier value at all")
            client.set(storage.prefix + keys[1], client.get(storage.prefix + keys[2]) or b"")
            value = bytearray(client.get(storage.prefix + keys[3]) or b"")
            client.set(storage.prefix + keys[3], bytes(value[: len(value) // 2]))  # torn
        for index in (0, 1, 3):
            out = await h.get([keys[index]])
            assert out.shape[0] == 0, index
        assert storage.stats.problems == {"foreign": 2, "damaged": 1}
        out = await h.get([keys[2]])  # its own value is intact
        assert torch.equal(out, blocks_of([keys[2]]))


async def test_a_wrong_password_is_refused_at_open_and_named(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    config = chain(server)
    config["strict"] = True
    with pytest.raises(TierConnectionError, match="refused the login"):
        async with Hierarchy.from_config(config):
            pass
    config["strict"] = False
    async with Hierarchy.from_config(config) as h:
        assert "fleet" in h.disabled_tiers and "refused the login" in h.disabled_tiers["fleet"]


async def test_an_unset_password_variable_is_named(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    config = chain(server)
    config["strict"] = True
    with pytest.raises(Exception, match=f"\\${PASSWORD_ENV}, which is not set"):
        async with Hierarchy.from_config(config):
            pass
    os.environ[PASSWORD_ENV] = server.password


async def test_redis_killed_mid_run_is_misses_then_comes_back(server: Server) -> None:
    async with Hierarchy.from_config(chain(server)) as h:
        keys = await fill(h, range(16))
        on_redis = [k for k in keys if h.where(k) == "fleet"]
        server.stop()
        out = await h.get(on_redis[:4])  # a miss (connection refused), never an exception
        assert out.shape[0] == 0
        more = [key(100 + i) for i in range(8)]
        assert await h.put(more, blocks_of(more)) == 8  # the top tier still takes puts
        await settle(h)
        storage = redis_storage(h)
        assert storage.stats.timeouts + storage.stats.errors + storage.stats.fast_failures > 0
        server.start()  # the same server again (empty: it keeps nothing on disk)
        await until_it_answers(storage)  # the breaker lets a trial through; it reconnects
        # Comes back: new blocks reach the server and are served whole again. The pool's
        # other connections died with the server, so a round may still be short: never
        # wrong bytes.
        for round_ in range(20):
            fresh = [key(200 + 8 * round_ + i) for i in range(8)]
            for first in range(0, 8, 4):
                await h.put(fresh[first : first + 4], blocks_of(fresh[first : first + 4]))
            await h.flush()
            await settle(h)
            on_fleet = any(h.where(k) == "fleet" for k in fresh)
            out = await h.get(fresh)
            assert torch.equal(out, blocks_of(fresh)[: out.shape[0]])  # a prefix, maybe none
            if on_fleet and out.shape[0] == len(fresh):
                break
        else:
            pytest.fail("after the server came back, no round was stored there and served whole")


async def test_redis_down_at_start_the_tier_opens_and_recovers(server: Server) -> None:
    server.stop()
    async with Hierarchy.from_config(chain(server)) as h:
        assert not h.disabled_tiers
        keys = [key(i) for i in range(8)]
        await h.put(keys[:4], blocks_of(keys[:4]))
        server.start()
        await until_it_answers(redis_storage(h))
        rest = await fill(h, range(4, 16))
        out = await h.get(rest)
        assert torch.equal(out, blocks_of(rest))


async def test_a_full_redis_evicts_or_refuses_and_kvtier_goes_on(server: Server) -> None:
    with server.client() as client:
        client.set("ballast", b"x" * (2 << 20))
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1mb")  # below what it holds: every write is refused
    async with Hierarchy.from_config(chain(server)) as h:
        keys = await fill(h, range(16))  # demotions to Redis fail: counted, no exception
        storage = redis_storage(h)
        assert storage.stats.errors > 0
        assert h.stats().failed_blocks > 0
        with server.client() as client:
            client.delete("ballast")
            client.config_set("maxmemory-policy", "allkeys-lru")
        many = await fill(h, range(100, 400))  # 300 blocks of 4 KiB in 1 MiB: Redis evicts
        out = await h.get(many[-4:])
        assert out.shape[0] in (0, 4) and torch.equal(out, blocks_of(many[-4:])[: out.shape[0]])
        assert len(keys) == 16


async def test_values_may_be_compressed(server: Server) -> None:
    async with Hierarchy.from_config(chain(server, compression="zstd")) as h:
        keys = [key(i) for i in range(12)]
        zeros = torch.zeros((12, BLOCK), dtype=torch.uint8)
        for first in range(0, 12, 4):
            await h.put(keys[first : first + 4], zeros[first : first + 4])
        await h.flush()
        await settle(h)
        storage = redis_storage(h)
        with server.client() as client:
            sizes = [client.strlen(storage.prefix + k) for k in keys if h.where(k) == "fleet"]
        assert sizes and max(sizes) < BLOCK // 4
        assert torch.equal(await h.get(keys), zeros)


def test_the_breaker_opens_after_failures_and_lets_one_trial_through() -> None:
    breaker = CircuitBreaker(failures=2, cooldown_s=0.05)
    assert breaker.allow()
    breaker.failure()
    assert breaker.allow() and not breaker.is_open
    breaker.failure()
    assert breaker.is_open and not breaker.allow()
    time.sleep(0.06)
    assert breaker.allow() and not breaker.allow()  # one trial per cooldown
    breaker.success()
    assert breaker.allow() and not breaker.is_open and breaker.opened == 1


async def test_redis_cluster_round_trip(server: Server) -> None:
    done = server.run("cluster")
    assert done.returncode == 0, done.stderr
    tier = {
        "name": "fleet",
        "medium": "redis",
        "capacity": 256,
        "cluster_nodes": [f"127.0.0.1:{CLUSTER_PORT}"],
        "password_env": PASSWORD_ENV,
        "auth_key_env": AUTH_KEY_ENV,
        "timeout_ms": 10_000,  # a busy machine's slow round trip is not what this tests
    }
    config = {
        "block_size": BLOCK,
        "model_id": "test-model",
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 4}, tier],
    }
    async with Hierarchy.from_config(config) as h:
        keys = await fill(h, range(20))
        on_cluster = sum(h.where(k) == "fleet" for k in keys)
        assert on_cluster >= 16, redis_storage(h).stats  # the stats say why a store failed
        assert torch.equal(await h.get(keys), blocks_of(keys))


def test_block_codec_round_trip_is_used_for_values() -> None:
    """The value codec is the disk tier's block codec: zstd frames decode exactly."""
    import numpy as np

    from kvtier.tiers.shared.value import ValueCodec

    values = ValueCodec("ns", 64, BlockCodec("zstd"))
    block = np.arange(64, dtype=np.uint8)
    value = values.encode(key(1), block)
    out = np.zeros(64, dtype=np.uint8)
    assert values.decode_into(key(1), value, out) == (None, None)
    assert np.array_equal(out, block)
    assert values.decode_into(key(2), value, out)[1] == "foreign"


async def test_a_slow_or_evicting_redis_is_a_miss_not_damage(server: Server) -> None:
    """A read that times out, or finds the value evicted, is a miss: counted as gone, not
    as corrupt, and nothing is deleted from the store other nodes share."""
    async with Hierarchy.from_config(chain(server, timeout_ms=300)) as h:
        keys = await fill(h, range(16))
        storage = redis_storage(h)
        on_redis = [k for k in keys if h.where(k) == "fleet"]
        with server.client() as client:
            client.delete(storage.prefix + on_redis[0])  # Redis evicted it
            # and now it stalls for 16x the tier's 300 ms deadline (UNPAUSE would wait too)
            client.execute_command("CLIENT", "PAUSE", "5000", "ALL")
        assert (await h.get(on_redis[:1])).shape[0] == 0
        assert (await h.get(on_redis[1:2])).shape[0] == 0  # timed out: a miss
        await h.drain()
        stats = h.stats()
        assert stats.gone_blocks == 2 and stats.corrupt_blocks == 0
        with server.client() as client:  # answered once the pause is over
            assert client.exists(storage.prefix + on_redis[1]) == 1  # not deleted


async def test_tls_to_redis(server: Server) -> None:
    done = server.run("tls")
    if done.returncode == 3:
        pytest.skip(f"no TLS Redis here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    directory = Path(server.env["KVTIER_REDIS_DIR"])
    port = server.env["KVTIER_REDIS_TLS_PORT"]
    tier = {
        "name": "fleet",
        "medium": "redis",
        "capacity": 256,
        "url": f"rediss://127.0.0.1:{port}/0",
        "tls_ca_file": str(directory / "tls" / "ca.crt"),
        "password_env": PASSWORD_ENV,
        "auth_key_env": AUTH_KEY_ENV,
        "timeout_ms": 2000,
    }
    config = {
        "block_size": BLOCK,
        "strict": True,
        "model_id": "test-model",
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 4}, tier],
    }
    async with Hierarchy.from_config(config) as h:
        keys = await fill(h, range(12))
        assert sum(h.where(k) == "fleet" for k in keys) >= 8
        assert torch.equal(await h.get(keys), blocks_of(keys))
    untrusted = {**tier, "tls_ca_file": None}  # the system's CAs do not know this one
    config["tiers"] = [config["tiers"][0], untrusted]
    with pytest.raises(TierConnectionError, match="set tls_ca_file"):
        async with Hierarchy.from_config(config):
            pass


async def test_two_writers_of_the_same_keys_leave_whole_blocks(server: Server) -> None:
    """Two nodes storing the same prefix at once: each value written is a whole, verified
    block (SET is atomic), whichever lands last."""
    async with (
        Hierarchy.from_config(chain(server)) as a,
        Hierarchy.from_config(chain(server)) as b,
    ):
        keys = [key(i) for i in range(32)]
        for _ in range(5):
            await asyncio.gather(fill(a, range(32)), fill(b, range(32)))
        out = await a.get(keys)
        assert torch.equal(out, blocks_of(keys))
        assert redis_storage(a).stats.problems == {} and redis_storage(b).stats.problems == {}
