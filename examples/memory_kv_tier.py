"""An example kvtier tier that owns its index: a shared key-value store, in memory.

It shows how a tier plugs into kvtier (see "Writing a tier" in the README): one module with

1. the store's client, a `KeyedStorage` (here over `MemoryKVServer`, a stand-in for a
   remote key-value service: many hierarchies, like many serving nodes, may share one
   server by name; it evicts least recently used blocks past its own capacity and answers
   after a configurable latency);
2. the tier's config table, a `BaseTierConfig` subclass with `medium = "memkv"`;
3. an opener, and one `register_tier` call.

Every value carries a header that binds the key, the namespace, the length and an xxh3
checksum, so a reader serves a block only if it is the block it asked for: a foreign, torn
or evicted value is a miss, never data.

Nothing else in kvtier changes for it. Use it from TOML after `import memory_kv_tier` (which
registers the medium), or, from an installed package, name `memory_kv_tier:KIND` in the
`kvtier.tiers` entry-point group, and kvtier registers it on first use:

    [[tiers]]
    name = "shared"
    medium = "memkv"
    capacity = 4096          # blocks kvtier keeps track of (the server has its own size)
    server = "fleet"         # hierarchies naming one server share its blocks
    server_capacity = 65536
    latency_ms = 0.5
"""

from __future__ import annotations

import asyncio
import struct
from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar, Literal

import numpy as np
import xxhash
from pydantic import Field

from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.tiers.keyed import KeyedStorage, ProbeCache
from kvtier.tiers.registry import (
    BaseTierConfig,
    TierAccess,
    TierContext,
    TierKind,
    register_tier,
)
from kvtier.tiers.storage import HostBuffer, ReadFailure

MEDIUM = "memkv"
_HEADER = struct.Struct("<16sQQH")  # namespace digest, payload length, xxh3, key length


