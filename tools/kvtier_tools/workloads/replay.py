"""`kvtier replay`: a request trace served through a real `Hierarchy`, moving and checking bytes.

For each request of the trace (each a prefix of block keys), the replay does what a serving
engine would do with a prefix cache:

    n = hierarchy.lookup(keys)                   # leading blocks some tier holds
    tiers = [hierarchy.where(k) for k in keys[:n]]
    loaded = await hierarchy.get(keys[:n])       # promoted up the chain, copied out
    verify every loaded row bit for bit against its expected content
    for part in batches of keys[len(loaded):]:   # the Hierarchy's own put batch size
        await hierarchy.put(part, contents.make(part))  # "recomputed" blocks stored
        await hierarchy.drain()                  # write-through cascades settle

and counts block i < len(loaded) as a hit of `tiers[i]`. These are exactly the calls that
`kvtier_tools.workloads.simulation.chain.serve_request` mirrors with instant copies, so as long
as every copy succeeds, **the per-tier hits of a replay equal those of `kvtier simulate
--config` on the same configuration** (same tiers, policies, write policy and block counts):
the chain's decisions do not depend on the bytes or on how long the copies take.
`tests/test_replay.py` checks this.

Block contents are a deterministic function of the key (`BlockContents`): 64-bit words
`j * K + seed(key)`, where `seed` is a keyed BLAKE2b of the key. Two keys' blocks differ in
every word, so a block served for the wrong key, a torn copy or a flipped bit cannot pass
verification; a non-zero mismatch count means the data path returned wrong bytes.

Only block *counts* matter to hit ratios, so a replay keeps each tier's block count from the
configuration and may use smaller blocks (`DEFAULT_REPLAY_BLOCK_BYTES`) to run in under a
minute; the traffic and bandwidth figures are then those of the smaller blocks. Disk tiers are
put in fresh directories under the output directory, emptied first, so a replay is
reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import itertools
import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from kvtier.config import HierarchyConfig, format_size, parse_config, parse_size
from kvtier.errors import InvalidValueError, TraceFormatError
from kvtier.hierarchy import Hierarchy, HierarchyStats, TierInfo
from kvtier.keys import OffloadKey
from kvtier_tools.workloads.replay_sessions import SessionPlan
from kvtier_tools.workloads.simulation.chain import offload_key_of
from kvtier_tools.workloads.simulation.sweep import SimTrace, load_trace
from kvtier_tools.workloads.traces import MOONCAKE_BLOCK_TOKENS, read_mooncake

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "DEFAULT_REPLAY_BLOCK_BYTES",
    "BlockContents",
    "Mismatch",
    "ReplayResult",
    "ReplayTrace",
    "Replayer",
    "describe_block_bytes",
    "load_replay_trace",
    "prepare_disk_dirs",
    "replay",
    "replay_block_bytes",
    "replay_config",
    "run_replay",
    "size_argument",
    "write_report",
]

DEFAULT_REPLAY_BLOCK_BYTES = 16 * 1024
"""Bytes per block of a replay without `--block-bytes` (or the config's block size, if that is
smaller). Measured: the default config over the whole shipped trace (12,031 requests, 288,500
block accesses, 8.5 GB copied) took 60 to 110 s on a 2-core machine at 16 KiB."""

SERIES_POINTS = 200
"""About how many points of the running figures a report keeps for its chart."""

MISMATCH_EXAMPLES = 20
"""At most this many mismatching blocks are described one by one in a report."""

OFF_LOOP_BYTES = 1 << 20
"""Block contents larger than this are generated and checked in a worker thread, not in the
event loop."""

_T = TypeVar("_T")
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: j -> j * K is a bijection mod 2**64
_DISK_STORE_PREFIX = "kvtier-"


# -- block contents -------------------------------------------------------------------------


class BlockContents:
    """The bytes every block of a replay holds: a deterministic function of its key.

    Row `i` of `make(keys)` is `block_bytes` bytes of the little-endian uint64 words
    `j * K + seed(keys[i])` (j = 0, 1, ...; K odd; arithmetic mod 2**64), where `seed` is an
    8-byte BLAKE2b of the key keyed with `salt`. Blocks of two different keys differ in every
    word (unless their 64-bit seeds collide), and the words of one block are all different,
    so a block served for another key, shifted or partly overwritten fails `bad_rows`.
    Generation and checking are vectorized (one numpy add per batch).
    """

    __slots__ = ("_base", "block_bytes", "salt")

    def __init__(self, block_bytes: int, salt: bytes = b"kvtier-replay") -> None:
        if block_bytes < 1:
            raise InvalidValueError(f"block_bytes must be at least 1, got {block_bytes}")
        self.block_bytes = block_bytes
        self.salt = salt
        words = -(-block_bytes // 8)
        self._base: npt.NDArray[np.uint64] = np.arange(words, dtype=np.uint64) * _MULTIPLIER

    def seeds(self, keys: Sequence[OffloadKey]) -> npt.NDArray[np.uint64]:
        """Each key's 64-bit seed."""
        salt = self.salt[:64]
        return np.fromiter(
            (
                int.from_bytes(hashlib.blake2b(key, digest_size=8, key=salt).digest(), "little")
                for key in keys
            ),
            dtype=np.uint64,
            count=len(keys),
        )

    def make_array(self, keys: Sequence[OffloadKey]) -> npt.NDArray[np.uint8]:
        """The blocks of `keys` as a C-contiguous uint8 array `[len(keys), block_bytes]`."""
        words = self._base[None, :] + self.seeds(keys)[:, None]
        raw = words.view(np.uint8).reshape(len(keys), -1)
        if raw.shape[1] != self.block_bytes:
            raw = np.ascontiguousarray(raw[:, : self.block_bytes])
        return raw

    def make(self, keys: Sequence[OffloadKey]) -> torch.Tensor:
        """The blocks of `keys` as a uint8 tensor `[len(keys), block_bytes]` (for `put`)."""
        return torch.from_numpy(self.make_array(keys))

    def bad_rows(self, keys: Sequence[OffloadKey], blocks: torch.Tensor) -> list[int]:
        """Indices of the rows of `blocks` (any device) that are not exactly `keys`' blocks."""
        if tuple(blocks.shape) != (len(keys), self.block_bytes) or blocks.dtype != torch.uint8:
            return list(range(len(keys)))
        got = blocks.detach().cpu().numpy()
        expected = self.make_array(keys)
        if self.block_bytes % 8 == 0:
            got, expected = got.view(np.uint64), expected.view(np.uint64)
        different: npt.NDArray[np.bool_] = (got != expected).any(axis=1)
        return [int(i) for i in np.flatnonzero(different)]


