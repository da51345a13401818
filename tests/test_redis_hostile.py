"""The Redis tier against hostile values and careless configs (issue 19, items 3 and 7),
with the real Redis of `scripts/redis.sh`:

- a value longer than any block's is a miss counted as oversized and is never downloaded
  (the server's own byte count says so), on a standalone server and on a cluster;
- a zstd bomb (a tiny frame that declares or holds 64 MiB) is refused without allocating it;
- large reads are verified and decoded on a worker thread: the event loop keeps ticking;
- kvtier never deletes a value it found bad (a forger, or a tenant sharing the store, must not
  be able to make nodes destroy blocks); a later store of the key overwrites it, and it is
  then served;
- a password never shows: one in `url` is refused (without echoing it), and none reaches an
  error, a log line, a repr, `describe()` or `Hierarchy.tiers`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import redis
import redis.asyncio as aioredis
import torch
import zstandard
from hierarchy_helpers import BLOCK, blocks_of, key
from pydantic import ValidationError
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis_helpers import CLUSTER_PORT, PASSWORD_ENV, Server
from test_redis_tier import chain, fill, redis_storage

from kvtier import Hierarchy
from kvtier.config import hide_userinfo, parse_config
from kvtier.errors import ConfigError, TierConnectionError
from kvtier.keys import OffloadKey
from kvtier.testing.keyed import keyed_auth
from kvtier.tiers.codec import BlockCodec, Codec, Compression
from kvtier.tiers.redis.kind import RedisTierConfig
from kvtier.tiers.redis.storage import CircuitBreaker, RedisStorage
from kvtier.tiers.storage import ReadFailure

pytestmark = pytest.mark.timeout(90)

SECRET = "s3cret-Pa55word"
"""A password written where it must not be; no output may contain it."""


def storage_on(
    client: Any,
    tmp_path: Path,
    *,
    block_size: int = BLOCK,
    compression: Compression = "none",
    cluster: bool = False,
) -> RedisStorage:
    """A Redis tier's storage as its opener builds it (authenticated values), on `client`."""
    return RedisStorage(
        client,
        block_size=block_size,
        num_blocks=256,
        namespace=str(tmp_path),
        prefix=f"hostile:{tmp_path.name}:".encode(),
        timeout_s=5.0,
        codec=BlockCodec(compression),
        cluster=cluster,
        auth=keyed_auth(str(tmp_path)),
    )


@pytest_asyncio.fixture
async def standalone(server: Server, redis_clean: None, tmp_path: Path) -> AsyncIterator[Any]:
    """A factory of storages on the test server (closed at the end)."""
    opened: list[RedisStorage] = []

    def make(**options: Any) -> RedisStorage:
        client = aioredis.Redis.from_url(server.url, password=server.password)
        opened.append(storage_on(client, tmp_path, **options))
        return opened[-1]

    yield make
    for storage in opened:
        await storage.aclose()


def zeros(n: int, block_size: int = BLOCK) -> list[np.ndarray[Any, np.dtype[np.uint8]]]:
    return [np.zeros(block_size, dtype=np.uint8) for _ in range(n)]


def sent_by_server(client: redis.Redis) -> int:
    """Bytes the server sent to all clients since its stats were last reset."""
    return int(client.info("stats")["total_net_output_bytes"])


# --------------------------------------------------------------------------------------------
# Bounded reads
# --------------------------------------------------------------------------------------------


async def test_an_oversized_value_is_a_miss_and_is_never_downloaded(
    server: Server, standalone: Any
) -> None:
    storage: RedisStorage = standalone()
    good = [key(2)]
    assert await storage.write(good, [0], [np.full(BLOCK, 7, dtype=np.uint8)]) == [None]
    name = storage.prefix + key(1)
    with server.client() as client:
        client.config_set("maxmemory", "512mb")
        client.set(name, bytes(64 << 20))  # 64 MiB where a 4 KiB block's value belongs
        client.config_resetstat()
    out = zeros(2)
    results = await storage.read([key(1), key(2)], [0, 1], out)
    with server.client() as client:
        sent = sent_by_server(client)
        commands = client.info("commandstats")
        assert client.strlen(name) == 64 << 20  # still there: never deleted
    assert results == [ReadFailure.NOT_INDEXED, None]
    assert np.all(out[1] == 7)
    assert storage.stats.problems == {"oversized": 1}
    # Two values of at most one frame each (4 KiB and a header), not 64 MiB.
    assert sent < 64 << 10, sent
    assert "cmdstat_getrange" in commands
    assert not {"cmdstat_get", "cmdstat_mget", "cmdstat_del", "cmdstat_unlink"} & set(commands)


