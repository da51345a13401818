"""Data-path throughput: kvtier's copies and disk I/O against this machine's own limits.

A benchmark that prints figures; it asserts nothing about speed. Every figure is kvtier's
achieved bandwidth next to a baseline measured in the same run, on the same bytes and the
same memory or filesystem, so that the ratio says how much of what the machine can do kvtier
gets (the target is 80 %), whatever the machine.

What is measured (per block size; GB/s are 10**9 bytes per second)
-----------------------------------------------------------------
``cpu -> cpu``: `TensorCopier.copy` of N blocks between two host `TorchPool`s, at scattered
slots (independent random permutations of the source and destination rows) and as one
contiguous run; baseline: one `dst.copy_(src)` of the two pools' whole tensors (the same
total bytes).

``cpu -> disk``: `DiskStore.write` of N blocks in one call (fsync on, O_DIRECT where the
probe allows, no compression) taken from scattered rows of a host pool into consecutive slots
of the store, fresh keys every time (so each write first unindexes the previous occupants, as
in a full tier); baseline: one `os.pwrite` of the same bytes from page-aligned memory with
O_DIRECT, then `os.fdatasync`, to a preallocated file in the same directory (queue depth 1).

``disk -> cpu``: `DiskStore.read` of those N blocks in one call (every checksum verified)
into scattered rows of another host pool; baseline: one `os.preadv` of the same bytes
straight from the store's slab file, with O_DIRECT (into page-aligned memory), so that
neither side reads from the page cache (queue depth 1).

``cpu -> disk (serial / concurrent)``, serving-sized: what a serving engine's demotions do.
`DiskStore.write` of `SERVING_WRITE_BLOCKS` (20) blocks per call, each call durable (fsync
on), fresh keys into every slot of a store of `serving_blocks` slots (about the same bytes
as the one-batch row, at least one batch per lane); serial: one call at a time; concurrent:
`SERVING_QUEUE_DEPTH` (16) callers in one `asyncio.gather`, each writing its own region of
consecutive slots one batch after another, so 16 calls are in flight. Baseline: as many
threads (1 or 16), each doing `os.pwritev` + `os.fdatasync` of the same 20-block batches of
the same bytes with O_DIRECT into its own region of a preallocated file, the queue depth that
saturates the device. The row also sums `DiskStore.stats()`'s group-commit counters
(`GROUP_COMMIT_COUNTERS`, where the store has them) into batches per fsync.

``disk -> cpu (serial / concurrent)``, serving-sized: `DiskStore.read` of
`SERVING_READ_BLOCKS` (16) consecutive slots per call (a prefix), 1 or 16 callers; baseline:
1 or 16 threads doing O_DIRECT `os.preadv` of the same 16-block runs from the store's slab
file. Where the filesystem refuses O_DIRECT, every raw baseline runs buffered (reads from a
warm page cache, writes still fdatasync'ed), and the output says so.

``cpu -> gpu`` / ``gpu -> cpu`` (only where `torch.cuda.is_available()`): `TensorCopier.copy`
between a pinned host pool and a pool on the GPU, scattered and contiguous, both directions;
baseline: one `copy_(..., non_blocking=True)` of the whole pool between the same pinned and
device tensors followed by `torch.cuda.synchronize()`. Both sides are wall-clock times that
start after a `torch.cuda.synchronize()`; kvtier's ends when its awaited copy returns (it
polls a CUDA event without blocking the event loop, as the transfer engine does).

``device`` (with the disk rows): the raw device alone, in the same directory, before the disk
rows of each block size: sequential O_DIRECT writes of 1 MiB parts, 16 in flight, + one
fdatasync (write GB/s), then random O_DIRECT reads of one block each, 16 in flight (read
GB/s); see `kvtier_tools.bench.device`. Every disk row then also shows its share of the
device ("of device"). The one-batch write rows (``cpu -> disk``, its log layout and its
steady state) pair it per repeat: each repeat times the device's write pattern
(`device.SequentialWriter`: the same bytes, 1 MiB parts, 16 in flight, one fdatasync,
O_DIRECT, a preallocated file in the same directory, written once in the warm-up) right
before or after the store's call (the order alternating), and `of device` is the median over
repeats of (kvtier GB/s / device GB/s of the same repeat), as `ratio` is for the raw
baseline: the device's drift, and the device row's own sequence (its writes back to back,
before the disk rows), stay out of it.
The other disk rows (reads, serving-sized writes) divide by the device row: kvtier's GB/s over
its write or read GB/s at the same block size, a ratio of medians (`of_device_row` in the
JSON, for every disk row, the old figure beside the paired one).

``bookkeeping``: block-operations per second of `TierManager` replaying the first
`QUICK_LIMIT_REQUESTS` requests of the shipped trace (`kvtier_tools.bench.bookkeeping` in its quick
mode, kvtier alone).

Method
------
Every measurement runs once as a warm-up (discarded), then `repeats` times, kvtier and its
baseline back to back, alternating which goes first. The one-batch disk writes warm the
store up longer: until a call writes under 1 % of its bytes to space of the store's files
never written before (holes or preallocated extents, by `SEEK_HOLE`;
`device.never_written_bytes`; what the timed calls still wrote there is `first_pass_bytes`
in the JSON), as the raw
baseline's and the device's warm-ups write their whole preallocated files: a log store a
call large has more regions than a call fills, and a first write to an extent costs its
conversion, which the timed calls must not pay on one side only (`warmup_calls` in the
JSON). A row shows the median of kvtier's
times, the median of the baseline's, and as ratio the median over repeats of (kvtier GB/s /
baseline GB/s) of the same repeat: pairing the two keeps the drift of a noisy machine out of
the ratio. Pools and buffers are touched before timing (no first-touch page faults are
timed). After timing, every pair copies fresh bytes once more and checks that each block
arrived where it belongs (a block's first 8 bytes carry its row and a generation number,
compared for every block; whole blocks for a sample): a figure for wrong bytes is worthless.
Files go into a fresh temporary directory (by default next to the disk tier's default
directory, `~/.cache/kvtier`, so on the same filesystem), removed at the end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import functools
import gc
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvtier.config import format_size
from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey, key_from_int
from kvtier.tiers.disk.io import PLAIN_IO, preadv_all, pwritev_all
from kvtier.tiers.pool.storage import TorchPool
from kvtier.tiers.storage import ReadFailure
from kvtier.tiers.tensor_copy import TensorCopier
from kvtier_tools.bench.device import (
    DeviceRow,
    SequentialWriter,
    measure_device,
    never_written_bytes,
    page_aligned,
)

GB = 1e9
"""A GB/s figure is this many bytes per second (decimal, as disks and links are rated)."""

TARGET = 0.80
"""kvtier should reach this fraction of the baseline's bandwidth."""

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

DEFAULT_BLOCK_SIZES: tuple[int, ...] = (64 * KIB, 256 * KIB, 2 * MIB)
DEFAULT_COPY_BYTES = 256 * MIB
DEFAULT_DISK_BYTES = 128 * MIB
DEFAULT_GPU_BYTES = 1 * GIB
DEFAULT_REPEATS = 5
QUICK_COPY_BYTES = 64 * MIB
QUICK_DISK_BYTES = 32 * MIB
QUICK_GPU_BYTES = 256 * MIB
QUICK_REPEATS = 3

SERVING_WRITE_BLOCKS = 20
"""Blocks per `DiskStore.write` in the serving-sized rows: about what one demotion batch of a
serving engine holds."""
SERVING_READ_BLOCKS = 16
"""Blocks per `DiskStore.read` in the serving-sized rows: a typical prefix read back."""
WARMUP_LIMIT = 8
"""At most this many warm-up calls (plus the store's size in batches) in the one-batch disk
write rows, where the filesystem keeps reporting never-written space."""
STEADY_CALLS = 4
"""Batches the log layout's steady-state rows' store holds (`measure_disk`'s `store_calls`):
each timed write overwrites the oldest, as in a full tier, rather than the batch before it
in a store exactly one batch large (which makes the log reclaim inside every call)."""
SERVING_QUEUE_DEPTH = 16
"""Calls in flight in the concurrent rows, on both sides: kvtier's concurrent `DiskStore`
calls and the raw baseline's threads (enough to saturate an SSD or a virtual disk)."""
GROUP_COMMIT_COUNTERS: tuple[str, ...] = (
    "write_groups",
    "write_batches",
    "fsyncs",
    "index_commits",
)
"""`DiskStoreStats` counters of group commit, reported where the store has them."""

