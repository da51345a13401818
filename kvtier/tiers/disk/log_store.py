"""`LogStore`: a disk tier's bytes in a log of regions (`layout = "log"`), after CacheLib
Navy's BlockCache: demotions appended in large sequential writes, group commit, regions
reclaimed whole, an in-memory index checkpointed in the background.

A facade over its parts, each a module with one job:

    log_format.py      records, region headers, the bound checksum, the scan of a region
    log_files.py       the lock, the regions file (O_DIRECT where it can), the geometry
    log_index.py       slot -> newest record, as packed arrays; regions' epochs and live bytes
    log_rows.py        the index's values: a row, a batch of durable records, a plan of one
    log_lane.py        the write lane: groups appended and synced once, regions reclaimed
    log_reader.py      reads, each block verified (and read again if its record moved)
    log_recovery.py    the open: checkpoint, region headers, the regions written since
    log_checkpoint.py  the index's checkpoint in LMDB
    log_layout.py      layout.json: the regions' size and the identity the store was written with

The default layout of a disk tier; the per-block layout (`DiskStore`, store.py, `layout =
"slots"`) is the other. See docs/ARCHITECTURE.md for why and for what each promises.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.errors import DiskTierError, InvalidValueError
from kvtier.keys import MAX_KEY_BYTES, OffloadKey
from kvtier.tiers.codec import BlockCodec, Compression
from kvtier.tiers.disk.batch import check_batch, check_keys
from kvtier.tiers.disk.facade import StoreFacade, creates_parents, store_options
from kvtier.tiers.disk.fsck import CheckProblem, CheckReport
from kvtier.tiers.disk.io import FileIO
from kvtier.tiers.disk.jobs import ForgetJob, WriteJob
from kvtier.tiers.disk.kind import DiskTierConfig
from kvtier.tiers.disk.layout import StoreLayout
from kvtier.tiers.disk.log_files import LogFiles, geometry
from kvtier.tiers.disk.log_format import (
    DEFAULT_REGION_BYTES,
    PAGE,
    TOMBSTONE,
    log_fingerprint,
    record_bytes,
)
from kvtier.tiers.disk.log_index import LogIndex
from kvtier.tiers.disk.log_lane import LogLane
from kvtier.tiers.disk.log_layout import (
    LAYOUT_FILE,
    Written,
    new_store_id,
    read_layout,
    write_layout,
    written_with,
)
from kvtier.tiers.disk.log_reader import LogReader
from kvtier.tiers.disk.log_recovery import recover, save_checkpoint
from kvtier.tiers.disk.log_restored import LogRestored
from kvtier.tiers.disk.read_threads import ReadThreads
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.storage import HostBuffer, ReadFailure, RestoredBlock

__all__ = ["DEFAULT_SPARE", "LAYOUT_FILE", "READ_THREADS", "LogStore", "read_layout"]

READ_THREADS = 8
"""A log store's read threads by default: a large read keeps this many runs in flight."""

DEFAULT_SPARE = 0.25
"""Space beyond the blocks' own for reclaiming (a quarter: write amplification stays low)."""

CHECKPOINT_MIN_BYTES = 256 << 20
"""Bytes appended before a background checkpoint is due by regions opened (a store's
`checkpoint_min_bytes`): a restart after a crash scans at most this much more than
`checkpoint_every` regions (~0.1-0.3 s at a device's speed)."""

_LOG = logging.getLogger(__name__)