async def test_a_value_of_another_type_is_a_miss_and_the_batch_goes_on(
    server: Server, standalone: Any
) -> None:
    """A list where a value belongs answers WRONGTYPE: that key is a foreign miss; the other
    keys of the round trip are read, and the breaker does not count it as a failure."""
    storage: RedisStorage = standalone()
    assert await storage.write([key(2)], [0], [np.full(BLOCK, 9, dtype=np.uint8)]) == [None]
    with server.client() as client:
        client.rpush(storage.prefix + key(1), b"not", b"a", b"string")
    out = zeros(3)
    results = await storage.read([key(1), key(2), key(3)], [0, 1, 2], out)
    assert results == [ReadFailure.NOT_INDEXED, None, ReadFailure.NOT_INDEXED]
    assert np.all(out[1] == 9)
    assert storage.stats.problems == {"foreign": 1, "missing": 1}
    assert storage.stats.errors == 0 and not storage.breaker.is_open


@pytest.mark.usefixtures("redis_clean")
async def test_bounded_reads_on_a_cluster(server: Server, tmp_path: Path) -> None:
    """Keys spread over a cluster's nodes are read in one pipelined round trip; an oversized
    value among them is a miss and is not downloaded."""
    done = server.run("cluster")
    assert done.returncode == 0, done.stderr
    client = RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", CLUSTER_PORT)], password=server.password
    )
    storage = storage_on(client, tmp_path, cluster=True)
    try:
        keys = [key(i) for i in range(24)]
        blocks = [np.full(BLOCK, i, dtype=np.uint8) for i in range(24)]
        assert await storage.write(keys, list(range(24)), blocks) == [None] * 24
        big = redis.RedisCluster(host="127.0.0.1", port=CLUSTER_PORT, password=server.password)
        try:
            big.set(storage.prefix + keys[5], bytes(16 << 20))
            nodes = {str(node.port) for node in big.get_nodes()}
            assert len(nodes) == 3
            sent_before = sum(
                int(stats["total_net_output_bytes"])
                for stats in big.info("stats", target_nodes=big.ALL_NODES).values()
            )
            out = zeros(24)
            results = await storage.read(keys, list(range(24)), out)
            sent = (
                sum(
                    int(stats["total_net_output_bytes"])
                    for stats in big.info("stats", target_nodes=big.ALL_NODES).values()
                )
                - sent_before
            )
            assert big.strlen(storage.prefix + keys[5]) == 16 << 20
        finally:
            big.close()
        assert results == [None] * 5 + [ReadFailure.NOT_INDEXED] + [None] * 18
        pairs = zip(out, blocks, strict=True)
        assert all(np.array_equal(o, b) for i, (o, b) in enumerate(pairs) if i != 5)
        assert storage.stats.problems == {"oversized": 1}
        assert sent < 1 << 20, sent  # 23 values of 4 KiB, not 16 MiB
    finally:
        await storage.aclose()


# --------------------------------------------------------------------------------------------
# Decoding: bounded memory, off the loop
# --------------------------------------------------------------------------------------------


def bomb_value(
    storage: RedisStorage, k: OffloadKey, frame: bytes, monkeypatch: pytest.MonkeyPatch
) -> bytes:
    """A value of `k` holding `frame` as its zstd block, made (and authenticated) by the
    storage's own codec, as a node holding the key could."""
    with monkeypatch.context() as patch:
        patch.setattr(BlockCodec, "encode", lambda self, block: (Codec.ZSTD, frame))
        return storage.values.encode(k, np.zeros(storage.block_size, dtype=np.uint8))