PARTS: tuple[str, ...] = ("cpu", "disk", "gpu", "bookkeeping")
"""What can be measured: CPU-tier copies, disk writes and reads, GPU <-> pinned CPU copies,
bookkeeping throughput."""

_JSON_FORMAT = "kvtier_tools.bench.datapath/1"
_VERIFY_SAMPLE = 16  # whole blocks compared per pair (every block's stamp is compared)
_SPACE_MARGIN = 3  # free space wanted on the disk: this many times the disk bytes
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)


# -- results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    """One measurement: kvtier against its baseline for one pair, case and block size.

    `blocks` / `nbytes` are what one timed run moves; `kvtier_s` / `baseline_s` are every
    repeat's wall-clock seconds (warm-up excluded); `baseline` says what the baseline did
    (and at which queue depth); `verified` whether every block arrived intact in the place it
    belongs after the timed runs. A run is made of calls of `batch_blocks` blocks each (0: one
    call of all `blocks`), `queue_depth` of them in flight at once on both sides (kvtier's
    concurrent calls, the baseline's threads). `store_counters` holds, for the disk write
    rows, `DiskStore.stats()`'s group-commit counters summed over the row's runs, and
    `write_calls`, the `DiskStore.write` calls made in those runs. `device_gbps`, for the
    disk rows, is the device row's write (cpu -> disk) or read (disk -> cpu) GB/s at the same
    block size, measured in the same run (None elsewhere). `device_s`, for the one-batch
    write rows, is every repeat's seconds of the device's write pattern of the same bytes,
    timed beside kvtier's call of that repeat (empty elsewhere); `warmup_calls` the store
    calls made before timing (fill calls excluded; 0 where not counted), `first_pass_bytes`
    the bytes of never-written space (`device.never_written_bytes`) the timed calls wrote.
    """

    pair: str
    case: str
    block_size: int
    blocks: int
    nbytes: int
    kvtier_s: tuple[float, ...]
    baseline_s: tuple[float, ...]
    baseline: str
    verified: bool
    batch_blocks: int = 0
    queue_depth: int = 1
    store_counters: dict[str, int] = field(default_factory=dict, hash=False)
    device_gbps: float | None = None
    device_s: tuple[float, ...] = ()
    warmup_calls: int = 0
    first_pass_bytes: int = 0

    @property
    def of_device(self) -> float | None:
        """kvtier's share of the device: the paired figure where the row has one
        (`of_device_paired`), else the device row's (`of_device_row`); None without either."""
        if self.device_s:
            return self.of_device_paired
        return self.of_device_row

    @property
    def of_device_paired(self) -> float | None:
        """Median over repeats of kvtier's GB/s over the device pattern's GB/s of the same
        repeat (the same bytes both), None where the device was not timed beside kvtier."""
        if not self.device_s:
            return None
        return float(
            statistics.median(
                d / k if k > 0 else math.inf
                for k, d in zip(self.kvtier_s, self.device_s, strict=True)
            )
        )

    @property
    def device_paired_gbps(self) -> float | None:
        """The device pattern's bandwidth from its median time beside kvtier's calls."""
        if not self.device_s:
            return None
        return _gbps(self.nbytes, statistics.median(self.device_s))

    @property
    def of_device_row(self) -> float | None:
        """kvtier's GB/s over the device row's (measured once per block size before the disk
        rows; a ratio of medians), None where there is no device figure."""
        if self.device_gbps is None or self.device_gbps <= 0:
            return None
        return self.kvtier_gbps / self.device_gbps

    @property
    def blocks_per_batch(self) -> int:
        """Blocks per kvtier call (and per baseline I/O call)."""
        return self.batch_blocks or self.blocks

    @property
    def kvtier_blocks_per_s(self) -> float:
        """kvtier's blocks per second from its median time (small blocks are bound by
        per-block CPU work, which this shows better than GB/s)."""
        seconds = statistics.median(self.kvtier_s)
        return self.blocks / seconds if seconds > 0 else math.inf

    @property
    def baseline_blocks_per_s(self) -> float:
        """The baseline's blocks per second from its median time."""
        seconds = statistics.median(self.baseline_s)
        return self.blocks / seconds if seconds > 0 else math.inf

    @property
    def batches_per_fsync(self) -> float | None:
        """Write batches per fsync the store made for this row (group commit merges
        concurrent batches into one fsync): `write_batches` (else the calls made) over
        `fsyncs` (else `write_groups`); None where the store counts neither."""
        counters = self.store_counters
        batches = counters.get("write_batches", counters.get("write_calls", 0))
        syncs = counters.get("fsyncs", counters.get("write_groups"))
        if not syncs or not batches:
            return None
        return batches / syncs

    @property
    def kvtier_gbps(self) -> float:
        """kvtier's bandwidth from its median time."""
        return _gbps(self.nbytes, statistics.median(self.kvtier_s))

    @property
    def baseline_gbps(self) -> float:
        """The baseline's bandwidth from its median time."""
        return _gbps(self.nbytes, statistics.median(self.baseline_s))

    @property
    def ratio(self) -> float:
        """Median over repeats of kvtier's bandwidth over the baseline's in the same repeat."""
        return float(
            statistics.median(
                b / k if k > 0 else math.inf
                for k, b in zip(self.kvtier_s, self.baseline_s, strict=True)
            )
        )

    @property
    def target_met(self) -> bool:
        """Whether the bytes were right and the ratio reached `TARGET`."""
        return self.verified and self.ratio >= TARGET

    @property
    def label(self) -> str:
        """The pair and, where there are several, the case: "cpu -> cpu (scattered)"."""
        return f"{self.pair} ({self.case})" if self.case else self.pair

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kvtier_s"] = list(self.kvtier_s)
        data["baseline_s"] = list(self.baseline_s)
        data["kvtier_gbps"] = self.kvtier_gbps
        data["baseline_gbps"] = self.baseline_gbps
        data["ratio"] = self.ratio
        data["blocks_per_batch"] = self.blocks_per_batch
        data["kvtier_blocks_per_s"] = self.kvtier_blocks_per_s
        data["baseline_blocks_per_s"] = self.baseline_blocks_per_s
        data["batches_per_fsync"] = self.batches_per_fsync
        data["device_s"] = list(self.device_s)
        data["device_paired_gbps"] = self.device_paired_gbps
        data["of_device"] = self.of_device
        data["of_device_paired"] = self.of_device_paired
        data["of_device_row"] = self.of_device_row
        data["of_device_method"] = (
            "paired" if self.device_s else ("device row" if self.of_device_row else None)
        )
        data["target"] = TARGET
        data["target_met"] = self.target_met
        return data


@dataclass(frozen=True, slots=True)
class BookkeepingRow:
    """kvtier's bookkeeping throughput for one policy and capacity (all phases together)."""

    policy: str
    fraction: float
    capacity: int
    requests: int
    ops: int
    mops: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Settings:
    """What to measure and how much: block sizes, bytes per measurement (per kind of pair),
    repeats, the parts (`PARTS`) and the parent directory of the files (None: the default,
    see `default_parent_dir`)."""

    block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES
    copy_bytes: int = DEFAULT_COPY_BYTES
    disk_bytes: int = DEFAULT_DISK_BYTES
    gpu_bytes: int = DEFAULT_GPU_BYTES
    repeats: int = DEFAULT_REPEATS
    parts: tuple[str, ...] = PARTS
    directory: Path | None = None
    seed: int = 0

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        """Smaller measurements and fewer repeats (about 35 s on a small machine: the
        serving-sized disk rows keep 16 batches in flight whatever the size)."""
        values: dict[str, Any] = {
            "copy_bytes": QUICK_COPY_BYTES,
            "disk_bytes": QUICK_DISK_BYTES,
            "gpu_bytes": QUICK_GPU_BYTES,
            "repeats": QUICK_REPEATS,
        }
        values.update(overrides)
        return cls(**values)

    def validate(self) -> None:
        """Raise InvalidValueError naming the first bad setting."""
        if not self.block_sizes:
            raise InvalidValueError("give at least one block size")
        for size in self.block_sizes:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise InvalidValueError(f"a block size must be a positive int, got {size!r}")
        for name in ("copy_bytes", "disk_bytes", "gpu_bytes", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidValueError(f"{name} must be a positive int, got {value!r}")
        unknown = [part for part in self.parts if part not in PARTS]
        if unknown or not self.parts:
            raise InvalidValueError(
                f"parts must be some of {', '.join(PARTS)}, got {', '.join(self.parts) or 'none'}"
            )


@dataclass
class Report:
    """Everything one run measured, and where and how."""

    settings: Settings
    rows: list[Row] = field(default_factory=list)
    bookkeeping: list[BookkeepingRow] = field(default_factory=list)
    device: list[DeviceRow] = field(default_factory=list)
    """The raw device's rows, one per block size (with the disk rows)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Parts not measured, with the reason (e.g. "gpu": no CUDA)."""
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def wrong_bytes(self) -> list[Row]:
        """Rows whose verification failed."""
        return [row for row in self.rows if not row.verified]

    def to_dict(self) -> dict[str, Any]:
        settings = asdict(self.settings)
        settings["directory"] = (
            None if self.settings.directory is None else str(self.settings.directory)
        )
        return {
            "format": _JSON_FORMAT,
            "unit": "GB/s = 10**9 bytes per second; Mops/s = 10**6 block-operations per second",
            "target_ratio": TARGET,
            "settings": settings,
            "environment": self.environment,
            "rows": [row.to_dict() for row in self.rows],
            "bookkeeping": [row.to_dict() for row in self.bookkeeping],
            "device": [row.to_dict() for row in self.device],
            "skipped": self.skipped,
            "notes": self.notes,
        }

    def to_json(self) -> str:
        """The report as a JSON document (for scripts)."""
        return json.dumps(self.to_dict(), indent=2)


# -- helpers -------------------------------------------------------------------------------


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB if seconds > 0 else math.inf


def default_parent_dir() -> Path:
    """The disk tier's default directory (`~/.cache/kvtier`), or its nearest existing
    ancestor: the bench's files then land on the filesystem a default disk tier uses,
    without creating the cache directory as a side effect."""
    from kvtier.config import default_cache_dir

    path = default_cache_dir()
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


def filesystem_of(path: Path) -> str:
    """The type and mount point of the filesystem holding `path`, e.g. "ext4 on /" (Linux;
    "unknown" elsewhere)."""
    resolved = str(path.resolve())
    best = ("", "unknown")
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[0]):
                    best = (point, fields[2])
    except OSError:
        return "unknown"
    return f"{best[1]} on {best[0]}" if best[0] else "unknown"


def _fill(rows: npt.NDArray[np.uint8], generation: int, rng: np.random.Generator) -> None:
    """Give every row of a `[n, block_size]` host array distinct bytes: one random block
    everywhere, then in each row's first 8 bytes (when it has them) its index and
    `generation`, which `_stamps` reads back. Touches every page (no faults while timed)."""
    rows[:] = rng.integers(0, 256, size=rows.shape[1], dtype=np.uint8)
    if rows.shape[1] >= 8:
        rows[:, :8] = _expected_stamps(len(rows), generation).view(np.uint8).reshape(-1, 8)


def _expected_stamps(count: int, generation: int) -> npt.NDArray[np.uint64]:
    return (np.arange(count, dtype=np.uint64) | np.uint64(generation << 40)).astype("<u8")


def _stamps(rows: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
    """The first 8 bytes of each row as a little-endian integer."""
    return np.ascontiguousarray(rows[:, :8]).view("<u8").reshape(-1)


def _rows_match(
    src: npt.NDArray[np.uint8],
    src_ids: npt.NDArray[np.int64],
    dst: npt.NDArray[np.uint8],
    dst_ids: npt.NDArray[np.int64],
    rng: np.random.Generator,
) -> bool:
    """Whether `dst[dst_ids[i]] == src[src_ids[i]]` for every i: stamps of all rows, whole
    rows for a sample."""
    if src.shape[1] >= 8 and not np.array_equal(_stamps(dst)[dst_ids], _stamps(src)[src_ids]):
        return False
    count = len(src_ids)
    sample = rng.choice(count, size=min(count, _VERIFY_SAMPLE), replace=False)
    return all(np.array_equal(dst[dst_ids[i]], src[src_ids[i]]) for i in sample)


async def _paired(
    kvtier: Callable[[], Awaitable[float]],
    baseline: Callable[[], float],
    repeats: int,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Seconds of `repeats` runs of each (after one discarded warm-up run each), back to
    back, alternating which runs first."""
    await kvtier()
    baseline()
    kvtier_s: list[float] = []
    baseline_s: list[float] = []
    for repeat in range(repeats):
        gc.collect()
        if repeat % 2 == 0:
            kvtier_s.append(await kvtier())
            baseline_s.append(baseline())
        else:
            baseline_s.append(baseline())
            kvtier_s.append(await kvtier())
    return tuple(kvtier_s), tuple(baseline_s)


async def _paired_with_device(
    kvtier: Callable[[], Awaitable[float]],
    baseline: Callable[[], float],
    device: Callable[[], float],
    repeats: int,
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """Seconds of `repeats` runs of kvtier, its baseline and the device's pattern (after one
    discarded warm-up run each). kvtier runs between the other two, which swap sides every
    repeat (baseline, kvtier, device; then device, kvtier, baseline): each is timed right
    before kvtier in half the repeats and right after it in the other half."""
    await kvtier()
    baseline()
    device()
    kvtier_s: list[float] = []
    baseline_s: list[float] = []
    device_s: list[float] = []
    for repeat in range(repeats):
        gc.collect()
        if repeat % 2 == 0:
            baseline_s.append(baseline())
            kvtier_s.append(await kvtier())
            device_s.append(device())
        else:
            device_s.append(device())
            kvtier_s.append(await kvtier())
            baseline_s.append(baseline())
    return tuple(kvtier_s), tuple(baseline_s), tuple(device_s)


async def _warm_up_store(
    write: Callable[[], Awaitable[object]], directory: Path, limit: int, threshold: int
) -> int:
    """Calls of `write` until one writes fewer than `threshold` bytes of `directory`'s files
    that were never written (`never_written_bytes` dropped by less), at most `limit`; the
    number made. A first write to a preallocated extent converts it (and the next fdatasync
    commits that), which a rewrite does not: the device's and the raw baseline's warm-ups
    write their whole files, so the store's timed calls must not be its first pass over its
    regions either. (A region's last pages may stay unwritten, or be reached a page at a time
    by later calls: `threshold` keeps those from prolonging the warm-up.)"""
    before = never_written_bytes(directory)
    for calls in range(1, limit + 1):
        await write()
        after = never_written_bytes(directory)
        if before - after < threshold:
            return calls
        before = after
    return limit


def _warm_threshold(nbytes: int) -> int:
    """Never-written bytes a warm-up call may still write and end the warm-up: 1 % of the
    call's bytes, at least a page."""
    return max(4096, nbytes // 100)


def _blocks(nbytes: int, block_size: int) -> int:
    return max(1, nbytes // block_size)


def _host_pool(num_blocks: int, block_size: int) -> tuple[TorchPool, npt.NDArray[np.uint8]]:
    pool = TorchPool(num_blocks, block_size)
    return pool, pool.tensor.numpy()


# -- CPU tier copies -----------------------------------------------------------------------


async def measure_cpu_copies(
    block_size: int, nbytes: int, repeats: int, rng: np.random.Generator
) -> list[Row]:
    """`TensorCopier.copy` between two host pools (scattered, then contiguous) against one
    contiguous torch copy of the same bytes."""
    count = _blocks(nbytes, block_size)
    total = count * block_size
    src, src_rows = _host_pool(count, block_size)
    dst, dst_rows = _host_pool(count, block_size)
    _fill(src_rows, 1, rng)
    dst_rows.fill(0)
    copier = TensorCopier()
    cases = {
        "scattered": (rng.permutation(count), rng.permutation(count)),
        "contiguous": (np.arange(count), np.arange(count)),
    }
    rows: list[Row] = []
    for generation, (case, (src_ids, dst_ids)) in enumerate(cases.items(), start=2):

        async def run_kvtier(s: Any = src_ids, d: Any = dst_ids) -> float:
            start = time.perf_counter()
            await copier.copy(src.tensor, s, dst.tensor, d)
            return time.perf_counter() - start

        def run_baseline() -> float:
            start = time.perf_counter()
            dst.tensor.copy_(src.tensor)
            return time.perf_counter() - start

        kvtier_s, baseline_s = await _paired(run_kvtier, run_baseline, repeats)
        _fill(src_rows, generation, rng)
        dst_rows.fill(0)
        await copier.copy(src.tensor, src_ids, dst.tensor, dst_ids)
        verified = _rows_match(src_rows, src_ids, dst_rows, dst_ids, rng)
        rows.append(
            Row(
                "cpu -> cpu",
                case,
                block_size,
                count,
                total,
                kvtier_s,
                baseline_s,
                "one torch copy_ of the whole pool (same bytes)",
                verified,
            )
        )
    return rows


# -- disk ----------------------------------------------------------------------------------


def _open_raw_write(path: Path, block_size: int) -> tuple[bool, int]:
    """(whether O_DIRECT is on, fd) of a new file for a raw write baseline: O_DIRECT unless
    the filesystem refuses it (or blocks are not whole 4 KiB pages), else buffered."""
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC
    if _O_DIRECT and block_size % 4096 == 0:
        try:
            return True, os.open(path, flags | _O_DIRECT, 0o600)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
    return False, os.open(path, flags, 0o600)


def _raw_mode(direct: bool) -> str:
    return "O_DIRECT" if direct else "buffered (O_DIRECT not available)"


async def measure_disk(
    block_size: int,
    nbytes: int,
    repeats: int,
    directory: Path,
    rng: np.random.Generator,
    layout: str = "slots",
    store_calls: int = 1,
) -> tuple[list[Row], dict[str, Any]]:
    """`DiskStore.write` and `DiskStore.read` of one batch against a raw O_DIRECT pwrite +
    fdatasync and a raw O_DIRECT preadv of the same bytes (buffered where the filesystem
    refuses O_DIRECT); also what the store and the baselines used. `layout = "log"`: the
    same for a `LogStore` (rows of case "log layout"; the raw read reads as many bytes from
    the start of its regions file).

    `store_calls` > 1 (rows of case "..., store N calls"): the store holds that many
    batches, filled before the timed runs, and each write goes to the next batch's slots in
    turn, overwriting the oldest (the steady state of a full tier whose policy evicts its
    least recently stored blocks); with one, the store is exactly one batch, so a log store
    reclaims the regions the call itself is writing over, inside the call."""
    from kvtier.tiers.disk import DEFAULT_SLAB_FILE_BYTES, DiskStore
    from kvtier.tiers.disk.log_store import LogStore

    count = _blocks(nbytes, block_size)
    total = count * block_size
    pool, pool_rows = _host_pool(count, block_size)
    target, target_rows = _host_pool(count, block_size)
    _fill(pool_rows, 1, rng)
    target_rows.fill(0)
    write_ids = rng.permutation(count)  # slot j gets pool row write_ids[j]
    read_ids = rng.permutation(count)  # slot j is read into target row read_ids[j]
    slots = list(range(count))
    sources = pool.rows(write_ids)
    targets = target.rows(read_ids)
    store: Any
    if layout == "log":
        store = await LogStore.open_async(
            directory / f"log-store-{block_size}",
            block_size=block_size,
            num_blocks=count * store_calls,
            fsync=True,
            direct_io="auto",
        )
    else:
        store = await DiskStore.open_async(
            directory / f"store-{block_size}",
            block_size=block_size,
            num_blocks=count * store_calls,
            fsync=True,
            direct_io="auto",
            # every slot in one slab file, so the raw read can cover them in one call
            slab_file_bytes=max(DEFAULT_SLAB_FILE_BYTES, total),
        )
    info: dict[str, Any] = {"direct_io": store.direct_io_active}
    generation = [0]

    def fresh_keys() -> list[OffloadKey]:
        generation[0] += 1
        first = generation[0] * count
        return [key_from_int(first + i) for i in range(count)]

    keys = fresh_keys()
    turn = [0]

    def next_slots() -> list[int]:
        """The next batch's slots (the oldest batch's, once the store is full)."""
        turn[0] = (turn[0] + 1) % store_calls
        return [turn[0] * count + slot for slot in slots]

    for _ in range(store_calls - 1):  # fill the store (the warm-up writes fill the rest)
        _raise_failures("write", await store.write(fresh_keys(), next_slots(), sources))

    async def warm_up_write() -> None:
        _raise_failures("write", await store.write(fresh_keys(), next_slots(), sources))

    # until no call writes never-written space; then `_paired_with_device`'s warm-up call
    warmup_calls = 1 + await _warm_up_store(
        warm_up_write, store.directory, WARMUP_LIMIT + store_calls, _warm_threshold(total)
    )
    new_space: list[int] = []  # never-written bytes each call wrote (measured untimed)
    write_slots = slots
    try:
        raw_path = directory / f"raw-{block_size}.bin"
        raw_write_direct, raw_fd = _open_raw_write(raw_path, block_size)
        try:
            PLAIN_IO.allocate(raw_fd, total)
            with page_aligned(total) as raw_source:
                # the bytes the store writes, in slot order, in memory O_DIRECT can use
                raw_source.reshape(count, block_size)[:] = pool_rows[write_ids]

                async def kvtier_write() -> float:
                    nonlocal keys, write_slots
                    keys, write_slots = fresh_keys(), next_slots()
                    unwritten = never_written_bytes(store.directory)
                    start = time.perf_counter()
                    failures = await store.write(keys, write_slots, sources)
                    elapsed = time.perf_counter() - start
                    new_space.append(unwritten - never_written_bytes(store.directory))
                    _raise_failures("write", failures)
                    return elapsed

                def baseline_write() -> float:
                    start = time.perf_counter()
                    pwritev_all(raw_fd, [raw_source.data], 0)
                    PLAIN_IO.fsync(raw_fd)
                    return time.perf_counter() - start

                # the device's pattern of the same bytes, timed beside each store call
                device_path = directory / f"device-paired-{block_size}.bin"
                try:
                    with SequentialWriter(device_path, raw_source) as device_writer:
                        write_s = await _paired_with_device(
                            kvtier_write, baseline_write, device_writer.write, repeats
                        )
                finally:
                    device_path.unlink(missing_ok=True)
        finally:
            os.close(raw_fd)
        raw_path.unlink()

        # Reads of the blocks just written; then fresh blocks are written and read back once
        # more, to check that both directions moved the right bytes.
        if layout == "log":
            slab, offset = store.path / "regions.bin", 0
        else:
            slab, offset = store.slot_location(0)
        raw_direct, read_fd = _open_for_raw_read(slab, store.direct_io_active, block_size)
        try:
            with page_aligned(total) as landing:

                async def kvtier_read() -> float:
                    start = time.perf_counter()
                    failures = await store.read(keys, write_slots, targets)
                    elapsed = time.perf_counter() - start
                    _raise_failures("read", failures)
                    return elapsed

                def baseline_read() -> float:
                    start = time.perf_counter()
                    preadv_all(read_fd, [landing.data], offset)
                    return time.perf_counter() - start

                read_s = await _paired(kvtier_read, baseline_read, repeats)
        finally:
            os.close(read_fd)
        _fill(pool_rows, 99, rng)
        target_rows.fill(0)
        keys = fresh_keys()
        _raise_failures("write", await store.write(keys, slots, sources))
        failures = await store.read(keys, slots, targets)
        verified = all(failure is None for failure in failures) and _rows_match(
            pool_rows, write_ids, target_rows, read_ids, rng
        )
        case = "log layout" if layout == "log" else ""
        if store_calls > 1:
            case = f"{case or 'per-block'}, {store_calls} calls stored"
        rows = [
            Row(
                "cpu -> disk",
                case,
                block_size,
                count,
                total,
                *write_s[:2],
                f"os.pwrite, {_raw_mode(raw_write_direct)}, of the same bytes in one call + "
                "os.fdatasync, to a preallocated file in the same directory (queue depth 1)",
                verified,
                device_s=write_s[2],
                warmup_calls=warmup_calls,
                first_pass_bytes=sum(new_space[1:]),  # the timed calls'
            ),
            Row(
                "disk -> cpu",
                case,
                block_size,
                count,
                total,
                *read_s,
                f"os.preadv, {_raw_mode(raw_direct)}, of the same bytes from the store's "
                f"{'regions' if layout == 'log' else 'slab'} file in one call (queue depth 1)",
                verified,
            ),
        ]
        info["raw_write"] = "O_DIRECT" if raw_write_direct else "buffered"
        info["raw_read"] = "O_DIRECT" if raw_direct else "buffered"
    finally:
        await store.aclose()
        shutil.rmtree(store.directory, ignore_errors=True)
    return rows, info


def serving_blocks(nbytes: int, block_size: int) -> int:
    """Blocks the serving-sized write rows move per timed run (and the store holds): about
    `nbytes`, rounded to a whole number of `SERVING_WRITE_BLOCKS`-block batches per lane of
    the concurrent rows, and at least one batch per lane (so `SERVING_QUEUE_DEPTH` batches
    really are in flight at once, even with large blocks). The read rows read the first
    whole number of `SERVING_READ_BLOCKS`-block runs per lane of them."""
    batch_bytes = SERVING_WRITE_BLOCKS * block_size
    per_lane = max(1, round(nbytes / (batch_bytes * SERVING_QUEUE_DEPTH)))
    return per_lane * SERVING_QUEUE_DEPTH * SERVING_WRITE_BLOCKS


def _lanes(calls: int, depth: int) -> list[list[int]]:
    """`calls` call numbers cut into `depth` lanes of consecutive calls (sizes differing by
    at most one): each lane is one caller that issues its calls one after another, so that
    `depth` calls are in flight at once, each lane in its own region of slots or file."""
    return [[int(c) for c in lane] for lane in np.array_split(np.arange(calls), depth)]


def _group_commit_counters(store: Any) -> dict[str, int]:
    """The group-commit counters `DiskStore.stats` has (none before the store counts them;
    read with `getattr` so that the benchmark runs against either). `stats` is a property
    today; a method is called."""
    stats = store.stats
    if callable(stats):
        stats = stats()
    counters: dict[str, int] = {}
    for name in GROUP_COMMIT_COUNTERS:
        value = getattr(stats, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            counters[name] = value
    return counters


@dataclass(slots=True)
class _ServingStore:
    """What the serving-sized disk rows share: the store, its slots, the host rows written
    from (`sources`, pool rows in slot order) and read into (`targets`), the calls of each
    lane, and the keys the latest writes stored.

    Call c of the writes covers slots [c * wb, (c + 1) * wb), of the reads [c * rb, ...).
    Writes cover every slot, in the same number of calls per lane. Timed reads cover the first
    `timed_reads` runs, a whole number per lane, so that `depth` reads really are in flight
    until the end (and the serial row reads the same); the check reads them all.
    """

    store: Any  # kvtier.tiers.disk.DiskStore
    block_size: int
    count: int
    sources: list[Any]
    targets: list[Any]
    write_lanes: dict[int, list[list[int]]]
    read_lanes: dict[int, list[list[int]]]
    check_lanes: dict[int, list[list[int]]]
    keys: list[OffloadKey] = field(default_factory=list)
    generation: int = 0

    @property
    def slots(self) -> list[int]:
        return list(range(self.count))

    def fresh_keys(self) -> list[OffloadKey]:
        """New keys for every slot, apart from `measure_disk`'s and earlier writes'."""
        self.generation += 1
        first = (1 << 40) + self.generation * self.count
        return [key_from_int(first + i) for i in range(self.count)]

    async def writes(self, lanes: list[list[int]]) -> None:
        """Fresh keys into every slot, `len(lanes)` batches in flight."""
        self.keys = keys = self.fresh_keys()
        slots, wb = self.slots, SERVING_WRITE_BLOCKS

        async def lane(calls: list[int]) -> None:
            for c in calls:
                part = slice(c * wb, (c + 1) * wb)
                failures = await self.store.write(keys[part], slots[part], self.sources[part])
                _raise_failures("write", failures)

        await asyncio.gather(*(lane(calls) for calls in lanes))

    async def reads(self, lanes: list[list[int]]) -> list[ReadFailure | None]:
        """The runs of `lanes` read into their target rows, `len(lanes)` runs in flight."""
        failures: list[ReadFailure | None] = []
        slots, rb = self.slots, SERVING_READ_BLOCKS

        async def lane(calls: list[int]) -> None:
            for c in calls:
                part = slice(c * rb, (c + 1) * rb)
                failures.extend(
                    await self.store.read(self.keys[part], slots[part], self.targets[part])
                )

        await asyncio.gather(*(lane(calls) for calls in lanes))
        return failures


async def measure_disk_serving(
    block_size: int,
    nbytes: int,
    repeats: int,
    directory: Path,
    rng: np.random.Generator,
) -> tuple[list[Row], dict[str, Any]]:
    """The serving-sized disk rows: `DiskStore.write` of `SERVING_WRITE_BLOCKS`-block
    batches (fsync on) and `DiskStore.read` of `SERVING_READ_BLOCKS`-block runs, one call at a
    time ("serial") and `SERVING_QUEUE_DEPTH` calls at once ("concurrent", one
    `asyncio.gather` of that many callers), against raw O_DIRECT `pwritev` + `fdatasync` /
    `preadv` of the same batches and runs from the same number of threads. Also what the
    store and the baselines used."""
    from kvtier.tiers.disk import DEFAULT_SLAB_FILE_BYTES, DiskStore

    count = serving_blocks(nbytes, block_size)
    depth = SERVING_QUEUE_DEPTH
    pool, pool_rows = _host_pool(count, block_size)
    target, target_rows = _host_pool(count, block_size)
    _fill(pool_rows, 1, rng)
    target_rows.fill(0)
    write_ids = rng.permutation(count)  # slot j gets pool row write_ids[j]
    read_ids = rng.permutation(count)  # slot j is read into target row read_ids[j]
    write_calls = count // SERVING_WRITE_BLOCKS
    read_calls = count // SERVING_READ_BLOCKS
    timed_reads = read_calls // depth * depth
    store = await DiskStore.open_async(
        directory / f"serving-{block_size}",
        block_size=block_size,
        num_blocks=count,
        fsync=True,
        direct_io="auto",
        slab_file_bytes=max(DEFAULT_SLAB_FILE_BYTES, count * block_size),  # one file
    )
    serving = _ServingStore(
        store,
        block_size,
        count,
        pool.rows(write_ids),
        target.rows(read_ids),
        write_lanes={qd: _lanes(write_calls, qd) for qd in (1, depth)},
        read_lanes={qd: _lanes(timed_reads, qd) for qd in (1, depth)},
        check_lanes={qd: _lanes(read_calls, qd) for qd in (1, depth)},
    )
    info: dict[str, Any] = {"direct_io": store.direct_io_active}
    executor = ThreadPoolExecutor(depth, thread_name_prefix="kvtier-bench-raw")
    try:
        rows, raw_write_direct = await _serving_writes(
            serving, pool_rows, write_ids, directory, repeats, executor
        )
        read_rows, raw_read_direct = await _serving_reads(serving, repeats, executor)
        rows += read_rows
        # Fresh bytes, written one way and read back the other: concurrent writes and serial
        # reads, then serial writes and concurrent reads; each row's own calls are checked.
        checked: dict[tuple[str, int], bool] = {}
        for write_qd, read_qd, gen in ((depth, 1, 98), (1, depth, 99)):
            _fill(pool_rows, gen, rng)
            target_rows.fill(0)
            await serving.writes(serving.write_lanes[write_qd])
            failures = await serving.reads(serving.check_lanes[read_qd])
            good = all(failure is None for failure in failures) and _rows_match(
                pool_rows, write_ids, target_rows, read_ids, rng
            )
            checked["cpu -> disk", write_qd] = checked["disk -> cpu", read_qd] = good
        rows = [replace(row, verified=checked[row.pair, row.queue_depth]) for row in rows]
        info["raw_write"] = "O_DIRECT" if raw_write_direct else "buffered"
        info["raw_read"] = "O_DIRECT" if raw_read_direct else "buffered"
    finally:
        executor.shutdown(wait=True)
        await store.aclose()
        shutil.rmtree(store.directory, ignore_errors=True)
    return rows, info


async def _serving_writes(
    serving: _ServingStore,
    pool_rows: npt.NDArray[np.uint8],
    write_ids: npt.NDArray[np.int64],
    directory: Path,
    repeats: int,
    executor: ThreadPoolExecutor,
) -> tuple[list[Row], bool]:
    """The serving-sized write rows (serial, concurrent), and whether the raw baseline used
    O_DIRECT: `DiskStore.write` of `SERVING_WRITE_BLOCKS`-block batches against `pwritev` +
    fdatasync of the same bytes (`pool_rows[write_ids]`, in slot order) into a preallocated
    file."""
    store, count, wb = serving.store, serving.count, SERVING_WRITE_BLOCKS
    block_size = serving.block_size
    total = count * block_size
    write_calls = count // wb
    rows: list[Row] = []
    raw_path = directory / f"raw-serving-{block_size}.bin"
    raw_write_direct, raw_fd = _open_raw_write(raw_path, block_size)
    try:
        PLAIN_IO.allocate(raw_fd, total)
        with page_aligned(total) as raw_source:
            blocks_out = list(raw_source.reshape(count, block_size))
            raw_source.reshape(count, block_size)[:] = pool_rows[write_ids]

            def raw_write_lane(calls: list[int]) -> None:
                for c in calls:
                    part = blocks_out[c * wb : (c + 1) * wb]
                    pwritev_all(raw_fd, [block.data for block in part], c * wb * block_size)
                    PLAIN_IO.fsync(raw_fd)

            for qd in serving.write_lanes:
                # DiskStore's group-commit counters over this row's runs (warm-up too), and
                # the write calls made in them
                counters: dict[str, int] = {"write_calls": 0}

                async def kvtier_write(qd: int = qd, counters: dict[str, int] = counters) -> float:
                    before = _group_commit_counters(store)
                    start = time.perf_counter()
                    await serving.writes(serving.write_lanes[qd])
                    elapsed = time.perf_counter() - start
                    for name, value in _group_commit_counters(store).items():
                        counters[name] = counters.get(name, 0) + value - before.get(name, 0)
                    counters["write_calls"] += write_calls
                    return elapsed

                def baseline_write(qd: int = qd) -> float:
                    return _timed_lanes(executor, raw_write_lane, serving.write_lanes[qd])

                write_s = await _paired(kvtier_write, baseline_write, repeats)
                rows.append(
                    Row(
                        "cpu -> disk",
                        _case(qd),
                        block_size,
                        count,
                        total,
                        *write_s,
                        f"os.pwritev, {_raw_mode(raw_write_direct)}, + os.fdatasync of "
                        f"{wb}-block batches of the same bytes, {_threads(qd)}, to a "
                        f"preallocated file in the same directory (queue depth {qd})",
                        False,  # set by the caller, once the bytes are checked
                        batch_blocks=wb,
                        queue_depth=qd,
                        store_counters=counters,
                    )
                )
    finally:
        os.close(raw_fd)
    raw_path.unlink()
    return rows, raw_write_direct


async def _serving_reads(
    serving: _ServingStore, repeats: int, executor: ThreadPoolExecutor
) -> tuple[list[Row], bool]:
    """The serving-sized read rows (serial, concurrent), and whether the raw baseline used
    O_DIRECT: `DiskStore.read` of `SERVING_READ_BLOCKS`-block runs against `preadv` of the
    same runs from the store's own slab file."""
    store, count, rb = serving.store, serving.count, SERVING_READ_BLOCKS
    block_size = serving.block_size
    read_blocks = sum(len(lane) for lane in serving.read_lanes[1]) * rb
    slab, first = store.slot_location(0)
    if store.slot_location(count - 1) != (slab, first + (count - 1) * block_size):
        raise InvalidValueError(f"{store!r} does not keep its slots in one run of one file")
    rows: list[Row] = []
    raw_read_direct, read_fd = _open_for_raw_read(slab, store.direct_io_active, block_size)
    try:
        with page_aligned(count * block_size) as landing:
            blocks_in = list(landing.reshape(count, block_size))

            def raw_read_lane(calls: list[int]) -> None:
                for c in calls:
                    offset = first + c * rb * block_size
                    run = blocks_in[c * rb : (c + 1) * rb]
                    preadv_all(read_fd, [block.data for block in run], offset)

            for qd in serving.read_lanes:

                async def kvtier_read(qd: int = qd) -> float:
                    start = time.perf_counter()
                    failures = await serving.reads(serving.read_lanes[qd])
                    elapsed = time.perf_counter() - start
                    _raise_failures("read", failures)
                    return elapsed

                def baseline_read(qd: int = qd) -> float:
                    return _timed_lanes(executor, raw_read_lane, serving.read_lanes[qd])

                read_s = await _paired(kvtier_read, baseline_read, repeats)
                rows.append(
                    Row(
                        "disk -> cpu",
                        _case(qd),
                        block_size,
                        read_blocks,
                        read_blocks * block_size,
                        *read_s,
                        f"os.preadv, {_raw_mode(raw_read_direct)}, of {rb}-block runs of "
                        f"the same bytes from the store's slab file, {_threads(qd)} "
                        f"(queue depth {qd})",
                        False,
                        batch_blocks=rb,
                        queue_depth=qd,
                    )
                )
    finally:
        os.close(read_fd)
    return rows, raw_read_direct


def _case(queue_depth: int) -> str:
    return "serial" if queue_depth == 1 else "concurrent"


def _threads(queue_depth: int) -> str:
    if queue_depth == 1:
        return "one thread"
    return f"{queue_depth} threads, each in its own region"


def _timed_lanes(
    executor: ThreadPoolExecutor, work: Callable[[list[int]], None], lanes: list[list[int]]
) -> float:
    """Seconds to run `work` on every lane at once, one thread per lane (a single lane runs
    in this thread)."""
    start = time.perf_counter()
    if len(lanes) == 1:
        work(lanes[0])
    else:
        futures = [executor.submit(work, lane) for lane in lanes]
        concurrent.futures.wait(futures)
        for future in futures:
            future.result()
    return time.perf_counter() - start


def _open_for_raw_read(path: Path, direct: bool, block_size: int) -> tuple[bool, int]:
    """(whether O_DIRECT is on, fd) of `path` for the raw read baseline: O_DIRECT when the
    store uses it (so neither side reads the page cache), else buffered."""
    if direct and _O_DIRECT and block_size % 4096 == 0:
        try:
            return True, os.open(path, os.O_RDONLY | _O_DIRECT | _O_CLOEXEC)
        except OSError:
            pass
    return False, os.open(path, os.O_RDONLY | _O_CLOEXEC)


def _raise_failures(what: str, failures: Sequence[object]) -> None:
    bad = [failure for failure in failures if failure is not None]
    if bad:
        from kvtier.errors import DiskTierError

        raise DiskTierError(
            f"benchmark disk {what}: {len(bad)} of {len(failures)} blocks failed, e.g. {bad[0]}"
        )


# -- GPU <-> pinned CPU --------------------------------------------------------------------


def _host_view(tensor: torch.Tensor) -> npt.NDArray[np.uint8]:
    """A host numpy array of a pool tensor's bytes (a copy when it is on a GPU)."""
    if tensor.device.type == "cuda":
        torch.cuda.synchronize(tensor.device)
        return tensor.cpu().numpy()
    return tensor.numpy()


async def measure_gpu_copies(
    block_size: int, nbytes: int, repeats: int, rng: np.random.Generator
) -> list[Row]:
    """`TensorCopier.copy` between a pinned host pool and a GPU pool, both directions,
    scattered and contiguous, against one large pinned `copy_` + synchronize."""
    count = _blocks(nbytes, block_size)
    total = count * block_size
    gpu = TorchPool(count, block_size, "cuda")
    host = TorchPool(count, block_size, "cpu", pin_memory=True)
    host_rows = host.tensor.numpy()
    _fill(host_rows, 1, rng)
    gpu.tensor.copy_(host.tensor)
    torch.cuda.synchronize()
    copier = TensorCopier()
    cases = {
        "scattered": (rng.permutation(count), rng.permutation(count)),
        "contiguous": (np.arange(count), np.arange(count)),
    }
    rows: list[Row] = []
    generation = 1
    for pair, src, dst in (("cpu -> gpu", host, gpu), ("gpu -> cpu", gpu, host)):
        for case, (src_ids, dst_ids) in cases.items():

            async def run_kvtier(
                s: Any = src_ids, d: Any = dst_ids, a: TorchPool = src, b: TorchPool = dst
            ) -> float:
                torch.cuda.synchronize()
                start = time.perf_counter()
                await copier.copy(a.tensor, s, b.tensor, d)
                return time.perf_counter() - start

            def run_baseline(a: TorchPool = src, b: TorchPool = dst) -> float:
                torch.cuda.synchronize()
                start = time.perf_counter()
                b.tensor.copy_(a.tensor, non_blocking=True)
                torch.cuda.synchronize()
                return time.perf_counter() - start

            kvtier_s, baseline_s = await _paired(run_kvtier, run_baseline, repeats)
            # Fresh bytes at the source and zeros at the destination, so that a copy that
            # serves stale or unfinished bytes cannot pass.
            generation += 1
            _fill(host_rows, generation, rng)
            if src is gpu:
                gpu.tensor.copy_(host.tensor)
                torch.cuda.synchronize()
                host_rows.fill(0)
            else:
                gpu.tensor.zero_()
                torch.cuda.synchronize()
            await copier.copy(src.tensor, src_ids, dst.tensor, dst_ids)
            verified = _rows_match(
                _host_view(src.tensor), src_ids, _host_view(dst.tensor), dst_ids, rng
            )
            rows.append(
                Row(
                    pair,
                    case,
                    block_size,
                    count,
                    total,
                    kvtier_s,
                    baseline_s,
                    "one pinned copy_(non_blocking=True) of the whole pool + synchronize",
                    verified,
                )
            )
    return rows


# -- bookkeeping ---------------------------------------------------------------------------


def measure_bookkeeping() -> list[BookkeepingRow]:
    """kvtier's bookkeeping throughput, `kvtier_tools.bench.bookkeeping` in its quick mode."""
    from kvtier_tools.bench.bookkeeping import (
        OVERALL,
        QUICK_LIMIT_REQUESTS,
        run_bookkeeping_benchmark,
    )

    results = run_bookkeeping_benchmark(
        repeats=1, limit_requests=QUICK_LIMIT_REQUESTS, include_vllm=False
    )
    return [
        BookkeepingRow(
            policy=result.policy,
            fraction=result.fraction,
            capacity=result.capacity,
            requests=result.requests,
            ops=result.kvtier.ops,
            mops=result.kvtier_mops,
        )
        for result in results
        if result.phase == OVERALL
    ]


# -- the benchmark -------------------------------------------------------------------------


def gpu_unavailable_reason() -> str | None:
    """Why the GPU rows cannot be measured here, or None when they can."""
    if torch.cuda.is_available():
        return None
    built = torch.version.cuda
    if built is None:
        return f"no CUDA: this torch ({torch.__version__}) is built without CUDA"
    return f"no CUDA device visible to torch {torch.__version__} (built for CUDA {built})"


def step_count(settings: Settings) -> int:
    """How many progress steps `run_datapath_benchmark` reports for `settings`."""
    per_size = ("cpu" in settings.parts) + 4 * ("disk" in settings.parts)
    if "gpu" in settings.parts and gpu_unavailable_reason() is None:
        per_size += 1
    return per_size * len(settings.block_sizes) + ("bookkeeping" in settings.parts)


def _disk_bytes_needed(settings: Settings) -> int:
    """Largest measurement's bytes (each has a store and a raw file of that size at once)."""
    return max(
        max(_blocks(settings.disk_bytes, size), serving_blocks(settings.disk_bytes, size)) * size
        for size in settings.block_sizes
    )


def _environment(directory: Path | None) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    if directory is not None:
        env["directory"] = str(directory)
        env["filesystem"] = filesystem_of(directory)
    return env


def run_datapath_benchmark(
    settings: Settings, progress: Callable[[str], None] | None = None
) -> Report:
    """Measure what `settings` asks for; `progress` receives a line after each step
    (`step_count` of them). Raises InvalidValueError for bad settings or a directory that
    cannot hold the files, DiskTierError when a disk write or read fails."""
    settings.validate()
    tick = progress if progress is not None else (lambda _: None)
    report = Report(settings)
    parent: Path | None = None
    if "disk" in settings.parts:
        parent = settings.directory if settings.directory is not None else default_parent_dir()
        if not parent.is_dir():
            raise InvalidValueError(f"--dir {parent}: not a directory")
        needed = _SPACE_MARGIN * _disk_bytes_needed(settings)
        free = shutil.disk_usage(parent).free
        if free < needed:
            raise InvalidValueError(
                f"{parent} has {format_size(free)} free; the disk measurements want "
                f"{format_size(needed)} (lower --disk-size or choose another --dir)"
            )
    report.environment = _environment(parent)
    with_gpu = False
    if "gpu" in settings.parts:
        gpu_reason = gpu_unavailable_reason()
        with_gpu = gpu_reason is None
        if gpu_reason is not None:
            report.skipped["gpu"] = gpu_reason
    if any(part in settings.parts for part in ("cpu", "disk", "gpu")):
        workdir = Path(tempfile.mkdtemp(prefix="kvtier-bench-", dir=parent)) if parent else None
        try:
            if workdir is not None:
                report.environment["directory"] = str(workdir)
            asyncio.run(_measure(settings, report, workdir, with_gpu, tick))
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
    if "bookkeeping" in settings.parts:
        report.bookkeeping = measure_bookkeeping()
        tick("bookkeeping")
    return report


async def _measure(
    settings: Settings,
    report: Report,
    workdir: Path | None,
    with_gpu: bool,
    tick: Callable[[str], None],
) -> None:
    rng = np.random.default_rng(settings.seed)
    direct: dict[str, bool] = {}
    buffered_raw: list[str] = []
    for block_size in settings.block_sizes:
        size = format_size(block_size)
        if "cpu" in settings.parts:
            report.rows += await measure_cpu_copies(
                block_size, settings.copy_bytes, settings.repeats, rng
            )
            gc.collect()
            tick(f"cpu copies, {size} blocks")
        if "disk" in settings.parts:
            assert workdir is not None
            device = await asyncio.to_thread(
                measure_device, block_size, settings.disk_bytes, settings.repeats, workdir, rng
            )
            report.device.append(device)
            tick(f"device, {size} blocks")
            first = len(report.rows)
            for measure, step in (
                (measure_disk, "one batch"),
                (functools.partial(measure_disk, layout="log"), "one batch, log layout"),
                (
                    functools.partial(measure_disk, layout="log", store_calls=STEADY_CALLS),
                    f"one batch, log layout, {STEADY_CALLS} calls stored",
                ),
                (measure_disk_serving, "serving-sized batches"),
            ):
                rows, info = await measure(
                    block_size, settings.disk_bytes, settings.repeats, workdir, rng
                )
                report.rows += rows
                direct[size] = direct.get(size, True) and bool(info["direct_io"])
                if "buffered" in (info["raw_write"], info["raw_read"]) and size not in buffered_raw:
                    buffered_raw.append(size)
                gc.collect()
                tick(f"disk, {size} blocks, {step}")
            report.rows[first:] = [_with_device(row, device) for row in report.rows[first:]]
        if with_gpu:
            report.rows += await measure_gpu_copies(
                block_size, settings.gpu_bytes, settings.repeats, rng
            )
            gc.collect()
            torch.cuda.empty_cache()
            tick(f"gpu copies, {size} blocks")
    if direct:
        report.environment["disk_direct_io"] = direct
        without = [size for size, on in direct.items() if not on]
        if without:
            report.notes.append(
                f"O_DIRECT was not available for {', '.join(without)} blocks in "
                f"{report.environment.get('filesystem', 'this filesystem')}: the disk tier "
                "and the raw read went through the page cache there."
            )
    refused = [
        format_size(row.block_size)
        for row in report.device
        if not (row.direct_write and row.direct_read)
    ]
    if refused:
        report.notes.append(
            f"The device row ran buffered for {', '.join(refused)} blocks: "
            f"{report.environment.get('filesystem', 'this filesystem')} refused O_DIRECT (or the "
            "block size is not a multiple of 4 KiB), so its reads came from the page cache."
        )
    if buffered_raw:
        report.notes.append(
            f"The raw disk baselines ran buffered for {', '.join(buffered_raw)} blocks: the "
            "filesystem refused O_DIRECT (or the block size is not a multiple of 4 KiB). Their "
            "writes still end in fdatasync; their reads may come from the page cache."
        )


def _with_device(row: Row, device: DeviceRow) -> Row:
    """`row` with the device's write (cpu -> disk) or read (disk -> cpu) GB/s."""
    if row.pair == "cpu -> disk":
        return replace(row, device_gbps=device.write_gbps)
    if row.pair == "disk -> cpu":
        return replace(row, device_gbps=device.read_gbps)
    return row


# -- output --------------------------------------------------------------------------------


def _group_commit_lines(rows: Sequence[Row]) -> list[Any]:
    """Batches per fsync of the disk write rows, from `DiskStore.stats()`'s group-commit
    counters, or one line saying the store does not count them."""
    from rich.text import Text

    written = [row for row in rows if "write_calls" in row.store_counters]
    if not written:
        return []
    lines: list[Any] = []
    for row in written:
        per_fsync = row.batches_per_fsync
        if per_fsync is None:
            continue
        counters = ", ".join(
            f"{name} {row.store_counters[name]:,}"
            for name in (*GROUP_COMMIT_COUNTERS, "write_calls")
            if name in row.store_counters
        )
        lines.append(
            Text(
                f"  {row.label}, {format_size(row.block_size)}: {per_fsync:.2f} batches per "
                f"fsync ({counters})"
            )
        )
    if not lines:
        return [
            Text(
                "Batches per fsync: not reported, this DiskStore's stats() has none of the "
                f"group-commit counters ({', '.join(GROUP_COMMIT_COUNTERS)})."
            )
        ]
    return [Text("Group commit (DiskStore.stats() over each write row's runs):"), *lines]


def render(report: Report) -> list[Any]:
    """Rich renderables (tables and lines) showing `report`."""
    from rich.text import Text

    shown: list[Any] = []
    if report.rows:
        shown += _data_path_lines(report)
    for part, reason in report.skipped.items():
        shown.append(Text(f"{part} rows skipped: {reason}"))
    if report.bookkeeping:
        shown.append(_bookkeeping_table(report))
    env = report.environment
    if "directory" in env:
        direct = env.get("disk_direct_io", {})
        on = (
            "yes"
            if direct and all(direct.values())
            else ("partly" if any(direct.values()) else "no")
        )
        shown.append(
            Text(
                f"Disk files: {env['directory']} ({env.get('filesystem', 'unknown')}), removed "
                f"afterwards; O_DIRECT used by the disk tier: {on}."
            )
        )
    shown.append(
        Text(
            f"Machine: {env.get('cpus')} CPUs, torch {env.get('torch')} "
            f"({env.get('torch_threads')} threads), "
            f"{env.get('cuda_device') or 'no CUDA device'}."
        )
    )
    for note in report.notes:
        shown.append(Text(note))
    for row in report.wrong_bytes:
        shown.append(
            Text(
                f"ERROR: {row.label}, {format_size(row.block_size)} blocks: blocks did not "
                "arrive intact where they belong; kvtier moved wrong bytes.",
                style="bold red",
            )
        )
    return shown


def _data_path_lines(report: Report) -> list[Any]:
    """The data path rows: the table of kvtier against its baselines, then what each baseline
    is and how to read the ratio."""
    from rich.table import Table
    from rich.text import Text

    shown: list[Any] = []
    settings = report.settings
    table = Table(
        title=(
            "Data path: kvtier against this machine's limit, same bytes, same run "
            f"(median of {settings.repeats} repeat{'s' if settings.repeats > 1 else ''}; "
            "GB/s = 10^9 B/s)"
        ),
        title_justify="left",
    )
    columns = (
        "pair",
        "block size",
        "blocks/batch",
        "qd",
        "kvtier GB/s",
        "kvtier blocks/s",
        "baseline GB/s",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "pair" else "right")
    table.add_column("ratio", justify="right")
    table.add_column(f">= {TARGET:.0%}?", justify="left")
    with_device = any(row.of_device is not None for row in report.rows)
    paired = any(row.device_s for row in report.rows)
    if with_device:
        table.add_column("of device", justify="right")
    if paired:
        table.add_column("of device row", justify="right")
    # Rows of one pair together (its one-batch row first), each case by block size.
    pairs: dict[str, int] = {}
    labels: dict[str, int] = {}
    for row in report.rows:
        pairs.setdefault(row.pair, len(pairs))
        labels.setdefault(row.label, len(labels))
    rows = sorted(report.rows, key=lambda r: (pairs[r.pair], labels[r.label], r.block_size))
    previous = None
    for row in rows:
        if previous is not None and row.label != previous:
            table.add_section()
        previous = row.label
        verdict = "WRONG BYTES" if not row.verified else ("yes" if row.target_met else "no")
        of_device = [] if not with_device else [_percent(row.of_device)]
        if paired:
            of_device.append(_percent(row.of_device_row))
        table.add_row(
            row.label,
            format_size(row.block_size),
            f"{row.blocks_per_batch:,}",
            f"{row.queue_depth}",
            f"{row.kvtier_gbps:.2f}",
            f"{row.kvtier_blocks_per_s:,.0f}",
            f"{row.baseline_gbps:.2f}",
            f"{row.ratio:.0%}",
            verdict,
            *of_device,
        )
    shown.append(table)
    if report.device:
        shown += _device_lines(report.device, paired)
    baselines: dict[str, str] = {}
    for row in rows:
        baselines.setdefault(row.label, row.baseline)
    shown.append(Text("Baselines:"))
    for label, baseline in baselines.items():
        shown.append(Text(f"  {label}: {baseline}"))
    shown.append(
        Text(
            "ratio = median over repeats of kvtier GB/s / baseline GB/s measured back to "
            "back in the same repeat (so it need not equal the ratio of the two medians). "
            "qd = calls in flight at once, the same on both sides: kvtier's concurrent "
            "calls, the baseline's threads. serial / concurrent: "
            f"{SERVING_WRITE_BLOCKS}-block writes (fsync on) and {SERVING_READ_BLOCKS}-block "
            f"reads, one at a time / {SERVING_QUEUE_DEPTH} at once."
        )
    )
    shown += _group_commit_lines(rows)
    return shown


def _percent(fraction: float | None) -> str:
    return "" if fraction is None else f"{fraction:.0%}"


def _device_lines(device: Sequence[DeviceRow], paired: bool) -> list[Any]:
    """The device rows (the raw disk alone) and how the disk rows' "of device" reads
    (`paired`: some rows timed the device's write beside each call)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title="Device: the raw disk alone, same directory, same run (median; GB/s = 10^9 B/s)",
        title_justify="left",
    )
    for column in ("row", "block size", "qd", "write GB/s", "read GB/s"):
        table.add_column(column, justify="left" if column == "row" else "right")
    for row in device:
        table.add_row(
            "device",
            format_size(row.block_size),
            f"{row.queue_depth}",
            f"{row.write_gbps:.2f}",
            f"{row.read_gbps:.2f}",
        )
    row_line = (
        "kvtier GB/s / the device row's write GB/s (cpu -> disk rows) or read GB/s "
        "(disk -> cpu rows) at the same block size, medians"
    )
    lines: list[Any] = [table, Text(f"  device: {device[0].method}.")]
    if not paired:
        lines.append(Text(f"of device = {row_line} (issue 33's targets: 70 %)."))
        return lines
    lines.append(
        Text(
            "of device = for the one-batch cpu -> disk rows, paired: the median over repeats "
            "of kvtier GB/s / the device's write GB/s in the same repeat (the device row's "
            "write pattern on the same bytes, timed right before or after kvtier's call, "
            "alternating; both sides warmed up past their first pass over their files); "
            f"for the other disk rows, {row_line} (issue 33's targets: 70 %). of device row "
            f"= {row_line}, for every disk row (the device row runs alone before the disk "
            "rows, its writes back to back: the device may run at another rate there)."
        )
    )
    return lines


def _bookkeeping_table(report: Report) -> Any:
    """The bookkeeping rows: Mops/s of each policy's TierManager on the shipped trace."""
    from rich.table import Table

    first = report.bookkeeping[0]
    table = Table(
        title=(
            f"Bookkeeping: kvtier TierManager, first {first.requests:,} requests of the "
            "shipped trace, one replay (Mops/s = 10^6 block-operations/s)"
        ),
        title_justify="left",
    )
    for column in ("policy", "capacity", "blocks", "block-ops", "Mops/s"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for book in report.bookkeeping:
        table.add_row(
            book.policy,
            f"{book.fraction:.0%}",
            f"{book.capacity:,}",
            f"{book.ops:,}",
            f"{book.mops:.3f}",
        )
    return table
