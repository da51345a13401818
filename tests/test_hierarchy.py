"""The data path end to end: tier spill, promotion, concurrency, faults, deadlines, restarts."""

from __future__ import annotations

import asyncio
import errno
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, chain_config, content, key

from kvtier import Hierarchy, SyncHierarchy
from kvtier.errors import InvalidValueError, KeyFormatError, ManagerClosedError
from kvtier.tiers.disk import DiskStore, FaultyIO
from kvtier.tiers.storage import BlockStorage

ROOT = Path(__file__).resolve().parent.parent


def keys_(*ids: int) -> list[bytes]:
    return [key(i) for i in ids]


def verify_all(h: Hierarchy) -> None:
    """No tier exceeds its capacity, nothing is left pinned or pending, bookkeeping checks."""
    h.check()
    for stats in h.stats().tiers:
        assert stats.used <= stats.num_blocks
        assert stats.pinned == 0, stats
        assert stats.pending == 0, stats


async def test_put_get_round_trip_on_the_top_tier(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        keys = keys_(1, 2, 3)
        assert await h.put(keys, blocks_of(keys)) == 3
        assert h.lookup(keys) == 3
        assert [h.where(k) for k in keys] == ["gpu"] * 3
        out = await h.get(keys)
        assert out.dtype == torch.uint8 and out.shape == (3, BLOCK)
        assert torch.equal(out.cpu(), blocks_of(keys))
        verify_all(h)


async def test_gpu_tier_without_cuda_says_it_runs_on_cpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the fallback is not taken")
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        top = h.tiers[0]
        assert top.medium == "gpu" and "fallback" in top.where and "cpu" in top.where
        assert "fallback" in repr(h)


async def test_spill_follows_each_tier_policy_and_reads_back_bit_exact(tmp_path: Path) -> None:
    """GPU 4, CPU 8, disk 32 blocks, LRU: after 44 puts the newest 4 are at the top, the next
    8 in the CPU tier, the oldest 32 on disk; every block still held reads back bit-exact."""
    async with Hierarchy.from_config(chain_config(tmp_path, reserve=False)) as h:
        all_keys = keys_(*range(44))
        for i in range(44):
            assert await h.put([all_keys[i]], blocks_of([all_keys[i]])) == 1
            for stats in h.stats().tiers:
                assert stats.used <= stats.num_blocks
        where = [h.where(k) for k in all_keys]
        assert where == ["disk"] * 32 + ["cpu"] * 8 + ["gpu"] * 4
        assert h.stats().chain.dropped_at_bottom == 0
        # One more: the oldest block leaves the bottom tier.
        await h.put(keys_(44), blocks_of(keys_(44)))
        assert h.where(all_keys[0]) is None
        assert h.stats().chain.dropped_at_bottom == 1
        # Reading a disk block promotes it, which (every tier being full) makes the disk drop
        # its oldest block; every block still held when it is read comes back bit-exact.
        served = 0
        for k in reversed(all_keys[1:]):
            held = h.where(k) is not None
            out = await h.get([k])
            assert len(out) == int(held), k
            if held:
                assert torch.equal(out[0].cpu(), content(k)), k
                served += 1
        assert served >= 12
        await h.drain()
        verify_all(h)


async def test_promotion_moves_a_hit_up_through_every_tier(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        ks = keys_(*range(20))
        for i in range(0, 20, 2):
            await h.put(ks[i : i + 2], blocks_of(ks[i : i + 2]))
        await h.drain()  # on disk (not its snapshot on the way there: a get reads that)
        assert h.where(ks[0]) == "disk"
        out = await h.get([ks[0]])
        assert torch.equal(out[0].cpu(), content(ks[0]))
        assert h.where(ks[0]) == "gpu"
        # Inclusive on the way up: the CPU tier got a copy too, the disk keeps its own.
        assert h.manager.tiers[1].lookup(ks[0]) is True
        assert h.manager.tiers[2].lookup(ks[0]) is True
        stats = h.stats()
        assert stats.chain.promotions == 1 and stats.pairs[("disk", "cpu")][0] >= 1
        await h.drain()
        verify_all(h)


async def test_lookup_counts_leading_keys_held_anywhere(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        ks = keys_(*range(12))
        for i in range(12):
            await h.put([ks[i]], blocks_of([ks[i]]))
        assert h.lookup(ks) == 12
        assert h.lookup([*ks[:5], key(99), *ks[5:]]) == 5
        assert h.lookup([]) == 0


async def test_get_stops_at_the_first_missing_block(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        ks = keys_(1, 2, 3)
        await h.put(ks, blocks_of(ks))
        out = await h.get([key(1), key(2), key(77), key(3)])
        assert out.shape[0] == 2
        assert torch.equal(out.cpu(), blocks_of(keys_(1, 2)))
        assert (await h.get([key(77)])).shape == (0, BLOCK)


async def test_put_skips_blocks_already_held(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        ks = keys_(*range(6))
        await h.put(ks, blocks_of(ks))
        assert h.where(ks[0]) == "cpu"
        assert await h.put(ks[:2], blocks_of(ks[:2])) == 0
        assert h.stats().calls.put_present == 2


async def test_a_partial_last_block_is_never_stored(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        ks = keys_(*range(5))
        assert await h.put(ks, blocks_of(ks), partial_last=True) == 4
        assert h.lookup(ks) == 4 and h.where(ks[4]) is None
        calls = h.stats().calls
        assert (calls.put_partial, calls.put_stored, calls.put_refused) == (1, 4, 0)
        # Flagged again while already held: nothing to skip, nothing counted.
        assert await h.put(ks[:4], blocks_of(ks[:4]), partial_last=True) == 0
        assert h.stats().calls.put_partial == 1
        # The same block as a full one (a longer prompt) is stored.
        assert await h.put(ks, blocks_of(ks)) == 1
        await h.drain()
        verify_all(h)
        with pytest.raises(InvalidValueError, match="partial_last must be a bool"):
            await h.put(ks, blocks_of(ks), partial_last=1)  # type: ignore[arg-type]


async def test_events_report_each_tier(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=2, cpu=2, disk=2, reserve=False)
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(7))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()  # a put returns before its victims' disk writes are done
        events = h.take_events()
        stored = {(e.tier, k) for e in events if not e.removed for k in e.keys}
        removed = {(e.tier, k) for e in events if e.removed for k in e.keys}
        assert ("gpu", ks[6]) in stored and ("disk", ks[0]) in stored
        assert ("disk", ks[0]) in removed  # dropped at the bottom
        assert h.take_events() == []


async def test_write_through_cascades_every_store_down(tmp_path: Path) -> None:
    config = chain_config(tmp_path, write_policy="write-through")
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(3))
        await h.put(ks, blocks_of(ks))
        await h.drain()
        for tier in h.manager.tiers:
            assert all(tier.lookup(k) is True for k in ks), tier.name
        # Evicting from the top is now free: no demotion job runs for these.
        before = h.stats().jobs["demote"]
        more = keys_(*range(10, 14))
        await h.put(more, blocks_of(more))
        assert h.stats().jobs["demote"] == before
        assert h.where(ks[0]) == "cpu"
        out = await h.get(ks)
        assert torch.equal(out.cpu(), blocks_of(ks))
        await h.drain()
        verify_all(h)


async def test_cascades_over_the_backlog_are_dropped_not_stalling(tmp_path: Path) -> None:
    config = chain_config(tmp_path, write_policy="write-through")
    async with Hierarchy.from_config(config, max_pending_cascades=0) as h:
        ks = keys_(1, 2)
        assert await h.put(ks, blocks_of(ks)) == 2
        await h.drain()
        stats = h.stats()
        assert stats.cascades_dropped >= 2
        assert h.where(ks[0]) == "gpu" and h.manager.tiers[1].lookup(ks[0]) is False
        verify_all(h)


@pytest.mark.slow
async def test_concurrent_puts_and_gets_on_overlapping_keys(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=8, cpu=16, disk=64)) as h:
        baseline = [s.free for s in h.stats().tiers]
        rng = np.random.default_rng(7)

        async def worker(n: int) -> int:
            checked = 0
            for _ in range(6):
                ids = sorted(set(rng.integers(0, 48, 3).tolist()))
                ks = keys_(*ids)
                await h.put(ks, blocks_of(ks))
                out = await h.get(ks)
                for k, row in zip(ks, out, strict=False):
                    assert torch.equal(row.cpu(), content(k))
                    checked += 1
            return checked

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(worker(n)) for n in range(64)]
        assert sum(t.result() for t in tasks) > 0
        await h.drain()
        verify_all(h)
        # Nothing leaked: every slot is free or holds a ready, unpinned block.
        for stats, free in zip(h.stats().tiers, baseline, strict=True):
            assert stats.free + stats.evictable == free


async def test_concurrent_gets_of_one_block_share_one_promotion(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        ks = keys_(*range(20))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()  # on disk, not on its way there (a get would read its staged copy)
        assert h.where(ks[0]) == "disk"
        results = await asyncio.gather(*(h.get([ks[0]]) for _ in range(64)))
        for out in results:
            assert torch.equal(out[0].cpu(), content(ks[0]))
        await h.drain()  # the promotion's victims may still be on their way to the disk
        stats = h.stats()
        assert stats.chain.promotions == 1
        assert stats.jobs["promote"] == 1
        # Each get is one lookup: a hit of the disk for the get that started the promotion
        # and for those that joined it (served by it), of the top for any that came later.
        chain = stats.chain
        assert chain.lookups == 64
        assert chain.misses == 0
        assert sum(chain.hits) == 64
        assert chain.hits[-1] >= 1
        assert [tier.hits for tier in stats.activity] == chain.hits
        verify_all(h)


# -- faults ----------------------------------------------------------------------------------


def disk_slot(h: Hierarchy, k: bytes) -> int:
    block = h.manager.tiers[-1].policy.get(k)
    assert block is not None
    return block.block_id


async def test_flipped_bytes_on_disk_are_a_miss_and_the_block_is_dropped(tmp_path: Path) -> None:
    # The per-block store's slab files (the log layout's rotten bytes: test_disk_log.py).
    config = chain_config(tmp_path, gpu=None, cpu=2, disk=8, reserve=False, layout="slots")
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(6))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()  # ks[0]'s demotion is written behind the put: let it land first
        assert h.where(ks[0]) == "disk"
        disk = h.storages[-1]
        assert isinstance(disk, DiskStore)
        path, offset = disk.slot_location(disk_slot(h, ks[0]))
        with open(path, "r+b") as f:
            f.seek(offset + 100)
            byte = f.read(1)
            f.seek(offset + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        out = await h.get([ks[0], ks[1]])
        assert out.shape[0] == 0  # a miss, never the corrupt bytes
        await h.drain()
        assert h.where(ks[0]) is None
        stats = h.stats()
        assert stats.corrupt_blocks == 1 and stats.chain.corrupt_dropped == 1
        removed = [k for e in h.take_events() if e.removed and e.tier == "disk" for k in e.keys]
        assert ks[0] in removed
        # The other blocks are unaffected.
        out = await h.get([ks[1]])
        assert torch.equal(out[0].cpu(), content(ks[1]))
        await h.drain()
        verify_all(h)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
async def test_a_failed_disk_write_fails_that_store_only(tmp_path: Path, code: int) -> None:
    io = FaultyIO()
    config = chain_config(tmp_path, gpu=None, cpu=2, disk=8)
    async with Hierarchy.from_config(config, disk_options={"io": io}) as h:
        ks = keys_(*range(8))
        await h.put(ks[:2], blocks_of(ks[:2]))
        fault = io.inject("pwritev", code, times=1)
        await h.put(ks[2:3], blocks_of(ks[2:3]))  # demotes ks[0] to disk: that write fails
        await h.drain()  # the put returned once ks[0] was snapshotted; the write runs behind
        assert fault.fired == 1
        # ks[0] is lost (it had been evicted), with no trace on disk. ks[1] too when its
        # demotion joined the same write group and run (timing): a failed run fails exactly
        # its blocks, each counted once.
        lost = [k for k in ks[:2] if h.where(k) is None]
        assert lost in ([ks[0]], [ks[0], ks[1]])
        assert h.stats().chain.copy_failures == len(lost)
        # The tier keeps working, and what was not in the failed run is intact.
        for k in ks[3:]:
            await h.put([k], blocks_of([k]))
        for k in ks[1:]:
            if k not in lost:
                assert h.where(k) is not None
                out = await h.get([k])
                assert torch.equal(out[0].cpu(), content(k))
        await h.drain()
        verify_all(h)


async def test_a_put_whose_top_tier_write_fails_stores_nothing(tmp_path: Path) -> None:
    io = FaultyIO()
    config = chain_config(tmp_path, gpu=None, cpu=None, disk=8)
    async with Hierarchy.from_config(config, disk_options={"io": io}) as h:
        io.inject("pwritev", errno.ENOSPC, times=1)
        assert await h.put(keys_(1), blocks_of(keys_(1))) == 0
        assert h.where(key(1)) is None
        assert await h.put(keys_(2), blocks_of(keys_(2))) == 1
        verify_all(h)


@dataclass
class HeldReads:
    """A storage's reads held at a gate (a lower tier hung): `entered` is set once a read
    waits there, `release` lets every read through."""

    entered: asyncio.Event
    release: asyncio.Event


def held_reads(storage: BlockStorage) -> HeldReads:
    """Hold a storage's reads until `release` is set, so a test knows where they are."""
    read = storage.read
    held = HeldReads(asyncio.Event(), asyncio.Event())

    async def gated(*args, **kwargs):  # type: ignore[no-untyped-def]
        held.entered.set()
        await held.release.wait()
        return await read(*args, **kwargs)

    storage.read = gated  # type: ignore[method-assign]
    return held


async def test_a_load_past_its_deadline_is_a_miss(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, cpu=2, disk=8)) as h:
        ks = keys_(*range(4))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()  # on disk, read from there (not from its snapshot on the way)
        held = held_reads(h.storages[-1])
        out = await h.get([ks[0]], timeout_s=0.05)
        assert out.shape[0] == 0  # at its deadline: the read is held until released below
        assert h.stats().calls.get_timeouts == 1
        held.release.set()
        await h.drain()  # the promotion itself went on
        assert h.where(ks[0]) == "cpu"
        out = await h.get([ks[0]])
        assert torch.equal(out[0].cpu(), content(ks[0]))
        verify_all(h)


async def test_a_cancelled_get_releases_its_pins(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, cpu=2, disk=8)) as h:
        ks = keys_(*range(4))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()  # on disk, read from there (not from its snapshot on the way)
        held = held_reads(h.storages[-1])
        task = asyncio.ensure_future(h.get([ks[0], ks[1]]))
        await asyncio.wait_for(held.entered.wait(), 60)  # the get waits for its read
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        held.release.set()
        await h.drain()
        verify_all(h)
        out = await h.get([ks[0]])
        assert torch.equal(out[0].cpu(), content(ks[0]))


# -- bad input -------------------------------------------------------------------------------


async def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        ks = keys_(1, 2)
        with pytest.raises(InvalidValueError, match="uint8"):
            await h.put(ks, blocks_of(ks).to(torch.int32))
        with pytest.raises(InvalidValueError, match=rf"\[n, {BLOCK}\]"):
            await h.put(ks, torch.zeros((2, 100), dtype=torch.uint8))
        with pytest.raises(InvalidValueError, match="2 keys but 3 blocks"):
            await h.put(ks, blocks_of(keys_(1, 2, 3)))
        with pytest.raises(InvalidValueError, match="duplicate key"):
            await h.put([key(1), key(1)], blocks_of(keys_(1, 1)))
        with pytest.raises(InvalidValueError, match="duplicate key"):
            await h.get([key(1), key(1)])
        with pytest.raises(KeyFormatError, match="bytes"):
            await h.put(["a", "b"], blocks_of(ks))  # type: ignore[list-item]
        with pytest.raises(InvalidValueError, match=r"torch\.Tensor"):
            await h.put(ks, np.zeros((2, BLOCK), dtype=np.uint8))  # type: ignore[arg-type]
        verify_all(h)
    with pytest.raises(ManagerClosedError, match="closed"):
        await h.put(ks, blocks_of(ks))
    with pytest.raises(ManagerClosedError):
        h.lookup(ks)


async def test_a_bad_config_dict_is_a_config_error(tmp_path: Path) -> None:
    from kvtier.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tiers\[0\].capacity"):
        Hierarchy.from_config(
            {"block_size": 4096, "tiers": [{"name": "c", "medium": "cpu", "capacity": "lots"}]}
        )


# -- restarts --------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    sys.path.insert(0, {tests!r})
    from hierarchy_helpers import blocks_of, chain_config, key
    from kvtier import Hierarchy
    from pathlib import Path

    async def main():
        config = chain_config(Path({tmp!r}), gpu=None, cpu=4, disk=64,
                              write_policy="write-through")
        async with Hierarchy.from_config(config) as h:
            for i in range({count}):
                await h.put([key(i)], blocks_of([key(i)]))
                if {drain} or i == {durable_at}:
                    await h.drain()
                print(i, flush=True)
            if {kill_self}:
                os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


def run_child(
    tmp_path: Path, count: int, *, drain: bool, kill_self: bool, durable_at: int = -1
) -> subprocess.Popen[str]:
    """Start a process that puts ``count`` blocks, one per line it prints.

    It drains after every put when ``drain`` is set, and once after put ``durable_at``
    otherwise, so a reader that has seen that line knows blocks are on disk, whatever the pace.
    """
    code = _CHILD.format(
        tests=str(ROOT / "tests"),
        tmp=str(tmp_path),
        count=count,
        drain=drain,
        kill_self=kill_self,
        durable_at=durable_at,
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
async def test_blocks_stored_by_one_process_are_read_by_the_next(tmp_path: Path) -> None:
    child = run_child(tmp_path, 12, drain=True, kill_self=True)
    child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=64, write_policy="write-through")
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(12))
        assert [h.where(k) for k in ks] == ["disk"] * 12
        out = await h.get(ks)
        assert torch.equal(out, blocks_of(ks))
        await h.drain()
        verify_all(h)