# -- configuration --------------------------------------------------------------------------


def replay_block_bytes(config: HierarchyConfig, requested: int | None) -> int:
    """The replay's bytes per block: `requested`, else the smaller of the config's block size
    and `DEFAULT_REPLAY_BLOCK_BYTES`."""
    if requested is not None:
        if requested < 1:
            raise InvalidValueError(f"--block-bytes must be at least 1 byte, got {requested}")
        return requested
    return min(config.block_size, DEFAULT_REPLAY_BLOCK_BYTES)


def replay_config(
    config: HierarchyConfig, block_bytes: int, disk_root: Path | None
) -> HierarchyConfig:
    """`config` with `block_size = block_bytes` and every tier's capacity set to its block
    count (so each tier holds as many blocks as configured, and hit ratios are the config's,
    but for `min_refill`: a size, which spans more of smaller blocks, at most a tier's own
    size). With `disk_root`, each persistent tier's directory becomes `disk_root / <name>`."""
    data = config.model_dump(mode="json")
    data["block_size"] = block_bytes
    tiers = []
    for raw, tier in zip(data["tiers"], config.tiers, strict=True):
        raw = dict(raw)
        raw["capacity"] = tier.num_blocks
        if tier.min_refill not in ("auto", 0):  # a size: more than the scaled tier is all of it
            raw["min_refill"] = min(parse_size(tier.min_refill), tier.num_blocks * block_bytes)
        # Every persistent tier with a directory of its own, whatever its medium, so the
        # replay never empties a directory it does not own (see prepare_disk_dirs).
        if not tier.kind.volatile and "path" in raw and disk_root is not None:
            raw["path"] = str(disk_root / tier.name)
        tiers.append(raw)
    data["tiers"] = tiers
    # A replay measures the configured chain: a tier left out because it cannot open would
    # make its figures another chain's, so every tier must open.
    data["strict"] = True
    return parse_config(data, source="replay configuration")


