"""Put at CPU speed (issue 23, item 1): the top tier's reserve grows to cover the puts it
gets, so a put into a full CPU tier over a disk tier finds its slots freed in the
background instead of evicting, and waiting for its victims' snapshot, on its own path."""

from __future__ import annotations

from pathlib import Path

from hierarchy_helpers import blocks_of, chain_config, key

from kvtier import Hierarchy


async def test_puts_larger_than_the_watermarks_reserve_stop_evicting_inline(
    tmp_path: Path,
) -> None:
    # 128 CPU blocks: the default watermarks (0.98 / 0.95) keep a reserve of 3 to 7 slots,
    # fewer than a put of 16 blocks needs (the reserve may grow to 1/8 of the tier: 16).
    config = chain_config(tmp_path, gpu=None, cpu=128, disk=1024)
    async with Hierarchy.from_config(config, flush_on_close=False) as h:
        next_key = 0
        for _ in range(12):  # fill the CPU tier, and more
            ks = [key(next_key + i) for i in range(16)]
            next_key += 16
            assert await h.put(ks, blocks_of(ks)) == 16
            await h.drain()
        manager = h.chain.manager
        # Once drained, the reserve holds a whole put's room.
        assert manager.top.num_free >= 16
        inline = h.stats().calls.put_demotion_waits
        for _ in range(4):
            ks = [key(next_key + i) for i in range(16)]
            next_key += 16
            assert await h.put(ks, blocks_of(ks)) == 16
            await h.drain()
        calls = h.stats().calls
        assert calls.put_demotion_waits == inline  # no put evicted on its own path
        assert calls.put_stored == next_key  # and none was lost
        for first in range(0, next_key, 16):
            ks = [key(first + i) for i in range(16)]
            assert h.lookup(ks) == 16


async def test_a_chain_without_a_reserve_keeps_none(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=16, disk=128, reserve=False)
    async with Hierarchy.from_config(config, flush_on_close=False) as h:
        for first in range(0, 64, 4):
            ks = [key(first + i) for i in range(4)]
            assert await h.put(ks, blocks_of(ks)) == 4
        await h.drain()
        # Exact placement: no background eviction, the CPU tier is full.
        assert h.chain.manager.top.num_free == 0
        assert h.stats().chain.reserve_evicted == 0
