"""Write path: what a serving engine waits for on its critical path when it offloads.

A benchmark that prints figures; it asserts nothing about speed. It drives kvtier only
through the public `Hierarchy` API and config dicts (`Hierarchy.from_config`), so it keeps
measuring the same thing while the data path behind that API changes.

What is measured (puts and gets of `batch_blocks` blocks, 16 by default, of `block_size`)
-----------------------------------------------------------------------------------------
**Put latency into a full CPU tier.** Three chains with the same CPU tier, each pre-filled
with unique blocks to its capacity: CPU only (its victims are dropped: the reference), and
CPU over a disk tier with `write_policy` write-back and write-through. Each receives `puts`
paced puts of fresh keys: put k starts at `k * interval` (or as soon as put k-1 returned,
when that is later: a "late start"). The interval is given (`put_rate`) or chosen so that
the disk could keep up: `RATE_FRACTION` of the raw O_DIRECT write bandwidth measured at the
start, at most `MAX_AUTO_RATE` puts per second. Reported: p50 and p99 of each chain's put
latencies, and their ratios to the CPU-only chain's (targets: p50 <= `PUT_P50_TARGET`,
p99 <= `PUT_P99_TARGET`).

**Get latency of disk-resident blocks, idle and under a write stream.** A write-back chain
gets `2 * gets` prefixes of `batch_blocks` blocks, then enough new blocks to push them out of
the CPU tier; every one of those blocks is checked to be on the disk tier alone
(`where(key) == "disk"`) before the first get, and again right before its own get. Each get
reads one such prefix (so it always comes from the disk: a get promotes what it reads). Half
of the gets run with the disk idle, half while a background task keeps putting new blocks at
the put rate. An idle phase starts after `flush()` and `drain()`: nothing in flight, and
every block of the CPU tier also on the disk, so that the gets' own evictions write nothing.
A stream phase starts with the CPU tier full of new blocks that only it holds, so that every
put of the stream demotes as many blocks to the disk (a sustained write-back stream). The
bytes each phase wrote to the disk are reported. Reported: p50 / p99 of each phase and the
ratios stream / idle (target <= `GET_TARGET`). Every get's bytes are compared with what was
put: a block's bytes derive from its key (`BlockMaker`), so a mismatch cannot hide.

**Demotion throughput.** The cpu -> disk pair of `stats().pairs` over the timed puts of each
disk chain: its bytes over its seconds, as the hierarchy counts them (the time a copy of the
pair was in flight), next to a raw baseline on the same filesystem: O_DIRECT (where the
filesystem allows it) `pwrite` + `fdatasync` of the same total bytes, one put's bytes per
batch; as a percentage (target: the data path's `kvtier_tools.bench.datapath.TARGET`).

Method
------
Pairing on a noisy machine: the three put chains stay open side by side and take turns, in
`rounds` rounds (the order rotated every round), each chain's share of puts in one paced
segment after a `drain()`; the raw baseline writes its share of bytes in every round too.
The get phases alternate the same way (idle, stream; then stream, idle; ...). A chain's or a
phase's percentiles pool all its rounds. Memory is touched before timing (the pre-fill
writes every CPU slot), the garbage collector runs before every timed segment, and blocks
are built (from their keys) outside the timed calls. Files go into a fresh temporary
directory inside `directory` (default: the current directory, or the system's temporary
directory when that is not writable), removed at the end; the report names its filesystem
(a tmpfs is memory, not a disk, and the report says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import json
import math
import mmap
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvtier.config import format_size
from kvtier.errors import InvalidValueError
from kvtier.hierarchy import Hierarchy
from kvtier.keys import OffloadKey, key_from_int
from kvtier.tiers.disk.io import PLAIN_IO, pwritev_all
from kvtier_tools.bench.datapath import GB, KIB, MIB, TARGET, filesystem_of

DEFAULT_BLOCK_SIZE = 256 * KIB
BATCH_BLOCKS = 16
DEFAULT_PUTS = 400
DEFAULT_GETS = 200
DEFAULT_CPU_BYTES = 256 * MIB
DEFAULT_ROUNDS = 8
DEFAULT_PROBE_BYTES = 128 * MIB
QUICK_PUTS = 100
QUICK_GETS = 50
QUICK_CPU_BYTES = 64 * MIB
QUICK_ROUNDS = 2
QUICK_PROBE_BYTES = 32 * MIB

RATE_FRACTION = 0.25
"""Without a given put rate, puts arrive at this fraction of the raw disk write bandwidth
measured at the start (so that the disk could keep up with them)..."""
MAX_AUTO_RATE = 200.0
"""... but no more than this many puts per second (one every 5 ms: about a serving engine's step;
small blocks on a fast disk would otherwise ask for more puts than two cores can issue)."""

PUT_P50_TARGET = 1.25
PUT_P99_TARGET = 2.0
GET_TARGET = 1.5
DEMOTION_TARGET = TARGET

GET_TIMEOUT_S = 10.0
"""Deadline of every timed `get` (a get cut short by it counts as short, its time is kept)."""
STREAM_LEAD_PUTS = 3
"""Puts of the background stream before the first get of a stream phase."""
STREAM_BUDGET_S = 1.5
STREAM_PUTS_PER_GET = 10
"""Per stream phase, the stream may put for `STREAM_BUDGET_S` at the put rate, and at most
`STREAM_PUTS_PER_GET` times the phase's gets (the disk tier is sized for it, so that the
stream never evicts the disk-resident prefixes still to be read)."""
PUSH_TRIES = 4
"""Most rounds of new blocks put to push the get rows' prefixes out of the CPU tier."""

CPU_TIER = "cpu"
DISK_TIER = "disk"
CPU_ONLY = "cpu only"
CHAINS: tuple[tuple[str, str | None], ...] = (
    (CPU_ONLY, None),
    ("cpu + disk, write-back", "write-back"),
    ("cpu + disk, write-through", "write-through"),
)
"""The put-latency chains: (label, write policy of the disk chain, None for CPU only)."""
IDLE = "idle"
STREAM = "write stream"
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})

