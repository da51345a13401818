"""`KeyedStorageTests`: the contract of a `KeyedStorage` (a tier that owns its index), as a
pytest mixin.

A keyed storage is addressed by key: the `slots` it is given are bookkeeping handles it must
ignore. Like `StorageTests`, a subclass implements `make_storage` and backdoor hooks that go
around the API, here to play the store's own part: evicting a value (`backdoor_delete`),
damaging one (`backdoor_damage`) or moving one under another key (`backdoor_move`). Every
read of a value that is gone, damaged or not the key's own must be a miss (a `ReadFailure`),
never data; `probe` never blocks and, once asked, learns the truth.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest_asyncio

from kvtier.keys import OffloadKey, key_from_int
from kvtier.testing.storage import empty_buffers, make_blocks
from kvtier.tiers.keyed import KeyedStorage
from kvtier.tiers.storage import HostBuffer, ReadFailure


def k(i: int) -> OffloadKey:
    return key_from_int(i)


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
        assert results == [None] * len(ids)
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
        assert storage.block_size == self.block_size

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
            assert results == [None] * len(buffers)
            assert [b.tobytes() for b in buffers] == [w.tobytes() for w in written]

    async def test_rows_of_one_array_as_buffers(self, storage: KeyedStorage) -> None:
        pool = np.zeros((4, self.block_size), dtype=np.uint8)
        pool[:] = np.arange(4, dtype=np.uint8)[:, None]
        assert await storage.write([k(i) for i in range(50, 54)], [0, 1, 2, 3], list(pool)) == [
            None
        ] * 4
        out = np.zeros_like(pool)
        assert await storage.read([k(i) for i in range(50, 54)], [3, 2, 1, 0], list(out)) == [
            None
        ] * 4
        assert np.array_equal(out, pool)

    async def test_aclose_is_idempotent(self, storage: KeyedStorage) -> None:
        await storage.aclose()
        await storage.aclose()