@contextlib.contextmanager
def _stores_locked(path: Path) -> Iterator[None]:
    """Hold the lock of every kvtier store in `path` (as a store does while open), or raise
    DiskLockedError naming the one a running kvtier holds; released on exit."""
    import fcntl

    from kvtier.errors import DiskLockedError

    held: list[int] = []
    try:
        for store in sorted(path.glob(f"{_DISK_STORE_PREFIX}*")):
            lock = store / "lock"
            try:
                fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except (FileNotFoundError, NotADirectoryError):
                continue
            held.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DiskLockedError(
                    f"{store} is in use by a running kvtier (another replay with this --out?); "
                    "wait for it or choose another --out"
                ) from None
        yield
    finally:
        for fd in held:
            os.close(fd)


def disk_usage_line(config: HierarchyConfig, out_dir: Path) -> str | None:
    """How much the replay's disk tiers will allocate and how much the file system of
    `out_dir` has free (None when no disk tier is active)."""
    from kvtier.tiers.disk.safety import format_bytes, free_bytes

    size = sum(
        tier.num_blocks * config.block_size
        for tier in config.active_tiers()
        if not tier.kind.volatile and isinstance(getattr(tier, "path", None), Path)
    )
    if not size:
        return None
    return (
        f"  disk tiers allocate {format_bytes(size)} under {out_dir} "
        f"({format_bytes(free_bytes(out_dir))} free there; --clean removes them afterwards)"
    )


def clean_disk_dirs(disk_dirs: list[Path]) -> None:
    """Remove the replay's disk tier directories (what `--clean` asks for)."""
    import shutil

    for path in disk_dirs:
        shutil.rmtree(path, ignore_errors=True)


def prepare_disk_dirs(config: HierarchyConfig) -> list[Path]:
    """Empty each disk tier's directory of the kvtier stores it holds (`kvtier-*`), so the
    replay starts cold; return the directories. A directory holding anything else is left
    alone and raises InvalidValueError (it is not a replay's own)."""
    import shutil

    from kvtier.tiers.trusted import make_dirs

    dirs: list[Path] = []
    for tier in config.active_tiers():
        path = getattr(tier, "path", None)
        if tier.kind.volatile or not isinstance(path, Path):
            continue
        if path.exists():
            if not path.is_dir():
                raise InvalidValueError(f"{path}: the disk tier's place exists and is not a dir")
            others = [p.name for p in path.iterdir() if not p.name.startswith(_DISK_STORE_PREFIX)]
            if others:
                raise InvalidValueError(
                    f"{path} holds files that are not a kvtier disk tier ({', '.join(others[:3])})"
                    "; choose another --out"
                )
            with _stores_locked(path):  # a store in use by a running kvtier is not deleted
                for store in path.iterdir():
                    if store.is_dir() and not store.is_symlink():
                        shutil.rmtree(store)
                    else:
                        store.unlink()
        # The replay's own directories (0700): a disk tier creates only its last level.
        make_dirs(path, create_parents=True)
        dirs.append(path)
    return dirs


# -- the trace ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayTrace:
    """A trace to replay: its requests and, for a Mooncake trace, each request's prompt length
    in tokens (None for a key file, whose blocks count `MOONCAKE_BLOCK_TOKENS` tokens each)."""

    trace: SimTrace
    input_lengths: tuple[int, ...] | None

    @property
    def requests(self) -> list[tuple[Any, ...]]:
        return self.trace.requests


def load_replay_trace(path: Path | None, limit: int | None) -> ReplayTrace:
    """The trace at `path` (None: the shipped Mooncake conversation trace), first `limit`
    requests, read by `kvtier_tools.workloads.simulation.load_trace` (Mooncake JSONL or a key file,
    plain or zstd; a bad line raises TraceFormatError naming file and line). A request that
    names the same block twice raises TraceFormatError too (a prefix cannot hold a block twice)."""
    if limit is not None and limit < 1:
        raise InvalidValueError(f"--limit must be at least 1, got {limit}")
    trace = load_trace(path, limit)
    for number, request in enumerate(trace.requests, 1):
        if len(set(request)) != len(request):
            duplicate = next(k for i, k in enumerate(request) if k in request[:i])
            raise TraceFormatError(
                f"{trace.path}: request {number} names block {duplicate!r} twice"
            )
    lengths: tuple[int, ...] | None = None
    if trace.format == "mooncake":
        source = None if path is None else path
        lengths = tuple(
            r.input_length for r in itertools.islice(read_mooncake(source), len(trace.requests))
        )
    return ReplayTrace(trace, lengths)


