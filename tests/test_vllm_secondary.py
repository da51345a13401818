"""kvtier as a secondary tier of vLLM 0.33 (issue 10, item 2), driven through vLLM's own
`TieringOffloadingSpec` and `TieringOffloadingManager`: cascades land in kvtier's disk tier,
promotions bring back the same bytes, every job is reported exactly once, a damaged block is
a partial load (never wrong bytes), reset and restart keep the disk tier's blocks, kvtier's
evictions reach vLLM's KV events, and a failing tier never raises into vLLM."""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hierarchy_helpers import HeldWrites
from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm_support import (
    Driver,
    disk_chain,
    key,
    kvtier_tier,
    pattern,
)

from kvtier.errors import ConfigError
from kvtier.integrations.vllm import KvtierSecondaryTier
from kvtier.integrations.vllm.testing import offloading_config
from kvtier.tiers.disk import FaultyIO
from kvtier.tiers.disk.testing import flip_byte

CHUNK = 4096
PRIMARY = 8

Make = Callable[..., tuple[Any, Driver, KvtierSecondaryTier]]


@pytest.fixture
def tiering(tmp_path: Path) -> Iterator[Make]:
    """Build vLLM's tiering manager with kvtier below its CPU tier; shut all down after."""
    managers: list[Any] = []
    drivers: list[Driver] = []

    def make(
        *,
        capacity: int = 64,
        events: bool = True,
        path: Path | None = None,
        model: str = "kvtier-test",
        layout: str | None = None,
        **options: Any,
    ) -> tuple[Any, Driver, KvtierSecondaryTier]:
        disk = {"fsync": False} if layout is None else {"fsync": False, "layout": layout}
        chain = disk_chain(path or tmp_path / "disk", capacity, **disk)
        extra = {
            "cpu_bytes_to_use": PRIMARY * CHUNK,
            "secondary_tiers": [kvtier_tier(chain, **options)],
        }
        spec = TieringOffloadingSpec(
            offloading_config(extra, block_bytes=CHUNK, events=events, model=model)
        )
        manager = spec.get_manager()
        managers.append(manager)
        tier = manager.secondary_tiers[0]
        assert isinstance(tier, KvtierSecondaryTier)
        drivers.append(Driver(manager))
        return manager, drivers[-1], tier

    yield make
    for driver in drivers:
        driver.close()
    for manager in managers:
        manager.shutdown()


def fill(driver: Driver, count: int) -> list[bytes]:
    """Store chunks 0..count-1 in batches of the primary's size, so the first ones are
    evicted from vLLM's CPU tier and live only in kvtier."""
    keys = [key(i) for i in range(count)]
    for first in range(0, count, PRIMARY):
        driver.store(keys[first : first + PRIMARY], first)
        driver.settle()
    return keys


def assert_reported_once(driver: Driver, tier: KvtierSecondaryTier) -> None:
    counts = collections.Counter(driver.job_ids_reported())
    assert counts and max(counts.values()) == 1, counts
    assert set(counts) == driver.submitted, driver.submitted ^ set(counts)
    assert not tier.has_pending_work()


def test_cascades_reach_kvtier_and_promotions_bring_back_the_same_bytes(tiering: Make) -> None:
    manager, driver, tier = tiering()
    keys = fill(driver, 3 * PRIMARY)
    where = tier.hierarchy.call(lambda h: [h.where(k) for k in keys])
    assert where == ["disk"] * len(keys)
    for index in range(2 * PRIMARY):  # evicted from vLLM's CPU tier: promoted from kvtier
        context = driver.context()
        with manager.lock:
            manager.on_new_request(context)
        assert driver.lookup(keys[index], context) is LookupResult.HIT
        assert torch.equal(driver.read(keys[index], context), pattern(index, CHUNK)), index
        with manager.lock:
            manager.on_request_finished(context)
    driver.settle()
    assert_reported_once(driver, tier)


def test_no_call_into_kvtier_waits_for_its_disk(tiering: Make) -> None:
    """vLLM's scheduler calls the tier under its lock: with every disk write of kvtier held,
    a store, the finished jobs, a look-up kvtier answers and has_pending_work all return;
    the held stores are reported (once) when the writes go through."""
    io = HeldWrites()
    manager, driver, tier = tiering(hierarchy_options={"tier_options": {"disk": {"io": io}}})
    keys = [key(i) for i in range(PRIMARY)]
    never = key(900)
    context = driver.context()
    try:
        driver.store(keys, 0)  # vLLM's CPU tier hands the chunks to kvtier: to its disk
        with manager.lock:
            manager._process_finished_jobs()
            manager.on_new_request(context)
        assert tier.lookup(never, context) is LookupResult.RETRY  # asked of kvtier's thread
        tier.hierarchy.call(lambda hierarchy: None)  # its loop answers meanwhile
        assert tier.lookup(never, context) is LookupResult.MISS
        assert tier.has_pending_work()
        assert io.completed == 0  # every call above returned while the writes were held
    finally:
        io.release.set()
    with manager.lock:
        manager.on_request_finished(context)
    driver.settle()
    assert_reported_once(driver, tier)
    assert io.completed > 0
    assert tier.hierarchy.call(lambda h: [h.where(k) for k in keys]) == ["disk"] * PRIMARY


