"""The page store behind kvtier's SGLang backend: SGLang's HiCache pages over a kvtier chain,
with no import of SGLang (so its logic is tested wherever kvtier is installed).

SGLang names an L3 page by a string (a SHA-256 hex digest chained over the page's tokens) and
moves it between its host memory pool and the storage backend. Its keys carry no model, KV
dtype, layout or page size, so two servers of different models would read each other's pages
from a shared store; here every page is bound to a namespace made of all of those (and of the
tensor-parallel shard where a page holds one rank's heads), which is the chain's `model_id`,
so kvtier's checksums and MACs reject a page of another namespace as foreign: a miss.

Every call SGLang makes is answered within a deadline (`timeout_s`): the work runs on the
`SyncHierarchy`'s loop thread and the calling thread waits for its future at most that long.
Any failure (a timeout, a closed chain, a tier error, a malformed argument) is a miss or a
failed store, logged, never an exception: an exception out of a backend kills SGLang's
prefetch thread in some versions.

Session hints (`kvtier.sessions`) come in the `extra_info` dict of the
`HiCacheStorageExtraInfo` SGLang passes to `batch_get_v1` / `batch_set_v1`, under the keys
vLLM's `kv_transfer_params` use (`kvtier.integrations.session_params`): the pages read and
stored for a request are named by its session (and its expectation), and its session ends
once the pages of a request marked `kvtier_session_end` are stored. A bad value is logged,
counted (`session_hints_ignored`) and the call goes on without hints.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import math
import re
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from kvtier.config import (
    HierarchyConfig,
    parse_config,
)
from kvtier.errors import ConfigError, InvalidValueError
from kvtier.hierarchy import Hierarchy
from kvtier.integrations.engine_config import ConfigSource, read_engine_config, refuse_gpu_tiers
from kvtier.integrations.session_params import (
    SessionParams,
    end_session_quietly,
    session_from_params,
)
from kvtier.keys import SGLANG_PAGE_TAG, OffloadKey, make_offload_key
from kvtier.namespaces import combined_model_id
from kvtier.sync import SyncHierarchy

log = logging.getLogger("kvtier.integrations.sglang")

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
"""How long one call of SGLang's waits for kvtier before it counts as a miss / failed store."""

_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_OTHER_KEY_TAG = b"\x02"


class HostPagePool(Protocol):
    """What the store uses of SGLang's host KV pool (`HostKVCache`): its page geometry and
    its own page copy functions, which know every layout (layer-first, page-first, ...)."""

    page_size: int
    layout: str
    dtype: torch.dtype

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor: ...

    def get_dummy_flat_data_page(self) -> torch.Tensor: ...

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None: ...


@dataclass(frozen=True)
class ShardIdentity:
    """Which part of a page's KV one SGLang rank holds (from `HiCacheStorageConfig`).

    `replicated` (MLA: every TP rank holds the same KV) leaves the TP rank out of the
    namespace, so ranks share pages; otherwise each TP rank's heads are a namespace of their
    own. The pipeline stage, the attention context-parallel rank and the data-parallel
    attention rank always are part of it."""

    model_name: str
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    dp_rank: int = 0
    replicated: bool = False

    def describe(self) -> str:
        """The shard part of the namespace."""
        tp = "tp=replicated" if self.replicated else f"tp={self.tp_rank}/{self.tp_size}"
        return (
            f"{tp}:pp={self.pp_rank}/{self.pp_size}:cp={self.cp_rank}/{self.cp_size}:"
            f"dp={self.dp_rank}"
        )


def page_bytes(pool: HostPagePool) -> int:
    """Bytes of one page of `pool` as SGLang flattens it (every layer's K and V)."""
    dummy = pool.get_dummy_flat_data_page()
    return int(dummy.numel()) * dummy.element_size()


def sglang_namespace(shard: ShardIdentity, pool: HostPagePool) -> str:
    """What makes a page's bytes mean the same KV to another SGLang rank or server: the
    model, the KV dtype, the host layout, the page size in tokens and bytes, and the shard.
    SGLang's page keys hash tokens alone, so without this two models with the same page
    size would read each other's KV."""
    dtype = str(pool.dtype).removeprefix("torch.")
    return (
        f"sglang:{shard.model_name}:{dtype}:{pool.layout}:page={pool.page_size}:"
        f"bytes={page_bytes(pool)}:{shard.describe()}"
    )


