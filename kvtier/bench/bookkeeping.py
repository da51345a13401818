"""Bookkeeping throughput: kvtier's `TierManager` against vLLM 0.33.0's CPU offloading manager.

A benchmark that prints figures; it asserts nothing about speed.

What is measured
----------------
The shipped Mooncake conversation trace (12,031 requests, 288,500 block accesses, 182,790
unique blocks) is replayed request by request, as a serving engine's scheduler drives an
offloading tier:

1. ``lookup``: look the request's blocks up in order until the first one that is not a ready
   hit (a prefix lookup). One op per `lookup` call, the failing one included.
2. ``load``: the hit prefix (if any) is pinned (`prepare_load`), marked recently used
   (`touch`) and unpinned (`complete_load`). One op per key of the prefix.
3. ``store``: the rest of the request (if any) is offered to `prepare_store`, which evicts by
   policy to make room, and the keys it chose are made ready (`complete_store`). One op per key
   offered to `prepare_store` (so load ops + store ops == block accesses).

Each phase is timed on its own with `time.perf_counter_ns`, accumulated over the replay: one
clock read before and after each phase of each request. The cost of a clock read, calibrated
once per benchmark (median of back-to-back reads), is subtracted from every timed interval,
the same for both contenders; ``raw_ns`` keeps the uncorrected figure. The driver code between
the clock reads (the prefix loop, two list slices, bound-method calls) is identical for both
contenders and is counted in their phases. Capacity is ``floor(fraction * unique blocks)``;
every replay starts from a fresh manager; each figure is the median of `repeats` replays, the
contenders alternating (and swapping order every repeat) so that drift on a noisy machine hits
both. The garbage collector is collected before and disabled during a timed replay, as
`timeit` does. Events are enabled on both managers (kvtier's default) and drained after every
request, outside the timed phases. The hit count is the number of blocks served from the tier
(the sum of the hit-prefix lengths).

Contenders
----------
``kvtier``: `kvtier.manager.tier.make_tier_manager(capacity, ..., policy)`, the manager the
product uses, over kvtier's `LRUCachePolicy` / `ARCCachePolicy`.

``vllm``: `VllmReferenceManager` below, a copy of vLLM 0.33.0's `CPUOffloadingManager`
(`vllm/v1/kv_offload/cpu/manager.py`) driving vLLM's own policy classes
(`vllm.v1.kv_offload.cpu.policies.lru/arc`), imported lazily. vLLM's manager module itself
cannot be imported without vLLM's full dependency tree, so its methods are reproduced here; see
the class docstring for exactly what was kept and dropped (everything dropped makes the vLLM
figures faster, not slower, than the real manager's). When vLLM is not installed the benchmark
reports kvtier alone; ``benchmarks/install-vllm-reference.sh`` installs it.

LRU hit counts must be equal between the two (same protocol, same recency order); ARC
implementations differ (kvtier follows the ARC paper, vLLM's does not), so their hit ratios are
only reported side by side.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager.base import ReqContext
from kvtier.manager.tier import make_tier_manager

PHASES: tuple[str, ...] = ("lookup", "load", "store")
"""The timed phases of a request, in the order the driver runs them."""

OVERALL = "all"
"""The phase name of the rows that sum the three phases."""

DEFAULT_FRACTIONS: tuple[float, ...] = (0.01, 0.10, 0.50)
DEFAULT_POLICIES: tuple[str, ...] = ("lru", "arc")
QUICK_LIMIT_REQUESTS = 2000
"""Trace prefix (requests) replayed by ``--quick``."""

VLLM_REFERENCE_VERSION = "0.33.0"
VLLM_MISSING_NOTE = (
    f"vLLM {VLLM_REFERENCE_VERSION} is not installed: kvtier figures only "
    "(to compare, run benchmarks/install-vllm-reference.sh, which runs "
    f"`$VENV/bin/python -m pip install vllm=={VLLM_REFERENCE_VERSION} --no-deps "
    "msgspec packaging`)."
)

_BLOCK_SIZE = 16  # tokens per block given to the kvtier tier; bookkeeping never reads it
_JSON_FORMAT = "kvtier.bench.bookkeeping/1"


# -- results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Measurement:
    """One contender's figures for one (policy, capacity, phase).

    `ns` is the median over repeats of the phase's time, clock overhead subtracted; `raw_ns`
    the same without the subtraction; `runs_ns` every repeat's corrected time. `intervals` is
    the number of timed intervals per replay (one per request that ran the phase). `hits`,
    `accesses`, `failed_stores` (prepare_store returned None) and `resident_digest` (of the
    keys resident at the end) describe the whole replay and repeat across its phases.
    """

    ops: int
    ns: int
    raw_ns: int
    intervals: int
    runs_ns: tuple[int, ...]
    hits: int
    accesses: int
    failed_stores: int
    resident_digest: str

    @property
    def mops(self) -> float:
        """Millions of block-operations per second."""
        return self.ops * 1e3 / self.ns if self.ns > 0 else math.inf

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0


@dataclass(frozen=True, slots=True)
class Result:
    """One row: a policy at a capacity, one phase (or `OVERALL`), both contenders."""

    policy: str
    fraction: float
    capacity: int
    phase: str
    requests: int
    unique_blocks: int
    repeats: int
    timer_overhead_ns: float
    kvtier: Measurement
    vllm: Measurement | None

    @property
    def kvtier_mops(self) -> float:
        return self.kvtier.mops

    @property
    def vllm_mops(self) -> float | None:
        return None if self.vllm is None else self.vllm.mops

    @property
    def ratio(self) -> float | None:
        """kvtier throughput / vLLM throughput (None without vLLM)."""
        if self.vllm is None:
            return None
        return self.kvtier.mops / self.vllm.mops

    @property
    def hit_ratio(self) -> float:
        """kvtier's hit ratio (blocks served from the tier / block accesses)."""
        return self.kvtier.hit_ratio

    @property
    def vllm_hit_ratio(self) -> float | None:
        return None if self.vllm is None else self.vllm.hit_ratio

    @property
    def hits_agree(self) -> bool | None:
        """For LRU, whether both contenders hit the same blocks (hit counts and final resident
        sets equal); None where not compared (ARC, or no vLLM)."""
        if self.vllm is None or self.policy != "lru":
            return None
        return (
            self.kvtier.hits == self.vllm.hits
            and self.kvtier.resident_digest == self.vllm.resident_digest
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kvtier_mops"] = self.kvtier_mops
        data["vllm_mops"] = self.vllm_mops
        data["ratio"] = self.ratio
        data["hits_agree"] = self.hits_agree
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        def measurement(raw: dict[str, Any] | None) -> Measurement | None:
            if raw is None:
                return None
            fields = {name: raw[name] for name in Measurement.__dataclass_fields__}
            fields["runs_ns"] = tuple(fields["runs_ns"])
            return Measurement(**fields)

        kvtier = measurement(data["kvtier"])
        if kvtier is None:
            raise ValueError("a result needs kvtier figures")
        return cls(
            policy=data["policy"],
            fraction=data["fraction"],
            capacity=data["capacity"],
            phase=data["phase"],
            requests=data["requests"],
            unique_blocks=data["unique_blocks"],
            repeats=data["repeats"],
            timer_overhead_ns=data["timer_overhead_ns"],
            kvtier=kvtier,
            vllm=measurement(data["vllm"]),
        )


def results_to_json(results: Sequence[Result]) -> str:
    """A JSON document of `results` (with derived Mops/s and ratios), for machines."""
    document = {
        "format": _JSON_FORMAT,
        "unit": "block-operations per second (Mops/s = millions)",
        "vllm_reference_version": VLLM_REFERENCE_VERSION,
        # the version this process compared with (None when it did not import vLLM)
        "vllm_installed_version": _vllm_version,
        "results": [result.to_dict() for result in results],
    }
    return json.dumps(document, indent=2)


def results_from_json(text: str) -> list[Result]:
    """The results of a document written by `results_to_json`."""
    document = json.loads(text)
    if document.get("format") != _JSON_FORMAT:
        raise ValueError(f"not a {_JSON_FORMAT} document")
    return [Result.from_dict(row) for row in document["results"]]


# -- vLLM 0.33.0 reference -----------------------------------------------------------------

# vLLM's classes, bound by `_import_vllm` as module globals so that the reference manager's
# methods reach them as vLLM's own module does (a global lookup).
ChunkStatus: Any = None
CPULoadStoreSpec: Any = None
LookupResult: Any = None
OffloadingEvent: Any = None
PrepareStoreOutput: Any = None
VllmMedium: Any = None
VllmReqContext: Any = None
_VLLM_POLICIES: dict[str, Any] = {}
_vllm_import_error: str | None = None
_vllm_version: str | None = None


def _import_vllm() -> bool:
    """Import vLLM's offloading policies (once); False when vLLM is not installed."""
    global ChunkStatus, CPULoadStoreSpec, LookupResult, OffloadingEvent, PrepareStoreOutput
    global VllmMedium, VllmReqContext, _vllm_import_error, _vllm_version
    if _VLLM_POLICIES:
        return True
    if _vllm_import_error is not None:
        return False
    try:
        import vllm
        from vllm.v1.kv_offload import base as vbase
        from vllm.v1.kv_offload.cpu import common as vcommon
        from vllm.v1.kv_offload.cpu.policies import arc as varc
        from vllm.v1.kv_offload.cpu.policies import base as vpolicy_base
        from vllm.v1.kv_offload.cpu.policies import lru as vlru
    except ImportError as error:
        _vllm_import_error = f"{type(error).__name__}: {error}"
        return False
    ChunkStatus = vpolicy_base.ChunkStatus
    CPULoadStoreSpec = vcommon.CPULoadStoreSpec
    LookupResult = vbase.LookupResult
    OffloadingEvent = vbase.OffloadingEvent
    PrepareStoreOutput = vbase.PrepareStoreOutput
    VllmMedium = vbase.Medium
    VllmReqContext = vbase.ReqContext
    _vllm_version = str(getattr(vllm, "__version__", "unknown"))
    _VLLM_POLICIES.update(lru=vlru.LRUCachePolicy, arc=varc.ARCCachePolicy)
    return True


def vllm_available() -> bool:
    """Whether vLLM's offloading policies can be imported."""
    return _import_vllm()


def vllm_version() -> str | None:
    """The installed vLLM version, or None when vLLM cannot be imported."""
    return _vllm_version if _import_vllm() else None


class VllmReferenceManager:
    """vLLM 0.33.0's `CPUOffloadingManager`, reproduced for the calls this benchmark makes.

    Source: `vllm/v1/kv_offload/cpu/manager.py` of vllm==0.33.0. The policies, `ChunkStatus`,
    `CPULoadStoreSpec`, `LookupResult`, `OffloadingEvent`, `PrepareStoreOutput` and
    `ReqContext` are vLLM's own classes; the method bodies below are vLLM's, statement for
    statement, except what is listed as dropped.

    Kept: the chunk pool (`_num_allocated_chunks`, `_free_list`, `_allocate_chunks`,
    `_free_chunk`, `_get_load_store_spec` building a `CPULoadStoreSpec`);
    `lookup` (`policy.get`, `LookupResult`); `prepare_load` through `_prepare_load` (ref-count
    pin, `mark_non_evictable` on 0 -> 1, `_num_evictable_cache_chunks`); `touch`
    (`policy.touch(keys, req_context)`); `complete_load` (unpin, `mark_evictable` on 1 -> 0);
    `prepare_store` (partition into keys to store and ready existing keys, `on_store_miss`,
    the `_num_evictable_cache_chunks` fast fail, `evict(n, protected=set(keys))`, freeing the
    victims' chunks, the eviction event, allocation, `insert(key, chunk, req_context)`,
    `_num_write_pending_chunks`); `complete_store` (success and failure paths,
    `mark_evictable`, events); `take_events`. The `store_threshold` admission filter is off by
    default in vLLM (`counts is None`); its `if self.counts is not None` checks are kept, its
    body (`_record_accesses`) is not.

    Dropped (request-access tracking, which lives in the heavy module, and metrics):
    `_record_request_cache_access` and with it `policy.on_request_access`;
    `on_request_finished` (vLLM's deferred recency commit); the per-request
    `_RequestCacheAccess` state of `prepare_store`, i.e. the `store_miss_keys` de-duplication
    of `on_store_miss` (a no-op here: each request calls `prepare_store` once, so every miss
    is new) and the `inserted_keys` bookkeeping; `allocation_sizes_in_current_batch`,
    `get_stats`, `config_info`, `reset_cache`, `on_new_request`, `get_load_source`. No
    offload-key positions are recorded in the `ReqContext` (the scheduler would), so vLLM's LRU
    ranks insertions in call order, as kvtier's LRU does. Every dropped piece is work the real
    manager does on top, so these figures overstate vLLM's throughput, if anything.
    """

    def __init__(
        self, num_chunks: int, cache_policy: str = "lru", enable_events: bool = False
    ) -> None:
        if not _import_vllm():
            raise RuntimeError(VLLM_MISSING_NOTE)
        self.medium: Any = VllmMedium.CPU
        self._num_chunks: int = num_chunks
        self._num_allocated_chunks: int = 0
        self._free_list: list[int] = []
        self.events: list[Any] | None = [] if enable_events else None
        policy_cls = _VLLM_POLICIES[cache_policy]
        self._policy: Any = policy_cls(cache_capacity=num_chunks)
        # Track the number of chunks in the cache that are evictable. i.e. ref_cnt 0.
        self._num_evictable_cache_chunks: int = 0
        # Track chunks with an in-flight store (ref_cnt -1, not yet completed).
        self._num_write_pending_chunks: int = 0
        # store_threshold == 1 (vLLM's default): no admission tracker.
        self.counts: dict[OffloadKey, int] | None = None

    @property
    def policy(self) -> Any:
        return self._policy

    def resident_keys(self) -> list[OffloadKey]:
        """Keys resident now (for the agreement check; not timed)."""
        policy = self._policy
        if hasattr(policy, "chunks"):  # LRU
            return list(policy.chunks)
        return [*policy.t1, *policy.t2]  # ARC

    # --- chunk pool ---

    def _get_num_free_chunks(self) -> int:
        return len(self._free_list) + self._num_chunks - self._num_allocated_chunks

    def _allocate_chunks(self, keys: list[OffloadKey]) -> list[Any]:
        num_fresh = min(len(keys), self._num_chunks - self._num_allocated_chunks)
        num_reused = len(keys) - num_fresh
        assert len(self._free_list) >= num_reused

        # allocate fresh chunks
        chunks: list[Any] = []
        for _ in range(num_fresh):
            chunks.append(ChunkStatus(self._num_allocated_chunks))
            self._num_allocated_chunks += 1

        # allocate reused chunks
        for _ in range(num_reused):
            chunks.append(ChunkStatus(self._free_list.pop()))
        return chunks

    def _free_chunk(self, chunk: Any) -> None:
        self._free_list.append(chunk.chunk_id)

    def _get_load_store_spec(self, keys: Iterable[OffloadKey], chunks: Iterable[Any]) -> Any:
        return CPULoadStoreSpec([chunk.chunk_id for chunk in chunks])

    # --- OffloadingManager interface ---

    def lookup(self, key: OffloadKey, req_context: Any) -> Any:
        chunk = self._policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        if not chunk.is_ready:
            return LookupResult.HIT_PENDING
        return LookupResult.HIT

    def prepare_load(self, keys: Collection[OffloadKey], req_context: Any) -> Any:
        return self._prepare_load(keys, req_context, record_access=True)

    def _prepare_load(
        self, keys: Collection[OffloadKey], req_context: Any, *, record_access: bool
    ) -> Any:
        chunks = []
        for key in keys:
            chunk = self._policy.get(key)
            assert chunk is not None, f"Chunk {key!r} not found in cache"
            assert chunk.is_ready, f"Chunk {key!r} is not ready for reading"
            if chunk.ref_cnt == 0:
                self._policy.mark_non_evictable(key)
                self._num_evictable_cache_chunks -= 1  # ref_cnt 0 -> 1
                assert self._num_evictable_cache_chunks >= 0
            chunk.ref_cnt += 1
            chunks.append(chunk)
        # dropped: if record_access: self._record_request_cache_access(...)
        return self._get_load_store_spec(keys, chunks)

    def touch(self, keys: Collection[OffloadKey], req_context: Any) -> None:
        self._policy.touch(keys, req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: Any) -> None:
        for key in keys:
            chunk = self._policy.get(key)
            assert chunk is not None, f"Chunk {key!r} not found"
            assert chunk.ref_cnt > 0, f"Chunk {key!r} ref_cnt is already 0"
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self._num_evictable_cache_chunks += 1  # ref_cnt 1 -> 0
                self._policy.mark_evictable(key)

    def prepare_store(self, keys: Collection[OffloadKey], req_context: Any) -> Any:
        keys = list(keys)
        if self.counts is not None:
            raise NotImplementedError("store_threshold >= 2 is not reproduced")
        keys_to_store: list[OffloadKey] = []
        ready_existing_keys: list[OffloadKey] = []
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None:
                keys_to_store.append(key)
            else:
                if chunk.is_ready:
                    ready_existing_keys.append(key)

        if self.counts is not None:
            raise NotImplementedError("store_threshold >= 2 is not reproduced")

        # vLLM de-duplicates against the request's earlier store misses here (dropped: one
        # prepare_store per request makes every miss new).
        new_store_misses = keys_to_store
        if new_store_misses:
            # ARC learns from B1/B2 before insert() removes the ghost entry.
            self._policy.on_store_miss(new_store_misses, req_context)
        # dropped: self._record_request_cache_access(...) of the offered keys.

        if not keys_to_store:
            return PrepareStoreOutput(
                keys_to_store=[],
                store_spec=self._get_load_store_spec([], []),
                evicted_keys=[],
            )

        # dropped (metrics): self.allocation_sizes_in_current_batch.append(len(keys_to_store))
        num_chunks_to_evict = len(keys_to_store) - self._get_num_free_chunks()

        to_evict: list[OffloadKey] = []
        if num_chunks_to_evict > 0:
            if num_chunks_to_evict > self._num_evictable_cache_chunks:
                # Eviction will fail.
                return None
            # Chunks from the original input are excluded from eviction candidates.
            protected = set(keys)
            evicted = self._policy.evict(num_chunks_to_evict, protected)
            if evicted is None:
                return None

            # cache-policy removes only idle chunks.
            self._num_evictable_cache_chunks -= len(evicted)
            assert self._num_evictable_cache_chunks >= 0

            for key, chunk in evicted:
                self._free_chunk(chunk)
                to_evict.append(key)

        if to_evict and self.events is not None:
            self.events.append(OffloadingEvent(keys=to_evict, medium=self.medium, removed=True))

        chunks = self._allocate_chunks(keys_to_store)
        assert len(chunks) == len(keys_to_store), (
            "Chunk pool did not allocate the expected number of chunks"
        )

        for key, chunk in zip(keys_to_store, chunks):  # noqa: B905 (as in vLLM)
            self._policy.insert(key, chunk, req_context)
        self._num_write_pending_chunks += len(keys_to_store)
        # dropped: state.inserted_keys.update(keys_to_store)

        # build store specs for allocated chunks
        store_spec = self._get_load_store_spec(keys_to_store, chunks)

        return PrepareStoreOutput(
            keys_to_store=keys_to_store,
            store_spec=store_spec,
            evicted_keys=to_evict,
        )

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: Any, success: bool = True
    ) -> None:
        stored_keys: list[OffloadKey] = []
        removed_keys: list[OffloadKey] = []

        if success:
            for key in keys:
                chunk = self._policy.get(key)
                if chunk is not None and not chunk.is_ready:
                    chunk.ref_cnt = 0
                    self._num_write_pending_chunks -= 1
                    self._num_evictable_cache_chunks += 1
                    self._policy.mark_evictable(key)
                    stored_keys.append(key)
        else:
            for key in keys:
                chunk = self._policy.get(key)
                if chunk is not None and not chunk.is_ready:
                    self._num_write_pending_chunks -= 1
                    self._policy.remove(key)
                    self._free_chunk(chunk)
                    removed_keys.append(key)

        if removed_keys and self.events is not None:
            self.events.append(
                OffloadingEvent(
                    keys=removed_keys, medium=self.medium, removed=True, metadata_only=True
                )
            )

        if stored_keys and self.events is not None:
            self.events.append(OffloadingEvent(keys=stored_keys, medium=self.medium, removed=False))

    def take_events(self) -> Iterator[Any]:
        if self.events is None:
            return
        events, self.events = self.events, []
        for event in events:
            if event.metadata_only:
                keys = [key for key in event.keys if self._policy.get(key) is None]
                if not keys:
                    continue
                event = replace(event, keys=keys)
            yield event


