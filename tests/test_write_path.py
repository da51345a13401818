"""The serving-grade write path: a put never waits for a lower tier's disk write, the top
tier keeps a reserve of free slots, write-through never refuses a put while the chain has
room, and a clean close keeps what the chain holds."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from hierarchy_helpers import blocks_of, chain_config, content, key

from kvtier import Hierarchy, SyncHierarchy
from kvtier.manager import make_tier_manager
from kvtier.manager.planner import reserve_slots
from kvtier.manager.tiered import TieredManager
from kvtier.tiers.disk.io import FileIO, IOBuffer


def keys_(*ids: int) -> list[bytes]:
    return [key(i) for i in ids]


class GatedIO(FileIO):
    """Slab writes wait until `gate` is set (reads and everything else go through)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.a_write_waits = threading.Event()

    def pwritev(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> int:
        if not self.gate.is_set():
            self.a_write_waits.set()
            self.gate.wait(30)
        return super().pwritev(fd, buffers, offset)


def settled(h: Hierarchy) -> None:
    """No pin, pending block or draining slot anywhere; the bookkeeping checks out."""
    for tier in h.stats().tiers:
        assert (tier.pending, tier.pinned, tier.draining) == (0, 0, 0), tier
    h.check()


async def test_a_put_returns_while_its_victims_disk_write_is_blocked(tmp_path: Path) -> None:
    io = GatedIO()
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=64)
    async with Hierarchy.from_config(config, disk_options={"io": io}) as h:
        first, second = keys_(*range(4)), keys_(*range(4, 8))
        # Closed before the first put: `first` may already be demoted in the background
        # (the top tier's reserve) as soon as it is stored; that write blocks too.
        io.gate.clear()
        assert await h.put(first, blocks_of(first)) == 4
        # The CPU tier is full: this put evicts `first`. Its disk write blocks, the put not.
        assert await asyncio.wait_for(h.put(second, blocks_of(second)), 5) == 4
        assert [h.where(k) for k in first] == ["disk"] * 4  # on their way (pending there)
        assert h.stats().calls.put_stored == 8
        # Not on disk until durable, but its snapshot on the way there serves a get at
        # once (loads first), with the block's own bytes.
        out = await asyncio.wait_for(h.get(first[:1], timeout_s=0.2), 5)
        assert torch.equal(out.cpu(), blocks_of(first[:1]))
        assert h.where(first[0]) == "disk"
        # The write lane reaches the closed gate in its own time (on a busy machine, after
        # all of the above): wait for it, so the write is known to have been held back.
        assert await asyncio.to_thread(io.a_write_waits.wait, 30)
        io.gate.set()
        await h.drain()
        out = await h.get(first)
        assert torch.equal(out.cpu(), blocks_of(first))
        await h.drain()
        settled(h)


def test_reserve_slots_from_watermarks() -> None:
    assert reserve_slots(100, (0.90, 0.95)) == (5, 10)
    assert reserve_slots(8, (0.95, 0.98)) == (1, 1)  # a small tier still keeps one free
    assert reserve_slots(8192, (0.95, 0.98)) == (164, 410)
    assert reserve_slots(100, (0.5, 1.0)) == (0, 0)  # high = 1: no reserve


def test_the_manager_refills_a_reserve_in_the_background() -> None:
    tiers = [
        make_tier_manager(20, 16, "cpu", "lru", name="cpu"),
        make_tier_manager(100, 16, "disk", "lru", name="disk"),
    ]
    manager = TieredManager(tiers, watermarks=[(0.5, 0.9), (0.5, 0.9)])
    keys = keys_(*range(19))
    out = manager.prepare_store(keys)
    assert out is not None and out.demotion is None  # room: no eviction on the store path
    manager.complete_store(out.keys_to_store)
    # 19 of 20 used: fuller than 90 %, so the next store plans a refill down to 50 %.
    out = manager.prepare_store(keys_(100))
    assert out is not None and out.demotion is None
    manager.complete_store(out.keys_to_store)
    jobs = manager.take_jobs()
    assert len(jobs) == 1 and jobs[0].background and jobs[0].drain
    top = manager.top.stats()
    assert top.draining == 10 and top.free == 0  # evicted, slots not free until read
    manager.release_sources(jobs[0])
    assert manager.top.stats().free == 10
    manager.complete_job(jobs[0])
    assert [manager.locate(k) for k in keys[:10]] == [(1, True)] * 10  # the LRU ten, below
    manager.check()


@pytest.mark.slow
async def test_write_through_stores_every_block_of_a_sequential_loop(tmp_path: Path) -> None:
    """A CPU tier of 16 blocks over a disk: 2,000 single-block puts, all stored (cascades
    never pin the top tier past a memory copy)."""
    config = chain_config(tmp_path, gpu=None, cpu=16, disk=4096, write_policy="write-through")
    async with Hierarchy.from_config(config) as h:
        stored = 0
        for i in range(2000):
            stored += await h.put(keys_(i), blocks_of(keys_(i)))
        assert stored == 2000
        await h.drain()
        stats = h.stats()
        assert stats.calls.put_refused == 0
        assert sum(tier.used for tier in stats.tiers) == 2000
        sample = keys_(0, 999, 1999)
        for k in sample:
            assert torch.equal((await h.get([k]))[0].cpu(), content(k))
        await h.drain()
        settled(h)