@pytest.mark.slow
async def test_a_process_killed_mid_burst_leaves_no_readable_corrupt_block(
    tmp_path: Path,
) -> None:
    child = run_child(tmp_path, 400, drain=False, kill_self=False, durable_at=9)
    assert child.stdout is not None
    # Line 9 comes after a drain (blocks 0-9 durable); 30 more put it well into its burst.
    for _ in range(40):
        assert child.stdout.readline(), "the child ended before its burst"
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=120)
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=64, write_policy="write-through")
    async with Hierarchy.from_config(config) as h:
        found = [i for i in range(400) if h.where(key(i)) == "disk"]
        assert found, "the child stored nothing durable before it was killed"
        for i in found:
            out = await h.get([key(i)])
            assert len(out) == 1 and torch.equal(out[0], content(key(i))), i
        assert h.stats().corrupt_blocks == 0
        await h.drain()
        verify_all(h)


async def test_another_model_id_never_sees_the_blocks(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=None, disk=8, model_id="model-a")
    async with Hierarchy.from_config(config) as h:
        await h.put(keys_(1), blocks_of(keys_(1)))
    other = chain_config(tmp_path, gpu=None, cpu=None, disk=8, model_id="model-b")
    async with Hierarchy.from_config(other) as h:
        assert h.where(key(1)) is None and h.lookup(keys_(1)) == 0
    async with Hierarchy.from_config(config) as h:
        assert h.where(key(1)) == "disk"