# -- the driver ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Contender:
    """How the driver builds and talks to one implementation."""

    name: str
    make_manager: Callable[[int, str], Any]
    make_context: Callable[[str], Any]
    hit: Any  # what `lookup` returns for a ready hit (compared with `is`)
    resident_keys: Callable[[Any], list[OffloadKey]]


@dataclass(slots=True)
class _Replay:
    """What one replay counted and timed, per phase (in `PHASES` order)."""

    ns: list[int]
    ops: list[int]
    intervals: list[int]
    hits: int
    accesses: int
    failed_stores: int
    resident_digest: str


def _kvtier_contender() -> _Contender:
    def make_manager(capacity: int, policy: str) -> Any:
        return make_tier_manager(capacity, _BLOCK_SIZE, "cpu", policy, name="bench")

    return _Contender(
        name="kvtier",
        make_manager=make_manager,
        make_context=lambda req_id: ReqContext(req_id=req_id),
        hit=True,
        resident_keys=lambda manager: [key for key, _ in manager.policy.items()],
    )


def _vllm_contender() -> _Contender:
    def make_manager(capacity: int, policy: str) -> Any:
        return VllmReferenceManager(capacity, policy, enable_events=True)

    return _Contender(
        name="vllm",
        make_manager=make_manager,
        make_context=lambda req_id: VllmReqContext(req_id=req_id),
        hit=LookupResult.HIT,
        resident_keys=lambda manager: manager.resident_keys(),
    )