class LogStore(StoreFacade):
    """`num_blocks` slots whose bytes live in a log of regions under `directory`.

    Same contract and arguments as `DiskStore` (store.py) plus `region_bytes` (the size of a
    region, shrunk for a store too small for eight) and `spare` (space for reclaiming, as a
    fraction of the blocks' own); `max_workers` is its read threads (default 8: calls in
    flight at once, and the runs of one large batch read at once, as a device is rated at
    queue depth); `inspect` opens an existing store only to `check` it
    (nothing created, grown or written; writes raise DiskTierError). Blocking constructor:
    use `open_async` from a coroutine. A new store records its geometry in `layout.json`
    (what `kvtier check` opens it by).
    It opens its own store directory only: a tier directory holding a per-block store or a
    log store of another format (same block size and model) is refused by the disk tier's
    opener (open_checks.py), one DiskLayoutError line saying what to do.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        block_size: int,
        num_blocks: int,
        model_id: str = "",
        compression: Compression = "none",
        zstd_level: int = 3,
        direct_io: bool | str = "auto",
        fsync: bool = True,
        max_workers: int = READ_THREADS,
        io: FileIO | None = None,
        region_bytes: int = DEFAULT_REGION_BYTES,
        spare: float = DEFAULT_SPARE,
        create_parents: bool = True,
        inspect: bool = False,
    ) -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise InvalidValueError(f"max_workers must be a positive int, got {max_workers!r}")
        shape = StoreLayout(num_blocks, block_size, 1, model_id)
        if isinstance(region_bytes, bool) or not isinstance(region_bytes, int):
            raise InvalidValueError(f"region_bytes must be an int, got {region_bytes!r}")
        if region_bytes < 16 * PAGE or region_bytes % PAGE:
            raise InvalidValueError(
                f"region_bytes must be a multiple of {PAGE} of at least {16 * PAGE}, "
                f"got {region_bytes}"
            )
        if not isinstance(spare, int | float) or not 0.05 <= spare <= 4:
            raise InvalidValueError(f"spare must be a number in [0.05, 4], got {spare!r}")
        if not (isinstance(direct_io, bool) or direct_io == "auto"):
            raise InvalidValueError(f'direct_io must be true, false or "auto", got {direct_io!r}')
        if not isinstance(fsync, bool):
            raise InvalidValueError(f"fsync must be a bool, got {fsync!r}")
        self._shape = shape
        self.block_size = shape.block_size
        self.num_blocks = shape.num_blocks
        self.model_id = model_id
        self.fsync = fsync
        self.directory = Path(directory)
        self.fingerprint = log_fingerprint(block_size, model_id)
        self.path = self.directory / f"kvtier-log-{self.fingerprint}"
        self._namespace = self.fingerprint.encode("ascii")
        self._codec = BlockCodec(compression, zstd_level)
        self._counters = StoreCounters()
        self.inspect = inspect
        if inspect and not self.path.is_dir():
            raise DiskTierError(f"nothing to check: {self.path} does not exist")
        try:
            self.directory.mkdir(mode=0o700, parents=create_parents, exist_ok=True)
            self.path.mkdir(mode=0o700, exist_ok=True)
        except OSError as error:
            raise DiskTierError(f"cannot create {self.path}: {error.strerror}") from None
        record_max = record_bytes(MAX_KEY_BYTES, block_size)  # a zstd frame is shorter
        geo = geometry(num_blocks, record_max, region_bytes, float(spare))
        self._files = LogFiles(
            self.path, geo, io if io is not None else FileIO(), direct_io, readonly=inspect
        )
        try:
            written = self._written(record_max, region_bytes, float(spare))
            self._store_id = written.store_id or ("" if inspect else new_store_id())
            geo = self._files.geo
            self._index = LogIndex(num_blocks, geo.num_regions)
            self.opened = recover(
                self._files, self._index, self.fingerprint, self._namespace, self._store_id
            )
            if not inspect:
                self._files.allocate()
                self._record_layout(region_bytes)
        except BaseException:
            self._files.close()
            raise
        self._counters.set_dropped_at_open(self.opened.dropped)
        self._cold = LogRestored(self._index)
        self._checkpoints = ThreadPoolExecutor(1, thread_name_prefix="kvtier-log-checkpoint")
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_busy = False
        self._checkpointed_at = (0, 0)
        self.checkpoint_every = max(2, geo.num_regions // 8)
        """Regions opened after which a background checkpoint is written (at most what a
        restart after a crash scans), once `checkpoint_min_bytes` were appended too."""
        self.checkpoint_min_bytes = CHECKPOINT_MIN_BYTES
        """Bytes appended (moves included) before a background checkpoint is due by regions:
        a small store's regions are few, so `checkpoint_every` alone checkpointed it on every
        large call (1.3-1.8 ms of CPU and an LMDB fdatasync beside the call's writes, a 64 MiB
        call into a store one call large); a restart scans at most this much more."""
        self.checkpoint_records = max(8192, num_blocks // 32)
        """Records appended after which a checkpoint is written sooner, once they are ten
        times its size in bytes (a restart scans fewer records; checkpoints add at most a
        tenth to the bytes written)."""
        self._record_estimate = record_bytes(16, block_size)
        self._lane = LogLane(
            self._files,
            self._index,
            self._codec,
            self._counters,
            self._namespace,
            fsync=fsync,
            next_seq=self.opened.next_seq,
            next_epoch=self.opened.next_epoch,
            on_flush=self._maybe_checkpoint,
        )
        self._read_pool: ReadThreads | None = ReadThreads(max_workers, "kvtier-log-read")
        self._reader = LogReader(
            self._files,
            self._index,
            self._codec,
            self._counters,
            self._namespace,
            self._read_pool,
        )
        self._closed = False
        self._close_lock = threading.Lock()

    def _written(self, record_max: int, region_bytes: int, spare: float) -> Written:
        """What the store's regions file was written with (log_layout.py); its regions'
        size, when known and not this open's, replaces the open's geometry (one line)."""
        files = self._files
        written = written_with(
            read_layout(self.path),
            block_size=self.block_size,
            model_id=self.model_id,
            record_max=record_max,
            regions_file=files.identity,
            fresh=files.found_bytes == 0,
        )
        size = written.region_size
        if size is not None and size != files.geo.region_bytes:
            _LOG.warning(
                "log store %s keeps the regions of %d bytes it was written with, not the %d "
                "bytes region_bytes = %d gives for %d blocks: remove that directory to start "
                "empty with those (a cache: its blocks are lost, nothing else)",
                self.path,
                size,
                files.geo.region_bytes,
                region_bytes,
                self.num_blocks,
            )
            files.cut(geometry(self.num_blocks, record_max, size, spare, exact=True))
        return written

    def _record_layout(self, region_bytes: int) -> None:
        """Record this open's layout and the store's identity (log_layout.py)."""
        layout = {
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "model_id": self.model_id,
            "region_bytes": region_bytes,
            "region_size": self._files.geo.region_bytes,
            "store_id": self._store_id,
            "regions_file": self._files.identity,
        }
        try:
            write_layout(self.path, layout)
        except OSError as error:
            raise DiskTierError(
                f"cannot write {self.path / LAYOUT_FILE}: {error.strerror}"
            ) from None

    @classmethod
    def from_config(
        cls, tier: DiskTierConfig, block_size: int, model_id: str = "", **kwargs: Any
    ) -> LogStore:
        """A store for a validated disk tier config with `layout = "log"` (`kwargs`:
        `max_workers`, `io`, `spare`, ...); as `DiskStore.from_config` for the path."""
        kwargs.setdefault("create_parents", creates_parents(tier))
        kwargs.pop("slab_file_bytes", None)
        options = store_options(tier, block_size, model_id)
        return cls(tier.path, region_bytes=tier.region_bytes, **options, **kwargs)

    # -- checkpoints -----------------------------------------------------------------------

    def _maybe_checkpoint(self, opened: int) -> None:
        """After a durable flush: a background checkpoint once `checkpoint_every` regions
        were opened and `checkpoint_min_bytes` appended since the last one, or
        `checkpoint_records` records and ten checkpoints' worth of bytes were appended
        (never more than one at a time)."""
        lane = self._lane
        appended = lane.appended_bytes + lane.moved_bytes
        with self._checkpoint_lock:
            regions_at, bytes_at = self._checkpointed_at
            records = (appended - bytes_at) // self._record_estimate
            due = (
                opened - regions_at >= self.checkpoint_every
                and appended - bytes_at >= self.checkpoint_min_bytes
            ) or (
                records >= self.checkpoint_records
                and appended - bytes_at >= 10 * self._index.checkpoint_bytes()
            )
            if self._checkpoint_busy or not due:
                return
            self._checkpoint_busy = True
            self._checkpointed_at = (opened, appended)
        self._checkpoints.submit(self._checkpoint)

    def _checkpoint(self) -> None:
        try:
            self.checkpoint()
        except Exception as error:  # a failed checkpoint costs a longer scan, nothing else
            _LOG.warning("log store %s: checkpoint failed: %s", self.path, error)
        finally:
            with self._checkpoint_lock:
                self._checkpoint_busy = False

    def checkpoint(self) -> None:
        """Write the index as the checkpoint now (blocking; tools, tests and close); never
        once the store is disabled (the directory may be another store's now)."""
        if self._files.lost is not None:
            return
        lane = self._lane
        save_checkpoint(
            self.path,
            self.fingerprint,
            self._store_id,
            self._index,
            self._files.geo.region_bytes,
            lane.next_seq,
            lane.next_epoch,
        )

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Finish every queued call, write a last checkpoint, close the files. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._lane.close()
            self._checkpoints.shutdown(wait=True)
            if self._read_pool is not None:
                self._read_pool.shutdown(wait=True)
                self._read_pool = None
            if self._files.lost is None and not self.inspect:
                try:
                    self.checkpoint()
                except Exception as error:
                    _LOG.warning("log store %s: last checkpoint failed: %s", self.path, error)
            self._files.close()

    @property
    def disabled_reason(self) -> str | None:
        """Why the store disabled itself while open (its lock file or regions file was
        removed or replaced under it), or None while it serves. Once set it stays: every
        write fails, every read is a miss, it holds no block and its files are closed; open
        the path again to start from what is there."""
        return self._files.lost

    # -- introspection ---------------------------------------------------------------------

    @property
    def direct_io_active(self) -> bool:
        """Whether the regions are written with O_DIRECT."""
        return self._files.direct_fd is not None

    @property
    def region_bytes(self) -> int:
        """The size of one region."""
        return self._files.geo.region_bytes

    @property
    def num_regions(self) -> int:
        """The regions the store's space is cut into."""
        return self._files.geo.num_regions

    @property
    def write_amplification(self) -> float:
        """Bytes appended (new records and records moved by reclaiming) per byte of new
        records since the store opened (1.0 before any write)."""
        new = self._lane.appended_bytes
        return (new + self._lane.moved_bytes) / new if new else 1.0

    @property
    def moved_bytes(self) -> int:
        """Bytes of live records moved by reclaiming since the store opened."""
        return self._lane.moved_bytes

    def index_bytes(self) -> int:
        """Bytes the in-memory index holds (arrays and key map, the keys' objects counted)."""
        return self._index.memory_bytes()

    def describe(self) -> str:
        """Where the bytes live."""
        mode = "O_DIRECT" if self.direct_io_active else "buffered"
        codec = "" if self.compression == "none" else f", {self.compression}"
        return f"log of {self.num_regions} regions in {self.path} ({mode}{codec})"

    def __len__(self) -> int:
        return 0 if self._files.lost is not None else self._index.blocks

    def __contains__(self, key: object) -> bool:
        if self._files.lost is not None or not isinstance(key, bytes):
            return False
        return self._index.find(OffloadKey(key)) is not None

    def keys(self) -> list[OffloadKey]:
        """The keys held now (none once disabled)."""
        if self._files.lost is not None:
            return []
        found = (self._index.key_at(int(slot)) for slot in self._index.held_slots())
        return [key for key in found if key is not None]

    def restore(self) -> list[RestoredBlock]:
        """The blocks found at open, oldest first, less those written over or forgotten
        since (an object per block: a chain uses `restore_cold`); none once disabled."""
        if self._files.lost is not None:
            return []
        cold = self._cold
        found = ((cold.key_of(int(slot)), int(slot)) for slot in cold.slots())
        return [RestoredBlock(key, slot) for key, slot in found if key is not None]

    def restore_cold(self) -> LogRestored:
        """The blocks found at open as a compact view for a tier's bookkeeping."""
        return self._cold

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        elif self._files.lost is not None:
            state = f"disabled: {self._files.lost}"
        else:
            state = f"{len(self)} blocks"
        return f"LogStore({str(self.path)!r}, block_size={self.block_size}, {state})"

    # -- the calls -------------------------------------------------------------------------

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        """Store the blocks (`BlockStorage.write`): appended with the lane's next group and
        reported stored once that group's write and fdatasync are done and it is indexed."""
        self._check_open()
        key_list, slot_list, buffer_list = check_batch(
            self._shape, keys, slots, buffers, writable=False
        )
        if not key_list:
            return []
        future: asyncio.Future[list[OSError | None]] = asyncio.get_running_loop().create_future()
        self._lane.submit(WriteJob(key_list, slot_list, buffer_list, future))
        return await future

    async def forget(self, keys: Sequence[OffloadKey]) -> None:
        """Forget `keys` (absent ones ignored): a forget record each, durable like a write."""
        self._check_open()
        self._check_writable()
        key_list = check_keys(keys)
        if not key_list:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lane.submit(ForgetJob(list(dict.fromkeys(key_list)), future))
        await future

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        """Read the blocks (`BlockStorage.read`), each verified; a miss is a value. One call
        to a read thread, whatever the batch's size: that thread reads a large batch's runs
        with the other read threads (`LogReader.read`)."""
        self._check_open()
        key_list, slot_list, buffer_list = check_batch(
            self._shape, keys, slots, buffers, writable=True
        )
        if not key_list:
            return []
        if self._files.lost is not None:
            return [ReadFailure.IO_ERROR] * len(key_list)
        return await self._run(
            functools.partial(self._reader.read, key_list, slot_list, buffer_list)
        )

    def check(self, repair: bool = False) -> CheckReport:
        """Read back every block and verify it; with `repair`, forget the bad ones in memory
        and write a checkpoint without them. Blocking; run it with no batch in flight.
        DiskTierError once the store is disabled (its files are not its own any more)."""
        self._check_open()
        if self._files.lost is not None:
            raise DiskTierError(f"the disk tier at {self.path} is disabled: {self._files.lost}")
        index = self._index
        problems: list[CheckProblem] = []
        bad: list[int] = []
        with index.lock:
            held = [s for s in range(self.num_blocks) if index.region[s] >= 0]
        records = 0
        for slot in held:
            row = index.row(slot)
            if row is None or index.codec[slot] == TOMBSTONE:
                continue
            records += 1
            buffer = np.empty(self.block_size, dtype=np.uint8)
            result = self._reader.read([row.key], [slot], [buffer])[0]
            if result is not None:
                problems.append(CheckProblem(row.key, slot, f"unreadable: {result}"))
                bad.append(slot)
        repaired = 0
        if repair and bad and not self.inspect:
            index.drop(bad)
            repaired = len(bad)
            self.checkpoint()
        return CheckReport(
            records, tuple(problems), repaired=repaired, opened=tuple(self.opened.problems)
        )