# -- the synchronous wrapper -----------------------------------------------------------------


def test_sync_hierarchy_runs_on_its_own_loop_thread(tmp_path: Path) -> None:
    with SyncHierarchy(chain_config(tmp_path)) as h:
        ks = keys_(*range(20))
        for k in ks:
            assert h.put([k], blocks_of([k])) == 1
        assert h.lookup(ks) == 20
        out = h.get(ks)
        assert torch.equal(out.cpu(), blocks_of(ks))
        h.drain()
        assert h.where(ks[-1]) is not None and h.stats().tiers[0].pinned == 0
        assert h.take_events()
    assert h.closed
    with pytest.raises(ManagerClosedError):
        h.lookup(ks)


def test_sync_hierarchy_reports_a_bad_open(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = chain_config(blocker, gpu=None, cpu=None, disk=4)
    with pytest.raises(Exception, match="disk"):
        SyncHierarchy(config)


# -- GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
async def test_gpu_tier_on_cuda_round_trip_and_spill(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, device="cuda")) as h:
        assert h.tiers[0].where.startswith("cuda")
        ks = keys_(*range(30))
        data = blocks_of(ks).cuda()
        for i in range(0, 30, 3):
            await h.put(ks[i : i + 3], data[i : i + 3])
        out = await h.get(ks)
        assert out.device.type == "cuda"
        assert torch.equal(out.cpu(), blocks_of(ks))
        await h.drain()
        verify_all(h)


