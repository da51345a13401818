"""`StorageTests`: the contract of a `BlockStorage`, as a pytest mixin.

Like zarr's `StoreTests`: a storage (a torch pool, the disk store, ...) subclasses it and
implements `make_storage` and two backdoor hooks that bypass the API, so that `write` is
checked by reading the medium behind its back and `read` by planting bytes behind its back;
a bug shared by `write` and `read` (say, both using the wrong offset) cannot hide.

The engine does not always call `write` and `read`: it moves blocks with
`kvtier.engine.moves.move`, which copies a pool's tensor directly (a `TorchPool` is never
asked to `read`/`write` in production) and hands other storages zero-copy row views. The
"engine's route" tests certify that path too, for every storage.

The suite is about `BlockStorage` only; checks that only a persistent or a particular storage
can pass (restart, checksums, faults) belong in that storage's own tests. It needs
pytest-asyncio (kvtier runs it with `asyncio_mode = "auto"`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import pytest_asyncio

from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.tiers.storage import BlockStorage, HostBuffer, ReadFailure


def k(i: int) -> OffloadKey:
    """The key of block `i`."""
    return key_from_int(i)


def make_blocks(count: int, block_size: int, seed: int) -> list[HostBuffer]:
    """`count` blocks, alternately random bytes (incompressible) and low-entropy runs
    (compressible, like real KV pages with structure), so that a compressing storage takes
    both of its paths."""
    rng = np.random.default_rng(seed)
    blocks = []
    for i in range(count):
        if i % 2 == 0:
            block = rng.integers(0, 256, block_size, dtype=np.uint8)
        else:
            values = rng.integers(0, 4, -(-block_size // 64), dtype=np.uint8)
            block = np.repeat(values, 64)[:block_size].copy()
        blocks.append(block)
    return blocks


def empty_buffers(count: int, block_size: int, fill: int = 0) -> list[HostBuffer]:
    """`count` fresh block buffers, filled with `fill`."""
    return [np.full(block_size, fill, dtype=np.uint8) for _ in range(count)]


class StorageTests:
    """Subclass and implement `make_storage`, `backdoor_read` and `backdoor_write`; every
    test then runs against that storage. `block_size` and `num_blocks` may be overridden."""

    block_size: ClassVar[int] = 4096
    num_blocks: ClassVar[int] = 16

    def make_storage(self, num_blocks: int, block_size: int, tmp_path: Path) -> BlockStorage:
        """A new, empty storage (its files, if any, under `tmp_path`)."""
        raise NotImplementedError

    def backdoor_read(self, storage: BlockStorage, slot: int) -> bytes:
        """The block stored in `slot`, read without `storage.read` (decoded, if the storage
        encodes blocks)."""
        raise NotImplementedError

    def backdoor_write(
        self, storage: BlockStorage, key: OffloadKey, slot: int, data: bytes
    ) -> None:
        """Store `data` as block `key` in `slot` without `storage.write`, so that a later
        `read([key], [slot], ...)` returns it (a volatile storage ignores `key`)."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[BlockStorage]:
        storage = self.make_storage(self.num_blocks, self.block_size, tmp_path)
        try:
            yield storage
        finally:
            await storage.aclose()

    # ---------------------------------------------------------------------------------------
    # Helpers
    # ---------------------------------------------------------------------------------------

    async def write_ok(
        self, storage: BlockStorage, ids: list[int], slots: list[int], blocks: list[HostBuffer]
    ) -> None:
        results = await storage.write([k(i) for i in ids], slots, blocks)
        assert results == [None] * len(ids), (
            f"results: got {results!r}, expected {[None] * len(ids)!r}"
        )

    async def read_back(
        self, storage: BlockStorage, ids: list[int], slots: list[int]
    ) -> list[HostBuffer]:
        buffers = empty_buffers(len(ids), self.block_size, fill=0x5A)
        results = await storage.read([k(i) for i in ids], slots, buffers)
        assert results == [None] * len(ids), (
            f"results: got {results!r}, expected {[None] * len(ids)!r}"
        )
        return buffers

    # ---------------------------------------------------------------------------------------
    # The engine's route: `move` between a caller's tensor, a host pool and this storage
    # ---------------------------------------------------------------------------------------

    async def test_the_engines_route_in_and_out_is_bit_exact(self, storage: BlockStorage) -> None:
        import torch

        from kvtier.engine.moves import MoveResult, move
        from kvtier.tiers.pool.storage import TorchPool
        from kvtier.tiers.tensor_copy import TensorCopier

        count = min(5, storage.num_blocks)
        blocks = make_blocks(count, self.block_size, seed=23)
        keys = [k(i) for i in range(count)]
        slots = np.arange(storage.num_blocks - 1, storage.num_blocks - 1 - count, -1)
        source = torch.from_numpy(np.stack(blocks))
        copier = TensorCopier()
        stored = await move(copier, keys, source, np.arange(count), storage, slots, self.block_size)
        assert stored == MoveResult(), f"stored: got {stored!r}, expected {MoveResult()!r}"
        for block, slot in zip(blocks, slots, strict=True):
            assert self.backdoor_read(storage, int(slot)) == block.tobytes()
        # Promotion into a host pool's rows (the chain's upper tier).
        pool = TorchPool(count + 2, self.block_size)
        rows = np.arange(2, count + 2)
        loaded = await move(copier, keys, storage, slots, pool, rows, self.block_size)
        assert loaded == MoveResult(), f"loaded: got {loaded!r}, expected {MoveResult()!r}"
        assert torch.equal(pool.tensor[2:], source)
        # And into a caller's tensor that has no row views (a strided one): through staging.
        wide = torch.zeros((count, 2 * self.block_size), dtype=torch.uint8)
        strided = wide[:, ::2]
        loaded = await move(
            copier,
            keys[::-1],
            storage,
            slots[::-1].copy(),
            strided,
            np.arange(count),
            self.block_size,
        )
        assert loaded == MoveResult(), f"loaded: got {loaded!r}, expected {MoveResult()!r}"
        assert torch.equal(strided, source.flip(0))
        assert not wide[:, 1::2].any()  # nothing written between the rows

    async def test_the_engines_route_reports_what_did_not_arrive(
        self, storage: BlockStorage
    ) -> None:
        """A persistent storage's unindexed block is a per-key failure of `move`, never bytes;
        a volatile one serves whatever its slot holds (the bookkeeping guards it)."""
        if not storage.persistent:
            pytest.skip("a volatile storage has no index to miss")
        import torch

        from kvtier.engine.moves import move
        from kvtier.tiers.tensor_copy import TensorCopier

        blocks = make_blocks(2, self.block_size, seed=29)
        await self.write_ok(storage, [1], [0], blocks[:1])
        target = torch.full((2, self.block_size), 0x77, dtype=torch.uint8)
        result = await move(
            TensorCopier(),
            [k(1), k(2)],
            storage,
            np.array([0, 1]),
            target,
            np.arange(2),
            self.block_size,
        )
        assert result.failed == {k(2)} and result.corrupt == {k(2)}
        assert target[0].numpy().tobytes() == blocks[0].tobytes()

    # ---------------------------------------------------------------------------------------
    # Shape
    # ---------------------------------------------------------------------------------------

    async def test_geometry_and_flags(self, storage: BlockStorage) -> None:
        assert storage.num_blocks == self.num_blocks, (
            f"storage.num_blocks: got {storage.num_blocks!r}, expected {self.num_blocks!r}"
        )
        assert storage.block_size == self.block_size, (
            f"storage.block_size: got {storage.block_size!r}, expected {self.block_size!r}"
        )
        assert isinstance(storage.persistent, bool)
        assert storage.restore() == []

    async def test_empty_batches_return_empty_lists(self, storage: BlockStorage) -> None:
        assert await storage.write([], [], []) == []
        assert await storage.read([], [], []) == []
        await storage.forget([])

    # ---------------------------------------------------------------------------------------
    # Bytes, checked through the backdoors
    # ---------------------------------------------------------------------------------------

    async def test_write_is_seen_by_the_backdoor(self, storage: BlockStorage) -> None:
        blocks = make_blocks(4, self.block_size, seed=1)
        slots = [3, 0, self.num_blocks - 1, 7]
        await self.write_ok(storage, [10, 11, 12, 13], slots, blocks)
        for slot, block in zip(slots, blocks, strict=True):
            assert self.backdoor_read(storage, slot) == block.tobytes()

    async def test_read_returns_what_the_backdoor_planted(self, storage: BlockStorage) -> None:
        blocks = make_blocks(3, self.block_size, seed=2)
        slots = [5, 1, 2]
        for i, slot, block in zip([20, 21, 22], slots, blocks, strict=True):
            self.backdoor_write(storage, k(i), slot, block.tobytes())
        buffers = await self.read_back(storage, [20, 21, 22], slots)
        for buffer, block in zip(buffers, blocks, strict=True):
            assert np.array_equal(buffer, block)

    async def test_round_trip_is_bit_exact_for_every_slot(self, storage: BlockStorage) -> None:
        n = self.num_blocks
        blocks = make_blocks(n, self.block_size, seed=3)
        await self.write_ok(storage, list(range(n)), list(range(n)), blocks)
        order = list(range(n))[::-1]
        buffers = await self.read_back(storage, order, order)
        for buffer, i in zip(buffers, order, strict=True):
            assert np.array_equal(buffer, blocks[i]), f"slot {i} differs"

    async def test_batches_with_non_contiguous_unordered_slots(self, storage: BlockStorage) -> None:
        n = self.num_blocks
        slots = [n - 1, 2, 3, 4, n // 2 + 1, 0, n // 2]  # runs, gaps, out of order
        ids = [100 + slot for slot in slots]
        blocks = make_blocks(len(slots), self.block_size, seed=4)
        await self.write_ok(storage, ids, slots, blocks)
        # Read back in another grouping and order than written.
        picks = [4, 0, 6, 2]
        buffers = await self.read_back(storage, [ids[p] for p in picks], [slots[p] for p in picks])
        for buffer, p in zip(buffers, picks, strict=True):
            assert np.array_equal(buffer, blocks[p])
        for slot, block in zip(slots, blocks, strict=True):
            assert self.backdoor_read(storage, slot) == block.tobytes()

    async def test_overwrite_replaces_the_slot(self, storage: BlockStorage) -> None:
        first, second = make_blocks(2, self.block_size, seed=5)
        await self.write_ok(storage, [1], [6], [first])
        await self.write_ok(storage, [2], [6], [second])
        assert self.backdoor_read(storage, 6) == second.tobytes()
        (buffer,) = await self.read_back(storage, [2], [6])
        assert np.array_equal(buffer, second)

    async def test_writes_leave_source_buffers_and_other_slots_alone(
        self, storage: BlockStorage
    ) -> None:
        blocks = make_blocks(3, self.block_size, seed=6)
        await self.write_ok(storage, [1, 2, 3], [4, 5, 6], blocks)
        copies = [block.copy() for block in blocks]
        changed = make_blocks(1, self.block_size, seed=7)
        await self.write_ok(storage, [9], [5], changed)
        for block, copy in zip(blocks, copies, strict=True):
            assert np.array_equal(block, copy)
        assert self.backdoor_read(storage, 4) == blocks[0].tobytes()
        assert self.backdoor_read(storage, 6) == blocks[2].tobytes()

    async def test_rows_of_one_pool_array_as_buffers(self, storage: BlockStorage) -> None:
        """Host pools hand out rows of one 2-D array; a read must fill exactly its rows."""
        count = 4
        source = np.stack(make_blocks(count, self.block_size, seed=8))
        slots = [8, 9, 10, 12]
        await self.write_ok(storage, [1, 2, 3, 4], slots, list(source))
        pool = np.full((count + 2, self.block_size), 0xEE, dtype=np.uint8)
        results = await storage.read([k(i) for i in [1, 2, 3, 4]], slots, list(pool[1:-1]))
        assert results == [None] * count, f"results: got {results!r}, expected {[None] * count!r}"
        assert np.array_equal(pool[1:-1], source)
        assert (pool[0] == 0xEE).all() and (pool[-1] == 0xEE).all(), "wrote outside its rows"

    async def test_unaligned_buffers_work(self, storage: BlockStorage) -> None:
        """Buffers need not start on any particular address (O_DIRECT stores stage them)."""
        backing = np.zeros(2 * self.block_size + 8, dtype=np.uint8)
        source = backing[1 : 1 + self.block_size]
        source[:] = make_blocks(1, self.block_size, seed=9)[0]
        await self.write_ok(storage, [1], [3], [source])
        target = np.full(2 * self.block_size + 8, 0x11, dtype=np.uint8)
        results = await storage.read([k(1)], [3], [target[3 : 3 + self.block_size]])
        assert results == [None], f"results: got {results!r}, expected {[None]!r}"
        assert np.array_equal(target[3 : 3 + self.block_size], source)
        assert (target[:3] == 0x11).all() and (target[3 + self.block_size :] == 0x11).all()

    async def test_concurrent_batches(self, storage: BlockStorage) -> None:
        n = self.num_blocks
        blocks = make_blocks(n, self.block_size, seed=10)
        groups = [list(range(start, n, 4)) for start in range(4)]
        writes = [
            storage.write([k(s) for s in group], group, [blocks[s] for s in group])
            for group in groups
        ]
        for written in await asyncio.gather(*writes):
            assert all(result is None for result in written)
        buffers = {slot: np.zeros(self.block_size, dtype=np.uint8) for slot in range(n)}
        reads = [
            storage.read([k(s) for s in group], group, [buffers[s] for s in group])
            for group in groups
        ]
        for read in await asyncio.gather(*reads):
            assert all(result is None for result in read)
        for slot in range(n):
            assert np.array_equal(buffers[slot], blocks[slot])

    async def test_random_workload_matches_a_model(self, storage: BlockStorage) -> None:
        """Many batches of random slots (overwriting as they go), checked against a dict."""
        rng = np.random.default_rng(11)
        model: dict[int, tuple[int, bytes]] = {}  # slot -> (block id, bytes)
        next_id = 0
        for _ in range(12):
            size = int(rng.integers(1, self.num_blocks + 1))
            slots = [int(slot) for slot in rng.choice(self.num_blocks, size, replace=False)]
            ids = list(range(next_id, next_id + size))
            next_id += size
            blocks = make_blocks(size, self.block_size, seed=int(rng.integers(1 << 30)))
            await self.write_ok(storage, ids, slots, blocks)
            for slot, i, block in zip(slots, ids, blocks, strict=True):
                model[slot] = (i, block.tobytes())
        slots = sorted(model)
        buffers = await self.read_back(storage, [model[slot][0] for slot in slots], slots)
        for slot, buffer in zip(slots, buffers, strict=True):
            assert buffer.tobytes() == model[slot][1]
            assert self.backdoor_read(storage, slot) == model[slot][1]

    # ---------------------------------------------------------------------------------------
    # Contract violations raise; nothing is written
    # ---------------------------------------------------------------------------------------

    def bad_buffer(self, kind: str) -> object:
        """A buffer that breaks the `HostBuffer` contract in the way `kind` names."""
        size = self.block_size
        return {
            "short": np.zeros(size - 1, dtype=np.uint8),
            "long": np.zeros(size + 1, dtype=np.uint8),
            "2d": np.zeros((2, size // 2), dtype=np.uint8),
            "dtype": np.zeros(size // 4, dtype=np.float32),
            "strided": np.zeros(2 * size, dtype=np.uint8)[::2],
            "not-array": bytearray(size),
        }[kind]

    @pytest.mark.parametrize("kind", ["short", "long", "2d", "dtype", "strided", "not-array"])
    async def test_bad_buffer_is_a_clear_error(self, storage: BlockStorage, kind: str) -> None:
        """A buffer that is not one contiguous 1-D uint8 block of `block_size` bytes (the
        `HostBuffer` contract) raises InvalidValueError, and the batch writes nothing."""
        good = make_blocks(2, self.block_size, seed=12)
        await self.write_ok(storage, [1], [2], [good[0]])
        wrong = self.bad_buffer(kind)
        with pytest.raises(InvalidValueError):
            await storage.write([k(9), k(8)], [2, 3], [good[1], wrong])  # type: ignore[list-item]
        assert self.backdoor_read(storage, 2) == good[0].tobytes(), "a rejected batch wrote"
        target = np.zeros(self.block_size, np.uint8)
        with pytest.raises(InvalidValueError):
            await storage.read([k(1), k(8)], [2, 3], [target, wrong])  # type: ignore[list-item]

    async def test_read_into_a_read_only_buffer_is_an_error(self, storage: BlockStorage) -> None:
        buffer = np.zeros(self.block_size, dtype=np.uint8)
        buffer.flags.writeable = False
        with pytest.raises(InvalidValueError):
            await storage.read([k(1)], [0], [buffer])

    @pytest.mark.parametrize("where", ["negative", "past-the-end"])
    async def test_slot_out_of_range_is_a_clear_error(
        self, storage: BlockStorage, where: str
    ) -> None:
        slot = -1 if where == "negative" else self.num_blocks
        block = make_blocks(1, self.block_size, seed=13)[0]
        with pytest.raises(InvalidValueError):
            await storage.write([k(1)], [slot], [block])
        with pytest.raises(InvalidValueError):
            await storage.read([k(1)], [slot], [block])

    async def test_mismatched_lengths_are_a_clear_error(self, storage: BlockStorage) -> None:
        blocks = make_blocks(2, self.block_size, seed=14)
        with pytest.raises(InvalidValueError):
            await storage.write([k(1), k(2)], [0], blocks)
        with pytest.raises(InvalidValueError):
            await storage.read([k(1)], [0, 1], blocks)
        with pytest.raises(InvalidValueError):
            await storage.write([k(1)], [0, 1], blocks)

    # ---------------------------------------------------------------------------------------
    # Keys (a persistent storage must serve a block only under the key it was stored as)
    # ---------------------------------------------------------------------------------------

    async def test_persistent_storage_serves_only_indexed_keys(self, storage: BlockStorage) -> None:
        if not storage.persistent:
            pytest.skip("a volatile storage does not know keys")
        block = make_blocks(1, self.block_size, seed=15)[0]
        await self.write_ok(storage, [1], [4], [block])
        buffers = empty_buffers(3, self.block_size)
        results = await storage.read([k(2), k(1), k(3)], [4, 5, 6], buffers)
        assert results == [ReadFailure.NOT_INDEXED] * 3, (
            f"results: got {results!r}, expected {[ReadFailure.NOT_INDEXED] * 3!r}"
        )
        await self.write_ok(storage, [7], [4], [block])  # slot 4 now holds block 7
        assert await storage.read([k(1)], [4], buffers[:1]) == [ReadFailure.NOT_INDEXED]

    async def test_forget(self, storage: BlockStorage) -> None:
        blocks = make_blocks(2, self.block_size, seed=16)
        await self.write_ok(storage, [1, 2], [0, 1], blocks)
        await storage.forget([k(1), k(99)])
        buffers = empty_buffers(2, self.block_size)
        results = await storage.read([k(1), k(2)], [0, 1], buffers)
        if storage.persistent:
            assert results == [ReadFailure.NOT_INDEXED, None]
        else:
            assert results[1] is None
        assert np.array_equal(buffers[1], blocks[1])

    # ---------------------------------------------------------------------------------------
    # Closing
    # ---------------------------------------------------------------------------------------

    async def test_aclose_is_idempotent(self, storage: BlockStorage) -> None:
        await storage.aclose()
        await storage.aclose()
