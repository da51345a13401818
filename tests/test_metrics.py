"""Prometheus metrics: registered on the registry the embedder chooses, equal to `stats()`,
one `hierarchy` label per hierarchy of a registry, and scraped over HTTP from a running
`kvtier replay --metrics-port`.

They need prometheus-client (the `metrics` extra, in the `test` extra too): without it they
are skipped, said once, except in CI (CI=true), where a missing package is an error.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

try:
    import prometheus_client  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":
        raise RuntimeError(
            "CI runs the metrics tests, but prometheus-client is not installed: the test "
            "extra has it (scripts/setup.sh installs it)"
        ) from None
    pytest.skip(
        "prometheus-client is not installed: pip install 'kvtier[metrics]'",
        allow_module_level=True,
    )

import numpy as np
from hierarchy_helpers import BLOCK, blocks_of, chain_config, key
from ports import free_port
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_sharedfs_tier import chain as sharedfs_chain
from test_sharedfs_tier import fill

from kvtier import Hierarchy
from kvtier.config import parse_config
from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.metrics import METRICS, serve_metrics
from kvtier.testing.keyed import keyed_auth
from kvtier.tiers.codec import BlockCodec
from kvtier.tiers.shared.value import ValueCodec
from kvtier.tiers.sharedfs.storage import SharedFSStorage

ROOT = Path(__file__).resolve().parent.parent


def keys_(*ids: int) -> list[OffloadKey]:
    return [key(i) for i in ids]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"hierarchy": "default", **labels})


async def test_metrics_on_a_chosen_registry_equal_stats(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16, reserve=False)
    async with Hierarchy.from_config(config, metrics=registry) as h:
        ks = keys_(*range(10))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()
        assert (await h.get(ks[:3])).shape[0] == 3  # on disk: three disk hits, promoted
        assert (await h.get(keys_(99))).shape[0] == 0  # a miss of every tier
        await h.drain()
        stats = h.stats()
        for tier in stats.activity:
            labels = {"tier": tier.name}
            assert value(registry, "kvtier_tier_hits_total", **labels) == tier.hits
            assert value(registry, "kvtier_tier_misses_total", **labels) == tier.misses
            assert value(registry, "kvtier_tier_stored_blocks_total", **labels) == tier.stored
            assert value(registry, "kvtier_tier_evicted_blocks_total", **labels) == tier.evicted
            assert value(registry, "kvtier_tier_demoted_blocks_total", **labels) == tier.demoted
            assert value(registry, "kvtier_tier_promoted_blocks_total", **labels) == tier.promoted
        assert value(registry, "kvtier_tier_hits_total", tier="disk") == 3
        assert value(registry, "kvtier_tier_misses_total", tier="cpu") == 4
        assert value(registry, "kvtier_tier_evicted_blocks_total", tier="cpu") == 9
        assert value(registry, "kvtier_tier_capacity_blocks", tier="disk") == 16
        assert value(registry, "kvtier_tier_used_blocks", tier="cpu") == 4
        assert value(registry, "kvtier_tier_blocks", tier="cpu", state="evictable") == 4
        for transfer in stats.transfers:
            pair = {"source": transfer.source, "target": transfer.target}
            assert value(registry, "kvtier_transfer_bytes_total", **pair) == transfer.bytes
            assert value(registry, "kvtier_transfer_blocks_total", **pair) == transfer.blocks
        assert value(registry, "kvtier_transfer_blocks_total", source="disk", target="cpu") == 3
        assert value(registry, "kvtier_put_blocks_total", outcome="stored") == 10
        assert value(registry, "kvtier_get_blocks_total", outcome="served") == 3
        assert value(registry, "kvtier_get_blocks_total", outcome="missed") == 1
        assert value(registry, "kvtier_get_seconds_count") == 2
        assert value(registry, "kvtier_put_seconds_count") == 10
        assert value(registry, "kvtier_get_seconds_bucket", le="+Inf") == 2
        total = value(registry, "kvtier_get_seconds_sum")
        assert total == pytest.approx(stats.calls.get_latency.sum_s)
        exported = {family.name for family in registry.collect()}
        assert exported == {re.sub(r"_total$", "", info.name) for info in METRICS}
    # The default registry was not touched; a closed hierarchy is no longer exported.
    labels = {"hierarchy": "default", "tier": "disk"}
    assert REGISTRY.get_sample_value("kvtier_tier_hits_total", labels) is None
    assert value(registry, "kvtier_tier_hits_total", tier="disk") is None


async def test_per_block_lookup_counts_give_the_replays_hit_ratio(tmp_path: Path) -> None:
    """A lookup-then-get workload, as `kvtier replay` runs it: the blocks after a miss are
    counted missed block by block (the chain's misses count one per lookup), so the tiers'
    hits over the blocks given to lookup is the hit ratio the replay reports."""
    registry = CollectorRegistry()
    config = chain_config(tmp_path, gpu=None, cpu=16, disk=16, reserve=False)
    async with Hierarchy.from_config(config, metrics=registry) as h:
        stored = keys_(*range(8))
        await h.put(stored, blocks_of(stored))  # all in the cpu tier
        await h.drain()
        served = 0
        for request in (
            keys_(0, 1, 2, 90, 91),  # 3 hits, then 2 blocks missed
            keys_(6, 7, 5, 4),  # 4 hits
            keys_(92, 0, 1, 2, 3, 4),  # a miss at the head: 6 blocks missed
            keys_(7, 93),  # 1 hit, 1 missed
        ):
            held = h.lookup(request)
            served += (await h.get(request[:held])).shape[0]
            await h.drain()
        stats = h.stats()
        assert value(registry, "kvtier_lookup_blocks_total", outcome="held") == 8
        assert value(registry, "kvtier_lookup_blocks_total", outcome="missed") == 9
    assert served == 8
    assert (stats.calls.lookup_blocks, stats.calls.lookup_held) == (17, 8)
    assert stats.calls.lookup_missed == 9
    assert [(tier.name, tier.hits) for tier in stats.activity] == [("cpu", 8), ("disk", 0)]
    assert stats.block_hit_ratio() == 8 / 17
    assert stats.activity[-1].misses == 3  # per lookup: one for each request that missed


async def test_corrupt_blocks_and_refusals_are_exported(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    config = chain_config(tmp_path, gpu=None, cpu=2, disk=8, reserve=False, layout="slots")
    async with Hierarchy.from_config(config, metrics=registry) as h:
        ks = keys_(*range(4))
        for k in ks:
            await h.put([k], blocks_of([k]))
        await h.drain()
        disk = h.storages[-1]
        slot = h.manager.tiers[-1].policy.get(ks[0])
        assert slot is not None
        path, offset = disk.slot_location(slot.block_id)  # type: ignore[attr-defined]
        with open(path, "r+b") as f:
            f.seek(offset + 7)
            byte = f.read(1)
            f.seek(offset + 7)
            f.write(bytes([byte[0] ^ 0x01]))
        assert (await h.get([ks[0]])).shape[0] == 0
        await h.drain()
        assert value(registry, "kvtier_tier_corrupt_blocks_total", tier="disk") == 1
        assert value(registry, "kvtier_tier_corrupt_blocks_total", tier="cpu") == 0
        read = next(t for t in h.stats().transfers if (t.source, t.target) == ("disk", "cpu"))
        failed = "kvtier_transfer_failed_blocks_total"
        assert value(registry, failed, source="disk", target="cpu") == read.failed == 1
        policy = h.manager.tiers[0].policy
        policy.admit = lambda keys: [False] * len(keys)  # type: ignore[method-assign]
        policy.admits_all = False  # type: ignore[misc]
        assert await h.put(keys_(50, 51), blocks_of(keys_(50, 51))) == 0
        assert value(registry, "kvtier_tier_refused_blocks_total", tier="cpu") == 2
        assert value(registry, "kvtier_put_blocks_total", outcome="refused") == 2
        ks = keys_(60, 61)
        assert await h.put(ks, blocks_of(ks), partial_last=True) == 0
        assert value(registry, "kvtier_put_blocks_total", outcome="partial") == 1
        assert value(registry, "kvtier_put_blocks_total", outcome="refused") == 3


async def test_two_hierarchies_on_one_registry_are_told_apart_by_name(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    a_config = chain_config(tmp_path / "a", gpu=None, cpu=4, disk=None)
    b_config = chain_config(tmp_path / "b", gpu=None, cpu=8, disk=None)
    async with (
        Hierarchy.from_config(a_config, metrics=registry, metrics_name="a") as a,
        Hierarchy.from_config(b_config, metrics=registry, metrics_name="b") as b,
    ):
        await a.put(keys_(1), blocks_of(keys_(1)))
        await b.put(keys_(1, 2), blocks_of(keys_(1, 2)))
        stored = "kvtier_tier_stored_blocks_total"
        assert registry.get_sample_value(stored, {"hierarchy": "a", "tier": "cpu"}) == 1
        assert registry.get_sample_value(stored, {"hierarchy": "b", "tier": "cpu"}) == 2
        with pytest.raises(InvalidValueError, match="'a' is already registered"):
            Hierarchy.from_config(a_config, metrics=registry, metrics_name="a")
        text = generate_latest(registry).decode()
        assert text.count("# TYPE kvtier_tier_stored_blocks_total counter") == 1
    # Closed, the name is free again.
    async with Hierarchy.from_config(a_config, metrics=registry, metrics_name="a") as again:
        assert again.stats().activity[0].stored == 0
        capacity = {"hierarchy": "a", "tier": "cpu"}
        assert registry.get_sample_value("kvtier_tier_capacity_blocks", capacity) == 4


def test_bad_metrics_arguments_are_clear_errors(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=None)
    with pytest.raises(InvalidValueError, match="CollectorRegistry"):
        Hierarchy.from_config(config, metrics=object())
    with pytest.raises(InvalidValueError, match="metrics_name"):
        Hierarchy.from_config(config, metrics=CollectorRegistry(), metrics_name="")
    taken = CollectorRegistry()
    from prometheus_client import Counter

    Counter("kvtier_tier_hits", "not kvtier's", registry=taken)
    with pytest.raises(InvalidValueError, match="already has metrics of kvtier's names"):
        Hierarchy.from_config(config, metrics=taken)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    """Every sample of the page, or None while nothing answers on the port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
def test_a_running_replay_serves_its_metrics(tmp_path: Path) -> None:
    """Scraped while the replay runs (it is stopped with Ctrl-C once the hits show)."""
    port = free_port()
    command = [
        sys.executable, "-m", "kvtier.cli", "replay", "--metrics-port", str(port),
        "--limit", "20000", "--block-bytes", "4KiB", "--no-plot", "--out", str(tmp_path),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        samples = None
        hits = 0.0
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and process.poll() is None:
            samples = scrape(port)
            if samples is not None:
                hits = sum(
                    v for (name, _), v in samples.items() if name == "kvtier_tier_hits_total"
                )
                if hits > 0:
                    break
            time.sleep(0.1)
        assert process.poll() is None, "the replay ended before a scrape saw a hit"
        assert samples is not None and hits > 0
        names = {name for name, _ in samples}
        for name in (
            "kvtier_tier_hits_total",
            "kvtier_tier_stored_blocks_total",
            "kvtier_transfer_bytes_total",
            "kvtier_get_seconds_bucket",
            "kvtier_put_seconds_count",
            "kvtier_tier_capacity_blocks",
        ):
            assert name in names, name
        labels = {dict(pairs).get("hierarchy") for _, pairs in samples}
        assert labels == {"replay"}
        gets = samples["kvtier_get_seconds_count", (("hierarchy", "replay"),)]
        assert gets > 0
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    assert process.returncode in (0, 130), stderr
    assert scrape(port) is None  # the server is gone with the replay


@pytest.mark.slow
def test_replay_on_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = int(busy.getsockname()[1])
        command = [
            sys.executable, "-m", "kvtier.cli", "replay", "--metrics-port", str(port),
            "--limit", "5", "--block-bytes", "4KiB", "--no-plot", "--out", str(tmp_path),
        ]  # fmt: skip
        done = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert f"port {port} is in use" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_serve_metrics_serves_a_registry_until_closed() -> None:
    registry = CollectorRegistry()
    port = free_port()
    with serve_metrics(registry, port) as server:
        assert server.url == f"http://127.0.0.1:{port}/metrics"
        assert scrape(port) == {}
    assert scrape(port) is None
    with pytest.raises(InvalidValueError, match="metrics port"):
        serve_metrics(registry, 0)


async def test_each_tier_exports_its_block_size_and_capacity_in_bytes(tmp_path: Path) -> None:
    """Gauges a dashboard can use as they are: bytes of a block, and of each tier."""
    registry = CollectorRegistry()
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16, reserve=False)
    async with Hierarchy.from_config(config, metrics=registry) as h:
        assert h.lookup(keys_(1)) == 0  # a miss of every tier, the bottom one included
        for tier in h.stats().tiers:
            labels = {"tier": tier.name}
            assert value(registry, "kvtier_tier_block_bytes", **labels) == h.block_size
            capacity = tier.num_blocks * h.block_size
            assert value(registry, "kvtier_tier_capacity_bytes", **labels) == capacity
            assert value(registry, "kvtier_tier_misses_total", **labels) == 1
            assert value(registry, "kvtier_tier_gone_blocks_total", **labels) == 0


@pytest.mark.parametrize("write_policy", ["write-back", "write-through"])
async def test_blocks_hinted_never_are_exported_by_fate(tmp_path: Path, write_policy: str) -> None:
    registry = CollectorRegistry()
    config = chain_config(
        tmp_path, gpu=None, cpu=2, disk=8, reserve=False, write_policy=write_policy
    )
    async with Hierarchy.from_config(config, metrics=registry) as h:
        never = keys_(1, 2)
        assert await h.put(never, blocks_of(never), hint="never") == 2
        others = keys_(3, 4)
        assert await h.put(others, blocks_of(others)) == 2  # evicts the two "never" blocks
        await h.drain()
        chain = h.stats().chain
        dropped = value(registry, "kvtier_hint_never_blocks_total", fate="dropped")
        not_copied = value(registry, "kvtier_hint_never_blocks_total", fate="not_copied")
        assert (dropped, not_copied) == (chain.hint_dropped, chain.hint_not_cascaded)
        assert all(h.where(k) is None for k in never)  # not on disk either
        if write_policy == "write-back":
            assert (dropped, not_copied) == (2, 0)  # evicted, dropped instead of demoted
        else:
            assert not_copied == 2  # never cascaded to the disk
        admission = value(registry, "kvtier_backpressure_waits_total", kind="admission")
        assert admission == h.stats().calls.put_admission_waits


async def test_forged_values_of_a_shared_tier_are_in_stats_and_metrics(tmp_path: Path) -> None:
    """Issue 31, item 12.4: a shared tier's problem counters reach `stats()` and a scrape, by
    tier and reason, so a fleet can alert on forgery attempts."""
    config = sharedfs_chain(tmp_path / "nfs")
    namespace = parse_config(config).namespace
    forger = ValueCodec(namespace, BLOCK, BlockCodec("none"), keyed_auth(namespace, seed=9))
    registry = CollectorRegistry()
    async with Hierarchy.from_config(config, metrics=registry, metrics_name="n") as h:
        keys = await fill(h, range(12))
        storage = h.storages[-1]
        assert isinstance(storage, SharedFSStorage)
        forged = [k for k in keys if h.where(k) == "shared"][:5]
        assert len(forged) == 5
        for k in forged:
            storage.path_of(k).write_bytes(forger.encode(k, np.zeros(BLOCK, dtype=np.uint8)))
        for k in forged:
            assert len(await h.get([k])) == 0  # a miss
        activity = h.stats().activity
        assert activity[0].problems == {}
        assert activity[1].problems == {"forged": len(forged)}
        labels = {"hierarchy": "n", "tier": "shared", "reason": "forged"}
        assert registry.get_sample_value("kvtier_tier_value_problems_total", labels) == 5
        labels["tier"] = "cpu"
        assert registry.get_sample_value("kvtier_tier_value_problems_total", labels) is None


async def test_unencrypted_values_served_or_refused_are_in_stats_and_metrics(
    tmp_path: Path,
) -> None:
    """Issue 31, item 12.5: a node with `encrypt = true` reading values another holder of the
    key wrote unencrypted counts them served, or with `require_encrypted` refuses them."""
    writer = sharedfs_chain(tmp_path / "nfs")
    async with Hierarchy.from_config(writer) as h:
        keys = await fill(h, range(12))
        shared = [k for k in keys if h.where(k) == "shared"][:3]
    assert len(shared) == 3
    registry = CollectorRegistry()
    labels = {"hierarchy": "n", "tier": "shared"}
    reader = sharedfs_chain(tmp_path / "nfs", encrypt=True)
    async with Hierarchy.from_config(reader, metrics=registry, metrics_name="n") as h:
        assert torch.equal(await h.get(shared), blocks_of(shared))
        activity = h.stats().activity[1]
        assert activity.unencrypted_served == 3 and activity.problems == {}
        assert registry.get_sample_value("kvtier_tier_unencrypted_served_total", labels) == 3
    registry = CollectorRegistry()
    strict = sharedfs_chain(tmp_path / "nfs", encrypt=True, require_encrypted=True)
    async with Hierarchy.from_config(strict, metrics=registry, metrics_name="n") as h:
        for k in shared:
            assert len(await h.get([k])) == 0  # a miss
        activity = h.stats().activity[1]
        assert activity.unencrypted_served == 0 and activity.problems == {"unencrypted": 3}
        refused = {**labels, "reason": "unencrypted"}
        assert registry.get_sample_value("kvtier_tier_value_problems_total", refused) == 3
        assert registry.get_sample_value("kvtier_tier_unencrypted_served_total", labels) == 0
