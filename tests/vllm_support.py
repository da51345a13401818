"""Driving vLLM 0.33's own offloading classes in tests: an `OffloadingConfig` without an
engine, and a `Driver` that plays the scheduler's part against a `TieringOffloadingManager`
(store chunks as the GPU worker would, step, look up until an answer, load).

Only tests/test_vllm_*.py import it; conftest.py leaves those out where vLLM is missing
(and fails CI then).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

if os.environ.get("CI") == "true":
    import vllm  # noqa: F401  (CI installs it: a missing vLLM must fail, not skip)
else:
    pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (scripts/setup.sh --vllm)")

import torch
from vllm.v1.kv_offload.base import (
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.tiering.base import JobResult

MODULE = "kvtier.integrations.vllm"


def disk_chain(path: os.PathLike[str] | str, capacity: int = 64, **disk: Any) -> dict[str, Any]:
    """A kvtier config of one disk tier (block size comes from vLLM)."""
    tier = {"name": "disk", "medium": "disk", "capacity": capacity, "path": str(path)}
    tier.update(disk)
    return {"tiers": [tier]}


def kvtier_tier(config: Any, **options: Any) -> dict[str, Any]:
    """A `secondary_tiers` entry naming kvtier's tier."""
    return {"type": "KvtierSecondaryTier", "module_path": MODULE, "config": config, **options}


def key(index: int, group: int = 0) -> bytes:
    """An OffloadKey as vLLM makes it: a 32-byte block hash and the group index."""
    return make_offload_key(index.to_bytes(4, "big") * 8, group)


def pattern(index: int, size: int) -> torch.Tensor:
    """Bytes of chunk `index`: different for every chunk and every byte position."""
    generator = torch.Generator().manual_seed(index)
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator)


class Driver:
    """Plays vLLM's scheduler against a TieringOffloadingManager whose GPU worker is this
    test: a store writes a chunk's bytes into the primary row vLLM allocated."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.primary = manager.primary_tier
        view = self.primary.get_kv_memoryview()
        self.rows = torch.frombuffer(view, dtype=torch.uint8).view(view.shape[0], -1)
        self.row_bytes = int(self.rows.shape[1])
        self._requests = 0
        self.results: list[JobResult] = []
        self.stores: set[int] = set()
        self.loads: set[int] = set()
        for tier in manager.secondary_tiers:
            self._record(tier)

    def _record(self, tier: Any) -> None:
        """Keep every JobResult a tier hands vLLM, to check each job is reported once."""
        original: Callable[[], Iterable[JobResult]] = tier.get_finished_jobs

        def recorded() -> list[JobResult]:
            results = list(original())
            self.results.extend(results)
            return results

        tier.get_finished_jobs = recorded
        submit_store, submit_load = tier.submit_store, tier.submit_load

        def store(job: Any) -> None:
            self.stores.add(job.job_id)
            submit_store(job)

        def load(job: Any) -> None:
            self.loads.add(job.job_id)
            submit_load(job)

        tier.submit_store, tier.submit_load = store, load

    def close(self) -> None:
        """Drop the view of vLLM's region, so vLLM can unmap it at shutdown."""
        del self.rows

    def context(self) -> ReqContext:
        self._requests += 1
        return ReqContext(req_id=f"req-{self._requests}")

    def step(self) -> None:
        with self.manager.lock:
            self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))

    def store(self, keys: Sequence[bytes], first: int) -> None:
        """One request storing `keys` (chunk i's bytes are `pattern(first + i)`)."""
        context = self.context()
        with self.manager.lock:
            self.manager.on_new_request(context)
            out = self.manager.prepare_store(list(keys), context)
            assert out is not None, "the primary tier refused the store"
            stored = set(out.keys_to_store)
            for chunk, k in zip(out.store_spec.block_ids, out.keys_to_store, strict=True):
                self.rows[int(chunk)] = pattern(first + list(keys).index(k), self.row_bytes)
            self.manager.complete_store(list(stored), context)
            self.manager.on_request_finished(context)
        self.step()

    def settle(self, timeout_s: float = 30.0) -> None:
        """Step until no secondary job is in flight."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.manager.lock:
                self.manager._process_finished_jobs()
                busy = bool(self.manager._jobs) or any(
                    tier.has_pending_work() for tier in self.manager.secondary_tiers
                )
            if not busy:
                return
            self.step()
            time.sleep(0.005)
        raise AssertionError("secondary jobs still in flight after the deadline")

    def lookup(self, k: bytes, context: ReqContext, timeout_s: float = 30.0) -> LookupResult:
        """Look `k` up as the scheduler does, stepping until the answer is not RETRY or
        HIT_PENDING (promotions finish between steps)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.manager.lock:
                result = self.manager.lookup(k, context)
            if result not in (LookupResult.RETRY, LookupResult.HIT_PENDING):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"lookup of {k!r} still {result} after the deadline")
            self.step()
            time.sleep(0.002)

    def read(self, k: bytes, context: ReqContext) -> torch.Tensor:
        """The bytes of `k` in the primary tier (after a HIT), as the GPU worker would load
        them."""
        with self.manager.lock:
            spec = self.manager.prepare_load([k], context)
            data = self.rows[int(spec.block_ids[0])].clone()
            self.manager.complete_load([k], context)
        return data

    def job_ids_reported(self) -> list[int]:
        return [result.job_id for result in self.results]

    @property
    def submitted(self) -> set[int]:
        return self.stores | self.loads
