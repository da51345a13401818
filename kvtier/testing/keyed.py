"""`KeyedStorageTests`: the contract of a `KeyedStorage` (a tier that owns its index), as a
pytest mixin.

A keyed storage is addressed by key: the `slots` it is given are bookkeeping handles it must
ignore. Like `StorageTests`, a subclass implements `make_storage` and backdoor hooks that go
around the API, here to play the store's own part: evicting a value (`backdoor_delete`),
damaging one (`backdoor_damage`) or moving one under another key (`backdoor_move`). Every
read of a value that is gone, damaged or not the key's own must be a miss (a `ReadFailure`),
never data; `probe` never blocks and, once asked, learns the truth.

A store that others can write (`shared = True`: Redis, a shared directory) is also attacked
through `backdoor_put_raw` / `backdoor_get_raw` and `open_shared` (another node's storage of
the same store, with a namespace and keys of the test's choosing): values forged without the
key (today's unkeyed and version-1 frames, frames MAC'd or encrypted with a wrong key, a
valid value with a header field changed), valid values copied to another key, namespace or
tenant, truncated values, zstd bombs (sealed with the right key: what a key holder gone rogue
could write) and oversized values must each be a miss: never data, never an exception, never
a large allocation. Two tenants' keys derived from one fleet key never read each other's
values, and a key rotation keeps the previous key's values readable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import struct
import tracemalloc
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import pytest_asyncio
import xxhash
import zstandard

from kvtier.errors import ConfigError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.namespaces import block_namespace
from kvtier.testing.storage import empty_buffers, make_blocks
from kvtier.tiers.codec import BlockCodec, Codec
from kvtier.tiers.keyed import KeyedStorage
from kvtier.tiers.shared.auth import (
    NamespaceKey,
    ValueAuth,
    ValueKey,
    derive_tenant_key,
)
from kvtier.tiers.shared.value import HEADER_BYTES, ValueCodec
from kvtier.tiers.storage import HostBuffer, ReadFailure

AUTH_KEY_ENV = "KVTIER_TEST_AUTH_KEY"
"""The environment variable a test chain of a shared tier names in `auth_key_env` (set it to
`fixed_key_hex()`)."""


def fixed_key_hex(seed: int = 0) -> str:
    """A test key (hex, 32 bytes), the same in every process for one `seed`: never a real
    key."""
    return hashlib.sha256(b"kvtier test key %d" % seed).hexdigest()


def fixed_key(seed: int = 0) -> ValueKey:
    return ValueKey(bytes.fromhex(fixed_key_hex(seed)), f"test key {seed}")


def keyed_auth(
    namespace: str, seed: int = 0, *, previous: Sequence[int] = (), encrypt: bool = False
) -> ValueAuth:
    """The keys of a shared tier's test storage: test key `seed`, and the test keys
    `previous` still read."""
    return ValueAuth.for_namespace(
        namespace, fixed_key(seed), [fixed_key(i) for i in previous], encrypt=encrypt
    )


def k(i: int) -> OffloadKey:
    return key_from_int(i)


def v1_value(namespace: str, key: bytes, block: bytes) -> bytes:
    """A raw block in the value format before authentication (version 1: an xxh3 checksum
    seeded by public data), which anyone who can write the store can make for any key."""
    prefix = struct.pack(
        "<4sBBH16sQQ",
        b"KVTR",
        1,
        0,
        len(key),
        xxhash.xxh3_128_digest(namespace.encode()),
        len(block),
        len(block),
    )
    checksum = xxhash.xxh3_64_intdigest(block, seed=xxhash.xxh3_64_intdigest(prefix + key))
    return prefix + struct.pack("<Q", checksum) + key + block


def forgeries(values: ValueCodec, key: OffloadKey, block: HostBuffer) -> dict[str, bytes]:
    """Values of `block` under `key` made without the key of `values`: from public data
    only, with a wrong key, or with a wrong key behind the real key's (public) id."""
    namespace = values.namespace_name
    size = values.block_size
    wrong = fixed_key(99)
    made = {
        "version 1 (unkeyed) frame": v1_value(namespace, key, block.tobytes()),
        "unkeyed frame": ValueCodec(namespace, size, BlockCodec()).encode(key, block),
        "wrong key": ValueCodec(
            namespace, size, BlockCodec(), ValueAuth.for_namespace(namespace, wrong)
        ).encode(key, block),
        "wrong key, zstd": ValueCodec(
            namespace, size, BlockCodec("zstd"), ValueAuth.for_namespace(namespace, wrong)
        ).encode(key, block),
    }
    if values.auth is not None:
        real_id = values.auth.current.key_id
        impostor = NamespaceKey(
            real_id, wrong.derive(b"mac", namespace), wrong.derive(b"aes-256-gcm", namespace)
        )
        made["wrong key under the real key id"] = ValueCodec(
            namespace, size, BlockCodec(), ValueAuth(impostor, {real_id: impostor})
        ).encode(key, block)
        with contextlib.suppress(ConfigError):  # no cryptography: nothing to forge with
            made["wrong key under the real key id, encrypted"] = ValueCodec(
                namespace,
                size,
                BlockCodec(),
                ValueAuth(impostor, {real_id: impostor}, encrypt=True),
            ).encode(key, block)
    return made