def page_key(key: str) -> OffloadKey:
    """SGLang's page key as a kvtier key, deterministically (every rank and every restart
    maps a key alike): a 64-digit lowercase hex digest (SGLang's page hashes) is its 32
    bytes; any other string is its BLAKE2b-256 digest, tagged apart so the two forms never
    meet. A non-string raises InvalidValueError (the backend turns it into a miss)."""
    if not isinstance(key, str):
        raise InvalidValueError(f"an SGLang page key must be a str, got {type(key).__name__}")
    if _HEX_DIGEST.fullmatch(key):
        return make_offload_key(SGLANG_PAGE_TAG + bytes.fromhex(key))
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=32).digest()
    return make_offload_key(_OTHER_KEY_TAG + digest)


def read_chain_data(config: ConfigSource) -> tuple[dict[str, Any], str]:
    """The raw chain config and where it came from (see `read_engine_config`)."""
    return read_engine_config(config, "SGLang", "kvtier_config")


def chain_config_for_sglang(
    config: ConfigSource, block_size: int, namespace: str
) -> HierarchyConfig:
    """The validated chain for `config` with `block_size` = one SGLang page and `model_id` =
    `namespace` (a `model_id` the config sets is added to it, never replaces it). A `gpu`
    tier is refused: SGLang's GPU and host memory are above kvtier's tiers."""
    data, source = read_chain_data(config)
    configured = data.get("model_id", "")
    if not isinstance(configured, str):
        raise ConfigError([f"model_id must be a string, got {configured!r}"], source=source)
    data["model_id"] = combined_model_id(namespace, configured)
    given = data.get("block_size")
    if given is not None and given != block_size:
        log.info(
            "%s sets block_size = %r; an SGLang page is %d bytes, so kvtier's blocks are",
            source,
            given,
            block_size,
        )
    data["block_size"] = block_size
    refuse_gpu_tiers(data, source, "SGLang", "its GPU and host memory are")
    return parse_config(data, source=source)


async def shared_prefix(hierarchy: Hierarchy, keys: Sequence[OffloadKey], timeout_s: float) -> int:
    """How many leading `keys` a shared tier (one that owns its index) holds, its answers
    awaited for at most `timeout_s`: a tier's `lookup` never blocks, it answers None ("ask
    again") while its query to the store runs, and remembers the keys found (so the `get`
    that follows reads them). 0 at once where the chain has no shared tier."""
    shared = [tier for tier in hierarchy.manager.tiers if getattr(tier, "owns_index", False)]
    if not shared or not keys:
        return 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pause = 0.001
    while True:
        answers: list[bool | None] = []
        for key in keys:  # every key each round, so their queries run together
            states = [tier.lookup(key) for tier in shared]
            known = True in states or all(state is False for state in states)
            answers.append((True in states) if known else None)
        found = next((i for i, answer in enumerate(answers) if answer is not True), len(keys))
        if found == len(keys) or answers[found] is False or loop.time() >= deadline:
            return found
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.05)


def _page_starts(host_indices: torch.Tensor, page_size: int, pages: int) -> list[int] | None:
    """The host pool index of each page's first token, or None when `host_indices` does not
    hold exactly `pages` pages of `page_size` tokens."""
    if host_indices.dim() != 1 or host_indices.numel() != pages * page_size:
        return None
    return [int(index) for index in host_indices[::page_size].tolist()]