def replay(
    manager: Any,
    hit: Any,
    requests: Sequence[Sequence[OffloadKey]],
    contexts: Sequence[Any],
    clock: Callable[[], int] = time.perf_counter_ns,
) -> tuple[list[int], list[int], list[int], int, int]:
    """Drive `manager` over `requests` as a serving engine would; time each phase.

    Returns (ns, ops, intervals) per phase in `PHASES` order, the hit count (blocks served
    from the tier) and the number of requests whose `prepare_store` returned None.
    """
    lookup = manager.lookup
    prepare_load, touch, complete_load = (
        manager.prepare_load,
        manager.touch,
        manager.complete_load,
    )
    prepare_store, complete_store = manager.prepare_store, manager.complete_store
    take_events = manager.take_events
    lookup_ns = load_ns = store_ns = 0
    lookup_ops = load_ops = store_ops = 0
    load_intervals = store_intervals = 0
    hits = failed_stores = 0
    for keys, ctx in zip(requests, contexts, strict=True):
        n = len(keys)
        t0 = clock()
        h = 0
        while h < n and lookup(keys[h], ctx) is hit:
            h += 1
        t1 = clock()
        lookup_ns += t1 - t0
        lookup_ops += h + 1 if h < n else h
        if h:
            t1 = clock()
            prefix = keys[:h]
            prepare_load(prefix, ctx)
            touch(prefix, ctx)
            complete_load(prefix, ctx)
            t2 = clock()
            load_ns += t2 - t1
            load_ops += h
            load_intervals += 1
            hits += h
        if h < n:
            t2 = clock()
            rest = keys[h:]
            output = prepare_store(rest, ctx)
            if output is not None:
                complete_store(output.keys_to_store, req_context=ctx)
            t3 = clock()
            store_ns += t3 - t2
            store_ops += n - h
            store_intervals += 1
            if output is None:
                failed_stores += 1
        for _ in take_events():
            pass
    return (
        [lookup_ns, load_ns, store_ns],
        [lookup_ops, load_ops, store_ops],
        [len(requests), load_intervals, store_intervals],
        hits,
        failed_stores,
    )