async def test_flush_keeps_volatile_blocks_across_a_restart(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=2, cpu=4, disk=32, reserve=False)
    ks = keys_(*range(8))
    async with Hierarchy.from_config(config, flush_on_close=True) as h:
        for k in ks:
            await h.put([k], blocks_of([k]))
        assert [h.where(k) for k in ks].count("disk") == 2  # only the demoted ones
    async with Hierarchy.from_config(config) as h:
        assert [h.where(k) for k in ks] == ["disk"] * 8
        out = await h.get(ks)
        assert torch.equal(out.cpu(), blocks_of(ks))
        assert await h.flush() >= 0
        await h.drain()
        verify_all(h)


async def test_without_flush_a_write_back_chain_keeps_only_what_reached_the_disk(
    tmp_path: Path,
) -> None:
    config = chain_config(tmp_path, gpu=2, cpu=4, disk=32, reserve=False)
    ks = keys_(*range(8))
    async with Hierarchy.from_config(config, flush_on_close=False) as h:
        for k in ks:
            await h.put([k], blocks_of([k]))
    async with Hierarchy.from_config(config, flush_on_close=False) as h:
        assert [h.where(k) for k in ks] == ["disk"] * 2 + [None] * 6
        copied = await h.flush()
        assert copied == 0


async def test_a_corrupt_block_of_a_disk_only_chain_is_dropped_after_one_failed_get(
    tmp_path: Path,
) -> None:
    """A disk tier at the top of the chain (as under vLLM): a get that finds a block's
    bytes bad serves the blocks before it, then drops that block, so the next lookup is a
    plain miss rather than another failed read."""
    from kvtier.tiers.disk.testing import flip_byte

    config = {
        "block_size": BLOCK,
        "tiers": [
            {
                "name": "disk",
                "medium": "disk",
                "capacity": 16,
                "path": str(tmp_path / "d"),
                "layout": "slots",  # its slab files are damaged below
                "fsync": False,
            }
        ],
    }
    async with Hierarchy.from_config(config) as h:
        keys = keys_(1, 2, 3)
        assert await h.put(keys, blocks_of(keys)) == 3
        (slot,) = h.manager.tiers[0].spec_of([keys[1]]).block_ids
        disk = h.storages[0]
        assert isinstance(disk, DiskStore)
        slab, offset = disk.slot_location(int(slot))
        flip_byte(slab, offset + 7)
        out = await h.get(keys)
        assert torch.equal(out.cpu(), blocks_of(keys[:1]))
        await h.drain()
        assert h.where(keys[1]) is None and h.lookup(keys) == 1
        assert h.stats().chain.corrupt_dropped == 1
        verify_all(h)