# -- the replay -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One loaded block that was not the bytes stored for its key."""

    request: int
    position: int
    key: str
    tier: str

    def to_dict(self) -> dict[str, Any]:
        return {"request": self.request, "position": self.position, "key": self.key,
                "tier": self.tier}  # fmt: skip


@dataclass(slots=True)
class ReplayCounters:
    """Running totals of a replay (blocks, except `requests` and the token counts)."""

    requests: int = 0
    accesses: int = 0
    looked_up: int = 0
    """Leading blocks `lookup` said some tier held."""
    hits: int = 0
    """Blocks `get` served (and the replay verified)."""
    tier_hits: dict[str, int] = field(default_factory=dict)
    verified: int = 0
    mismatches: int = 0
    mismatch_examples: list[Mismatch] = field(default_factory=list)
    input_tokens: int = 0
    tokens_reused: int = 0
    event_batches: int = 0
    events_stored: int = 0
    events_removed: int = 0
    unique: set[OffloadKey] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """Running totals after `requests` requests, for the chart."""

    requests: int
    accesses: int
    tier_hits: dict[str, int]
    infinite_hits: int
    pair_bytes: dict[str, int]
    elapsed_s: float


def pair_name(pair: tuple[str, str]) -> str:
    """`"cpu->disk"` for the pair ("cpu", "disk")."""
    return f"{pair[0]}->{pair[1]}"


