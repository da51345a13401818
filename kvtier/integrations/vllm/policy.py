"""kvtier's cache policies as the `eviction_policy` of vLLM's CPU tier.

vLLM builds its CPU tier's policy from a class name and `cache_policy_module_path`, with
the capacity as the only argument, and hands it `ChunkStatus` records whose `ref_cnt` it
changes as transfers pin and release a chunk. A kvtier policy keeps `BlockStatus` records of
the same layout (a 32-bit ref count, a 64-bit slot), so the adapter gives the kvtier policy a
view of vLLM's own record (`BlockStatus.from_buffer`): both read one `ref_cnt`, nothing is
copied or kept in step by hand, and the kvtier policy never evicts a chunk vLLM has pinned.

A chunk stored for a request whose `kv_transfer_params` carry a reuse hint
(`kvtier.integrations.vllm.hints`; vLLM 0.33 passes the storing request to `insert`) is
hinted in the kvtier policy: a `"never"` chunk is evicted first, a `"likely"` one kept for
its TTL (withdrawn at the first eviction after it, on the monotonic clock).

    "eviction_policy": "KvtierARCCachePolicy",
    "cache_policy_module_path": "kvtier.integrations.vllm"
"""

from __future__ import annotations

import ctypes
import heapq
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import OffloadKey as VllmKey
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy as VllmCachePolicy
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from kvtier.blocks import BlockStatus
from kvtier.hints import ReuseHint
from kvtier.integrations.vllm.hints import RequestHints
from kvtier.keys import OffloadKey
from kvtier.policies import get_policy_class
from kvtier.policies.base import CachePolicy

if ctypes.sizeof(ChunkStatus) != ctypes.sizeof(BlockStatus) or [
    (name, kind) for name, kind in ChunkStatus._fields_
] != [("ref_cnt", ctypes.c_int32), ("chunk_id", ctypes.c_int64)]:
    raise ImportError(
        "vLLM's ChunkStatus no longer has kvtier's BlockStatus layout (int32 ref_cnt, int64 "
        "slot); this kvtier cannot adapt its policies to this vLLM"
    )


class KvtierCachePolicy(VllmCachePolicy):
    """A kvtier policy (`kvtier_policy`, by its config name) behind vLLM's CachePolicy
    interface. Used by name it is kvtier's LRU; subclass it and set `kvtier_policy` for
    another."""

    kvtier_policy: ClassVar[str] = "lru"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.policy: CachePolicy = get_policy_class(self.kvtier_policy)(cache_capacity)
        """The kvtier policy that decides."""
        self._chunks: dict[VllmKey, ChunkStatus] = {}
        self.hints = RequestHints()
        """The storing requests' reuse hints read so far (`given`, `ignored`)."""
        self._hint_until: dict[OffloadKey, float] = {}
        self._deadlines: list[tuple[float, OffloadKey]] = []

    def get(self, key: VllmKey) -> ChunkStatus | None:
        return self._chunks.get(key)

    def insert(
        self, key: VllmKey, chunk: ChunkStatus, req_context: ReqContext | None = None
    ) -> None:
        """A chunk vLLM allocated. `req_context` (the storing request) is passed by vLLM 0.33
        and not by 0.32 (see `_compat`): the chunk takes its reuse hint, if it gave one."""
        kvtier_key = OffloadKey(key)
        self.policy.insert(kvtier_key, BlockStatus.from_buffer(chunk))
        self._chunks[key] = chunk
        hint = self.hints.of(req_context)
        if hint is not None:
            self._hint(kvtier_key, hint)

    def _hint(self, key: OffloadKey, hint: ReuseHint) -> None:
        self.policy.hint(key, hint.reuse)
        if hint.ttl_s is None:
            self._hint_until.pop(key, None)
            return
        expires = time.monotonic() + hint.ttl_s
        self._hint_until[key] = expires
        heapq.heappush(self._deadlines, (expires, key))

    def _expire_hints(self) -> None:
        """Withdraw the hints whose TTL passed (a later hint on the chunk stays)."""
        deadlines, until, now = self._deadlines, self._hint_until, time.monotonic()
        while deadlines and deadlines[0][0] <= now:
            expires, key = heapq.heappop(deadlines)
            if until.get(key) == expires:
                del until[key]
                self.policy.hint(key, None)

    def remove(self, key: VllmKey) -> None:
        self.policy.remove(OffloadKey(key))
        del self._chunks[key]
        if self._hint_until:
            self._hint_until.pop(OffloadKey(key), None)

    def touch(self, keys: Iterable[VllmKey], req_context: ReqContext) -> None:
        self.policy.touch([OffloadKey(key) for key in keys])

    def on_store_miss(self, keys: Iterable[VllmKey], req_context: ReqContext) -> None:
        self.policy.on_store_miss([OffloadKey(key) for key in keys])

    def evict(self, n: int, protected: set[VllmKey]) -> list[tuple[VllmKey, ChunkStatus]] | None:
        if self._deadlines:
            self._expire_hints()
        victims = self.policy.evict(n, protected)
        if victims is None:
            return None
        if self._hint_until:
            for key, _ in victims:
                self._hint_until.pop(key, None)
        return [(VllmKey(key), self._chunks.pop(VllmKey(key))) for key, _ in victims]

    def clear(self) -> None:
        self.policy.clear()
        self._chunks.clear()
        self._hint_until.clear()
        self._deadlines.clear()

    def __len__(self) -> int:
        return len(self._chunks)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.policy!r})"

    def __getstate__(self) -> Any:  # pragma: no cover - vLLM never pickles a policy
        raise TypeError(f"{type(self).__name__} holds views of vLLM's chunks; not picklable")


class KvtierLRUCachePolicy(KvtierCachePolicy):
    """kvtier's LRU (a prefix's tail evicted before its head) as vLLM's CPU-tier policy."""

    kvtier_policy: ClassVar[str] = "lru"


class KvtierARCCachePolicy(KvtierCachePolicy):
    """kvtier's ARC (exact to the paper) as vLLM's CPU-tier policy."""

    kvtier_policy: ClassVar[str] = "arc"


class KvtierLCTCachePolicy(KvtierCachePolicy):
    """kvtier's `lct` (learned class thresholds) as vLLM's CPU-tier policy, for eviction.

    vLLM's CPU tier has no admission hook in its policy interface (its only filter is a fixed
    `store_threshold` of sightings, kept by the manager), so every chunk vLLM offers is
    stored; a chunk of a class `lct` would not have admitted has a residency limit of 0 and
    is the first evicted. Under `KvtierOffloadingSpec` kvtier's own manager asks `admit`."""

    kvtier_policy: ClassVar[str] = "lct"