class PageStore:
    """SGLang's pages in a kvtier chain: opened once the host pool (hence the page size) is
    known, then every call answered within `timeout_s` and every failure a miss."""

    def __init__(
        self,
        config: ConfigSource,
        shard: ShardIdentity,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        **options: Any,
    ) -> None:
        if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
            raise InvalidValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
        self._config = config
        self._shard = shard
        self._timeout_s = float(timeout_s)
        self._options = options
        self._pool: HostPagePool | None = None
        self._hierarchy: SyncHierarchy | None = None
        self.namespace: str | None = None
        self.block_size: int | None = None
        self.session_hints_given = 0
        """Calls whose `extra_info` named a session (`session_of`)."""
        self.session_hints_ignored = 0
        """Calls whose `extra_info` held a bad session hint (logged, then ignored)."""

    # -- life ---------------------------------------------------------------------------------

    def attach(self, pool: HostPagePool) -> None:
        """Open the chain for `pool`'s pages. A bad config raises here (SGLang fails its
        start-up with the message, which is where a mistake should be loud); attaching
        again to the same pool does nothing."""
        if self._hierarchy is not None:
            if pool is self._pool:
                return
            self.close()
        namespace = sglang_namespace(self._shard, pool)
        block_size = page_bytes(pool)
        chain = chain_config_for_sglang(self._config, block_size, namespace)
        self._hierarchy = SyncHierarchy(chain, **self._options)
        self._pool = pool
        self.namespace = namespace
        self.block_size = block_size
        log.info(
            "kvtier chain for SGLang opened: %s, pages of %d bytes, tiers %s",
            namespace,
            block_size,
            ", ".join(tier.name for tier in chain.tiers),
        )

    def close(self) -> None:
        """Close the chain (a persistent bottom tier keeps what it holds)."""
        hierarchy, self._hierarchy = self._hierarchy, None
        if hierarchy is not None:
            try:
                hierarchy.close()
            except Exception:
                log.exception("closing kvtier's chain failed")

    @property
    def pool(self) -> HostPagePool | None:
        """The host pool the chain is open for (None before `attach`)."""
        return self._pool

    @property
    def hierarchy(self) -> SyncHierarchy | None:
        """The open chain (None before `attach` or after `close`)."""
        return self._hierarchy

    # -- the loop thread, with a deadline -------------------------------------------------------

    def _run(self, what: str, work: Callable[[Hierarchy], Coroutine[Any, Any, T]]) -> T | None:
        """`work(hierarchy)` on the chain's loop thread, waited for at most `timeout_s` (plus
        a second for the loop to answer); None on any failure or timeout, logged."""
        hierarchy = self._hierarchy
        if hierarchy is None:
            log.debug("%s: the kvtier chain is not open; a miss", what)
            return None
        future = hierarchy.submit(work)
        try:
            return future.result(timeout=self._timeout_s + 1.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            log.warning("%s: kvtier did not answer within %.1f s; a miss", what, self._timeout_s)
        except Exception as error:
            log.warning("%s failed (%s: %s); a miss", what, type(error).__name__, error)
        return None

    # -- the verbs ------------------------------------------------------------------------------

    def exists_prefix(self, keys: Sequence[str]) -> int:
        """How many leading pages of `keys` the chain holds (0 on any failure). Only a
        prefix counts, so a rank never claims a page after one it lacks.

        Past what this node's tiers know of, the shared tiers (Redis, a shared filesystem)
        are asked and their answers awaited within the deadline: SGLang asks once per
        request and prefetches only what this answer counts, so a page another server stored
        must be found here, not on a later request."""
        try:
            offload_keys = [page_key(key) for key in keys]
        except Exception as error:
            log.warning("exists: %s; a miss", error)
            return 0
        timeout_s = self._timeout_s

        async def lookup(hierarchy: Hierarchy) -> int:
            held = hierarchy.lookup(offload_keys)
            if held == len(offload_keys):
                return held
            return held + await shared_prefix(hierarchy, offload_keys[held:], timeout_s)

        found = self._run("exists", lookup)
        return 0 if found is None else found

    def session_of(self, extra_info: object) -> SessionParams | None:
        """The session hints of SGLang's `HiCacheStorageExtraInfo` (its `extra_info` dict;
        a plain mapping is read as that dict), None if none. A bad one is logged and
        counted, and None: a request is never failed for its hint."""
        params = getattr(extra_info, "extra_info", extra_info)
        try:
            session = session_from_params(params)
        except InvalidValueError as error:
            self.session_hints_ignored += 1
            log.warning("session hint in extra_info ignored: %s", error)
            return None
        if session is not None:
            self.session_hints_given += 1
        return session

    def get_pages(
        self, keys: Sequence[str], host_indices: torch.Tensor, extra_info: object = None
    ) -> list[bool]:
        """Read the pages of `keys` into the host pool at `host_indices` (page i starts at
        `host_indices[i * page_size]`); True for each leading page read. The bytes come back
        in a tensor of kvtier's own and are copied into the pool only after the read has
        finished, so a read that runs past the deadline never writes into host memory
        SGLang has since given to another request. With a session in `extra_info`, the
        pages read are named by it (a put of held pages: nothing is stored), so a session's
        prefix ranks as recently active as its last request."""
        pool = self._pool
        misses = [False] * len(keys)
        if pool is None or not keys:
            return misses
        try:
            starts = _page_starts(host_indices, pool.page_size, len(keys))
            offload_keys = [page_key(key) for key in keys]
            if starts is None or len(set(offload_keys)) != len(offload_keys):
                log.warning("get: %d keys with %s host indices; a miss", len(keys), host_indices)
                return misses
        except Exception as error:
            log.warning("get: %s; a miss", error)
            return misses
        timeout_s = self._timeout_s

        session = self.session_of(extra_info)

        async def read(hierarchy: Hierarchy) -> torch.Tensor:
            blocks = await hierarchy.get(offload_keys, timeout_s=timeout_s)
            if session is not None and blocks.shape[0]:
                await hierarchy.put(
                    offload_keys[: blocks.shape[0]],
                    blocks,
                    session=session.session,
                    expect_within_s=session.expect_within_s,
                )
            return blocks

        blocks = self._run("get", read)
        if blocks is None:
            return misses
        served = 0
        try:
            for start, block in zip(starts, blocks, strict=False):
                pool.set_from_flat_data_page(start, block.view(pool.dtype))
                served += 1
        except Exception as error:
            log.warning("get: copying page %d into the host pool failed: %s", served, error)
        return [True] * served + [False] * (len(keys) - served)

    def set_pages(
        self, keys: Sequence[str], host_indices: torch.Tensor, extra_info: object = None
    ) -> list[bool]:
        """Store the host pool's pages at `host_indices` under `keys`; True for each page the
        chain holds afterwards (stored now or already held). `extra_info`: SGLang's, with
        the request's session hints (`session_of`)."""
        pool = self._pool
        failed = [False] * len(keys)
        if pool is None or not keys:
            return failed
        try:
            starts = _page_starts(host_indices, pool.page_size, len(keys))
            if starts is None:
                log.warning(
                    "set: %d keys with %s host indices; not stored", len(keys), host_indices
                )
                return failed
            pages = [pool.get_data_page(start, flat=True) for start in starts]
        except Exception as error:
            log.warning("set: reading the host pool failed: %s; not stored", error)
            return failed
        return self.put_pages(keys, pages, self.session_of(extra_info))

    def put_pages(
        self,
        keys: Sequence[str],
        pages: Sequence[torch.Tensor],
        session: SessionParams | None = None,
    ) -> list[bool]:
        """Store `pages` (flat tensors of one page each, any dtype) under `keys`; True for
        each page the chain holds afterwards. A page of the wrong size is not stored, nor is
        a second copy of a key within the call (its first copy answers for it). `session`:
        the pages are the request's of that session; its end is given once they are in."""
        failed = [False] * len(keys)
        block_size = self.block_size
        if block_size is None or len(pages) != len(keys) or not keys:
            return failed
        try:
            offload_keys = [page_key(key) for key in keys]
            first: dict[OffloadKey, int] = {}
            rows: list[torch.Tensor] = []
            for index, (key, page) in enumerate(zip(offload_keys, pages, strict=True)):
                raw = page.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                if key in first or raw.numel() != block_size:
                    continue
                first[key] = index
                rows.append(raw)
        except Exception as error:
            log.warning("set: %s; not stored", error)
            return failed
        if not rows:
            return failed
        unique = list(first)
        blocks = torch.stack(rows)

        async def write(hierarchy: Hierarchy) -> list[bool]:
            if session is None:
                await hierarchy.put(unique, blocks)
            else:
                await hierarchy.put(
                    unique,
                    blocks,
                    session=session.session,
                    expect_within_s=session.expect_within_s,
                )
                if session.end:
                    end_session_quietly(hierarchy, session.session)
            return [hierarchy.where(key) is not None for key in offload_keys]

        held = self._run("set", write)
        return failed if held is None else held

    def get_page(self, key: str, target: torch.Tensor | None) -> torch.Tensor | None:
        """One page (legacy interface): copied into `target` (a flat page of the pool's
        dtype) when given, else returned as uint8 bytes; None for a miss."""
        try:
            offload_key = page_key(key)
        except Exception as error:
            log.warning("get: %s; a miss", error)
            return None
        timeout_s = self._timeout_s

        async def read(hierarchy: Hierarchy) -> torch.Tensor:
            return await hierarchy.get([offload_key], timeout_s=timeout_s)

        blocks = self._run("get", read)
        if blocks is None or len(blocks) != 1:
            return None
        if target is None:
            return blocks[0].clone()
        try:
            if not target.is_contiguous() or target.nbytes != blocks.shape[1]:
                log.warning(
                    "get: a target of %d bytes for a page of %d", target.nbytes, blocks.shape[1]
                )
                return None
            target.view(-1).copy_(blocks[0].view(target.dtype))
        except Exception as error:
            log.warning("get: copying into the target failed: %s; a miss", error)
            return None
        return target
