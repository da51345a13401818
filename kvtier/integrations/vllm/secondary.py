"""`KvtierSecondaryTier`: kvtier's tiers (a bounded, checksummed, restartable disk tier;
remote tiers later) below vLLM's CPU primary tier, as a vLLM 0.33 `SecondaryTierManager`.

vLLM calls a secondary tier from its scheduler process, under its manager's lock, and every
call must return at once. So the tier chain lives in a `SyncHierarchy` (an event loop on a
thread of its own) and this class only hands work over and collects what came back:

- `submit_store` / `submit_load` start a job on the loop thread and return. A store `put`s
  the job's rows of vLLM's CPU tier straight from vLLM's memory (`put(rows=...)`), a load
  reads the blocks straight into the job's rows (`get_into`), no copy in between. Nothing
  touches vLLM's memory once a job's result is queued, and every job queues exactly one
  result, whatever it raised.
- Results, verdicts and events come back through one thread-safe queue, applied on vLLM's
  thread by the next call (`get_finished_jobs`, `lookup`, `take_events`).
- `lookup` answers from a bounded table of verdicts (present or not). A key it has not seen is
  asked of the loop thread in a batch and answered RETRY until the answer arrives; a store
  marks its keys present, kvtier's evictions (its removed events) and failed loads mark them
  absent. So a restarted disk tier's blocks are found without a scan.
- A request's reuse hint (`kv_transfer_params` `{"kvtier_reuse": ..., "kvtier_reuse_ttl_s":
  ...}`, see `hints`) is read once per request and given to kvtier with the blocks of that
  request this tier stores (`put(hint=...)`); a bad one is logged, counted in
  `hints.ignored`, and the blocks stored without it.
- While a request has loads in flight (not yet reported to vLLM), a key of that request that
  kvtier does not hold is answered RETRY, not MISS (see `lookup`): vLLM then recomputes and
  offloads again every block of the request whose load failed.
- `drain_jobs` waits for every job in flight (none is aborted mid-copy); `shutdown` drains,
  then closes the hierarchy (which finishes its own background writes) and stops the thread,
  and logs the chain's figures (hits, misses, stored, corrupt per tier) in vLLM's log.
- `metrics_port` serves the chain's Prometheus metrics from this process (`visible`).

The longest time any of these calls took is kept in `call_seconds` for the curious.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any, ClassVar, NamedTuple, ParamSpec, TypeVar

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingEvent,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.base import OffloadKey as VllmKey
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from kvtier.errors import ManagerClosedError
from kvtier.hierarchy import Hierarchy
from kvtier.hints import ReuseHint
from kvtier.integrations.engine_config import ConfigSource
from kvtier.integrations.vllm.config import chain_config_for_vllm, vllm_namespace
from kvtier.integrations.vllm.hints import RequestHints, SessionParams, end_session_quietly
from kvtier.integrations.vllm.visible import (
    close_quietly,
    closing_line,
    join_vllm_logging,
)
from kvtier.integrations.vllm.visible import metrics_port as metrics_port_of
from kvtier.keys import OffloadKey
from kvtier.metrics import MetricsServer, serve_metrics
from kvtier.sync import SyncHierarchy

log = logging.getLogger("kvtier.integrations.vllm")

P = ParamSpec("P")
R = TypeVar("R")

MAX_VERDICTS = 1 << 20
"""Keys whose presence the tier remembers on vLLM's side (about 100 bytes each); one that
falls out is asked again (one RETRY)."""


class _Verdicts(NamedTuple):
    """Keys present (True), absent (False), or to be asked again (None)."""

    answers: Mapping[bytes, bool | None]


class _Finished(NamedTuple):
    """A job's one result."""

    result: JobResult


class _Events(NamedTuple):
    """Keys kvtier stored (removed=False) or no longer holds in any tier (removed=True)."""

    keys: list[bytes]
    removed: bool


_Message = _Verdicts | _Finished | _Events
"""What the loop thread hands back to vLLM's thread."""


def _timed(method: Callable[P, R]) -> Callable[P, R]:
    """Keep the longest duration of each call in `self.call_seconds[name]`."""
    name = method.__name__

    @functools.wraps(method)
    def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            took = time.perf_counter() - started
            seconds: dict[str, float] = args[0].call_seconds  # type: ignore[attr-defined]
            if took > seconds.get(name, 0.0):
                seconds[name] = took

    return timed


