"""`RedisStorage`: a tier of blocks in Redis (standalone or Redis Cluster), through redis-py's
asyncio client (`pip install 'kvtier[redis]'`).

Many nodes write one Redis, so Redis owns the capacity: its `maxmemory` with an LRU or LFU
policy evicts, and a block that is gone is a miss (see `KeyedTierManager`). Every value is a
`ValueCodec` value: a read verifies key, namespace, length, codec and checksum, so a foreign,
torn or overwritten value is a miss plus a counted problem, never data.

Failure is a miss, within `timeout_ms`: every round trip has that deadline; a down, slow or
full Redis makes writes fail (counted failed stores) and reads miss, never an exception in
the caller. After `breaker_failures` failed round trips in a row the circuit breaker opens:
for `breaker_cooldown_s` every call fails at once without touching the network, then one
round trip is tried again (redis-py reconnects). Lookups are batched pipelined EXISTS through
`ProbeCache` ("ask again" while in flight, a short negative cache).

Hostile values cost little: a read fetches at most one block's value (GETRANGE to one byte
past the largest, so a longer value is a miss counted as oversized, never downloaded), and
verifies and decodes large batches on a worker thread, never stalling the event loop. A
value found bad is never deleted (kvtier cannot tell who wrote it, and other nodes and
tenants share the store): this node takes its key as absent until it stores it again, which
overwrites it. No URL credential or password reaches a log line, an error or a repr.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import AuthenticationError, RedisError, ResponseError

from kvtier.config_fields import hide_userinfo
from kvtier.errors import InvalidValueError, TierConnectionError
from kvtier.keys import OffloadKey
from kvtier.namespaces import namespace_fingerprint
from kvtier.tiers.codec import BlockCodec
from kvtier.tiers.keyed import KeyedStorage, ProbeCache
from kvtier.tiers.redis.kind import RedisTierConfig
from kvtier.tiers.registry import TierContext
from kvtier.tiers.shared.auth import ValueAuth, auth_from_config
from kvtier.tiers.shared.value import (
    ValueCodec,
    ValueProblem,
    check_block_buffers,
    record_problem,
    reported_problems,
)
from kvtier.tiers.storage import HostBuffer, ReadFailure

log = logging.getLogger("kvtier.tiers.redis")

T = TypeVar("T")

REUSE_BUFFER_BYTES = 1 << 20
"""Blocks of at least this size are encoded into reused buffers."""

INLINE_CPU_BYTES = 2 << 20
"""Batches up to this many bytes are encoded and verified on the event loop (about 0.3 ms
of hashing and copying); larger ones on a worker thread."""

INLINE_READ_BYTES = 256 << 10
"""Reads of up to this many block bytes are verified and decoded on the event loop (tens of
microseconds, a zstd block included); larger ones on a worker thread, so no get holds the
loop for more than about a millisecond whatever the values hold."""

ABSENT_TTL_S = 60.0
"""How long a key whose value was found bad is taken as absent by this node (lookups say
so, reads miss without a round trip) unless it stores the key again first."""

MAX_ABSENT = 65536
"""Keys taken as absent at most (the oldest are asked about again)."""


@dataclass(slots=True)
class RedisStats:
    """What a Redis tier's round trips did (each failure was a miss or a failed store)."""

    round_trips: int = 0
    timeouts: int = 0
    errors: int = 0
    fast_failures: int = 0
    """Calls refused by the open circuit breaker, without a round trip."""
    breaker_opened: int = 0
    problems: dict[str, int] = field(default_factory=dict)
    """Values not served, by `ValueProblem` (missing, foreign, damaged)."""


class CircuitBreaker:
    """Opens after `failures` failures in a row; while open, `allow()` is False until
    `cooldown_s` passed, then one trial is let through (half open)."""

    def __init__(self, failures: int, cooldown_s: float) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self._in_a_row = 0
        self._open_until: float | None = None
        self.opened = 0

    def allow(self) -> bool:
        if self._open_until is None:
            return True
        if time.monotonic() >= self._open_until:
            self._open_until = time.monotonic() + self.cooldown_s  # one trial per cooldown
            return True
        return False

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def success(self) -> None:
        self._in_a_row = 0
        self._open_until = None

    def failure(self) -> None:
        self._in_a_row += 1
        if self._in_a_row >= self.failures and self._open_until is None:
            self._open_until = time.monotonic() + self.cooldown_s
            self.opened += 1