_JSON_FORMAT = "kvtier_tools.bench.writepath/1"
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_SPACE_MARGIN = 1.2
_MODEL_ID = "kvtier-bench-writepath"


# -- results -------------------------------------------------------------------------------


def percentile_ms(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `samples` (seconds), in milliseconds (0 if none)."""
    return float(np.percentile(samples, q)) * 1e3 if len(samples) else 0.0


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else math.inf


class LatencyRow:
    """Percentiles of a row's `latencies_s` (seconds), shared by the put and get rows."""

    __slots__ = ()
    latencies_s: tuple[float, ...]

    @property
    def p50_ms(self) -> float:
        return percentile_ms(self.latencies_s, 50)

    @property
    def p99_ms(self) -> float:
        return percentile_ms(self.latencies_s, 99)


def latency_row_dict(row: Any, count_name: str) -> dict[str, Any]:
    """A latency row as JSON data: its fields, `count_name` (how many samples), p50, p99."""
    data: dict[str, Any] = asdict(row)
    data["latencies_s"] = list(row.latencies_s)
    data[count_name] = len(row.latencies_s)
    data["p50_ms"] = row.p50_ms
    data["p99_ms"] = row.p99_ms
    return data


@dataclass(frozen=True, slots=True)
class PutRow(LatencyRow):
    """The puts of one chain: every put's latency (seconds), the late starts, and the
    changes of the hierarchy's `put_*` counters over the timed puts."""

    chain: str
    write_policy: str | None
    blocks_per_put: int
    latencies_s: tuple[float, ...]
    late_starts: int
    counters: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return latency_row_dict(self, "puts")


@dataclass(frozen=True, slots=True)
class GetRow(LatencyRow):
    """The gets of one phase (idle or under a write stream) of disk-resident prefixes.

    `not_on_disk`: blocks found elsewhere than only on the disk tier right before their get
    (should be 0); `short_gets`: gets that returned fewer blocks than asked;
    `mismatched_blocks`: returned blocks whose bytes differ from what was put;
    `stream_puts`: puts of the background stream during the phase; `written_bytes`: bytes
    the chain copied to the disk tier during the phase (the stream's demotions, and those of
    the victims the gets' own promotions evict); `gets_without_stream`:
    gets that ran after the stream had used up its budget (should be 0).
    """

    phase: str
    blocks_per_get: int
    latencies_s: tuple[float, ...]
    blocks_read: int
    not_on_disk: int
    short_gets: int
    mismatched_blocks: int
    stream_puts: int = 0
    written_bytes: int = 0
    gets_without_stream: int = 0

    def to_dict(self) -> dict[str, Any]:
        return latency_row_dict(self, "gets")


@dataclass(frozen=True, slots=True)
class DemotionRow:
    """cpu -> disk bytes and copy seconds of one disk chain over its timed puts, next to the
    raw baseline's bytes and seconds (written in `raw_batch_bytes` batches, `raw_mode`)."""

    chain: str
    nbytes: int
    seconds: float
    raw_bytes: int
    raw_seconds: float
    raw_batch_bytes: int
    raw_mode: str

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / GB if self.seconds > 0 else 0.0

    @property
    def raw_gbps(self) -> float:
        return self.raw_bytes / self.raw_seconds / GB if self.raw_seconds > 0 else 0.0

    @property
    def ratio(self) -> float:
        """kvtier's GB/s over the raw baseline's."""
        return _ratio(self.gbps, self.raw_gbps)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gbps"] = self.gbps
        data["raw_gbps"] = self.raw_gbps
        data["ratio"] = self.ratio
        data["target"] = DEMOTION_TARGET
        return data


@dataclass(frozen=True, slots=True)
class Pace:
    """How fast the puts arrive: `rate` puts per second, one every `interval_s`; `source`
    says how the rate was chosen; `probe_gbps` is the raw write bandwidth measured at the
    start (0 when a rate was given)."""

    rate: float
    interval_s: float
    source: str
    probe_gbps: float
    put_bytes: int

    @property
    def mb_per_s(self) -> float:
        """The offered write load in 10**6 bytes per second."""
        return self.rate * self.put_bytes / 1e6

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["mb_per_s"] = self.mb_per_s
        return data


@dataclass(frozen=True, slots=True)
class Settings:
    """What to measure and how much (see the module docstring). `put_rate` None: chosen from
    the raw disk bandwidth; `directory` None: see `default_parent_dir`."""

    block_size: int = DEFAULT_BLOCK_SIZE
    batch_blocks: int = BATCH_BLOCKS
    puts: int = DEFAULT_PUTS
    gets: int = DEFAULT_GETS
    cpu_bytes: int = DEFAULT_CPU_BYTES
    rounds: int = DEFAULT_ROUNDS
    put_rate: float | None = None
    probe_bytes: int = DEFAULT_PROBE_BYTES
    directory: Path | None = None
    seed: int = 0
    cpu_load: int = 0
    """CPU-bound processes (each spins on one core) running through the whole measurement:
    the put ratios while other work shares the machine's cores."""

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        """Fewer puts and gets, a smaller CPU tier, two rounds (about 15 s)."""
        values: dict[str, Any] = {
            "puts": QUICK_PUTS,
            "gets": QUICK_GETS,
            "cpu_bytes": QUICK_CPU_BYTES,
            "rounds": QUICK_ROUNDS,
            "probe_bytes": QUICK_PROBE_BYTES,
        }
        values.update(overrides)
        return cls(**values)

    def fitted(self) -> Settings:
        """These settings with no more rounds than puts or gets per phase (a small run
        takes fewer turns)."""
        rounds = max(1, min(self.rounds, self.puts, self.gets))
        return self if rounds == self.rounds else dataclasses.replace(self, rounds=rounds)

    @property
    def cpu_blocks(self) -> int:
        """Capacity of the CPU tier in blocks."""
        return self.cpu_bytes // self.block_size

    @property
    def put_bytes(self) -> int:
        return self.batch_blocks * self.block_size

    def validate(self) -> None:
        """Raise InvalidValueError naming the first bad setting."""
        for name in ("block_size", "batch_blocks", "puts", "gets", "cpu_bytes", "rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidValueError(f"{name} must be a positive int, got {value!r}")
        load = self.cpu_load
        if isinstance(load, bool) or not isinstance(load, int) or not 0 <= load <= 64:
            raise InvalidValueError(f"cpu_load must be an int in [0, 64], got {load!r}")
        if self.block_size % 4096:
            raise InvalidValueError(
                f"the block size (--write-block-size) must be a multiple of 4 KiB (O_DIRECT), "
                f"got {self.block_size}"
            )
        if self.cpu_blocks < 2 * self.batch_blocks:
            raise InvalidValueError(
                f"the CPU tier (--cpu-size) must hold at least two puts "
                f"({2 * self.batch_blocks} blocks of {format_size(self.block_size)}), "
                f"got {format_size(self.cpu_bytes)}"
            )
        if self.rounds > min(self.puts, self.gets):
            raise InvalidValueError(
                f"rounds ({self.rounds}) must not exceed the puts ({self.puts}, --puts) or the "
                f"gets per phase ({self.gets}, --gets)"
            )
        rate = self.put_rate
        if rate is not None and (isinstance(rate, bool) or not math.isfinite(rate) or rate <= 0):
            raise InvalidValueError(f"the put rate must be a positive number, got {rate!r}")
        if self.probe_bytes < self.put_bytes:
            raise InvalidValueError("probe_bytes must hold at least one put")


@dataclass
class WriteReport:
    """Everything one run measured, and where and how."""

    settings: Settings
    pace: Pace | None = None
    puts: list[PutRow] = field(default_factory=list)
    gets: list[GetRow] = field(default_factory=list)
    demotion: list[DemotionRow] = field(default_factory=list)
    resident_blocks: int = 0
    """Blocks put for the get phases (all of them must reach the disk tier only)."""
    resident_on_disk: int = 0
    """Of those, the blocks found on the disk tier only before the first get."""
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> int:
        """Blocks a get returned with bytes other than those put."""
        return sum(row.mismatched_blocks for row in self.gets)

    def reference(self) -> PutRow | None:
        """The CPU-only chain's row, the put ratios' denominator."""
        return next((row for row in self.puts if row.write_policy is None), None)

    def put_ratios(self, row: PutRow) -> tuple[float, float]:
        """(p50, p99) of `row` over the CPU-only chain's."""
        ref = self.reference()
        if ref is None:
            return math.nan, math.nan
        return _ratio(row.p50_ms, ref.p50_ms), _ratio(row.p99_ms, ref.p99_ms)

    def get_ratios(self) -> tuple[float, float]:
        """(p50, p99) of the gets under the write stream over the idle gets'."""
        phases = {row.phase: row for row in self.gets}
        idle, stream = phases.get(IDLE), phases.get(STREAM)
        if idle is None or stream is None:
            return math.nan, math.nan
        return _ratio(stream.p50_ms, idle.p50_ms), _ratio(stream.p99_ms, idle.p99_ms)

    def to_dict(self) -> dict[str, Any]:
        settings = asdict(self.settings)
        settings["directory"] = (
            None if self.settings.directory is None else str(self.settings.directory)
        )
        puts = []
        for row in self.puts:
            data = row.to_dict()
            data["p50_ratio"], data["p99_ratio"] = self.put_ratios(row)
            puts.append(data)
        get_p50, get_p99 = self.get_ratios()
        return {
            "format": _JSON_FORMAT,
            "unit": "latencies in seconds (samples) and ms (percentiles); GB/s = 10**9 B/s",
            "targets": {
                "put_p50_ratio": PUT_P50_TARGET,
                "put_p99_ratio": PUT_P99_TARGET,
                "get_ratio": GET_TARGET,
                "demotion_ratio": DEMOTION_TARGET,
            },
            "settings": settings,
            "pace": None if self.pace is None else self.pace.to_dict(),
            "puts": puts,
            "gets": [row.to_dict() for row in self.gets],
            "get_p50_ratio": get_p50,
            "get_p99_ratio": get_p99,
            "resident_blocks": self.resident_blocks,
            "resident_on_disk": self.resident_on_disk,
            "demotion": [row.to_dict() for row in self.demotion],
            "mismatches": self.mismatches,
            "environment": self.environment,
            "notes": self.notes,
        }

    def to_json(self) -> str:
        """The report as a JSON document (for scripts). Infinite or undefined ratios (a
        zero denominator) are written as null."""
        return json.dumps(_finite(self.to_dict()), indent=2)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


# -- blocks derived from their keys --------------------------------------------------------


class BlockMaker:
    """Block `i` (key `key_from_int(i)`) is one random pattern (seeded) XOR a 64-bit mix of
    `i` in every word: any two blocks differ in every word, and the bytes of any block can
    be rebuilt from its number to check what a get returned."""

    def __init__(self, block_size: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.block_size = block_size
        self._pattern = rng.integers(0, 1 << 63, size=block_size // 8, dtype=np.uint64)

    def blocks(self, first: int, count: int) -> torch.Tensor:
        """Blocks `first .. first + count - 1` as a uint8 tensor `[count, block_size]`."""
        ids = np.arange(first, first + count, dtype=np.uint64)
        words = self._pattern[None, :] ^ _mix(ids)[:, None]
        return torch.from_numpy(words.view(np.uint8).reshape(count, self.block_size))


def _mix(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser (wrapping uint64 arithmetic)."""
    with np.errstate(over="ignore"):
        z = values + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def keys_of(first: int, count: int) -> list[OffloadKey]:
    return [key_from_int(first + i) for i in range(count)]


def mismatched_blocks(got: torch.Tensor, expected: torch.Tensor) -> int:
    """How many rows of `got` differ from the same rows of `expected`."""
    rows = got.shape[0]
    if rows == 0:
        return 0
    differ = (got.cpu() != expected[:rows]).any(dim=1)
    return int(differ.sum())


class _Numbers:
    """Block numbers handed out in order: every block of a run has a key of its own."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int) -> int:
        first = self.next
        self.next += count
        return first


# -- the raw baseline ----------------------------------------------------------------------


class RawWriter:
    """`pwrite` + `fdatasync` of `batch_bytes` batches into a preallocated file of `batches`
    batches, with O_DIRECT where the filesystem accepts it (from page-aligned memory)."""

    def __init__(self, path: Path, batch_bytes: int, batches: int) -> None:
        self.path = path
        self.batch_bytes = batch_bytes
        self.batches = max(1, batches)
        self._map = mmap.mmap(-1, batch_bytes)
        self._view = memoryview(self._map)
        np.frombuffer(self._map, dtype=np.uint8)[:] = np.random.default_rng(1).integers(
            0, 256, size=batch_bytes, dtype=np.uint8
        )
        self.direct = False
        self._fd = -1
        if _O_DIRECT and batch_bytes % 4096 == 0:
            try:
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_DIRECT | _O_CLOEXEC, 0o600)
                PLAIN_IO.allocate(self._fd, batch_bytes * self.batches)
                self._write_one(0)  # some filesystems accept the flag and refuse the write
                self.direct = True
            except OSError as error:
                if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    self.close()
                    raise
                if self._fd >= 0:
                    os.close(self._fd)
                self._fd = -1
        if self._fd < 0:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o600)
            PLAIN_IO.allocate(self._fd, batch_bytes * self.batches)

    @property
    def mode(self) -> str:
        return "O_DIRECT" if self.direct else "buffered (O_DIRECT not available)"

    def _write_one(self, index: int) -> None:
        offset = (index % self.batches) * self.batch_bytes
        pwritev_all(self._fd, [self._view], offset, nbytes=self.batch_bytes)
        PLAIN_IO.fsync(self._fd)

    def write(self, batches: int) -> float:
        """Seconds to write `batches` batches, each followed by fdatasync."""
        start = time.perf_counter()
        for index in range(batches):
            self._write_one(index)
        return time.perf_counter() - start

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._view.release()
        self._map.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


# -- chains --------------------------------------------------------------------------------


def chain_config(
    settings: Settings,
    write_policy: str,
    disk_dir: Path | None = None,
    disk_blocks: int = 0,
) -> dict[str, Any]:
    """The config dict of a CPU tier of `settings.cpu_blocks` blocks over (when `disk_dir`
    is given) a disk tier of `disk_blocks` blocks in `disk_dir` (fsync, O_DIRECT "auto")."""
    tiers: list[dict[str, Any]] = [
        {"name": CPU_TIER, "medium": "cpu", "capacity": settings.cpu_blocks, "policy": "lru"}
    ]
    if disk_dir is not None:
        tiers.append(
            {
                "name": DISK_TIER,
                "medium": "disk",
                "capacity": disk_blocks,
                "policy": "lru",
                "path": str(disk_dir),
                "direct_io": "auto",
                "fsync": True,
            }
        )
    return {
        "block_size": settings.block_size,
        "model_id": _MODEL_ID,
        "write_policy": write_policy,
        "tiers": tiers,
    }


def _open_chain(config: dict[str, Any]) -> Hierarchy:
    return Hierarchy.from_config(config, flush_on_close=False)


def _put_counters(hierarchy: Hierarchy) -> dict[str, int]:
    """The hierarchy's integer `put_*` counters (whichever this version has)."""
    calls = hierarchy.stats().calls
    found: dict[str, int] = {}
    if dataclasses.is_dataclass(calls):
        for item in dataclasses.fields(calls):
            value = getattr(calls, item.name)
            if item.name.startswith("put_") and isinstance(value, int):
                found[item.name] = value
    return found


def _pair(hierarchy: Hierarchy, src: str, dst: str) -> tuple[int, float]:
    """(bytes, seconds) the hierarchy has copied from tier `src` to tier `dst` so far."""
    _, nbytes, seconds = hierarchy.stats().pairs.get((src, dst), (0, 0, 0.0))
    return nbytes, seconds


async def _fill(hierarchy: Hierarchy, maker: BlockMaker, numbers: _Numbers, blocks: int) -> None:
    """Put `blocks` new blocks, in puts of at most 64 blocks, and wait for the transfers."""
    while blocks > 0:
        count = min(64, blocks)
        first = numbers.take(count)
        await hierarchy.put(keys_of(first, count), maker.blocks(first, count))
        blocks -= count
    await hierarchy.drain()


async def _sleep_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def paced_puts(
    hierarchy: Hierarchy,
    maker: BlockMaker,
    numbers: _Numbers,
    count: int,
    batch: int,
    interval_s: float,
) -> tuple[list[float], int]:
    """`count` puts of `batch` new blocks, put k starting at `k * interval_s` (or when put
    k-1 returns, if later: a late start): every put's latency and the late starts."""
    latencies: list[float] = []
    late = 0
    first = numbers.take(batch)
    keys, blocks = keys_of(first, batch), maker.blocks(first, batch)
    start = returned = time.perf_counter()
    for index in range(count):
        scheduled = start + index * interval_s
        late += returned > scheduled
        await _sleep_until(scheduled)
        began = time.perf_counter()
        await hierarchy.put(keys, blocks)
        returned = time.perf_counter()
        latencies.append(returned - began)
        if index + 1 < count:
            first = numbers.take(batch)
            keys, blocks = keys_of(first, batch), maker.blocks(first, batch)
    return latencies, late


async def _drain_all(hierarchies: Sequence[Hierarchy]) -> None:
    """Wait until no chain has a transfer in flight, then collect garbage (before timing)."""
    for hierarchy in hierarchies:
        await hierarchy.drain()
    gc.collect()


def _shares(total: int, parts: int) -> list[int]:
    """`total` split into `parts` near-equal whole shares."""
    return [total // parts + (index < total % parts) for index in range(parts)]


# -- row 1 and 3: puts into a full CPU tier, demotion throughput --------------------------


async def measure_puts(
    settings: Settings,
    workdir: Path,
    pace: Pace,
    raw: RawWriter,
    maker: BlockMaker,
    numbers: _Numbers,
    tick: Callable[[str], None],
) -> tuple[list[PutRow], list[DemotionRow], list[str]]:
    """Row 1 (put latency per chain) and row 3 (cpu -> disk throughput of the disk chains
    next to the raw baseline); also each disk chain's tier description."""
    batch = settings.batch_blocks
    disk_blocks = puts_disk_blocks(settings)
    hierarchies: list[Hierarchy] = []
    described: list[str] = []
    try:
        for label, policy in CHAINS:
            disk_dir = None if policy is None else workdir / f"puts-{policy}"
            config = chain_config(settings, policy or "write-back", disk_dir, disk_blocks)
            hierarchy = _open_chain(config)
            hierarchies.append(hierarchy)
            await hierarchy.open()
            if policy is not None:
                described.append(f"{label}: {hierarchy.tiers[-1].where}")
            await _fill(hierarchy, maker, numbers, settings.cpu_blocks)
        before = [(_put_counters(h), _pair(h, CPU_TIER, DISK_TIER)) for h in hierarchies]
        latencies: list[list[float]] = [[] for _ in CHAINS]
        late = [0 for _ in CHAINS]
        raw_s = 0.0
        shares = _shares(settings.puts, settings.rounds)
        for round_index, share in enumerate(shares):
            for turn in range(len(CHAINS)):
                which = (round_index + turn) % len(CHAINS)
                await _drain_all(hierarchies)  # nothing of another chain runs behind
                got, started_late = await paced_puts(
                    hierarchies[which], maker, numbers, share, batch, pace.interval_s
                )
                latencies[which] += got
                late[which] += started_late
            await _drain_all(hierarchies)
            raw_s += raw.write(share)
            tick(f"puts, round {round_index + 1}")
        put_rows: list[PutRow] = []
        demotion: list[DemotionRow] = []
        for (label, policy), hierarchy, times, late_starts, (counters, pair) in zip(
            CHAINS, hierarchies, latencies, late, before, strict=True
        ):
            now = _put_counters(hierarchy)
            put_rows.append(
                PutRow(
                    label,
                    policy,
                    batch,
                    tuple(times),
                    late_starts,
                    {name: value - counters.get(name, 0) for name, value in now.items()},
                )
            )
            if policy is not None:
                nbytes, seconds = _pair(hierarchy, CPU_TIER, DISK_TIER)
                demotion.append(
                    DemotionRow(
                        label,
                        nbytes - pair[0],
                        seconds - pair[1],
                        settings.puts * settings.put_bytes,
                        raw_s,
                        settings.put_bytes,
                        raw.mode,
                    )
                )
        return put_rows, demotion, described
    finally:
        for hierarchy in hierarchies:
            await hierarchy.close()


# -- row 2: gets of disk-resident prefixes, idle and under a write stream -----------------


class _Stream:
    """A background task putting new blocks at the put rate until stopped or out of budget."""

    def __init__(
        self,
        hierarchy: Hierarchy,
        maker: BlockMaker,
        numbers: _Numbers,
        batch: int,
        interval_s: float,
        budget: int,
    ) -> None:
        self.hierarchy = hierarchy
        self.maker = maker
        self.numbers = numbers
        self.batch = batch
        self.interval_s = interval_s
        self.budget = budget
        self.puts = 0
        self.started = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        start = time.perf_counter()
        try:
            while not self._stop.is_set() and self.puts < self.budget:
                await _sleep_until(start + self.puts * self.interval_s)
                if self._stop.is_set():
                    break
                first = self.numbers.take(self.batch)
                keys, blocks = keys_of(first, self.batch), self.maker.blocks(first, self.batch)
                await self.hierarchy.put(keys, blocks)
                self.puts += 1
                if self.puts >= STREAM_LEAD_PUTS:
                    self.started.set()
        finally:
            self.started.set()  # never leave the gets waiting (an error is raised by stop)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


def _disk_only(hierarchy: Hierarchy, keys: Sequence[OffloadKey]) -> int:
    """How many of `keys` are held by the disk tier alone right now."""
    return sum(1 for key in keys if hierarchy.where(key) == DISK_TIER)


async def measure_gets(
    settings: Settings,
    workdir: Path,
    pace: Pace,
    maker: BlockMaker,
    numbers: _Numbers,
    tick: Callable[[str], None],
    report: WriteReport,
) -> None:
    """Row 2: put `2 * gets` prefixes, push them to the disk tier, then time their gets in
    alternating idle and stream phases, verifying every returned byte."""
    batch = settings.batch_blocks
    shares = _shares(settings.gets, settings.rounds)
    prefixes = 2 * settings.gets
    budget = stream_budget(settings, pace.rate)
    push = settings.cpu_blocks + 2 * batch
    disk_blocks = gets_disk_blocks(settings, pace.rate)
    config = chain_config(settings, "write-back", workdir / "gets", disk_blocks)
    hierarchy = _open_chain(config)
    await hierarchy.open()
    try:
        await _fill(hierarchy, maker, numbers, settings.cpu_blocks)
        first_block = numbers.take(prefixes * batch)
        for index in range(prefixes):
            first = first_block + index * batch
            await hierarchy.put(keys_of(first, batch), maker.blocks(first, batch))
        resident = keys_of(first_block, prefixes * batch)
        on_disk = 0
        for _ in range(PUSH_TRIES):  # push them out of the CPU tier (whatever it keeps free)
            await _fill(hierarchy, maker, numbers, push)
            on_disk = _disk_only(hierarchy, resident)
            if on_disk == len(resident):
                break
        report.resident_blocks = len(resident)
        report.resident_on_disk = on_disk
        tick("gets, disk-resident blocks written")

        results: dict[str, dict[str, Any]] = {
            phase: {
                "latencies": [],
                "blocks": 0,
                "not_on_disk": 0,
                "short": 0,
                "wrong": 0,
                "stream_puts": 0,
                "alone": 0,
                "written": 0,
            }
            for phase in (IDLE, STREAM)
        }
        next_prefix = 0
        for round_index, share in enumerate(shares):
            phases = (IDLE, STREAM) if round_index % 2 == 0 else (STREAM, IDLE)
            for phase in phases:
                if phase == IDLE:
                    # Every block of the CPU tier also on the disk: evicting one for a get
                    # writes nothing, so the disk only reads.
                    await hierarchy.flush()
                else:
                    # The CPU tier full of blocks it alone holds: every put of the stream
                    # demotes as many blocks to the disk (a sustained write-back stream).
                    await _fill(hierarchy, maker, numbers, settings.cpu_blocks)
                await _drain_all([hierarchy])
                written_before, _ = _pair(hierarchy, CPU_TIER, DISK_TIER)
                stream = None
                if phase == STREAM:
                    stream = _Stream(hierarchy, maker, numbers, batch, pace.interval_s, budget)
                    stream.start()
                    await stream.started.wait()
                result = results[phase]
                try:
                    for _ in range(share):
                        first = first_block + next_prefix * batch
                        next_prefix += 1
                        keys = keys_of(first, batch)
                        result["not_on_disk"] += batch - _disk_only(hierarchy, keys)
                        began = time.perf_counter()
                        got = await hierarchy.get(keys, timeout_s=GET_TIMEOUT_S)
                        result["latencies"].append(time.perf_counter() - began)
                        if stream is not None and not stream.running:
                            result["alone"] += 1
                        result["blocks"] += got.shape[0]
                        result["short"] += got.shape[0] < batch
                        result["wrong"] += mismatched_blocks(got, maker.blocks(first, batch))
                finally:
                    if stream is not None:
                        await stream.stop()
                        result["stream_puts"] += stream.puts
                await hierarchy.drain()  # the phase's writes still in flight count too
                written, _ = _pair(hierarchy, CPU_TIER, DISK_TIER)
                result["written"] += written - written_before
            tick(f"gets, round {round_index + 1}")
        await hierarchy.drain()
        for phase, result in results.items():
            report.gets.append(
                GetRow(
                    phase,
                    batch,
                    tuple(result["latencies"]),
                    result["blocks"],
                    result["not_on_disk"],
                    result["short"],
                    result["wrong"],
                    result["stream_puts"],
                    result["written"],
                    result["alone"],
                )
            )
    finally:
        await hierarchy.close()


# -- the benchmark -------------------------------------------------------------------------


def default_parent_dir() -> Path:
    """The current directory when it is writable, else the system's temporary directory
    (`$TMPDIR`, ...)."""
    here = Path.cwd()
    if os.access(here, os.W_OK | os.X_OK):
        return here
    return Path(tempfile.gettempdir())


def stream_budget(settings: Settings, rate: float) -> int:
    """Most puts of the background stream in one stream phase: `STREAM_BUDGET_S` at the put
    rate, at most `STREAM_PUTS_PER_GET` per get of the phase."""
    gets = math.ceil(settings.gets / settings.rounds)
    budget = min(math.ceil(rate * STREAM_BUDGET_S), STREAM_PUTS_PER_GET * gets)
    return max(STREAM_LEAD_PUTS + 1, budget)


def puts_disk_blocks(settings: Settings) -> int:
    """Disk tier capacity of a put chain: the pre-fill and every timed put, and a margin."""
    return settings.cpu_blocks + settings.puts * settings.batch_blocks + 4 * settings.batch_blocks


def gets_disk_blocks(settings: Settings, rate: float) -> int:
    """Disk tier capacity of the get chain: every block it is ever given (pre-fill, the
    disk-resident prefixes, the pushes, a fill before every stream phase and the streams;
    each key is new), so that the disk tier never evicts a prefix still to be read."""
    batch = settings.batch_blocks
    cpu = settings.cpu_blocks
    blocks = cpu + 2 * settings.gets * batch + PUSH_TRIES * (cpu + 2 * batch)
    blocks += settings.rounds * (cpu + stream_budget(settings, rate) * batch)
    return blocks + 4 * batch


def step_count(settings: Settings) -> int:
    """How many progress steps `run_writepath_benchmark` reports for `settings`."""
    return 1 + settings.rounds + 1 + settings.rounds


def disk_bytes_needed(settings: Settings, rate: float) -> int:
    """Disk space the run preallocates at most at once (tier files and the raw file)."""
    puts_chains = 2 * puts_disk_blocks(settings)
    gets_chain = gets_disk_blocks(settings, rate)
    raw = max(settings.probe_bytes, math.ceil(settings.puts / settings.rounds) * settings.put_bytes)
    return max(puts_chains, gets_chain) * settings.block_size + raw


def _environment(directory: Path) -> dict[str, Any]:
    filesystem = filesystem_of(directory)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "directory": str(directory),
        "filesystem": filesystem,
        "memory_filesystem": filesystem.split(" ", 1)[0] in MEMORY_FILESYSTEMS,
    }


def _choose_pace(settings: Settings, raw: RawWriter) -> Pace:
    if settings.put_rate is not None:
        rate = float(settings.put_rate)
        return Pace(rate, 1.0 / rate, "given (--put-rate)", 0.0, settings.put_bytes)
    batches = max(1, settings.probe_bytes // settings.put_bytes)
    raw.write(1)  # warm-up
    seconds = raw.write(batches)
    gbps = batches * settings.put_bytes / seconds / GB if seconds > 0 else math.inf
    rate = RATE_FRACTION * gbps * GB / settings.put_bytes
    source = f"{RATE_FRACTION:.0%} of the raw {raw.mode} write bandwidth measured at the start"
    if not rate <= MAX_AUTO_RATE:
        rate = MAX_AUTO_RATE
        source += f", capped at {MAX_AUTO_RATE:g} puts/s"
    return Pace(rate, 1.0 / rate, source, gbps, settings.put_bytes)


def run_writepath_benchmark(
    settings: Settings, progress: Callable[[str], None] | None = None
) -> WriteReport:
    """Measure the three write-path rows; `progress` receives a line after each step
    (`step_count` of them). Raises InvalidValueError for bad settings or a directory that
    cannot hold the files."""
    settings.validate()
    tick = progress if progress is not None else (lambda _: None)
    parent = settings.directory if settings.directory is not None else default_parent_dir()
    if not parent.is_dir():
        raise InvalidValueError(f"--dir {parent}: not a directory")
    report = WriteReport(settings)
    workdir = Path(tempfile.mkdtemp(prefix="kvtier-writepath-", dir=parent))
    spinners = start_cpu_load(settings.cpu_load)
    try:
        report.environment = _environment(workdir)
        report.environment["cpu_load"] = settings.cpu_load
        asyncio.run(_measure(settings, report, workdir, tick))
    finally:
        stop_cpu_load(spinners)
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def start_cpu_load(count: int) -> list[subprocess.Popen[bytes]]:
    """Start `count` processes that each spin on one core until stopped (other work
    sharing the machine: a serving engine's own threads, a tokenizer, another process)."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]


def stop_cpu_load(spinners: list[subprocess.Popen[bytes]]) -> None:
    """Stop the processes of `start_cpu_load` (each by its own handle) and reap them."""
    for spinner in spinners:
        spinner.kill()
    for spinner in spinners:
        spinner.wait()


async def _measure(
    settings: Settings, report: WriteReport, workdir: Path, tick: Callable[[str], None]
) -> None:
    share = math.ceil(settings.puts / settings.rounds)
    probe = max(1, settings.probe_bytes // settings.put_bytes)
    raw = RawWriter(workdir / "raw.bin", settings.put_bytes, max(share, probe))
    try:
        pace = _choose_pace(settings, raw)
        report.pace = pace
        needed = int(_SPACE_MARGIN * disk_bytes_needed(settings, pace.rate))
        free = shutil.disk_usage(workdir).free
        if free < needed:
            raise InvalidValueError(
                f"{workdir.parent} has {format_size(free)} free; the write-path benchmark "
                f"wants {format_size(needed)} (lower --puts, --gets or --put-rate, or choose "
                "another --dir)"
            )
        report.environment["raw_write"] = raw.mode
        tick("raw disk write bandwidth")
        maker = BlockMaker(settings.block_size, settings.seed)
        numbers = _Numbers()
        put_rows, demotion, described = await measure_puts(
            settings, workdir, pace, raw, maker, numbers, tick
        )
        report.puts, report.demotion = put_rows, demotion
        report.environment["disk_tiers"] = described
        await measure_gets(settings, workdir, pace, maker, numbers, tick, report)
    finally:
        raw.close()
    _add_notes(report)


def _add_notes(report: WriteReport) -> None:
    env = report.environment
    if env.get("memory_filesystem"):
        report.notes.append(
            f"The disk files are on {env['filesystem']}: that is memory, not a disk, so the "
            "disk rows do not measure a disk (choose --dir on a real disk)."
        )
    if not all("O_DIRECT" in line for line in env.get("disk_tiers", [])):
        report.notes.append("The disk tier did not use O_DIRECT here (page cache writes).")
    if report.resident_on_disk < report.resident_blocks:
        report.notes.append(
            f"Only {report.resident_on_disk:,} of {report.resident_blocks:,} blocks meant for "
            "the get rows reached the disk tier alone before the gets."
        )
    for row in report.puts:
        if row.late_starts:
            report.notes.append(
                f"{row.chain}: {row.late_starts} of {len(row.latencies_s)} puts started late "
                "(the put before outlasted the interval between puts)."
            )
    for demotion in report.demotion:
        if demotion.nbytes < demotion.raw_bytes:
            report.notes.append(
                f"{demotion.chain}: the disk tier received {format_size(demotion.nbytes)} of "
                f"the {format_size(demotion.raw_bytes)} put (copies dropped or failed)."
            )
    for get in report.gets:
        if get.not_on_disk:
            report.notes.append(
                f"gets {get.phase}: {get.not_on_disk} blocks were not on the disk tier alone "
                "right before their get."
            )
        if get.short_gets:
            report.notes.append(
                f"gets {get.phase}: {get.short_gets} gets returned fewer blocks than asked "
                f"(missing, or past the {GET_TIMEOUT_S:.0f} s deadline)."
            )
        if get.gets_without_stream:
            report.notes.append(
                f"gets {get.phase}: {get.gets_without_stream} gets ran after the stream had "
                "used its budget (raise it or lower --gets)."
            )


# -- output --------------------------------------------------------------------------------


def _io_mode(description: str) -> str:
    """The I/O mode in a tier's description, "files in DIR (O_DIRECT)" -> "O_DIRECT"."""
    found = re.search(r"\(([^()]*)\)\s*$", description)
    return found.group(1) if found else description


def _times(value: float) -> str:
    return f"{value:.2f}x" if math.isfinite(value) else "-"


def _verdict(*checks: tuple[float, float]) -> str:
    if any(not math.isfinite(value) for value, _ in checks):
        return "-"
    return "yes" if all(value <= limit for value, limit in checks) else "no"


def render(report: WriteReport) -> list[Any]:
    """Rich renderables (tables and lines) showing `report`."""
    shown: list[Any] = []
    if report.puts and report.pace is not None:
        shown.append(_put_table(report, report.pace))
    if report.gets:
        shown += _get_renderables(report)
    if report.demotion:
        shown.append(_demotion_table(report))
    return shown + _footer(report)


def _put_table(report: WriteReport, pace: Pace) -> Any:
    """The put latencies of each chain, and their ratios to the CPU-only chain."""
    from rich.table import Table

    settings = report.settings
    size = format_size(settings.block_size)
    puts = len(report.puts[0].latencies_s)
    cpu = format_size(settings.cpu_blocks * settings.block_size)
    table = Table(
        title=(
            f"Put latency into a full CPU tier ({cpu}): "
            f"{puts} puts of {settings.batch_blocks} x {size} per chain, one every "
            f"{pace.interval_s * 1e3:.1f} ms ({pace.mb_per_s:,.0f} MB/s), "
            f"{settings.rounds} interleaved rounds; ratio to the CPU-only chain "
            f"(targets p50 <= {PUT_P50_TARGET:g}x, p99 <= {PUT_P99_TARGET:g}x)"
        ),
        title_justify="left",
    )
    for column in ("chain", "puts", "late", "p50 ms", "p99 ms", "p50 ratio", "p99 ratio"):
        table.add_column(column, justify="left" if column == "chain" else "right")
    table.add_column("targets met?", justify="left")
    for row in report.puts:
        p50, p99 = report.put_ratios(row)
        reference = row.write_policy is None
        table.add_row(
            row.chain,
            f"{len(row.latencies_s):,}",
            f"{row.late_starts:,}",
            f"{row.p50_ms:.2f}",
            f"{row.p99_ms:.2f}",
            "ref" if reference else _times(p50),
            "" if reference else _times(p99),
            "" if reference else _verdict((p50, PUT_P50_TARGET), (p99, PUT_P99_TARGET)),
        )
    return table


def _get_verdict(get: GetRow) -> str:
    """What the check of a phase's gets found: blocks read, wrong, or short."""
    if get.mismatched_blocks:
        return f"{get.mismatched_blocks:,} WRONG"
    if get.short_gets:
        return f"{get.blocks_read:,} ok, {get.short_gets} short"
    return f"{get.blocks_read:,} ok"


def _get_renderables(report: WriteReport) -> list[Any]:
    """The get latencies, disk idle and under the put stream, and whether they met the
    target."""
    from rich.table import Table
    from rich.text import Text

    p50, p99 = report.get_ratios()
    table = Table(
        title=(
            f"Get latency of {report.settings.batch_blocks}-block prefixes on the disk tier "
            f"only (write-back chain; {report.resident_on_disk:,} of "
            f"{report.resident_blocks:,} blocks checked on disk before the gets), disk idle vs "
            f"under a paced put stream (target <= {GET_TARGET:g}x)"
        ),
        title_justify="left",
    )
    columns = ("disk", "gets", "stream puts", "MB written", "p50 ms", "p99 ms", "p50 ratio")
    for column in (*columns, "p99 ratio"):
        table.add_column(column, justify="left" if column == "disk" else "right")
    table.add_column("verified", justify="left")
    for get in report.gets:
        idle = get.phase == IDLE
        table.add_row(
            get.phase,
            f"{len(get.latencies_s):,}",
            "" if idle else f"{get.stream_puts:,}",
            f"{get.written_bytes / 1e6:,.0f}",
            f"{get.p50_ms:.2f}",
            f"{get.p99_ms:.2f}",
            "ref" if idle else _times(p50),
            "" if idle else _times(p99),
            _get_verdict(get),
        )
    verdict = _verdict((p50, GET_TARGET), (p99, GET_TARGET))
    met = Text(f"Targets met (stream / idle <= {GET_TARGET:g}x, p50 and p99): {verdict}")
    return [table, met]


def _demotion_table(report: WriteReport) -> Any:
    """Each disk chain's demotion throughput next to the raw writer's."""
    from rich.table import Table

    first = report.demotion[0]
    table = Table(
        title=(
            "Demotion throughput cpu -> disk during the puts (stats().pairs: bytes / busy "
            f"seconds) next to raw {first.raw_mode} pwrite + fdatasync of the same bytes "
            f"in {format_size(first.raw_batch_bytes)} batches, same filesystem "
            "(GB/s = 10^9 B/s)"
        ),
        title_justify="left",
    )
    for column in ("chain", "GB moved", "kvtier GB/s", "raw GB/s", "ratio"):
        table.add_column(column, justify="left" if column == "chain" else "right")
    table.add_column(f">= {DEMOTION_TARGET:.0%}?", justify="left")
    for demotion in report.demotion:
        ratio = demotion.ratio
        table.add_row(
            demotion.chain,
            f"{demotion.nbytes / GB:.2f}",
            f"{demotion.gbps:.2f}",
            f"{demotion.raw_gbps:.2f}",
            f"{ratio:.0%}" if math.isfinite(ratio) else "-",
            "yes" if ratio >= DEMOTION_TARGET else "no",
        )
    return table


def _footer(report: WriteReport) -> list[Any]:
    """The lines under the tables: put rate, files, disk modes, machine, notes, errors."""
    from rich.text import Text

    shown: list[Any] = []
    env = report.environment
    pace = report.pace
    if pace is not None:
        probe = f" ({pace.probe_gbps:.2f} GB/s)" if pace.probe_gbps else ""
        shown.append(Text(f"Put rate: {pace.rate:,.1f} puts/s, {pace.source}{probe}."))
    if "directory" in env:
        shown.append(
            Text(
                f"Disk files: {env['directory']} ({env.get('filesystem', 'unknown')}), removed "
                "afterwards."
            )
        )
    modes = sorted({_io_mode(line) for line in env.get("disk_tiers", [])})
    if modes:
        shown.append(Text(f"Disk tiers: {', '.join(modes)}, fsync on."))
    shown.append(
        Text(
            f"Machine: {env.get('cpus')} CPUs, torch {env.get('torch')} "
            f"({env.get('torch_threads')} threads)."
        )
    )
    if env.get("cpu_load"):
        shown.append(
            Text(f"CPU load: {env['cpu_load']} CPU-bound processes ran through the measurement.")
        )
    shown += [Text(note) for note in report.notes]
    if report.mismatches:
        shown.append(
            Text(
                f"ERROR: {report.mismatches} blocks returned by get differ from the bytes put; "
                "kvtier returned wrong bytes.",
                style="bold red",
            )
        )
    return shown