def tampered(value: bytes, key_length: int) -> dict[str, bytes]:
    """A valid value with one field changed each: version, codec, flags (an authenticated
    value passed off as unkeyed), key length, key id, namespace, lengths, nonce, tag, key and
    stored bytes. Each must fail its tag (or a check before it)."""
    offsets = {
        "version": 4,
        "codec": 5,
        "flags": 6,
        "key length": 8,
        "key id": 12,
        "namespace": 20,
        "block length": 36,
        "stored length": 44,
        "nonce": 52,
        "tag": 64,
        "key": HEADER_BYTES + key_length - 1,
        "stored bytes": len(value) - 1,
        "first stored byte": HEADER_BYTES + key_length,
    }
    out = {}
    for name, offset in offsets.items():
        changed = bytearray(value)
        changed[offset] ^= 0x01
        out[name] = bytes(changed)
    unkeyed = bytearray(value)
    unkeyed[6:8] = b"\0\0"
    out["flags cleared"] = bytes(unkeyed)
    return out


@functools.lru_cache(maxsize=4)
def zstd_bomb(content_bytes: int, declared: bool) -> bytes:
    """A zstd frame of `content_bytes` zero bytes (a few KiB for 64 MiB), declaring its size
    in its header or not; made in 1 MiB pieces, so making it allocates little."""
    params = zstandard.ZstdCompressionParameters.from_level(
        1, write_content_size=1 if declared else 0
    )
    compressor = zstandard.ZstdCompressor(compression_params=params)
    chunk = bytes(1 << 20)
    out = compressor.compressobj(size=content_bytes) if declared else compressor.compressobj()
    parts = [out.compress(chunk) for _ in range(content_bytes // len(chunk))]
    parts.append(out.flush())
    return b"".join(parts)


class KeyedStorageTests:
    """Subclass and implement `make_storage` and the three backdoors."""

    block_size: ClassVar[int] = 4096
    num_blocks: ClassVar[int] = 64
    probe_timeout_s: ClassVar[float] = 5.0

    def make_storage(self, num_blocks: int, block_size: int, tmp_path: Path) -> KeyedStorage:
        raise NotImplementedError

    def backdoor_delete(self, storage: KeyedStorage, key: OffloadKey) -> None:
        """The store drops `key`'s value (its own eviction)."""
        raise NotImplementedError

    def backdoor_damage(self, storage: KeyedStorage, key: OffloadKey) -> None:
        """Flip a byte of `key`'s stored value (its payload, not only its header)."""
        raise NotImplementedError

    def backdoor_move(self, storage: KeyedStorage, src: OffloadKey, dst: OffloadKey) -> None:
        """Store `src`'s value, unchanged, as the value of `dst`."""
        raise NotImplementedError

    # -- a store others write (shared = True) ----------------------------------------------

    shared: ClassVar[bool] = False
    """True for a store other parties can write (a shared tier): the attacks below run, with
    the three hooks that follow."""
    bomb_bytes: ClassVar[int] = 64 << 20
    """What the zstd bombs expand to; a read must never allocate this much."""
    allocation_bound: ClassVar[int] = 16 << 20
    """The most a read of one hostile value may allocate (traced by tracemalloc)."""

    def shared_namespace(self, tenant: str = "") -> str:
        """The namespace the storage of `make_storage` is opened for (another tenant's with
        `tenant`)."""
        return block_namespace("conformance-model", self.block_size, tenant)

    def open_shared(self, tmp_path: Path, namespace: str, auth: ValueAuth | None) -> KeyedStorage:
        """Another node's storage over the same store as `make_storage`'s (same tmp_path),
        opened for `namespace` with `auth` (its keys); a shared store's `make_storage` is
        `open_shared(tmp_path, shared_namespace(), keyed_auth(shared_namespace()))`."""
        raise NotImplementedError

    def backdoor_get_raw(self, storage: KeyedStorage, key: OffloadKey) -> bytes | None:
        """The bytes the store holds as `key`'s value (None: none)."""
        raise NotImplementedError

    def backdoor_put_raw(self, storage: KeyedStorage, key: OffloadKey, value: bytes) -> None:
        """Make `value` the bytes the store holds as `key`'s value, as anyone who can write
        the store can."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[KeyedStorage]:
        storage = self.make_storage(self.num_blocks, self.block_size, tmp_path)
        try:
            yield storage
        finally:
            await storage.aclose()

    async def write_ok(self, storage: KeyedStorage, ids: list[int], seed: int) -> list[HostBuffer]:
        blocks = make_blocks(len(ids), self.block_size, seed)
        # Handles chosen to collide and to differ from the keys: a keyed store ignores them.
        results = await storage.write([k(i) for i in ids], [0] * len(ids), blocks)
        assert results == [None] * len(ids), (
            f"results: got {results!r}, expected {[None] * len(ids)!r}"
        )
        return blocks

    async def read(
        self, storage: KeyedStorage, ids: list[int]
    ) -> tuple[list[ReadFailure | None], list[HostBuffer]]:
        buffers = empty_buffers(len(ids), self.block_size, fill=0xAB)
        results = await storage.read([k(i) for i in ids], list(range(len(ids))), buffers)
        return results, buffers

    async def probe_until_known(self, storage: KeyedStorage, key: OffloadKey) -> bool:
        """Ask until the store has answered (the listener is not needed for that)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.probe_timeout_s
        while True:
            answer = storage.probe([key])[0]
            if answer is not None:
                return answer
            if loop.time() > deadline:
                raise AssertionError(f"probe of {key!r} never answered")
            await asyncio.sleep(0.001)

    # ---------------------------------------------------------------------------------------

    async def test_volatility_is_declared(self, storage: KeyedStorage) -> None:
        assert isinstance(storage.persistent, bool)
        assert storage.block_size == self.block_size, (
            f"storage.block_size: got {storage.block_size!r}, expected {self.block_size!r}"
        )

    async def test_empty_batches(self, storage: KeyedStorage) -> None:
        assert await storage.write([], [], []) == []
        assert await storage.read([], [], []) == []

    async def test_round_trip_by_key_whatever_the_handles(self, storage: KeyedStorage) -> None:
        blocks = await self.write_ok(storage, [1, 2, 3], seed=1)
        results, buffers = await self.read(storage, [3, 1, 2])
        assert results == [None, None, None]
        for got, want in zip(buffers, [blocks[2], blocks[0], blocks[1]], strict=True):
            assert got.tobytes() == want.tobytes()

    async def test_overwrite_replaces_the_value(self, storage: KeyedStorage) -> None:
        await self.write_ok(storage, [5], seed=2)
        second = await self.write_ok(storage, [5], seed=3)
        results, buffers = await self.read(storage, [5])
        assert results == [None] and buffers[0].tobytes() == second[0].tobytes()

    async def test_a_key_never_written_is_a_miss(self, storage: KeyedStorage) -> None:
        results, _ = await self.read(storage, [404])
        assert results[0] is not None

    async def test_a_value_the_store_evicted_is_a_miss(self, storage: KeyedStorage) -> None:
        await self.write_ok(storage, [7, 8], seed=4)
        self.backdoor_delete(storage, k(7))
        results, _ = await self.read(storage, [7, 8])
        assert results[0] is not None and results[1] is None

    async def test_a_damaged_value_is_a_miss(self, storage: KeyedStorage) -> None:
        await self.write_ok(storage, [9], seed=5)
        self.backdoor_damage(storage, k(9))
        results, _ = await self.read(storage, [9])
        assert results[0] is not None

    async def test_another_keys_value_is_never_served(self, storage: KeyedStorage) -> None:
        await self.write_ok(storage, [10, 11], seed=6)
        self.backdoor_move(storage, k(10), k(11))
        results, _ = await self.read(storage, [11, 10])
        assert results[0] is not None and results[1] is None

    async def test_probe_learns_what_the_store_holds(self, storage: KeyedStorage) -> None:
        await self.write_ok(storage, [20], seed=7)
        assert await self.probe_until_known(storage, k(20)) is True
        assert await self.probe_until_known(storage, k(21)) is False

    async def test_probe_never_blocks(self, storage: KeyedStorage) -> None:
        answers = storage.probe([k(i) for i in range(100, 164)])
        assert all(answer in (None, False, True) for answer in answers)

    async def test_forget_makes_it_a_miss(self, storage: KeyedStorage) -> None:
        await self.write_ok(storage, [30], seed=8)
        await storage.forget([k(30)])
        results, _ = await self.read(storage, [30])
        assert results[0] is not None
        assert await self.probe_until_known(storage, k(30)) is False

    async def test_concurrent_batches(self, storage: KeyedStorage) -> None:
        ids = [list(range(40 + 4 * j, 44 + 4 * j)) for j in range(6)]
        writes = (self.write_ok(storage, batch, seed=j) for j, batch in enumerate(ids))
        blocks = await asyncio.gather(*writes)
        reads = await asyncio.gather(*(self.read(storage, b) for b in ids))
        for written, (results, buffers) in zip(blocks, reads, strict=True):
            assert results == [None] * len(buffers), (
                f"results: got {results!r}, expected {[None] * len(buffers)!r}"
            )
            assert [b.tobytes() for b in buffers] == [w.tobytes() for w in written]

    async def test_rows_of_one_array_as_buffers(self, storage: KeyedStorage) -> None:
        pool = np.zeros((4, self.block_size), dtype=np.uint8)
        pool[:] = np.arange(4, dtype=np.uint8)[:, None]
        assert (
            await storage.write([k(i) for i in range(50, 54)], [0, 1, 2, 3], list(pool))
            == [None] * 4
        )
        out = np.zeros_like(pool)
        assert (
            await storage.read([k(i) for i in range(50, 54)], [3, 2, 1, 0], list(out)) == [None] * 4
        )
        assert np.array_equal(out, pool)

    async def test_aclose_is_idempotent(self, storage: KeyedStorage) -> None:
        await storage.aclose()
        await storage.aclose()

    # -- attacks on a store others write ---------------------------------------------------

    def _values(self, storage: KeyedStorage) -> ValueCodec:
        if not self.shared:
            pytest.skip("not a store others write (shared = False)")
        values = getattr(storage, "values", None)
        if not isinstance(values, ValueCodec):
            pytest.skip("the store's values are not ValueCodec values")
        return values

    async def _is_a_miss(
        self,
        storage: KeyedStorage,
        key: OffloadKey,
        value: bytes,
        what: str,
        never: HostBuffer | None = None,
    ) -> None:
        """`value` planted as `key`'s: its read is a miss, the buffer holds no block of
        `never`, and the read allocates less than `allocation_bound`."""
        self.backdoor_put_raw(storage, key, value)
        buffers = empty_buffers(1, self.block_size, fill=0xAB)
        tracemalloc.start()
        try:
            results = await storage.read([key], [0], buffers)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert results[0] is not None, f"{what}: served as data"
        if never is not None:
            assert buffers[0].tobytes() != never.tobytes(), f"{what}: its bytes were served"
        assert peak < self.allocation_bound, f"{what}: the read allocated {peak} bytes"

    async def test_values_forged_without_the_key_are_misses(self, storage: KeyedStorage) -> None:
        values = self._values(storage)
        assert values.auth is not None, "a shared store's conformance storage needs keys"
        evil = make_blocks(1, self.block_size, seed=66)[0]
        for i, what in enumerate(forgeries(values, k(700), evil)):
            value = forgeries(values, k(700 + i), evil)[what]  # each made for its own key
            await self._is_a_miss(storage, k(700 + i), value, what, never=evil)
        problems = getattr(getattr(storage, "stats", None), "problems", None)
        if isinstance(problems, dict):
            assert problems.get("forged", 0) >= 4, problems

    async def test_a_valid_value_with_a_field_changed_is_a_miss(
        self, storage: KeyedStorage
    ) -> None:
        self._values(storage)
        # Each change on a key of its own, read once: a store may take a key whose value it
        # found bad as absent for a while, which would make a second read prove nothing.
        ids = list(range(720, 721 + len(tampered(b"\0" * 200, 1))))
        await self.write_ok(storage, ids, seed=67)
        results, _ = await self.read(storage, ids[:1])
        assert results == [None]  # as written, a value is served: only the changes fail
        for i in ids[1:]:
            value = self.backdoor_get_raw(storage, k(i))
            assert value is not None
            what, changed = list(tampered(value, len(k(i))).items())[i - ids[1]]
            await self._is_a_miss(storage, k(i), changed, f"changed {what}")

    async def test_a_truncated_value_is_a_miss(self, storage: KeyedStorage) -> None:
        self._values(storage)
        value_bytes = HEADER_BYTES + len(k(740)) + self.block_size
        cuts = [0, 3, 5, HEADER_BYTES - 1, HEADER_BYTES + 2, value_bytes // 2, value_bytes - 1]
        ids = list(range(740, 740 + len(cuts)))
        await self.write_ok(storage, ids, seed=68)
        for i, cut in zip(ids, cuts, strict=True):
            value = self.backdoor_get_raw(storage, k(i))
            assert value is not None
            await self._is_a_miss(storage, k(i), value[:cut], f"cut at {cut}")

    async def test_a_value_copied_to_another_namespace_or_tenant_is_a_miss(
        self, storage: KeyedStorage, tmp_path: Path
    ) -> None:
        self._values(storage)
        blocks = await self.write_ok(storage, [760], seed=69)
        value = self.backdoor_get_raw(storage, k(760))
        assert value is not None
        for other in (
            block_namespace("another-model", self.block_size),
            self.shared_namespace(tenant="another-tenant"),
        ):
            peer = self.open_shared(tmp_path, other, keyed_auth(other))  # the same key
            try:
                await self._is_a_miss(peer, k(760), value, f"copied to {other}", blocks[0])
            finally:
                await peer.aclose()

    async def test_tenants_never_read_or_forge_each_others_values(
        self, storage: KeyedStorage, tmp_path: Path
    ) -> None:
        self._values(storage)
        fleet = fixed_key(7)
        auths = {}
        for tenant in ("a", "b"):
            namespace = self.shared_namespace(tenant)
            tenant_key = ValueKey(derive_tenant_key(fleet, tenant), f"tenant {tenant}")
            auths[tenant] = (namespace, tenant_key)
        a = self.open_shared(tmp_path, auths["a"][0], ValueAuth.for_namespace(*auths["a"]))
        b = self.open_shared(tmp_path, auths["b"][0], ValueAuth.for_namespace(*auths["b"]))
        try:
            blocks = await self.write_ok(a, [780], seed=70)
            value = self.backdoor_get_raw(a, k(780))
            assert value is not None
            await self._is_a_miss(b, k(780), value, "tenant a's value read by b", blocks[0])
            # b's nodes hold b's key only: what they make for a's namespace is forged there.
            evil = make_blocks(1, self.block_size, seed=71)[0]
            forged = ValueCodec(
                auths["a"][0],
                self.block_size,
                BlockCodec(),
                ValueAuth.for_namespace(auths["a"][0], auths["b"][1]),
            ).encode(k(781), evil)
            await self._is_a_miss(a, k(781), forged, "made by tenant b for a", evil)
            results, buffers = await self.read(a, [780])
            assert results == [None] and buffers[0].tobytes() == blocks[0].tobytes()
        finally:
            await a.aclose()
            await b.aclose()

    async def test_a_rotated_key_still_reads_the_previous_keys_values(
        self, storage: KeyedStorage, tmp_path: Path
    ) -> None:
        self._values(storage)
        namespace = self.shared_namespace()
        old = self.open_shared(tmp_path, namespace, keyed_auth(namespace, 0))
        rotated = self.open_shared(tmp_path, namespace, keyed_auth(namespace, 1, previous=[0]))
        dropped = self.open_shared(tmp_path, namespace, keyed_auth(namespace, 1))
        try:
            before = await self.write_ok(old, [800], seed=72)
            results, buffers = await self.read(rotated, [800])
            assert results == [None] and buffers[0].tobytes() == before[0].tobytes()
            await self.write_ok(rotated, [801], seed=73)
            value = self.backdoor_get_raw(rotated, k(801))
            assert value is not None and value[12:20] == fixed_key(1).key_id
            assert (await self.read(old, [801]))[0] != [None]  # old key only: not its key
            assert (await self.read(dropped, [800]))[0] != [None]  # previous key dropped
        finally:
            for node in (old, rotated, dropped):
                await node.aclose()

    async def test_zstd_bombs_are_refused_without_a_large_allocation(
        self, storage: KeyedStorage
    ) -> None:
        values = self._values(storage)
        for i, declared in enumerate((True, False)):
            bomb = zstd_bomb(self.bomb_bytes, declared)
            assert len(bomb) < self.block_size, "the bomb must fit a block to reach zstd"
            head, stored = values.seal_parts(k(820 + i), Codec.ZSTD, bomb, self.block_size)
            what = f"zstd bomb ({'declared' if declared else 'undeclared'} size)"
            await self._is_a_miss(storage, k(820 + i), head + bytes(stored), what)

    async def test_oversized_values_are_misses(self, storage: KeyedStorage) -> None:
        values = self._values(storage)
        size = self.block_size
        big = make_blocks(1, 4 * size, seed=74)[0]
        cases = {
            # Sealed with the right key: lengths are checked, not only tags.
            "stored bytes of four blocks": values.seal_parts(k(840), Codec.NONE, big.data, size),
            "a block length of four blocks": values.seal_parts(
                k(841), Codec.NONE, big.data, 4 * size
            ),
        }
        for i, (what, (head, stored)) in enumerate(cases.items()):
            await self._is_a_miss(storage, k(840 + i), head + bytes(stored), what)
        junk = b"KVTR\x02" + bytes(4 << 20)
        await self._is_a_miss(storage, k(842), junk, "4 MiB of junk")