class RedisStorage(KeyedStorage):
    """Blocks by key in Redis under `prefix`, verified on read (see the module doc)."""

    def __init__(
        self,
        client: Any,
        *,
        block_size: int,
        num_blocks: int,
        namespace: str,
        prefix: bytes,
        timeout_s: float,
        max_in_flight: int = 8,
        batch_keys: int = 32,
        ttl_s: int | None = None,
        codec: BlockCodec | None = None,
        breaker: CircuitBreaker | None = None,
        negative_ttl_s: float = 0.2,
        cluster: bool = False,
        description: str = "redis",
        auth: ValueAuth | None = None,
        where: str = "redis",
        secrets: Sequence[str] = (),
    ) -> None:
        self.client = client
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.batch_keys = batch_keys
        self.ttl_s = ttl_s
        self.cluster = cluster
        self._secrets = tuple(secret for secret in secrets if secret)
        """Strings never shown (the password): replaced wherever a message would quote them."""
        self.description = self._scrub(description)
        self.where = self._scrub(where)
        self.values = ValueCodec(namespace, block_size, codec or BlockCodec(), auth)
        self.breaker = breaker or CircuitBreaker(5, 2.0)
        self.stats = RedisStats()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._cache = ProbeCache(
            self._exists, on_answer=self._answered, negative_ttl_s=negative_ttl_s
        )
        self._closed = False
        self._spare: list[bytearray] = []
        """Value buffers of finished writes, reused by the next ones (at most the values of
        the round trips in flight are ever allocated)."""
        self._absent: OrderedDict[OffloadKey, float] = OrderedDict()
        """Keys whose values this node found bad, until when it takes them as absent
        (`forget`); oldest first."""

    @property
    def persistent(self) -> bool:
        return True  # outlives this process: every value is verified when read

    # -- round trips -------------------------------------------------------------------------

    async def _round_trip(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """One round trip under the deadline and the breaker; TierConnectionError (an
        OSError) when it fails, so callers turn it into misses or failed stores."""
        if self._closed:
            raise TierConnectionError(errno.ESHUTDOWN, f"{self.description} is closed")
        if not self.breaker.allow():
            self.stats.fast_failures += 1
            raise TierConnectionError(errno.ECONNREFUSED, f"{self.description}: breaker open")
        async with self._slots:
            self.stats.round_trips += 1
            try:  # asyncio.timeout: 3.11's wait_for can swallow the caller's cancellation
                async with asyncio.timeout(self.timeout_s):
                    result = await call()
            except TimeoutError:
                self.stats.timeouts += 1
                self._failed(what, "timed out")
                raise TierConnectionError(
                    errno.ETIMEDOUT, f"{self.description}: {what} timed out"
                ) from None
            except (RedisError, OSError) as error:
                self.stats.errors += 1
                self._failed(what, self._scrub(repr(error)))
                raise TierConnectionError(
                    errno.EIO, f"{self.description}: {what} failed: {self._scrub(str(error))}"
                ) from None
        self.breaker.success()
        return result

    def _failed(self, what: str, why: str) -> None:
        was_open = self.breaker.is_open
        self.breaker.failure()
        if self.breaker.is_open and not was_open:
            self.stats.breaker_opened += 1
            log.warning(
                "%s: %s %s; failing fast for %.1f s (every lookup a miss, every store failed)",
                self.description,
                what,
                why,
                self.breaker.cooldown_s,
            )

    def _take_buffer(self) -> bytearray:
        """A value buffer from the spare ones (reused: a fresh 2 MiB allocation costs more
        page faults than the copy into it), or a new one."""
        if self._spare:
            return self._spare.pop()
        return bytearray(self.values.max_value_bytes(255))

    async def _cpu(
        self, blocks: int, work: Callable[[], T], inline_bytes: int = INLINE_CPU_BYTES
    ) -> T:
        """Encoding or verifying `blocks` blocks: on the loop when that is brief (at most
        `inline_bytes` of blocks: a thread hop and the GIL hand-off cost more than a few
        hundred microseconds of hashing), on a worker thread when it is not, so the loop
        never stalls for long."""
        if blocks * self.block_size <= inline_bytes:
            return work()
        return await asyncio.to_thread(work)

    def _scrub(self, text: str) -> str:
        """`text` fit to log or raise: URL credentials hidden, and the password itself
        wherever it appears (a client error could quote what it was given)."""
        text = hide_userinfo(text)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _taken_absent(self, key: OffloadKey, now: float) -> bool:
        """Whether this node takes `key` as absent now (its value was found bad)."""
        until = self._absent.get(key)
        if until is None:
            return False
        if until > now:
            return True
        del self._absent[key]
        return False

    def _take_absent(self, key: OffloadKey) -> None:
        """Take `key` as absent for ABSENT_TTL_S (its value was found bad), so lookups do
        not learn it as present again and the next store of it rewrites it."""
        self._absent[key] = time.monotonic() + ABSENT_TTL_S
        self._absent.move_to_end(key)
        while len(self._absent) > MAX_ABSENT:
            self._absent.popitem(last=False)

    def _key(self, key: OffloadKey) -> bytes:
        return self.prefix + key

    def _batches(self, count: int) -> list[range]:
        """Pipelined round trips of at most `batch_keys` keys and about INLINE_CPU_BYTES of
        blocks (so each batch's encoding or verifying is brief, on the loop or a worker
        thread, while others are in flight)."""
        step = max(1, min(self.batch_keys, INLINE_CPU_BYTES // max(1, self.block_size)))
        return [range(i, min(count, i + step)) for i in range(0, count, step)]

    # -- BlockStorage ------------------------------------------------------------------------

    def probe(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        if not self._absent:
            return self._cache.probe(keys)
        now = time.monotonic()
        absent = [self._taken_absent(key, now) for key in keys]
        asked = iter(self._cache.probe([k for k, no in zip(keys, absent, strict=True) if not no]))
        return [False if no else next(asked) for no in absent]

    async def _exists(self, keys: list[OffloadKey]) -> list[bool]:
        async def query() -> list[bool]:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(self._key(key))
            return [bool(found) for found in await pipe.execute()]

        found = await self._round_trip("lookup", query)
        now = time.monotonic()  # a key found bad while the query ran stays absent
        return [
            there and not self._taken_absent(key, now)
            for key, there in zip(keys, found, strict=True)
        ]

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        check_block_buffers(buffers, self.block_size)
        results: list[OSError | None] = [None] * len(keys)

        async def write_batch(batch: range) -> None:
            # Each batch is encoded (header, checksum, zstd) off the loop while the others'
            # round trips are in flight.
            # Large values are built in reused buffers (a fresh multi-MiB allocation costs more
            # page faults than the copy); small ones are joined (cheaper than the slicing).
            scratch = (
                [self._take_buffer() for _ in batch]
                if self.block_size >= REUSE_BUFFER_BYTES
                else []
            )
            try:
                values: list[bytes] | list[memoryview] = await self._cpu(
                    len(batch),
                    lambda: (
                        [
                            self.values.encode_into(keys[i], buffers[i], out)
                            for i, out in zip(batch, scratch, strict=True)
                        ]
                        if scratch
                        else [self.values.encode(keys[i], buffers[i]) for i in batch]
                    ),
                )

                async def call() -> None:
                    pipe = self.client.pipeline(transaction=False)
                    for i, value in zip(batch, values, strict=True):
                        pipe.set(self._key(keys[i]), value, ex=self.ttl_s)
                    await pipe.execute()

                try:
                    await self._round_trip("store", call)
                except OSError as error:
                    for i in batch:
                        results[i] = error
            finally:
                self._spare.extend(scratch)

        await asyncio.gather(*(write_batch(batch) for batch in self._batches(len(keys))))
        for key, result in zip(keys, results, strict=True):
            if result is None:
                self._absent.pop(key, None)  # a value found bad is now overwritten
            self._cache.note(key, result is None)
        return results

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        """Each value is fetched with GETRANGE up to one byte past the largest value of a
        block: a longer one (planted, or another program's) is a miss counted as oversized
        without being downloaded, whatever its size. Batches of more than
        INLINE_READ_BYTES are verified and decoded on a worker thread. A key this node found
        bad (`forget`) is a miss without a round trip until it stores the key again."""
        results: list[ReadFailure | None] = [ReadFailure.IO_ERROR] * len(keys)
        now = time.monotonic()
        wanted: list[int] = []
        for i, key in enumerate(keys):
            if self._taken_absent(key, now):
                results[i] = ReadFailure.NOT_INDEXED
            else:
                wanted.append(i)

        async def read_batch(batch: list[int]) -> None:
            limits = [self.values.max_value_bytes(len(keys[i])) for i in batch]

            async def call() -> list[Any]:
                # Non-transactional: a cluster pipeline sends each node its keys' commands.
                pipe = self.client.pipeline(transaction=False)
                for i, limit in zip(batch, limits, strict=True):
                    pipe.getrange(self._key(keys[i]), 0, limit)  # at most limit + 1 bytes
                replies: list[Any] = await pipe.execute(raise_on_error=False)
                for reply in replies:
                    if isinstance(reply, Exception) and not _wrong_type(reply):
                        raise reply  # a node down, a refused command: the round trip failed
                return replies

            try:
                replies = await self._round_trip("load", call)
            except OSError:
                return  # every block of the batch stays an IO_ERROR: a miss
            todo: list[tuple[int, bytes | None]] = []
            for i, reply, limit in zip(batch, replies, limits, strict=True):
                if isinstance(reply, bytes) and len(reply) > limit:
                    results[i] = ReadFailure.NOT_INDEXED
                    self._count(ValueProblem.OVERSIZED, keys[i])
                elif isinstance(reply, bytes):
                    todo.append((i, reply or None))  # b"": no such key (or an empty value)
                else:  # WRONGTYPE: a list, a hash... where a value belongs
                    results[i] = ReadFailure.NOT_INDEXED
                    self._count(ValueProblem.FOREIGN, keys[i])
            decoded = await self._cpu(
                sum(value is not None for _, value in todo),
                lambda: [self.values.decode_into(keys[i], value, buffers[i]) for i, value in todo],
                INLINE_READ_BYTES,
            )
            for (i, _), (failure, problem) in zip(todo, decoded, strict=True):
                results[i] = failure
                if problem is not None:
                    self._count(problem, keys[i])

        batches = [[wanted[j] for j in batch] for batch in self._batches(len(wanted))]
        await asyncio.gather(*(read_batch(batch) for batch in batches))
        return results

    def _count(self, problem: ValueProblem, key: OffloadKey) -> None:
        """Count a value not served; one that is there but bad makes its key absent to
        this node (`_take_absent`), so a later store of the key rewrites it."""
        record_problem(self.stats.problems, problem, key, self.description)
        self._cache.note(key, False)
        if problem is not ValueProblem.MISSING:
            self._take_absent(key)

    def value_problems(self) -> dict[str, int]:
        """Values read and not served, by `ValueProblem` (see `BlockStorage`)."""
        return reported_problems(self.stats.problems)

    def unencrypted_served(self) -> int:
        """MAC-only values served by this `encrypt = true` tier (see `BlockStorage`)."""
        return self.values.unencrypted_served

    async def forget(self, keys: Sequence[OffloadKey]) -> None:
        """Keys whose values a read found bad. Never deleted from Redis: other nodes and
        tenants share it and kvtier cannot tell who wrote a value, so deleting what it cannot
        verify would let a forger (or a tenant with an overlapping key_prefix) make every
        node destroy good blocks. This node takes the keys as absent instead (lookups say
        so, reads miss) until it stores them again, which overwrites the value (SET), or
        ABSENT_TTL_S passed."""
        for key in keys:
            self._cache.forget(key)
            self._take_absent(key)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._cache.aclose()
        try:
            await self.client.aclose()
        except (RedisError, OSError) as error:
            log.debug("%s: closing the client: %r", self.description, error)

    def describe(self) -> str:
        """Where the values live, for `Hierarchy.tiers` (never with credentials)."""
        return self.where

    def __repr__(self) -> str:
        return f"RedisStorage({self.description}, prefix={self.prefix!r})"


def _wrong_type(reply: Exception) -> bool:
    """Whether a command failed because its key holds another type than a string (a key
    that is not a value of ours, not a failure of the round trip)."""
    return isinstance(reply, ResponseError) and str(reply).startswith("WRONGTYPE")


def key_prefix(namespace: str, configured: str | None = None) -> bytes:
    """`<configured or "kvtier:"><fingerprint of the namespace>:`: nodes of one namespace
    (model, block size, tenant) share keys, others never see them. A configured prefix is
    always followed by the fingerprint, so two tenants' prefixes never overlap."""
    return (configured or "kvtier:").encode() + namespace_fingerprint(namespace).encode() + b":"


async def open_redis_tier(config: RedisTierConfig, context: TierContext) -> RedisStorage:
    """The opener of `medium = "redis"`: connects and checks the server answers (a wrong
    password or an unreachable server is a TierConnectionError naming it)."""
    auth = auth_from_config(config, context.namespace)  # no client without the keys
    try:
        password = config.password()
    except ValueError as error:
        raise InvalidValueError(str(error)) from None
    timeout_s = config.timeout_ms / 1000
    common: dict[str, Any] = {
        "username": config.username,
        "password": password,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
    }
    if config.uses_tls:
        common["ssl_ca_certs"] = None if config.tls_ca_file is None else str(config.tls_ca_file)
        if config.tls_cert_file is not None and config.tls_key_file is not None:
            common["ssl_certfile"] = str(config.tls_cert_file)
            common["ssl_keyfile"] = str(config.tls_key_file)
        if config.cluster_nodes is not None:
            common["ssl"] = True
    client: Any
    if config.cluster_nodes is not None:
        nodes = [ClusterNode(*node.rsplit(":", 1)) for node in config.cluster_nodes]
        client = RedisCluster(startup_nodes=nodes, max_connections=config.max_connections, **common)
        where = f"redis cluster {','.join(config.cluster_nodes)}"
    else:
        assert config.url is not None  # the config model requires one of the two
        client = aioredis.Redis.from_url(
            config.url, max_connections=config.max_connections, **common
        )
        where = f"redis {hide_userinfo(config.url)}"  # the config refuses credentials too
    namespace = context.namespace
    storage = RedisStorage(
        client,
        block_size=context.block_size,
        num_blocks=config.num_blocks,
        namespace=namespace,
        prefix=key_prefix(namespace, config.key_prefix),
        timeout_s=timeout_s,
        max_in_flight=config.max_in_flight,
        batch_keys=config.batch_keys,
        ttl_s=config.ttl_s,
        codec=BlockCodec(config.compression, config.zstd_level),
        breaker=CircuitBreaker(config.breaker_failures, config.breaker_cooldown_s),
        negative_ttl_s=config.negative_ttl_ms / 1000,
        cluster=config.cluster_nodes is not None,
        description=f"tier {config.name!r} ({where})",
        auth=auth,
        where=where,
        secrets=() if password is None else (password,),
    )
    try:
        async with asyncio.timeout(max(timeout_s, 5.0)):
            await client.ping()
    except (AuthenticationError, ResponseError) as error:
        # A wrong password or user is the config's problem, not the network's: say so.
        await storage.aclose()
        raise TierConnectionError(
            errno.EACCES,
            f"tier {config.name!r}: {where} refused the login: {storage._scrub(str(error))}",
        ) from None
    except (RedisError, OSError, TimeoutError) as error:
        if "CERTIFICATE_VERIFY_FAILED" in str(error) or "certificate verify" in str(error):
            await storage.aclose()
            raise TierConnectionError(
                errno.EACCES,
                f"tier {config.name!r}: {where} has a TLS certificate this node does not "
                f"trust ({storage._scrub(str(error))}); set tls_ca_file to the CA that "
                "signed it",
            ) from None
        # Down for now: the tier starts anyway; its round trips fail fast and are retried
        # after each cooldown, so the tier comes back with the server.
        storage.breaker.failure()
        log.warning(
            "tier %r: %s does not answer yet (%s): its lookups are misses until it does",
            config.name,
            where,
            storage._scrub(repr(error)),
        )
    return storage