def _run_once(
    contender: _Contender,
    policy: str,
    capacity: int,
    requests: Sequence[Sequence[OffloadKey]],
) -> _Replay:
    manager = contender.make_manager(capacity, policy)
    contexts = [contender.make_context(f"req-{index}") for index in range(len(requests))]
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        ns, ops, intervals, hits, failed = replay(manager, contender.hit, requests, contexts)
    finally:
        if gc_was_enabled:
            gc.enable()
    digest = hashlib.sha256(b"".join(sorted(contender.resident_keys(manager)))).hexdigest()
    return _Replay(
        ns=ns,
        ops=ops,
        intervals=intervals,
        hits=hits,
        accesses=sum(len(keys) for keys in requests),
        failed_stores=failed,
        resident_digest=digest[:16],
    )


def clock_overhead_ns(samples: int = 20001) -> float:
    """The median time between two back-to-back `perf_counter_ns` reads, as the driver reads
    them (the overhead each timed interval carries)."""
    clock = time.perf_counter_ns
    deltas = []
    for _ in range(samples):
        t0 = clock()
        t1 = clock()
        deltas.append(t1 - t0)
    return float(statistics.median(deltas))


def _median_int(values: Iterable[int]) -> int:
    return round(statistics.median(values))


def _measurements(replays: list[_Replay], overhead_ns: float) -> dict[str, Measurement]:
    """Per phase (and `OVERALL`), the median figures of a contender's replays."""
    first = replays[0]
    for other in replays[1:]:
        if (other.hits, other.ops, other.resident_digest) != (
            first.hits,
            first.ops,
            first.resident_digest,
        ):
            raise RuntimeError("two replays of the same configuration diverged")

    def corrected(run: _Replay, index: int) -> int:
        return max(1, round(run.ns[index] - run.intervals[index] * overhead_ns))

    def build(ops: int, intervals: int, runs: list[int], raw: list[int]) -> Measurement:
        return Measurement(
            ops=ops,
            ns=_median_int(runs),
            raw_ns=_median_int(raw),
            intervals=intervals,
            runs_ns=tuple(runs),
            hits=first.hits,
            accesses=first.accesses,
            failed_stores=first.failed_stores,
            resident_digest=first.resident_digest,
        )

    out: dict[str, Measurement] = {}
    for index, phase in enumerate(PHASES):
        out[phase] = build(
            first.ops[index],
            first.intervals[index],
            [corrected(run, index) for run in replays],
            [run.ns[index] for run in replays],
        )
    out[OVERALL] = build(
        sum(first.ops),
        sum(first.intervals),
        [sum(corrected(run, index) for index in range(len(PHASES))) for run in replays],
        [sum(run.ns) for run in replays],
    )
    return out