@pytest.mark.slow
async def test_write_through_with_128_concurrent_writers_refuses_nothing(tmp_path: Path) -> None:
    """128 writers into a 16-block top tier: every put waits for room as long as it takes
    (`store_timeout_s=None`), so every block is stored however loaded the machine is (with a
    bound, a put on a busy machine may give up and refuse: see the next test)."""
    config = chain_config(tmp_path, gpu=None, cpu=16, disk=4096, write_policy="write-through")
    async with Hierarchy.from_config(config, store_timeout_s=None) as h:
        counts: list[int] = []

        async def writer(first: int) -> None:
            for i in range(first, 1000, 128):
                counts.append(await h.put(keys_(i), blocks_of(keys_(i))))

        await asyncio.gather(*(writer(w) for w in range(128)))
        await h.drain()
        assert sum(counts) == 1000
        assert h.stats().calls.put_refused == 0
        assert h.stats().calls.put_store_timeouts == 0
        ks = keys_(*range(1000))
        assert all(h.where(k) is not None for k in ks)  # every block is held by some tier
        cpu, disk = h.stats().tiers
        # Each block is in one tier, or in both when its write-through copy reached the disk
        # before the CPU tier evicted it (which of the cascades ran and which were dropped
        # over the backlog limit depends on timing; either way nothing is missing).
        assert cpu.used <= 16
        assert 1000 <= cpu.used + disk.used <= 1000 + cpu.used
        for k in ks[::97]:
            assert torch.equal((await h.get([k]))[0].cpu(), content(k))
        await h.drain()
        settled(h)


async def test_a_put_waits_for_room_until_store_timeout_not_get_deadline(tmp_path: Path) -> None:
    """A put's wait for room has its own bound: with the disk's writes stuck and a one-block
    staging arena, demotions cannot give slots back; a put waits past `get`'s deadline
    (here 0 s), gives up at `store_timeout_s`, and that is counted. Nothing is lost or wrong
    once the disk moves again."""
    io = GatedIO()
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=512)
    async with Hierarchy.from_config(
        config,
        disk_options={"io": io},
        staging_bytes=1,  # the arena's floor: 64 blocks
        load_timeout_s=0.01,
        store_timeout_s=0.5,
    ) as h:
        first = keys_(*range(8))
        assert await h.put(first, blocks_of(first)) == 8
        io.gate.clear()

        async def open_the_gate_once_a_wait_expired() -> None:
            # Past its wait, the put evicts, and its victims' snapshot needs the full arena:
            # the disk must move again for that put to return.
            while not h.stats().calls.put_store_timeouts:
                await asyncio.sleep(0.01)
            io.gate.set()

        opener = asyncio.create_task(open_the_gate_once_a_wait_expired())
        stored = 0
        for i in range(8, 200):
            stored += await h.put(keys_(i), blocks_of(keys_(i)))
            if h.stats().calls.put_store_timeouts:
                break
        await opener
        calls = h.stats().calls
        assert calls.put_store_timeouts == 1
        assert calls.put_backpressure_waits >= 1
        assert stored + calls.put_refused + calls.put_failed == i - 7
        await h.drain()
        for k in keys_(*range(i + 1)):
            if h.where(k) is not None:
                assert torch.equal((await h.get([k], timeout_s=60))[0].cpu(), content(k))
        await h.drain()
        settled(h)


async def test_a_clean_close_keeps_what_the_chain_holds_by_default(tmp_path: Path) -> None:
    """The default: a chain with a persistent tier flushes on close; 256 blocks put into a
    write-back chain whose CPU tier holds them all are all found after a reopen."""
    config = chain_config(tmp_path, gpu=None, cpu=512, disk=4096)
    ks = keys_(*range(256))
    async with Hierarchy.from_config(config) as h:
        assert h.flush_on_close is True
        assert await h.put(ks, blocks_of(ks)) == 256
        assert all(h.where(k) == "cpu" for k in ks)
    async with Hierarchy.from_config(config) as h:
        assert [h.where(k) for k in ks] == ["disk"] * 256
        out = await h.get(ks)
        assert torch.equal(out.cpu(), blocks_of(ks))
        assert h.last_flush is None
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=None)) as h:
        assert h.flush_on_close is False  # nothing persistent to flush to


def test_sync_hierarchy_flush(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=64, disk=256)
    ks = keys_(*range(10))
    with SyncHierarchy(config, flush_on_close=False) as h:
        assert h.put(ks, blocks_of(ks)) == 10
        assert h.where(ks[0]) == "cpu"
        assert h.flush() == 10
    with SyncHierarchy(config) as h:
        assert [h.where(k) for k in ks] == ["disk"] * 10


async def test_a_flush_over_its_budget_reports_what_is_left(tmp_path: Path) -> None:
    io = GatedIO()
    config = chain_config(tmp_path, gpu=None, cpu=64, disk=256)
    ks = keys_(*range(8))
    async with Hierarchy.from_config(config, disk_options={"io": io}, flush_on_close=False) as h:
        await h.put(ks, blocks_of(ks))
        io.gate.clear()
        copied = await h.flush(timeout_s=0.2)
        assert copied == 0
        assert h.last_flush is not None and h.last_flush.left == 8
        io.gate.set()
        await h.drain()
        assert [h.where(k) for k in ks] == ["cpu"] * 8  # still at the top, and now below too
        assert all(h.manager.tiers[1].lookup(k) is True for k in ks)
        settled(h)


async def test_default_get_deadline_is_finite(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=None)) as h:
        assert h.load_timeout_s is not None and 0 < h.load_timeout_s <= 10