def test_a_key_kvtier_never_stored_is_a_miss_after_one_retry(tiering: Make) -> None:
    manager, driver, tier = tiering()
    context = driver.context()
    with manager.lock:
        manager.on_new_request(context)
        first = tier.lookup(key(999), context)
    assert first is LookupResult.RETRY  # asked of kvtier's thread, not answered inline
    assert driver.lookup(key(999), context) is LookupResult.MISS


def test_a_damaged_block_is_a_partial_load_and_never_wrong_bytes(tiering: Make) -> None:
    manager, driver, tier = tiering(layout="slots")  # a byte of its slab file is flipped
    keys = fill(driver, 2 * PRIMARY)

    # Damage chunk 2 on disk; promote chunks 0..3 in one job (one request, one step).
    def damage(hierarchy: Any) -> None:
        disk = hierarchy.storages[0]
        (slot,) = hierarchy.manager.tiers[0].spec_of([keys[2]]).block_ids
        slab, offset = disk.slot_location(int(slot))
        flip_byte(slab, offset + 100)

    tier.hierarchy.call(damage)
    context = driver.context()
    with manager.lock:
        manager.on_new_request(context)
        answers = [manager.lookup(k, context) for k in keys[:4]]
    assert set(answers) <= {LookupResult.HIT_PENDING}, answers
    driver.step()  # submits the one promotion job of 4 keys
    driver.settle()
    (load,) = [result for result in driver.results if result.job_id in driver.loads]
    assert load.success is False
    assert list(load.successful_keys) == keys[:2]
    for index in (0, 1):
        assert driver.lookup(keys[index], context) is LookupResult.HIT
        assert torch.equal(driver.read(keys[index], context), pattern(index, CHUNK))
    assert driver.lookup(keys[2], context) is LookupResult.MISS  # dropped: recompute
    stats = tier.hierarchy.stats()
    assert stats.corrupt_blocks >= 1
    assert_reported_once(driver, tier)


def test_a_miss_waits_for_the_loads_of_its_request(tiering: Make) -> None:
    """vLLM recomputes a request from its first MISS and offloads again only what its CPU
    tier does not hold: a MISS answered while another load of the request is pending would
    leave that load's blocks, if it failed, recomputed but never stored again. So while a
    request has loads not yet reported, a key kvtier does not hold is RETRY for it (and
    MISS for any other request); MISS once they are reported."""
    _, _, tier = tiering()
    release = threading.Event()
    load = tier._load

    async def held_load(job_id: int, *args: Any) -> None:
        if job_id == 2:  # this load is in flight until the test releases it
            await asyncio.to_thread(release.wait, 60)
        await load(job_id, *args)

    tier._load = held_load  # type: ignore[method-assign]
    request, other = ReqContext(req_id="request"), ReqContext(req_id="other")
    for job_id in (1, 2):  # keys kvtier never stored: each load fails (loads nothing)
        rows = np.array([job_id], dtype=np.int64)
        tier.submit_load(TransferJob(job_id, [key(900 + job_id)], rows, True, request))
    tier._jobs[1].result(timeout=60)
    assert [(result.job_id, result.success) for result in tier.get_finished_jobs()] == [(1, False)]
    failed = key(901)
    assert tier.lookup(failed, request) is LookupResult.RETRY  # asked of kvtier's thread
    tier.hierarchy.call(lambda hierarchy: None)  # the answer (absent) is back
    assert tier.lookup(failed, other) is LookupResult.MISS
    assert tier.lookup(failed, request) is LookupResult.RETRY  # its other load is pending
    release.set()
    tier.drain_jobs()
    assert tier.lookup(failed, request) is LookupResult.RETRY  # not reported to vLLM yet
    assert [(result.job_id, result.success) for result in tier.get_finished_jobs()] == [(2, False)]
    assert tier.lookup(failed, request) is LookupResult.MISS
    assert not tier.has_pending_work()


def test_a_failing_disk_is_a_failed_store_never_an_exception(tiering: Make) -> None:
    io = FaultyIO()
    io.inject("pwritev", errno.EIO)
    manager, driver, tier = tiering(hierarchy_options={"tier_options": {"disk": {"io": io}}})
    driver.store([key(i) for i in range(4)], 0)
    driver.settle()
    stores = [result for result in driver.results if result.job_id in driver.stores]
    assert stores and not any(result.success for result in stores)
    context = driver.context()
    with manager.lock:
        manager.on_new_request(context)
    assert driver.lookup(key(0), context) is LookupResult.HIT  # still in vLLM's CPU tier
    assert_reported_once(driver, tier)


