"""`Hierarchy.stats()`: one snapshot whose size does not grow with the calls made, per-tier
activity that matches what happened, a latency histogram instead of samples, and a bounded
event log. None of this needs prometheus_client (see test_metrics.py for the export)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hierarchy_helpers import blocks_of, chain_config, key

import kvtier.manager.base as manager_base
from kvtier import Hierarchy
from kvtier.errors import InvalidValueError, KvtierError
from kvtier.manager.base import EventLog
from kvtier.metrics import LATENCY_BOUNDS_S, METRICS_EXTRA_HINT, LatencyHistogram
from kvtier.tiers.disk import DiskStore


def keys_(*ids: int) -> list[bytes]:
    return [key(i) for i in ids]


async def test_stats_size_does_not_grow_with_the_number_of_calls(tmp_path: Path) -> None:
    """The snapshot holds fixed-size histograms, not one sample per call."""
    config = chain_config(tmp_path, gpu=None, cpu=16, disk=None)
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(4))
        await h.put(ks, blocks_of(ks))
        sizes = []
        for calls in (10, 2_000):
            for _ in range(calls):
                await h.get(ks[:1])
            stats = h.stats()
            latency = stats.calls.get_latency
            sizes.append((len(latency.counts), len(stats.calls.put_latency.counts)))
            assert latency.count == sum(latency.counts)
        assert sizes[0] == sizes[1] == (len(LATENCY_BOUNDS_S) + 1,) * 2
        assert stats.calls.get_latency.count == 2_010
        assert stats.calls.put_latency.count == 1
        assert 0 < stats.latency_percentile(50) <= stats.latency_percentile(99)
        assert stats.latency_percentile(99) <= stats.calls.get_latency.max_s
        # A snapshot is a copy: later calls do not change it.
        await h.get(ks[:1])
        assert stats.calls.get_latency.count == 2_010


def test_latency_percentiles_are_estimated_within_a_bucket() -> None:
    rng = np.random.default_rng(7)
    samples = rng.lognormal(mean=-7.0, sigma=1.0, size=20_000)
    histogram = LatencyHistogram()
    for sample in samples:
        histogram.observe(float(sample))
    for q in (1, 50, 90, 99, 99.9):
        exact = float(np.percentile(samples, q))
        assert abs(histogram.percentile(q) - exact) <= 0.25 * exact, q
    assert histogram.percentile(100) == pytest.approx(float(samples.max()))
    assert LatencyHistogram().percentile(50) == 0.0
    late = LatencyHistogram()
    late.observe(500.0)  # past the last bound: its own bucket, up to the max seen
    assert 100.0 <= late.percentile(50) <= late.percentile(100) == 500.0
    with pytest.raises(InvalidValueError):
        histogram.percentile(101)


def test_event_log_keeps_the_newest_batches_and_counts_what_it_drops() -> None:
    log = EventLog(16, "cpu", "cpu", max_blocks=10)
    for batch in range(5):
        log.record(keys_(*range(batch * 3, batch * 3 + 3)), removed=False)
    assert log.dropped == 6 and len(log) == 3
    taken = log.take()
    assert [event.keys for event in taken] == [tuple(keys_(*range(i, i + 3))) for i in (6, 9, 12)]
    assert log.take() == [] and log.dropped == 6  # the count is never reset
    log.record(keys_(*range(100, 120)), removed=True)  # larger than the bound: still kept
    assert len(log) == 1 and log.dropped == 6
    disabled = EventLog(16, "cpu", "cpu", enabled=False, max_blocks=1)
    disabled.record(keys_(1, 2), removed=False)
    assert disabled.take() == [] and disabled.dropped == 0


async def test_events_nobody_takes_are_bounded_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_base, "EVENT_LOG_BLOCKS", 8)
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=32, reserve=False)
    async with Hierarchy.from_config(config) as h:
        for k in keys_(*range(20)):
            await h.put([k], blocks_of([k]))
        await h.drain()
        stats = h.stats()
        cpu, disk = stats.activity
        # cpu: 20 stored + 16 evicted = 36 blocks of events, 8 kept; disk: 16 stored.
        assert (cpu.events_dropped, disk.events_dropped) == (28, 8)
        assert stats.events_dropped == 36
        events = h.take_events()
        assert sum(len(event.keys) for event in events) == 16


async def test_tier_activity_counts_what_happened(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16, reserve=False)
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(10))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()
        cpu, disk = h.stats().activity
        assert (cpu.stored, cpu.evicted, cpu.demoted) == (10, 6, 6)
        assert (disk.stored, disk.evicted, disk.promoted) == (6, 0, 0)
        assert await h.put(ks[:2], blocks_of(ks[:2])) == 0  # held by the disk tier
        served = await h.get(ks[:3])  # on disk: promoted to cpu, evicting three
        await h.drain()
        assert served.shape[0] == 3
        stats = h.stats()
        cpu, disk = stats.activity
        assert (cpu.hits, cpu.misses, disk.hits, disk.misses) == (0, 3, 3, 0)
        assert (cpu.stored, cpu.evicted, cpu.demoted, cpu.promoted) == (13, 9, 9, 3)
        assert (disk.stored, disk.hits) == (9, 3)
        assert stats.calls.put_present == 2
        pairs = {(t.source, t.target): t for t in stats.transfers}
        assert pairs["disk", "cpu"].blocks == 3 and pairs["cpu", "caller"].blocks == 3
        assert {pair: (t.blocks, t.bytes, t.seconds) for pair, t in pairs.items()} == stats.pairs
        await h.get(keys_(99))  # absent: a miss of every tier
        cpu, disk = h.stats().activity
        assert (cpu.misses, disk.misses) == (4, 1)


async def test_a_corrupt_block_is_counted_against_its_tier(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=2, disk=8, reserve=False, layout="slots")
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(4))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()
        disk = h.storages[-1]
        assert isinstance(disk, DiskStore) and h.where(ks[0]) == "disk"
        slot = h.manager.tiers[-1].policy.get(ks[0])
        assert slot is not None
        path, offset = disk.slot_location(slot.block_id)
        with open(path, "r+b") as f:
            f.seek(offset + 100)
            byte = f.read(1)
            f.seek(offset + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        assert (await h.get([ks[0]])).shape[0] == 0
        await h.drain()
        stats = h.stats()
        assert [tier.corrupt for tier in stats.activity] == [0, 1]
        assert stats.corrupt_blocks == 1
        assert sum(t.corrupt for t in stats.transfers) == 1


async def test_an_admission_refusal_is_counted_against_its_tier(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=None)
    async with Hierarchy.from_config(config) as h:
        h.manager.tiers[0].policy.admit = lambda keys: [False] * len(keys)  # type: ignore[method-assign]
        h.manager.tiers[0].policy.admits_all = False  # type: ignore[misc]
        ks = keys_(1, 2, 3)
        assert await h.put(ks, blocks_of(ks)) == 0
        stats = h.stats()
        assert stats.activity[0].refused == 3 and stats.calls.put_refused == 3


async def test_metrics_without_prometheus_client_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=None)
    with pytest.raises(KvtierError, match=r"pip install 'kvtier\[metrics\]'"):
        Hierarchy.from_config(config, metrics=object())
    assert METRICS_EXTRA_HINT == "pip install 'kvtier[metrics]'"
    async with Hierarchy.from_config(config) as h:  # without metrics: nothing needed
        assert h.stats().calls.get_latency.count == 0


def test_replay_metrics_port_without_prometheus_client_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from kvtier.cli import main

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    result = CliRunner().invoke(
        main,
        ["replay", "--metrics-port", "9", "--limit", "5", "--no-plot", "--out", str(tmp_path)],
    )
    assert result.exit_code == 2, result.output
    assert "pip install 'kvtier[metrics]'" in result.output


def test_the_readme_lists_every_metric_with_its_type_and_labels() -> None:
    from kvtier.metrics import METRICS

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `kvtier_"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    documented = {
        info.name: (info.kind, ", ".join(f"`{label}`" for label in ("hierarchy", *info.labels)))
        for info in METRICS
    }
    assert rows == documented


async def test_a_lookup_miss_is_a_miss_of_every_tier_down_to_the_bottom(tmp_path: Path) -> None:
    """A caller that asks with `lookup` and gets only the held prefix (the replay, the README
    loop) has each key no tier holds counted once, at every tier: the bottom tier's misses
    are the chain's misses."""
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16, reserve=False)
    async with Hierarchy.from_config(config) as h:
        ks = keys_(*range(6))
        await h.put(ks[:2], blocks_of(ks[:2]))
        assert h.lookup(ks) == 2  # the third key ends the prefix: one miss
        assert (await h.get(ks[:2])).shape[0] == 2
        cpu, disk = h.stats().activity
        assert (cpu.hits, cpu.misses, disk.hits, disk.misses) == (2, 1, 0, 1)
        assert h.stats().chain.misses == 1
        assert h.lookup(ks[:2]) == 2  # all held: no miss
        assert [tier.misses for tier in h.stats().activity] == [1, 1]


async def test_a_value_a_shared_store_evicted_is_gone_at_its_tier(tmp_path: Path) -> None:
    """A block the shared store no longer holds (evicted by the store itself) is counted as
    gone at that tier and its transfer, never as corrupt."""
    from test_sharedfs_tier import chain, fill

    async with Hierarchy.from_config(chain(tmp_path / "nfs")) as h:
        ks = await fill(h, range(12))
        lost = next(k for k in ks if h.where(k) == "shared")
        storage = h.storages[1]
        storage.path_of(lost).unlink()  # type: ignore[attr-defined]
        assert (await h.get([lost], timeout_s=5)).shape[0] == 0
        await h.drain()
        stats = h.stats()
        cpu, shared = stats.activity
        assert (shared.gone, shared.corrupt, cpu.gone) == (1, 0, 0)
        pair = next(t for t in stats.transfers if t.source == "shared" and t.gone)
        assert pair.gone == 1 and pair.corrupt == 0 and pair.failed >= 1
        assert stats.gone_blocks == 1 and stats.block_size == h.block_size