async def test_a_zstd_bomb_is_refused_without_a_big_allocation(
    server: Server, standalone: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage: RedisStorage = standalone(compression="zstd")
    declared = zstandard.ZstdCompressor(level=3).compress(bytes(64 << 20))  # says 64 MiB
    stream = zstandard.ZstdCompressor(level=3).compressobj()
    undeclared = stream.compress(bytes(64 << 20)) + stream.flush()  # says nothing, holds 64 MiB
    assert len(declared) < BLOCK and len(undeclared) < BLOCK
    assert zstandard.frame_content_size(undeclared) == -1
    with server.client() as client:
        for k, frame in ((key(1), declared), (key(2), undeclared)):
            client.set(storage.prefix + k, bomb_value(storage, k, frame, monkeypatch))
    tracemalloc.start()
    try:
        results = await storage.read([key(1), key(2)], [0, 1], zeros(2))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert results == [ReadFailure.CODEC, ReadFailure.CODEC]
    assert storage.stats.problems == {"damaged": 2}
    assert peak < 4 << 20, peak  # not the 64 MiB the frames declare or hold


async def test_large_reads_are_decoded_off_the_event_loop(
    standalone: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = 1 << 20
    storage: RedisStorage = standalone(block_size=block, compression="zstd")
    rng = np.random.default_rng(19)
    keys = [key(i) for i in range(16)]
    blocks = [rng.integers(0, 16, block, dtype=np.uint8) for _ in keys]  # zstd shrinks them
    assert await storage.write(keys, list(range(16)), blocks) == [None] * 16
    decoders: list[int] = []
    codec_class = type(storage.values)
    decode = codec_class.decode_into

    def recording(self: Any, *args: Any) -> Any:
        decoders.append(threading.get_ident())
        return decode(self, *args)

    monkeypatch.setattr(codec_class, "decode_into", recording)
    out = zeros(16, block)
    results = await storage.read(keys, list(range(16)), out)
    assert results == [None] * 16
    assert all(np.array_equal(o, b) for o, b in zip(out, blocks, strict=True))
    assert len(decoders) == 16
    assert threading.get_ident() not in decoders  # every 1 MiB block decoded on a worker


# --------------------------------------------------------------------------------------------
# Bad values: never deleted, healed by the next store
# --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("redis_clean")
async def test_bad_values_are_never_deleted_and_a_later_put_heals_them(server: Server) -> None:
    async with Hierarchy.from_config(chain(server)) as h:
        keys = await fill(h, range(12))
        storage = redis_storage(h)
        garbage, altered, oversized = [k for k in keys if h.where(k) == "fleet"][:3]
        planted: dict[OffloadKey, bytes] = {}
        with server.client() as client:
            value = bytearray(client.get(storage.prefix + altered) or b"")
            value[-5] ^= 0x40
            planted[altered] = bytes(value)
            planted[garbage] = b"not a kvtier value at all"
            planted[oversized] = bytes(1 << 20)
            for k, v in planted.items():
                client.set(storage.prefix + k, v)
            client.config_resetstat()
        for k in planted:
            assert (await h.get([k])).shape[0] == 0
        await h.drain()
        problems = storage.stats.problems
        assert problems["foreign"] == 1 and problems["oversized"] == 1
        assert sum(problems.values()) == 3  # the altered one: damaged, or forged when keyed
        with server.client() as client:
            for k, v in planted.items():
                assert client.get(storage.prefix + k) == v  # left as they were
            assert not {"cmdstat_del", "cmdstat_unlink"} & set(client.info("commandstats"))
        await asyncio.sleep(0.3)  # past the short negative cache of lookups
        assert storage.probe(list(planted)) == [False] * 3  # not learnt as present again

        bad = list(planted)
        assert await h.put(bad, blocks_of(bad)) == 3  # stored again, not skipped as present
        await h.flush()
        await h.drain()
        assert all(h.where(k) in ("cpu", "fleet") for k in bad)
        with server.client() as client:
            for k, v in planted.items():
                assert client.get(storage.prefix + k) != v  # overwritten by the store
    async with Hierarchy.from_config(chain(server)) as b:  # another node reads them
        out = await b.get(bad)
        assert torch.equal(out, blocks_of(bad))
        assert redis_storage(b).stats.problems == {}


async def test_forget_never_deletes(server: Server, standalone: Any) -> None:
    storage: RedisStorage = standalone()
    assert await storage.write([key(1)], [0], zeros(1)) == [None]
    await storage.forget([key(1), key(2)])
    assert storage.probe([key(1)]) == [False]
    assert await storage.read([key(1)], [0], zeros(1)) == [ReadFailure.NOT_INDEXED]
    with server.client() as client:
        assert client.exists(storage.prefix + key(1)) == 1
    assert await storage.write([key(1)], [0], zeros(1)) == [None]  # stored again: served
    assert await storage.read([key(1)], [0], zeros(1)) == [None]


# --------------------------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------------------------


def redis_chain(url: str) -> dict[str, Any]:
    tier = {"name": "fleet", "medium": "redis", "capacity": 8, "url": url}
    return {
        "block_size": BLOCK,
        "model_id": "m",
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 4}, tier],
    }