class Replayer:
    """Serves requests one at a time through an open hierarchy, verifying every loaded block.

    `serve` is one request (see the module docstring); the counters are updated only when a
    request is complete, so a replay cut short counts whole requests only.

    The missed blocks are put in batches of the Hierarchy's own `put` batch (a quarter of the
    top tier), each followed by `drain()`: with write-through, a batch's cascade then reaches
    the lower tiers before the next batch evicts from the top, as in the simulation (which
    completes every job at once). Without it, a request longer than a batch would evict
    while its earlier batch's cascade is still in flight, and per-tier hits could differ
    slightly from `kvtier simulate --config` (the totals would not).
    """

    def __init__(
        self,
        hierarchy: Hierarchy,
        contents: BlockContents,
        *,
        block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    ) -> None:
        if contents.block_bytes != hierarchy.block_size:
            raise InvalidValueError(
                f"contents of {contents.block_bytes}-byte blocks for a hierarchy of "
                f"{hierarchy.block_size}-byte blocks"
            )
        self.hierarchy = hierarchy
        self.contents = contents
        self.block_tokens = block_tokens
        self.counters = ReplayCounters(tier_hits={tier.name: 0 for tier in hierarchy.tiers})
        self.put_batch = max(1, hierarchy.tiers[0].num_blocks // 4)
        """Blocks per `put` call: the Hierarchy's own batch (a quarter of the top tier), so
        that each call is one store, after which the replay drains the background jobs."""

    async def _off_loop(
        self, work: Callable[..., _T], keys: Sequence[OffloadKey], *args: Any
    ) -> _T:
        """`work(keys, *args)`: in a worker thread when it touches more than
        `OFF_LOOP_BYTES` (numpy releases the GIL, so transfers go on meanwhile), else here."""
        if len(keys) * self.contents.block_bytes > OFF_LOOP_BYTES:
            return await asyncio.to_thread(work, keys, *args)
        return work(keys, *args)

    async def serve(
        self,
        keys: Sequence[OffloadKey],
        input_length: int | None = None,
        session: str | None = None,
        expect_within_s: float | None = None,
    ) -> int:
        """Serve one request (its block keys, in prefix order); return how many leading
        blocks were loaded (hits). `input_length` caps the tokens counted as reused; every put
        carries `session` (and `expect_within_s`), and one more names the hits
        (`replay_sessions`)."""
        h = self.hierarchy
        keys = list(keys)
        looked_up = h.lookup(keys)
        tiers = [h.where(key) or "?" for key in keys[:looked_up]]
        got = 0
        bad: list[int] = []
        if looked_up:
            loaded = await h.get(keys[:looked_up])
            got = int(loaded.shape[0])
            if got:
                bad = await self._off_loop(self.contents.bad_rows, keys[:got], loaded)
            del loaded
        await h.drain()
        if session is not None and got:  # held already: the session's read, nothing stored
            await h.put(
                keys[:got],
                await self._off_loop(self.contents.make, keys[:got]),
                session=session,
                expect_within_s=expect_within_s,
            )
        for start in range(got, len(keys), self.put_batch):
            part = keys[start : start + self.put_batch]
            await h.put(
                part,
                await self._off_loop(self.contents.make, part),
                session=session,
                expect_within_s=expect_within_s,
            )
            await h.drain()
        events = h.take_events()

        c = self.counters
        c.requests += 1
        c.accesses += len(keys)
        c.unique.update(keys)
        c.looked_up += looked_up
        c.hits += got
        for tier in tiers[:got]:
            c.tier_hits[tier] = c.tier_hits.get(tier, 0) + 1
        c.verified += got
        c.mismatches += len(bad)
        for position in bad:
            if len(c.mismatch_examples) < MISMATCH_EXAMPLES:
                c.mismatch_examples.append(
                    Mismatch(c.requests, position, keys[position].hex(), tiers[position])
                )
        tokens = len(keys) * self.block_tokens if input_length is None else input_length
        c.input_tokens += tokens
        c.tokens_reused += min(got * self.block_tokens, tokens)
        c.event_batches += len(events)
        for event in events:
            if event.removed:
                c.events_removed += len(event.keys)
            else:
                c.events_stored += len(event.keys)
        return got


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Everything a replay measured; `to_dict()` is `report.json`."""

    config_source: str
    config: HierarchyConfig
    """The configuration as given (its block size is the model's)."""
    replayed: HierarchyConfig
    """The configuration replayed: `block_bytes`-byte blocks, the same block counts."""
    block_bytes: int
    trace: SimTrace
    requests_planned: int
    tiers: tuple[TierInfo, ...]
    counters: ReplayCounters
    stats: HierarchyStats
    series: tuple[SeriesPoint, ...]
    timings: dict[str, float]
    disk_dirs: tuple[Path, ...]
    interrupted: bool
    sessions: SessionPlan | None = None

    @property
    def partial(self) -> bool:
        """Whether the replay stopped before the end of the trace (Ctrl-C)."""
        return self.interrupted or self.counters.requests < self.requests_planned

    @property
    def hit_ratio(self) -> float:
        c = self.counters
        return c.hits / c.accesses if c.accesses else 0.0

    def tier_hit_ratio(self, name: str) -> float:
        """Tier `name`'s hits over all block accesses (the ratios add up to `hit_ratio`)."""
        c = self.counters
        return c.tier_hits.get(name, 0) / c.accesses if c.accesses else 0.0

    def blocks_written(self, name: str) -> int:
        """Blocks stored into tier `name` (puts, demotions, cascades, promotions)."""
        return next((a.stored for a in self.stats.activity if a.name == name), 0)

    @property
    def infinite_hit_ratio(self) -> float:
        """Hit ratio of an infinite cache over the requests replayed."""
        c = self.counters
        return (c.accesses - len(c.unique)) / c.accesses if c.accesses else 0.0

    @property
    def failed_blocks(self) -> int:
        """Blocks whose copy failed for a real reason: an I/O error, bytes the tier's check
        rejected. The hierarchy's `failed_blocks` also counts its `gone_blocks` (blocks a
        shared store no longer held: it evicted them itself, or could not be asked), which
        are misses, not failures; the report shows those apart, as "gone"."""
        return self.stats.failed_blocks - self.stats.gone_blocks

    @property
    def scaled(self) -> bool:
        """Whether the replay's blocks are smaller (or larger) than the config's."""
        return self.block_bytes != self.config.block_size

    def pairs(self) -> list[dict[str, Any]]:
        """Traffic per tier pair, in the order the transfer engine first moved bytes between
        them; `copies` and `blocks_per_copy` say how large the pair's copies were (a disk
        pair's GB/s depends on it: each copy pays its own write hand-offs and fdatasync),
        `peak_in_flight` how many ran at once at most (1: one at a time, so a disk tier had
        no queued calls to merge into one group)."""
        copies = {(t.source, t.target): t.copies for t in self.stats.transfers}
        peaks = {(t.source, t.target): t.peak_in_flight for t in self.stats.transfers}
        rows = []
        for (src, dst), (blocks, nbytes, seconds) in self.stats.pairs.items():
            made = copies.get((src, dst), 0)
            rows.append(
                {
                    "source": src,
                    "destination": dst,
                    "blocks": blocks,
                    "bytes": nbytes,
                    "seconds": seconds,
                    "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else None,
                    "copies": made,
                    "blocks_per_copy": blocks / made if made else None,
                    "peak_in_flight": peaks.get((src, dst), 0),
                }
            )
        return rows

    def latency(self) -> dict[str, float | int]:
        """`get` latency percentiles, seconds (estimated from the latency histogram's
        buckets, see `kvtier.metrics.LatencyHistogram`)."""
        return {
            "calls": self.stats.calls.get_latency.count,
            "p50_s": self.stats.latency_percentile(50),
            "p99_s": self.stats.latency_percentile(99),
        }

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (what `report.json` holds)."""
        c = self.counters
        chain = self.stats.chain
        calls = self.stats.calls
        return {
            "kind": "kvtier replay",
            "partial": self.partial,
            "interrupted": self.interrupted,
            "method": (
                "per request: n = lookup(keys); where(k) for keys[:n]; got = get(keys[:n]), each "
                "loaded block verified bit-exact against its key's content; put(keys[got:]) in "
                "batches of a quarter of the top tier, drain() after each; block i < got "
                "counts as a hit of the tier where(k) named. Per-tier hits equal `kvtier "
                "simulate --config` of the same chain and block counts."
            ),
            "config": {
                "source": self.config_source,
                "block_size": self.config.block_size,
                "given": self.config.model_dump(mode="json"),
                "replayed": self.replayed.model_dump(mode="json"),
            },
            "block_bytes": {
                "config": self.config.block_size,
                "replayed": self.block_bytes,
                "scaled": self.scaled,
                "note": (
                    "each tier keeps its block count (so hit ratios are the config's, but for "
                    "min_refill, a size that spans more of smaller blocks); bytes and GB/s "
                    "are those of the replayed block size"
                ),
            },
            "disk_dirs": [str(path) for path in self.disk_dirs],
            "trace": {
                **self.trace.summary(),
                "requests_planned": self.requests_planned,
                "requests_replayed": c.requests,
            },
            "requests": c.requests,
            "block_accesses": c.accesses,
            "unique_blocks": len(c.unique),
            "looked_up": c.looked_up,
            "hits": c.hits,
            "hit_ratio": self.hit_ratio,
            "infinite_cache_hit_ratio": self.infinite_hit_ratio,
            "tiers": [
                {
                    "name": tier.name,
                    "medium": tier.medium,
                    "where": tier.where,
                    "policy": tier.policy,
                    "blocks": tier.num_blocks,
                    "bytes": tier.num_blocks * self.block_bytes,
                    "hits": c.tier_hits.get(tier.name, 0),
                    "hit_ratio": self.tier_hit_ratio(tier.name),
                    "blocks_written": self.blocks_written(tier.name),
                    "bytes_written": self.blocks_written(tier.name) * self.block_bytes,
                }
                for tier in self.tiers
            ],
            "prefill": {
                "block_tokens": MOONCAKE_BLOCK_TOKENS,
                "input_tokens": c.input_tokens,
                "tokens_reused": c.tokens_reused,
                "fraction_saved": c.tokens_reused / c.input_tokens if c.input_tokens else 0.0,
                "capped_by_input_length": self.trace.format == "mooncake",
            },
            "pairs": self.pairs(),
            "bytes_moved": sum(nbytes for _, nbytes, _ in self.stats.pairs.values()),
            "load_latency": self.latency(),
            "verification": {
                "verified": c.verified,
                "mismatches": c.mismatches,
                "examples": [m.to_dict() for m in c.mismatch_examples],
            },
            "calls": {
                "put_blocks": calls.put_blocks,
                "put_stored": calls.put_stored,
                "put_present": calls.put_present,
                "put_refused": calls.put_refused,
                "put_failed": calls.put_failed,
                "get_blocks": calls.get_blocks,
                "get_served": calls.get_served,
                "get_timeouts": calls.get_timeouts,
            },
            "chain": {
                "promotions": chain.promotions,
                "promotions_refused": chain.promotions_refused,
                "demoted": chain.demoted,
                "demotions_dropped": chain.demotions_dropped,
                "demotions_refused": chain.demotions_refused,
                "dropped_at_bottom": chain.dropped_at_bottom,
                "cascaded": chain.cascaded,
                "cascades_dropped": self.stats.cascades_dropped,
                "copy_failures": chain.copy_failures,
                "corrupt_dropped": chain.corrupt_dropped,
            },
            "jobs": self.stats.jobs,
            "events": {
                "batches": c.event_batches,
                "stored_blocks": c.events_stored,
                "removed_blocks": c.events_removed,
            },
            "corrupt_blocks": self.stats.corrupt_blocks,
            "failed_blocks": self.failed_blocks,
            "gone_blocks": self.stats.gone_blocks,
            "occupancy": [
                {"name": tier.name, "used": tier.used, "blocks": tier.num_blocks}
                for tier in self.stats.tiers
            ],
            "timings": self.timings,
            "sessions": None if self.sessions is None else self.sessions.to_dict(),
            "series": {
                "requests": [p.requests for p in self.series],
                "block_accesses": [p.accesses for p in self.series],
                "tier_hits": {
                    tier.name: [p.tier_hits.get(tier.name, 0) for p in self.series]
                    for tier in self.tiers
                },
                "infinite_hits": [p.infinite_hits for p in self.series],
                "pair_bytes": {
                    name: [p.pair_bytes.get(name, 0) for p in self.series]
                    for name in (pair_name(pair) for pair in self.stats.pairs)
                },
                "elapsed_s": [round(p.elapsed_s, 4) for p in self.series],
            },
        }


def _point(replayer: Replayer, started: float) -> SeriesPoint:
    c = replayer.counters
    pairs = replayer.hierarchy.stats().pairs
    return SeriesPoint(
        c.requests,
        c.accesses,
        dict(c.tier_hits),
        c.accesses - len(c.unique),
        {pair_name(pair): nbytes for pair, (_, nbytes, _) in pairs.items()},
        time.perf_counter() - started,
    )


class _StopOnInterrupt:
    """While installed, the first SIGINT sets `requested` (the replay stops at the next
    request) and a second one cancels the running task, as asyncio.run's own handler would.
    Installed only where the loop can take signals (its thread is the main thread)."""

    def __init__(self) -> None:
        self.requested = False
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._previous = signal.getsignal(signal.SIGINT)  # asyncio.run's, given back after
        try:
            self._loop.add_signal_handler(signal.SIGINT, self._interrupt)
            self._installed = True
        except (NotImplementedError, RuntimeError, ValueError):
            self._installed = False  # not the main thread, or no signals here

    def _interrupt(self) -> None:
        if self.requested and self._task is not None:
            self._task.cancel()
        self.requested = True

    def remove(self) -> None:
        if self._installed:
            self._loop.remove_signal_handler(signal.SIGINT)
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False


async def replay(
    config: HierarchyConfig,
    trace: ReplayTrace,
    *,
    config_source: str = "",
    given: HierarchyConfig | None = None,
    contents: BlockContents | None = None,
    progress: Callable[[int], None] | None = None,
    disk_dirs: Sequence[Path] = (),
    load_trace_s: float = 0.0,
    metrics: CollectorRegistry | None = None,
    freeze_gc: bool = False,
    sessions: SessionPlan | None = None,
) -> ReplayResult:
    """Replay `trace` through a hierarchy opened from `config` (the replayed configuration;
    `given` is the user's, for the report) and return what it measured. `metrics`: a
    prometheus_client registry to export the hierarchy's metrics on while it runs
    (`hierarchy="replay"`). `sessions`: give the trace's sessions to the hierarchy
    (`kvtier_tools.workloads.replay_sessions`).

    `freeze_gc` (for a process that is the replay's own, as `kvtier replay`'s): once the
    hierarchy is open, every object alive (the interpreter's, torch's, the trace's, the
    hierarchy's) is moved out of the cyclic collector's sight (`gc.freeze()`), as a serving
    engine does once it is set up (vLLM freezes its heap after start-up), and thawed at the
    end (`gc.unfreeze()`, which also thaws what the process froze before). A full
    collection then visits only what the replay made since, not the ~330,000 objects of
    the set-up, which took ~140 ms each time on the 2-core VM (10 times in 8,000 requests
    of the default replay), stalling whatever copy was in flight.

    Ctrl-C (SIGINT, where the loop runs in the main thread) stops the replay at the next
    request, and a cancellation (a second Ctrl-C under `asyncio.run`) at once; either way the
    hierarchy is closed cleanly and a partial result (`interrupted`) is returned, rather than
    propagating. The first Ctrl-C is a flag read between requests, not a cancellation, so no
    await along the data path can swallow it.
    """
    contents = contents or BlockContents(config.block_size)
    started = time.perf_counter()
    requests = trace.requests
    every = max(1, len(requests) // SERIES_POINTS)
    series: list[SeriesPoint] = []
    interrupted = False
    timings: dict[str, float] = {"load_trace_s": load_trace_s}
    # No flush on close: the next replay empties the disk tiers anyway (it starts cold).
    clock = {} if sessions is None else {"session_clock": sessions.clock}
    hierarchy = Hierarchy.from_config(
        config, flush_on_close=False, metrics=metrics, metrics_name="replay", **clock
    )
    async with hierarchy as h:
        opened = time.perf_counter()
        timings["open_s"] = opened - started
        replayer = Replayer(h, contents)
        lengths = trace.input_lengths
        stop = _StopOnInterrupt()
        if freeze_gc:
            gc.freeze()
        try:
            for index, request in enumerate(requests):
                if stop.requested:
                    interrupted = True
                    break
                keys = [offload_key_of(key) for key in request]
                session = within = None
                if sessions is not None:
                    session, within = sessions.session_of(index), sessions.expect_within(index)
                length = None if lengths is None else lengths[index]
                await replayer.serve(keys, length, session, within)
                if sessions is not None:
                    sessions.after(h, index)  # the session ended
                number = index + 1
                if number % every == 0 or number == len(requests):
                    series.append(_point(replayer, opened))
                if progress is not None:
                    progress(1)
        except asyncio.CancelledError:
            interrupted = True
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            stop.remove()
            if freeze_gc:
                gc.unfreeze()
        if interrupted and (not series or series[-1].requests != replayer.counters.requests):
            series.append(_point(replayer, opened))
        served = time.perf_counter()
        timings["replay_s"] = served - opened
        h.check()
        stats = h.stats()
        tiers = tuple(h.tiers)
    closed = time.perf_counter()
    timings["close_s"] = closed - served
    timings["total_s"] = closed - started + load_trace_s
    return ReplayResult(
        config_source=config_source,
        config=given or config,
        replayed=config,
        block_bytes=config.block_size,
        trace=trace.trace,
        requests_planned=len(requests),
        tiers=tiers,
        counters=replayer.counters,
        stats=stats,
        series=tuple(series),
        timings={key: round(value, 4) for key, value in timings.items()},
        disk_dirs=tuple(disk_dirs),
        interrupted=interrupted,
        sessions=sessions,
    )


def run_replay(
    given: HierarchyConfig,
    trace: ReplayTrace,
    *,
    block_bytes: int,
    out_dir: Path,
    config_source: str = "",
    progress: Callable[[int], None] | None = None,
    contents: BlockContents | None = None,
    load_trace_s: float = 0.0,
) -> ReplayResult:
    """Build the replayed configuration (`block_bytes` blocks, disk tiers under
    `out_dir/disk/<tier>`, emptied), and replay `trace` through it in a new event loop."""
    config = replay_config(given, block_bytes, out_dir / "disk")
    if not config.active_tiers():
        raise InvalidValueError("the configuration has no active tier here (no CUDA?)")
    dirs = prepare_disk_dirs(config)
    return asyncio.run(
        replay(
            config,
            trace,
            config_source=config_source,
            given=given,
            contents=contents,
            progress=progress,
            disk_dirs=dirs,
            load_trace_s=load_trace_s,
        )
    )


def write_report(result: ReplayResult, out_dir: Path) -> Path:
    """Write `report.json` into `out_dir`, whole or not at all; return its path. The command
    line draws the chart (`kvtier_tools.cli.replay_chart.plot_replay`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    # Whole or not at all: a reader never sees half a report.
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        temporary.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise InvalidValueError(f"cannot write {path}: {error.strerror or error}") from None
    return path


def size_argument(size: int) -> str:
    """`size` as an option value that means exactly `size` bytes: "256KiB", else "262145"."""
    text = format_size(size)
    return text if parse_size(text) == size else str(size)


def describe_block_bytes(result: ReplayResult) -> str:
    """One line on the replayed block size against the config's."""
    given, used = format_size(result.config.block_size), format_size(result.block_bytes)
    if not result.scaled:
        return f"blocks of {used}, as configured"
    return (
        f"blocks of {used} instead of the config's {given}: each tier keeps its block count, "
        f"so hit ratios are the config's (but for min_refill, a size); bytes and GB/s are "
        f"those of {used} blocks "
        f"(--block-bytes {size_argument(result.config.block_size)} replays the real size)"
    )