# -- the trace -----------------------------------------------------------------------------


def load_requests(
    limit_requests: int | None = None, path: str | Path | None = None
) -> list[list[int]]:
    """The hash ids of each request of a Mooncake trace (default: the shipped one), in order;
    only the first `limit_requests` requests when given."""
    from kvtier.workloads.traces import read_mooncake

    requests: Iterable[Any] = read_mooncake(path)
    if limit_requests is not None:
        if limit_requests < 1:
            raise ValueError(f"limit_requests must be positive, got {limit_requests}")
        requests = itertools.islice(requests, limit_requests)
    return [list(request.hash_ids) for request in requests]


def keys_for(requests: Iterable[Iterable[int]]) -> list[list[OffloadKey]]:
    """Offload keys for the requests' hash ids, one shared (and pre-hashed) key per id."""
    interned: dict[int, OffloadKey] = {}
    out: list[list[OffloadKey]] = []
    for hash_ids in requests:
        row: list[OffloadKey] = []
        for hash_id in hash_ids:
            key = interned.get(hash_id)
            if key is None:
                key = interned[hash_id] = key_from_int(hash_id)
                hash(key)  # bytes cache their hash: no contender pays for the first one
            row.append(key)
        out.append(row)
    return out


def capacity_for(fraction: float, unique_blocks: int) -> int:
    """`floor(fraction * unique_blocks)`, at least one block."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a capacity fraction must be in (0, 1], got {fraction}")
    return max(1, math.floor(fraction * unique_blocks))


# -- the benchmark -------------------------------------------------------------------------


def run_bookkeeping_benchmark(
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    policies: Sequence[str] = DEFAULT_POLICIES,
    repeats: int = 3,
    limit_requests: int | None = None,
    *,
    include_vllm: bool | None = None,
    trace_path: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Result]:
    """Replay the trace through kvtier (and vLLM, when installed) for every policy and
    capacity fraction; one `Result` per (policy, fraction, phase), phases then `OVERALL`.

    `include_vllm`: None compares with vLLM when it is installed; True requires it (raises
    RuntimeError when missing); False measures kvtier alone. `progress` receives a line per
    configuration.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    with_vllm = _import_vllm() if include_vllm is None else include_vllm
    if with_vllm and not _import_vllm():
        raise RuntimeError(VLLM_MISSING_NOTE)
    hash_ids = load_requests(limit_requests, trace_path)
    requests = keys_for(hash_ids)
    unique_blocks = len({key for keys in requests for key in keys})
    contenders = [_kvtier_contender()]
    if with_vllm:
        contenders.append(_vllm_contender())
    overhead_ns = clock_overhead_ns()

    results: list[Result] = []
    for policy in policies:
        for fraction in fractions:
            capacity = capacity_for(fraction, unique_blocks)
            replays: dict[str, list[_Replay]] = {contender.name: [] for contender in contenders}
            for repeat in range(repeats):
                order = contenders if repeat % 2 == 0 else contenders[::-1]
                for contender in order:
                    replays[contender.name].append(_run_once(contender, policy, capacity, requests))
            kvtier = _measurements(replays["kvtier"], overhead_ns)
            vllm = _measurements(replays["vllm"], overhead_ns) if with_vllm else None
            for phase in (*PHASES, OVERALL):
                results.append(
                    Result(
                        policy=policy,
                        fraction=fraction,
                        capacity=capacity,
                        phase=phase,
                        requests=len(requests),
                        unique_blocks=unique_blocks,
                        repeats=repeats,
                        timer_overhead_ns=overhead_ns,
                        kvtier=kvtier[phase],
                        vllm=None if vllm is None else vllm[phase],
                    )
                )
            if progress is not None:
                row = results[-1]
                line = f"{policy} {fraction:.0%}: kvtier {row.kvtier_mops:.2f} Mops/s"
                if row.vllm_mops is not None:
                    line += f", vLLM {row.vllm_mops:.2f} Mops/s"
                progress(line)
    return results