def test_reset_drains_kvtier_and_its_blocks_survive_the_reset(tiering: Make) -> None:
    manager, driver, tier = tiering()
    keys = fill(driver, PRIMARY)
    driver.store([key(100 + i) for i in range(4)], 100)  # jobs in flight at the reset
    with manager.lock:
        manager.reset_cache()  # drains the tier; vLLM asserts no job is left
        manager.on_reset_flushed()
    assert not tier.has_pending_work()
    context = driver.context()
    with manager.lock:
        manager.on_new_request(context)
    assert driver.lookup(keys[3], context) is LookupResult.HIT
    assert torch.equal(driver.read(keys[3], context), pattern(3, CHUNK))
    assert_reported_once(driver, tier)


def test_a_restarted_disk_tier_serves_what_it_stored_under_vllm(
    tiering: Make, tmp_path: Path
) -> None:
    manager, driver, tier = tiering()
    keys = fill(driver, PRIMARY)
    manager.shutdown()  # vLLM's shutdown: the tier finishes its writes and closes
    assert tier.hierarchy.closed
    manager, driver, tier = tiering()  # a new vLLM process on the same directory
    context = driver.context()
    with manager.lock:
        manager.on_new_request(context)
    for index, k in enumerate(keys):
        assert driver.lookup(k, context) is LookupResult.HIT
        assert torch.equal(driver.read(k, context), pattern(index, CHUNK))


def test_another_model_on_the_same_directory_never_reads_these_blocks(tiering: Make) -> None:
    """vLLM's block hashes come from tokens alone: the namespace (model, dtype, layout)
    keeps a second model's vLLM from loading the first one's KV for the same tokens."""
    manager, driver, _ = tiering(model="model-a")
    keys = fill(driver, PRIMARY)
    manager.shutdown()
    manager, driver, _ = tiering(model="model-b")
    context = driver.context()
    with manager.lock:
        manager.on_new_request(context)
    assert driver.lookup(keys[0], context) is LookupResult.MISS
    manager.shutdown()
    manager, driver, _ = tiering(model="model-a")  # the first model again: still there
    with manager.lock:
        manager.on_new_request(context)
    assert driver.lookup(keys[0], context) is LookupResult.HIT


def test_stored_and_evicted_blocks_reach_vllms_kv_events(tiering: Make) -> None:
    manager, driver, _tier = tiering(capacity=PRIMARY)
    keys = fill(driver, 2 * PRIMARY)  # kvtier's disk holds 8: the first 8 are evicted
    with manager.lock:
        events = [event for event in manager.take_events() if event.medium is Medium.STORAGE]
    stored = {k for event in events if not event.removed for k in event.keys}
    removed = {k for event in events if event.removed for k in event.keys}
    assert stored == set(keys)
    assert removed == set(keys[:PRIMARY])
    context = driver.context()
    with manager.lock:
        manager.on_new_request(context)
    assert driver.lookup(keys[0], context) is LookupResult.MISS  # evicted by kvtier


def test_no_events_when_vllms_kv_events_are_off(tiering: Make) -> None:
    _manager, driver, tier = tiering(events=False)
    fill(driver, PRIMARY)
    assert list(tier.take_events()) == []


def test_after_shutdown_a_job_fails_and_is_reported_once(tiering: Make) -> None:
    manager, driver, tier = tiering()
    fill(driver, 2)
    tier.shutdown()
    context = driver.context()
    with manager.lock:
        manager.on_new_request(context)
    driver.store([key(50)], 50)
    driver.settle()
    late = [result for result in driver.results if result.job_id == max(driver.submitted)]
    assert [result.success for result in late] == [False]
    assert_reported_once(driver, tier)


def test_a_gpu_tier_in_the_config_is_refused(tmp_path: Path) -> None:
    chain = {"tiers": [{"name": "g", "medium": "gpu", "capacity": 4}]}
    extra = {"cpu_bytes_to_use": PRIMARY * CHUNK, "secondary_tiers": [kvtier_tier(chain)]}
    spec = TieringOffloadingSpec(offloading_config(extra, block_bytes=CHUNK))
    with pytest.raises(ConfigError, match="tier 'g': medium 'gpu' cannot be used under vLLM"):
        spec.get_manager()


def test_a_config_file_with_another_block_size_is_used_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "kvtier.toml"
    config.write_text(
        'block_size = "2MiB"\n[[tiers]]\nname = "disk"\nmedium = "disk"\n'
        f'capacity = "1MiB"\npath = "{tmp_path / "disk"}"\nfsync = false\n'
    )
    extra = {"cpu_bytes_to_use": PRIMARY * CHUNK, "secondary_tiers": [kvtier_tier(str(config))]}
    spec = TieringOffloadingSpec(offloading_config(extra, block_bytes=CHUNK))
    with caplog.at_level(logging.WARNING, logger="kvtier.integrations.vllm"):
        manager = spec.get_manager()
    try:
        tier = manager.secondary_tiers[0]
        (info,) = tier.hierarchy.tiers
        assert info.num_blocks == (1 << 20) // CHUNK  # 1 MiB of vLLM's 4 KiB chunks
        assert "block_size = '2MiB'" in caplog.text and f"{CHUNK} bytes" in caplog.text
    finally:
        manager.shutdown()