@pytest.mark.parametrize(
    "url",
    [
        f"redis://user:{SECRET}@127.0.0.1:6379/0",
        f"redis://:{SECRET}@127.0.0.1:6379/0",
        f"rediss://{SECRET}@127.0.0.1:6379",
        f"redis://user:{SECRET[:4]}/{SECRET[4:]}@127.0.0.1/0",
        f"redis://127.0.0.1:6379/0?password={SECRET}",
        f"unix://:{SECRET}@/run/redis.sock",
    ],
)
def test_a_password_in_the_url_is_refused_and_never_echoed(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(redis_chain(url))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("tiers[1].url: must not hold a user or password")
    assert "password_env" in message and "username" in message
    assert SECRET not in message and SECRET[4:] not in message
    with pytest.raises(ValidationError) as direct:
        RedisTierConfig.model_validate(redis_chain(url)["tiers"][1])
    assert SECRET[4:] not in str(direct.value) and SECRET[4:] not in repr(direct.value)


def test_hide_userinfo() -> None:
    assert hide_userinfo(f"at redis://u:{SECRET}@h:1/0 and rediss://:{SECRET}@q") == (
        "at redis://***@h:1/0 and rediss://***@q"
    )
    assert hide_userinfo(f"redis://h/0?db=1&password={SECRET}") == "redis://h/0?db=1&password=***"
    assert hide_userinfo("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


class _FailingClient:
    """A client whose every round trip fails with an error quoting the URL and password."""

    def pipeline(self, transaction: bool = False) -> _FailingClient:
        return self

    def set(self, *args: Any, **kwargs: Any) -> None:
        pass

    def getrange(self, *args: Any) -> None:
        pass

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        raise RedisConnectionError(
            f"Error connecting to redis://admin:{SECRET}@10.0.0.5:6379/0 with password {SECRET}"
        )

    async def aclose(self) -> None:
        pass


@pytest.fixture
def log_everything(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG):
        yield caplog


async def test_client_errors_are_scrubbed(
    tmp_path: Path, log_everything: pytest.LogCaptureFixture
) -> None:
    storage = RedisStorage(
        _FailingClient(),
        block_size=BLOCK,
        num_blocks=8,
        namespace="ns",
        prefix=b"p:",
        timeout_s=1.0,
        breaker=CircuitBreaker(1, 60.0),
        description=f"tier 'fleet' (redis redis://admin:{SECRET}@10.0.0.5:6379/0)",
        where=f"redis redis://admin:{SECRET}@10.0.0.5:6379/0",
        secrets=(SECRET,),
        auth=keyed_auth("ns"),
    )
    errors = await storage.write([key(1)], [0], zeros(1))
    assert isinstance(errors[0], OSError) and "Error connecting" in str(errors[0])
    assert await storage.read([key(1)], [0], zeros(1)) == [ReadFailure.IO_ERROR]
    shown = [str(errors[0]), repr(storage), storage.describe(), log_everything.text]
    assert storage.breaker.is_open and "failing fast" in log_everything.text
    for text in shown:
        assert SECRET not in text, text
    assert storage.describe() == "redis redis://***@10.0.0.5:6379/0"
    await storage.aclose()


@pytest.mark.usefixtures("redis_clean")
async def test_the_password_never_shows(
    server: Server, monkeypatch: pytest.MonkeyPatch, log_everything: pytest.LogCaptureFixture
) -> None:
    config = chain(server)
    async with Hierarchy.from_config(config) as h:
        keys = await fill(h, range(12))
        assert torch.equal(await h.get(keys[:2]), blocks_of(keys[:2]))
        storage = redis_storage(h)
        fleet = next(tier for tier in h.tiers if tier.name == "fleet")
        assert fleet.where == f"redis {server.url}"
        server.stop()  # round trips fail: warnings, errors
        try:
            await h.get(keys[-4:])
            await fill(h, range(100, 108))
        finally:
            server.start()
        shown = [
            repr(storage),
            storage.describe(),
            repr(h.tiers),
            repr(h.stats()),
            parse_config(config).describe(),
            log_everything.text,
        ]
    monkeypatch.setenv(PASSWORD_ENV, f"wrong-{SECRET}")  # refused: the error names no password
    with pytest.raises(TierConnectionError, match="refused the login") as refused:
        async with Hierarchy.from_config({**config, "strict": True}):
            pass
    async with Hierarchy.from_config({**config, "strict": False}) as h:
        assert "fleet" in h.disabled_tiers
        shown += [str(refused.value), repr(h.disabled_tiers), log_everything.text]
    for text in shown:
        assert server.password not in text and SECRET not in text, text