class KvtierSecondaryTier(SecondaryTierManager):
    """kvtier's tier chain as one vLLM secondary tier. vLLM passes `config` (a kvtier TOML
    path or dict; None: the embedded default's disk tier) from the tier's entry in
    `secondary_tiers`; the block size is vLLM's chunk row size."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        config: ConfigSource = None,
        backpressure_detector: Any = None,
        enable_kv_events: bool = True,
        locality: str | None = None,
        load_timeout_s: float | None = None,
        hierarchy_options: Mapping[str, Any] | None = None,
        metrics_port: int | None = None,
    ) -> None:
        """`metrics_port`: serve the chain's Prometheus metrics on this port (from this
        process, vLLM's engine core: vLLM's own `/metrics` cannot see them)."""
        join_vllm_logging()
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.call_seconds: dict[str, float] = {}
        self.hints = RequestHints()
        """The requests' reuse hints read so far (`given`, `ignored`)."""
        row_bytes = int(self.block_size_bytes)
        rows = primary_kv_view.nbytes // row_bytes
        self._row_bytes = row_bytes
        self._rows = torch.frombuffer(primary_kv_view, dtype=torch.uint8).view(rows, row_bytes)
        vllm_config = getattr(offloading_spec, "config", None)
        namespace = None if vllm_config is None else vllm_namespace(vllm_config)
        chain = chain_config_for_vllm(config, row_bytes, namespace)
        options = dict(hierarchy_options or {})
        options.setdefault("load_timeout_s", load_timeout_s)
        port = metrics_port_of(metrics_port)
        if port is not None:
            from prometheus_client import CollectorRegistry

            options.setdefault("metrics", CollectorRegistry())
            options.setdefault("metrics_name", tier_type)
        self.hierarchy = SyncHierarchy(chain, **options)
        """The kvtier hierarchy behind this tier (for stats and tests)."""
        self.metrics_server: MetricsServer | None = None
        """The HTTP server of the chain's metrics (`metrics_port`), or None."""
        if port is not None:
            try:
                self.metrics_server = serve_metrics(options["metrics"], port)
            except BaseException:
                self.hierarchy.close()
                raise
        if locality is not None:
            from vllm.v1.kv_offload.base import Locality

            self.locality = Locality(locality)
        events_config = getattr(offloading_spec, "kv_events_config", None)
        self._events_on = bool(
            enable_kv_events and getattr(events_config, "enable_kv_cache_events", False)
        )
        self._events: list[OffloadingEvent] = []
        self._inbox: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        self._finished: list[JobResult] = []
        self._verdicts: OrderedDict[bytes, bool] = OrderedDict()
        self._asked: set[bytes] = set()
        self._questions: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._question_lock = threading.Lock()
        self._answer_scheduled = False
        self._sweep_scheduled = False
        self._jobs: dict[int, Future[None]] = {}
        self._loads_of: dict[str, set[int]] = {}
        """Per request, its load jobs not yet reported to vLLM (`get_finished_jobs`)."""
        self._request_of: dict[int, str] = {}
        """The request of each load job in `_loads_of`."""
        log.info(
            "kvtier secondary tier %r: %s%s",
            tier_type,
            ", ".join(
                f"{tier.name} ({tier.medium}, {tier.num_blocks} blocks at {tier.where})"
                for tier in self.hierarchy.tiers
            ),
            f"; metrics at {self.metrics_server.url}" if self.metrics_server else "",
        )

    # -- vLLM's thread -----------------------------------------------------------------------

    def _apply_inbox(self) -> None:
        """Apply what the loop thread sent: verdicts, finished jobs, removals."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Verdicts):
                for key, present in item.answers.items():
                    self._asked.discard(key)
                    if present is None:
                        self._verdicts.pop(key, None)  # ask again on the next lookup
                    else:
                        self._remember(key, present)
            elif isinstance(item, _Finished):
                self._finished.append(item.result)
            elif self._events_on and item.keys:
                self._events.append(
                    OffloadingEvent(
                        keys=[VllmKey(key) for key in item.keys],
                        medium=self.medium,
                        removed=item.removed,
                        locality=self.locality,
                    )
                )

    def _remember(self, key: bytes, present: bool) -> None:
        verdicts = self._verdicts
        verdicts[key] = present
        verdicts.move_to_end(key)
        if len(verdicts) > MAX_VERDICTS:
            verdicts.popitem(last=False)

    @_timed
    def lookup(self, key: VllmKey, req_context: ReqContext) -> LookupResult:
        """HIT / MISS from the verdicts; RETRY while the loop thread is asked, and instead of
        MISS while the request has loads in flight.

        vLLM recomputes a request from its first block that is a MISS, and offloads again
        only the blocks its primary tier does not hold at that moment; a block whose load is
        still in flight is held there (pending). A block whose load failed (damaged, dropped)
        answered MISS at once would have the request recomputed and stored while the loads
        of its later blocks were pending (or started meanwhile: vLLM goes on looking past a
        RETRY): when those failed too, their blocks were recomputed but never offered again,
        and their damaged copies stayed in kvtier's disk tier. Answered RETRY until every
        load of the request is reported, the request waits for them (as it would for any
        pending block), and then is recomputed and stored whole."""
        self._apply_inbox()
        present = self._verdicts.get(key)
        if present:
            return LookupResult.HIT
        if present is None and key not in self._asked:
            self._asked.add(key)
            self._ask(key)
        if present is None or getattr(req_context, "req_id", None) in self._loads_of:
            return LookupResult.RETRY
        return LookupResult.MISS

    def _ask(self, key: bytes) -> None:
        self._questions.put(key)
        with self._question_lock:
            if self._answer_scheduled:
                return
            self._answer_scheduled = True
        if not self.hierarchy.call_soon(self._answer):
            with self._question_lock:
                self._answer_scheduled = False
            self._inbox.put(_Verdicts(self._drain_questions(lambda key: False)))

    def _drain_questions(self, present: Callable[[bytes], bool]) -> dict[bytes, bool | None]:
        answers: dict[bytes, bool | None] = {}
        while True:
            try:
                key = self._questions.get_nowait()
            except queue.Empty:
                return answers
            answers[key] = present(key)

    @_timed
    def submit_store(self, job_metadata: TransferJob) -> None:
        """Store the job's rows of vLLM's CPU tier, in the background, with the reuse hint
        of the request they belong to, if it gave one."""
        context = getattr(job_metadata, "req_context", None)
        hint = self.hints.of(context)
        session = self.hints.session_of(context)
        self._start(job_metadata, functools.partial(self._store, hint=hint, session=session))

    @_timed
    def submit_load(self, job_metadata: TransferJob) -> None:
        """Read the job's blocks into its rows of vLLM's CPU tier, in the background."""
        context = getattr(job_metadata, "req_context", None)
        request = getattr(context, "req_id", None)
        if isinstance(request, str):
            self._loads_of.setdefault(request, set()).add(job_metadata.job_id)
            self._request_of[job_metadata.job_id] = request
        self._start(job_metadata, self._load)

    def _start(self, job: TransferJob, run: Callable[..., Coroutine[Any, Any, None]]) -> None:
        keys = [OffloadKey(bytes(key)) for key in job.keys]
        rows = np.asarray(job.chunk_ids, dtype=np.int64).copy()
        future = self.hierarchy.submit(functools.partial(run, job.job_id, keys, rows))
        if (
            future.done()
            and not future.cancelled()
            and isinstance(future.exception(), ManagerClosedError)
        ):
            # Never started (the hierarchy is closed): the job fails, reported once.
            self._inbox.put(_Finished(JobResult(job_id=job.job_id, success=False)))
            return
        self._jobs[job.job_id] = future

    @_timed
    def get_finished_jobs(self) -> Iterable[JobResult]:
        """Every job finished since the last call, each reported once."""
        self._apply_inbox()
        finished, self._finished = self._finished, []
        for result in finished:
            self._jobs.pop(result.job_id, None)
            request = self._request_of.pop(result.job_id, None)
            if request is not None:
                loads = self._loads_of[request]
                loads.discard(result.job_id)
                if not loads:
                    del self._loads_of[request]
        return finished

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    @_timed
    def take_events(self) -> Iterable[OffloadingEvent]:
        """Blocks this tier stored and kvtier removed (evicted, or dropped as damaged), when
        vLLM's KV events are on."""
        self._apply_inbox()
        events, self._events = self._events, []
        return events

    @_timed
    def touch(self, keys: Collection[VllmKey], req_context: ReqContext) -> None:
        """Mark the keys recently used in kvtier's top tier too."""
        if keys:
            held = [OffloadKey(bytes(key)) for key in keys if self._verdicts.get(key)]
            if held:
                self.hierarchy.call_soon(functools.partial(self._touch, held))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Reads the request's reuse hint now (a bad one is logged as the request comes)."""
        self.hints.of(req_context)
        return RequestOffloadingContext()

    @_timed
    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Pick up evictions kvtier made in the background since the last job."""
        self._apply_inbox()
        if not self._sweep_scheduled:
            self._sweep_scheduled = self.hierarchy.call_soon(self._sweep)

    @_timed
    def drain_jobs(self) -> None:
        """Wait until every submitted job has finished (none is cut short); their results are
        then queued for `get_finished_jobs`."""
        pending = [future for future in self._jobs.values() if not future.done()]
        if pending:
            wait_futures(pending)

    def shutdown(self) -> None:
        """Finish every job, close kvtier's tiers (their background writes included) and stop
        the loop thread; nothing touches vLLM's memory afterwards."""
        self.drain_jobs()
        try:
            figures: str | None = closing_line(self.hierarchy.stats())
        except ManagerClosedError:
            figures = None  # closed before: nothing more to say
        self.hierarchy.close()
        self._rows = torch.empty(0, 0, dtype=torch.uint8)  # vLLM may now unmap its region
        if self.metrics_server is not None:
            close_quietly(self.metrics_server, "kvtier's metrics server")
            self.metrics_server = None
        if figures is not None:
            log.info("kvtier secondary tier %r closed: %s", self.tier_type, figures)

    def config_info(self) -> Mapping[str, str]:
        return {}

    # -- the loop thread ---------------------------------------------------------------------

    def _answer(self, hierarchy: Hierarchy) -> None:
        with self._question_lock:
            self._answer_scheduled = False
        manager = hierarchy.manager

        def present(key: bytes) -> bool:
            where = manager.locate(OffloadKey(key))
            return where is not None and where[1]

        self._inbox.put(_Verdicts(self._drain_questions(present)))

    def _sweep(self, hierarchy: Hierarchy) -> None:
        self._sweep_scheduled = False
        self._report_removed(hierarchy)

    def _report_removed(self, hierarchy: Hierarchy) -> None:
        """Keys that left every kvtier tier since the last look: absent, and a removed event."""
        removed: dict[OffloadKey, None] = {}
        for event in hierarchy.take_events():
            if event.removed:
                removed.update(dict.fromkeys(event.keys))
        manager = hierarchy.manager
        gone = [key for key in removed if manager.locate(key) is None]
        if gone:
            self._inbox.put(_Verdicts(dict.fromkeys(gone, False)))
            self._inbox.put(_Events(list(gone), True))

    def _touch(self, keys: list[OffloadKey], hierarchy: Hierarchy) -> None:
        manager = hierarchy.manager
        held = [key for key in keys if manager.top.lookup(key) is True]
        if held:
            manager.touch(held)

    async def _store(
        self,
        job_id: int,
        keys: list[OffloadKey],
        rows: np.ndarray,
        hierarchy: Hierarchy,
        hint: ReuseHint | None = None,
        session: SessionParams | None = None,
    ) -> None:
        started = time.perf_counter()
        moved = 0
        success = False
        try:
            manager = hierarchy.manager
            new = [index for index, key in enumerate(keys) if manager.locate(key) is None]
            if new:
                # Straight from vLLM's rows (pinned by vLLM until this job is reported).
                await hierarchy.put(
                    [keys[index] for index in new],
                    self._rows,
                    rows=rows[new],
                    hint=hint,
                    session=None if session is None else session.session,
                    expect_within_s=None if session is None else session.expect_within_s,
                )
                moved = len(new) * self._row_bytes
            if session is not None and session.end:
                end_session_quietly(hierarchy, session.session)
            held = [manager.locate(key) is not None for key in keys]
            success = all(held)
            stored = [keys[index] for index in new if held[index]]
            if stored:
                self._inbox.put(_Verdicts(dict.fromkeys(stored, True)))
                self._inbox.put(_Events(list(stored), False))
            self._report_removed(hierarchy)
        except BaseException as error:  # a failed store is a counted failure, never a raise
            log.warning("kvtier store job %d of %d blocks failed: %r", job_id, len(keys), error)
            if not isinstance(error, Exception):
                self._finish(job_id, False, started, moved)
                raise
        self._finish(job_id, success, started, moved)

    async def _load(
        self, job_id: int, keys: list[OffloadKey], rows: np.ndarray, hierarchy: Hierarchy
    ) -> None:
        started = time.perf_counter()
        loaded = 0
        try:
            # Straight into vLLM's rows; returns only once no copy writes into them.
            loaded = await hierarchy.get_into(keys, self._rows, rows)
            if loaded < len(keys):
                # A damaged block is dropped once its read is over: ask again, later.
                self._inbox.put(_Verdicts(dict.fromkeys(keys[loaded:], None)))
        except BaseException as error:  # a failed load is a miss, never a raise
            log.warning("kvtier load job %d of %d blocks failed: %r", job_id, len(keys), error)
            loaded = 0
            if not isinstance(error, Exception):
                self._finish(job_id, False, started, 0)
                raise
        success = loaded == len(keys)
        partial = None if success or loaded == 0 else tuple(VllmKey(k) for k in keys[:loaded])
        self._finish(job_id, success, started, loaded * self._row_bytes, partial)

    def _finish(
        self,
        job_id: int,
        success: bool,
        started: float,
        moved: int,
        successful_keys: tuple[VllmKey, ...] | None = None,
    ) -> None:
        self._inbox.put(
            _Finished(
                JobResult(
                    job_id=job_id,
                    success=success,
                    successful_keys=successful_keys,
                    transfer_time=time.perf_counter() - started,
                    transfer_bytes=moved or None,
                )
            )
        )
