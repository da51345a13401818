"""A get served from a block's in-flight copy (a demotion's snapshot in the staging arena,
`TransferEngine.read_staged`) is a hit of the tier the block is being written to: the chain's
hit counts, the per-tier activity of `stats()` and the Prometheus metrics count it there,
hits + misses = lookups after every get, and `staged_reads` still counts it apart.

Ordering is observed through a disk tier whose slab writes are held, never through clocks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from hierarchy_helpers import HeldWrites, blocks_of, chain_config, demoting_chain, key

from kvtier import Hierarchy
from kvtier.chain.stats import HierarchyStats

CPU, DISK = 0, 1


def assert_balanced(stats: HierarchyStats) -> None:
    """Every key a lookup answered is a hit of one tier or a miss of the chain."""
    chain = stats.chain
    assert chain.lookups == chain.misses + sum(chain.hits)
    assert [tier.hits for tier in stats.activity] == chain.hits


async def test_a_get_served_from_a_snapshot_is_a_hit_of_the_tier_it_is_written_to(
    tmp_path: Path,
) -> None:
    io = HeldWrites()
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=64, reserve=False)
    async with Hierarchy.from_config(config, disk_options={"io": io}) as h:
        victims = await demoting_chain(h, io)
        for count, first in enumerate(range(0, 20, 4), start=1):
            part = victims[first : first + 4]
            out = await asyncio.wait_for(h.get(part, timeout_s=None), 10)
            assert torch.equal(out, blocks_of(part))
            stats = h.stats()
            assert stats.chain.hits == [0, 4 * count]  # disk hits, served before they land
            assert_balanced(stats)
        assert io.completed == 0
        assert h.chain.engine.counters.staged_reads == 20  # the detail, counted apart
        assert (await h.get([key(99)])).shape[0] == 0  # a miss of every tier
        stats = h.stats()
        assert stats.chain.misses == 1
        assert [(t.hits, t.misses) for t in stats.activity] == [(0, 21), (20, 1)]
        assert_balanced(stats)
        io.release.set()
        await h.drain()
        assert_balanced(h.stats())


async def test_the_metrics_count_a_snapshot_read_as_a_hit(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    io = HeldWrites()
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=64, reserve=False)
    async with Hierarchy.from_config(config, disk_options={"io": io}, metrics=registry) as h:
        victims = await demoting_chain(h, io)
        out = await asyncio.wait_for(h.get(victims[:4], timeout_s=None), 10)
        assert out.shape[0] == 4
        hits = {
            name: registry.get_sample_value(
                "kvtier_tier_hits_total", {"hierarchy": "default", "tier": name}
            )
            for name in ("cpu", "disk")
        }
        assert hits == {"cpu": 0, "disk": 4}
        io.release.set()
        await h.drain()