class MemoryKVServer:
    """A key-value service in this process: bytes by key, least recently used evicted past
    `capacity` values, each call answered after `latency_s`."""

    _servers: ClassVar[dict[str, MemoryKVServer]] = {}

    def __init__(self, capacity: int, latency_s: float = 0.0) -> None:
        self.capacity = capacity
        self.latency_s = latency_s
        self._values: OrderedDict[bytes, bytes] = OrderedDict()
        self.calls = 0

    @classmethod
    def named(cls, name: str, capacity: int, latency_s: float) -> MemoryKVServer:
        """The server called `name`, created on first use (shared by every client)."""
        server = cls._servers.get(name)
        if server is None:
            server = cls._servers[name] = cls(capacity, latency_s)
        return server

    async def _round_trip(self) -> None:
        self.calls += 1
        await asyncio.sleep(self.latency_s)

    async def mset(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        await self._round_trip()
        for key, value in items:
            self._values[key] = value
            self._values.move_to_end(key)
        while len(self._values) > self.capacity:
            self._values.popitem(last=False)

    async def mget(self, keys: Sequence[bytes]) -> list[bytes | None]:
        await self._round_trip()
        found = []
        for key in keys:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            found.append(value)
        return found

    async def exists(self, keys: Sequence[bytes]) -> list[bool]:
        await self._round_trip()
        return [key in self._values for key in keys]

    async def delete(self, keys: Sequence[bytes]) -> None:
        await self._round_trip()
        for key in keys:
            self._values.pop(key, None)

    def raw(self) -> OrderedDict[bytes, bytes]:
        """The stored values, for tests that tamper with them."""
        return self._values


class MemoryKVStorage(KeyedStorage):
    """A client of a `MemoryKVServer`: blocks by key under `prefix`, verified on read."""

    def __init__(
        self, server: MemoryKVServer, *, block_size: int, num_blocks: int, namespace: str
    ) -> None:
        self.server = server
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._namespace = xxhash.xxh3_128_digest(namespace.encode())
        self.prefix = b"kvtier:" + self._namespace.hex().encode()[:16] + b":"
        self._cache = ProbeCache(self._exists, on_answer=self._answered)

    @property
    def persistent(self) -> bool:
        return False  # in memory; a real remote store would say True and verify as here

    def probe(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        return self._cache.probe(keys)

    async def _exists(self, keys: list[OffloadKey]) -> list[bool]:
        return await self.server.exists([self.prefix + key for key in keys])

    def _encode(self, key: OffloadKey, buffer: HostBuffer) -> bytes:
        payload = buffer.tobytes()
        checksum = xxhash.xxh3_64_intdigest(payload)
        header = _HEADER.pack(self._namespace, len(payload), checksum, len(key))
        return header + key + payload

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        for i, buffer in enumerate(buffers):
            if buffer.dtype != np.uint8 or buffer.shape != (self.block_size,):
                raise InvalidValueError(
                    f"buffers[{i}] must be a 1-D uint8 array of {self.block_size} bytes, "
                    f"got {buffer.dtype} {buffer.shape}"
                )
        items = [
            (self.prefix + key, self._encode(key, buffer))
            for key, buffer in zip(keys, buffers, strict=True)
        ]
        try:
            await self.server.mset(items)
        except OSError as error:
            return [error] * len(keys)
        for key in keys:
            self._cache.note(key, True)
        return [None] * len(keys)

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        values = await self.server.mget([self.prefix + key for key in keys])
        results: list[ReadFailure | None] = []
        for key, value, buffer in zip(keys, values, buffers, strict=True):
            failure = self._decode_into(key, value, buffer)
            if failure is not None:
                self._cache.note(key, False)
            results.append(failure)
        return results

    def _decode_into(
        self, key: OffloadKey, value: bytes | None, buffer: HostBuffer
    ) -> ReadFailure | None:
        if value is None:
            return ReadFailure.NOT_INDEXED  # evicted by the server, or never there
        if len(value) < _HEADER.size:
            return ReadFailure.SHORT_READ
        namespace, length, checksum, key_length = _HEADER.unpack_from(value)
        stored_key = value[_HEADER.size : _HEADER.size + key_length]
        payload = memoryview(value)[_HEADER.size + key_length :]
        if namespace != self._namespace or stored_key != key:
            return ReadFailure.NOT_INDEXED  # another namespace's or another key's value
        if length != self.block_size or len(payload) != length:
            return ReadFailure.SHORT_READ
        if xxhash.xxh3_64_intdigest(payload) != checksum:
            return ReadFailure.CHECKSUM
        buffer[:] = np.frombuffer(payload, dtype=np.uint8)
        return None

    async def forget(self, keys: Sequence[OffloadKey]) -> None:
        for key in keys:
            self._cache.forget(key)
        await self.server.delete([self.prefix + key for key in keys])

    async def aclose(self) -> None:
        await self._cache.aclose()

    def __repr__(self) -> str:
        return f"MemoryKVStorage({len(self.server.raw())} values on the server)"


class MemoryKVTierConfig(BaseTierConfig):
    """The `[[tiers]]` table of a memkv tier."""

    medium: Literal["memkv"]
    server: str = "default"
    """Name of the in-process server: hierarchies naming the same one share its blocks."""
    server_capacity: int = Field(default=65536, ge=1)
    """Values the server keeps before it evicts its least recently used ones."""
    latency_ms: float = Field(default=0.0, ge=0.0, le=10_000.0)
    """Delay of every round trip to the server."""


async def open_tier(config: MemoryKVTierConfig, context: TierContext) -> MemoryKVStorage:
    """The opener the registry calls for a `medium = "memkv"` tier."""
    server = MemoryKVServer.named(config.server, config.server_capacity, config.latency_ms / 1000)
    return MemoryKVStorage(
        server,
        block_size=context.block_size,
        num_blocks=config.num_blocks,
        namespace=f"{context.model_id}/{context.block_size}",
    )


KIND = TierKind(
    medium=MEDIUM,
    config_class=MemoryKVTierConfig,
    volatile=True,
    owns_index=True,
    access=TierAccess.CLIENT,
    auto_enable=False,
    opener=f"{__name__}:open_tier",
)
register_tier(KIND, replace=True)
