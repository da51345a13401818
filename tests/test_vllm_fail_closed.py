"""Under vLLM 0.33, a kvtier disk tier whose directory is removed while vLLM runs fails
closed (issue 19, item 5), driven through vLLM's own `TieringOffloadingSpec` and
`TieringOffloadingManager`: the store jobs after the removal are reported failed to vLLM
(`JobResult.success` False, each once), the blocks kvtier held before are misses (not HITs
whose loads would fail), `stats().disabled_tiers` says why, and a restarted vLLM on the
same path finds nothing kvtier does not have."""

from __future__ import annotations

import collections
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm.v1.kv_offload.base import LookupResult
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm_support import Driver, disk_chain, key, kvtier_tier

from kvtier.integrations.vllm import KvtierSecondaryTier
from kvtier.integrations.vllm.testing import offloading_config

CHUNK = 4096
PRIMARY = 8


class Run:
    """vLLM's tiering manager with kvtier's disk tier (at `path`) below its CPU tier."""

    def __init__(self, path: Path) -> None:
        extra = {
            "cpu_bytes_to_use": PRIMARY * CHUNK,
            "secondary_tiers": [kvtier_tier(disk_chain(path, 64, fsync=True))],
        }
        spec = TieringOffloadingSpec(offloading_config(extra, block_bytes=CHUNK, events=True))
        self.manager: Any = spec.get_manager()
        tier = self.manager.secondary_tiers[0]
        assert isinstance(tier, KvtierSecondaryTier)
        self.tier = tier
        self.driver = Driver(self.manager)

    def fill(self, first: int, count: int) -> list[bytes]:
        """Store chunks first..first+count-1, a primary's worth at a time (so the earlier
        ones leave vLLM's CPU tier and live only in kvtier)."""
        keys = [key(first + i) for i in range(count)]
        for start in range(0, count, PRIMARY):
            self.driver.store(keys[start : start + PRIMARY], first + start)
            self.driver.settle()
        return keys

    def store_results(self) -> list[bool]:
        return [r.success for r in self.driver.results if r.job_id in self.driver.stores]

    def lookup(self, k: bytes) -> LookupResult:
        context = self.driver.context()
        with self.manager.lock:
            self.manager.on_new_request(context)
        return self.driver.lookup(k, context)

    def shutdown(self) -> None:
        self.driver.close()
        self.manager.shutdown()


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.shutdown()


def test_rm_rf_under_vllm_fails_the_store_jobs_and_claims_nothing(
    tmp_path: Path, runs: list[Run]
) -> None:
    path = tmp_path / "disk"
    run = Run(path)
    runs.append(run)
    early = run.fill(0, 2 * PRIMARY)
    assert all(run.store_results()) and len(run.store_results()) >= 2
    assert run.lookup(early[0]) is LookupResult.HIT  # only in kvtier now
    stored_before = len(run.store_results())

    (store_dir,) = path.glob("kvtier-*")
    shutil.rmtree(store_dir)
    run.fill(100, 2 * PRIMARY)

    after = run.store_results()[stored_before:]
    assert after and not any(after), after  # every store job after the removal failed
    counts = collections.Counter(run.driver.job_ids_reported())
    assert max(counts.values()) == 1 and set(counts) == run.driver.submitted
    stats = run.tier.hierarchy.stats()
    assert "was removed" in stats.disabled_tiers["disk"]  # its files: rm -rf
    assert stats.calls.put_stored == 2 * PRIMARY  # only the blocks stored before
    # What kvtier held is gone: a miss to recompute, not a HIT whose load would fail.
    assert run.lookup(early[0]) is LookupResult.MISS
    assert run.lookup(key(100)) is LookupResult.MISS

    run.shutdown()
    runs.remove(run)
    again = Run(path)  # a restarted vLLM on the same path
    runs.append(again)
    assert again.tier.hierarchy.stats().disabled_tiers == {}
    for k in early[:4] + [key(100 + i) for i in range(4)]:
        assert again.lookup(k) is LookupResult.MISS