async def test_put_rows_and_get_into_move_blocks_straight_from_and_into_a_buffer(
    tmp_path: Path,
) -> None:
    """An engine's buffer (rows in any order) is stored without a gather and read back into
    other rows without a scatter; bad rows are one clear error that changes nothing."""
    async with Hierarchy.from_config(chain_config(tmp_path)) as h:
        keys = keys_(1, 2, 3, 4)
        buffer = torch.zeros((10, BLOCK), dtype=torch.uint8)
        source_rows = [7, 2, 9, 0]
        buffer[source_rows] = blocks_of(keys)
        assert await h.put(keys, buffer, rows=source_rows) == 4
        target = torch.zeros((6, BLOCK), dtype=torch.uint8)
        assert await h.get_into(keys, target, [5, 1, 3, 0]) == 4
        assert torch.equal(target[[5, 1, 3, 0]], blocks_of(keys))
        assert torch.count_nonzero(target[[2, 4]]) == 0  # other rows untouched
        for rows, message in (
            ([0, 1, 2], "4 keys but rows has shape"),
            ([0, 1, 2, 6], "row 6 is not one of the 6 rows"),
            ([0, 1, 1, 2], "a row is given twice"),
            ([0.5, 1, 2, 3], "rows must be ints"),
        ):
            with pytest.raises(InvalidValueError, match=message):
                await h.get_into(keys, target, rows)
        with pytest.raises(InvalidValueError, match="row -1 is not one"):
            await h.put(keys_(8), buffer, rows=[-1])
        assert h.where(key(8)) is None
        verify_all(h)