# -- output --------------------------------------------------------------------------------


def _percent(fraction: float) -> str:
    text = f"{fraction * 100:.2f}".rstrip("0").rstrip(".")
    return f"{text}%"


def format_table(results: Sequence[Result]) -> str:
    """A plain-text table of `results`, a hit-count check, and notes."""
    if not results:
        return "no results"
    first = results[0]
    with_vllm = any(result.vllm is not None for result in results)
    header = [
        "policy",
        "capacity",
        "blocks",
        "phase",
        "ops",
        "kvtier Mops/s",
        "vLLM Mops/s",
        "kvtier/vLLM",
        "hit ratio kvtier",
        "hit ratio vLLM",
    ]
    rows: list[list[str]] = []
    for result in results:
        rows.append(
            [
                result.policy,
                _percent(result.fraction),
                f"{result.capacity:,}",
                result.phase,
                f"{result.kvtier.ops:,}",
                f"{result.kvtier_mops:.3f}",
                "-" if result.vllm_mops is None else f"{result.vllm_mops:.3f}",
                "-" if result.ratio is None else f"{result.ratio:.2f}x",
                f"{result.hit_ratio:.4f}",
                "-" if result.vllm_hit_ratio is None else f"{result.vllm_hit_ratio:.4f}",
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    left = {0, 3}

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i in left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    accesses = first.kvtier.accesses
    out = [
        f"Bookkeeping throughput: {first.requests:,} requests, {accesses:,} block accesses, "
        f"{first.unique_blocks:,} unique blocks; median of {first.repeats} replay(s); "
        "Mops/s = million block-operations per second",
        line(header),
        line(["-" * width for width in widths]),
    ]
    previous: tuple[str, float] | None = None
    for result, row in zip(results, rows, strict=True):
        group = (result.policy, result.fraction)
        if previous is not None and group != previous:
            out.append("")
        previous = group
        out.append(line(row))

    overall = [result for result in results if result.phase == OVERALL]
    if with_vllm:
        out.append("")
        out.append("Hit counts (blocks served from the tier):")
        for result in overall:
            assert result.vllm is not None
            agree = result.hits_agree
            if agree is None:
                verdict = "not compared (the ARC implementations differ)"
            elif agree:
                verdict = "agree (hit counts and final resident sets)"
            else:
                verdict = "!!! DISAGREE: the LRU replays diverged; the comparison is invalid !!!"
            out.append(
                f"  {result.policy} {_percent(result.fraction):>4}: kvtier "
                f"{result.kvtier.hits:,}  vLLM {result.vllm.hits:,}  {verdict}"
            )
        ratios = [result.ratio for result in results if result.ratio is not None]
        if ratios:
            out.append(f"kvtier/vLLM throughput: min {min(ratios):.2f}x, max {max(ratios):.2f}x")
    else:
        out.append("")
        out.append(VLLM_MISSING_NOTE)
    failed = {
        (result.policy, result.fraction): result.kvtier.failed_stores
        for result in overall
        if result.kvtier.failed_stores
    }
    if failed:
        shown = ", ".join(f"{p} {_percent(f)}: {n}" for (p, f), n in failed.items())
        out.append(f"Requests whose store could not be placed (larger than the tier): {shown}")
    share = max(
        (
            result.kvtier.intervals * first.timer_overhead_ns / result.kvtier.raw_ns
            for result in results
            if result.kvtier.raw_ns
        ),
        default=0.0,
    )
    out.append(
        f"Clock overhead {first.timer_overhead_ns:.0f} ns per timed interval, subtracted "
        f"(at most {share:.0%} of a kvtier phase's raw time)."
    )
    return "\n".join(out)


def lru_disagreements(results: Sequence[Result]) -> list[Result]:
    """The LRU rows whose hit counts or resident sets differ between kvtier and vLLM."""
    return [result for result in results if result.hits_agree is False]


# -- command line --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`python benchmarks/bookkeeping.py [--quick] [--json [PATH]] ...`"""
    parser = argparse.ArgumentParser(
        prog="benchmarks/bookkeeping.py",
        description="Bookkeeping throughput (block-operations/s) of kvtier's TierManager "
        "against vLLM 0.33.0's CPU offloading manager, replaying the shipped Mooncake trace.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"replay the first {QUICK_LIMIT_REQUESTS} requests once (repeats=1)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="replays per figure (3)")
    parser.add_argument("--limit-requests", type=int, default=None, help="trace prefix")
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=list(DEFAULT_FRACTIONS),
        help="capacities as fractions of the unique blocks (0.01 0.1 0.5)",
    )
    parser.add_argument(
        "--policies", nargs="+", default=list(DEFAULT_POLICIES), choices=DEFAULT_POLICIES
    )
    parser.add_argument("--trace", default=None, help="a Mooncake JSONL(.zst) trace")
    parser.add_argument(
        "--no-vllm", action="store_true", help="measure kvtier alone even if vLLM is installed"
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write machine-readable results to PATH (stdout, instead of the table, if no "
        "PATH is given)",
    )
    args = parser.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    limit = args.limit_requests
    if limit is None and args.quick:
        limit = QUICK_LIMIT_REQUESTS
    include_vllm = False if args.no_vllm else None
    json_to_stdout = args.json == "-"

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if include_vllm is None and not vllm_available():
        progress(VLLM_MISSING_NOTE)
    results = run_bookkeeping_benchmark(
        fractions=tuple(args.fractions),
        policies=tuple(args.policies),
        repeats=repeats,
        limit_requests=limit,
        include_vllm=include_vllm,
        trace_path=args.trace,
        progress=progress,
    )
    if args.json is not None:
        document = results_to_json(results)
        if json_to_stdout:
            print(document)
        else:
            Path(args.json).write_text(document + "\n", encoding="utf-8")
    if not json_to_stdout:
        print(format_table(results))
    bad = lru_disagreements(results)
    if bad:
        print(
            "ERROR: kvtier and vLLM disagree on LRU hits at "
            + ", ".join(_percent(result.fraction) for result in bad if result.phase == OVERALL),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