async def test_get_into_never_returns_while_a_copy_into_the_buffer_runs(tmp_path: Path) -> None:
    """A read slower than the deadline: `get` gives up (the read finishes in its own
    buffer), `get_into` waits for it, so the caller's memory is never written after the
    call returned, and the block it waited for is whole."""
    from kvtier.tiers.disk.io import FileIO

    class SlowReads(FileIO):
        slow = False

        def preadv(self, fd: int, buffers: Any, offset: int) -> int:
            if self.slow:
                time.sleep(0.3)
            return super().preadv(fd, buffers, offset)

    io = SlowReads()
    config = {
        "block_size": BLOCK,
        "tiers": [
            {
                "name": "disk",
                "medium": "disk",
                "capacity": 8,
                "path": str(tmp_path / "d"),
                "fsync": False,
            }
        ],
    }
    async with Hierarchy.from_config(config, tier_options={"disk": {"io": io}}) as h:
        keys = keys_(1, 2)
        assert await h.put(keys, blocks_of(keys)) == 2
        io.slow = True
        assert (await h.get(keys[:1], timeout_s=0.01)).shape[0] == 0  # gave up
        target = torch.zeros((2, BLOCK), dtype=torch.uint8)
        assert await h.get_into(keys[1:], target, [1], timeout_s=0.01) == 1
        snapshot = target.clone()
        await asyncio.sleep(0.4)
        assert torch.equal(target, snapshot)  # nothing wrote into it after the return
        assert torch.equal(target[1], blocks_of(keys[1:])[0])
        await h.drain()
        verify_all(h)
