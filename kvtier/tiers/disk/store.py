"""`DiskStore`: the bytes of a disk tier, in preallocated slab files indexed by LMDB.

`DiskStore` is a facade: it checks arguments, owns the read threads and the lifecycle, and
hands every call to one of its parts, each a module with one job and its own tests:

    layout.py    the on-disk format: files, slot addressing, slot headers, index records and
                 the checksum binding a block to its key (`StoreLayout`: the one object that
                 knows the block size)
    recovery.py  opening: directories, lock, layout checks, index check and rebuild from the
                 slot headers, the in-flight log (inflight.py), records settled (`Recovery`)
    catalog.py   what the store holds: records in memory over the LMDB index (index.py)
    files.py     the open files and the bytes moved through them (`StoreFiles`)
    lane.py      the write lane: every write and forget (jobs.py) merged into group commits
    reader.py    the read path: runs read and every block verified (`BlockReader`)
    fsck.py      `check`: every record against its slot, lost records, stray files
    guard.py     failing closed: a store whose files were taken disables itself
    io.py        the system calls (`FileIO`, `FaultyIO`) and the short-I/O resume loops
    neighbours.py  the other stores in its directory (a changed block size), said at open
    facade.py    what it shares with the log layout's `LogStore` (`StoreFacade`)

Reads never wait behind writes: they run in their own thread pool, and the write lane is one
thread (with helpers) that always makes progress. Every read verifies its blocks' checksums,
so a torn, rotten or stale block is a miss, never data. A write is reported stored only once
its bytes are durable and indexed (lane.py); a store whose files are removed or replaced under
it disables itself (`disabled_reason`). All file and index work runs in threads, never on the
event loop.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.namespaces import combined_model_id
from kvtier.tiers.codec import BlockCodec, Compression, Stored
from kvtier.tiers.disk.batch import check_batch, check_keys, check_slot
from kvtier.tiers.disk.catalog import RestoredBlocks
from kvtier.tiers.disk.facade import StoreFacade, creates_parents, store_options
from kvtier.tiers.disk.fsck import CheckProblem, CheckReport, StoreChecker
from kvtier.tiers.disk.guard import Guard
from kvtier.tiers.disk.io import FileIO
from kvtier.tiers.disk.jobs import ForgetJob, WriteJob
from kvtier.tiers.disk.kind import DiskTierConfig
from kvtier.tiers.disk.lane import WriteLane
from kvtier.tiers.disk.layout import IndexRecord, StoreLayout, slab_file_name
from kvtier.tiers.disk.neighbours import say_other_stores
from kvtier.tiers.disk.open_checks import (
    refuse_older_log_store,
    refuse_other_layout,
    store_dir_of,
    trust_log_dirs,
)
from kvtier.tiers.disk.read_threads import ReadThreads
from kvtier.tiers.disk.reader import BlockReader, BlockVerifier, read_in_parts, read_parts
from kvtier.tiers.disk.recovery import Recovery
from kvtier.tiers.disk.stats import DiskStoreStats, StoreCounters
from kvtier.tiers.registry import TierContext
from kvtier.tiers.storage import BlockStorage, HostBuffer, ReadFailure, RestoredBlock

__all__ = [
    "DEFAULT_SLAB_FILE_BYTES",
    "CheckProblem",
    "CheckReport",
    "DirectIO",
    "DiskStore",
    "DiskStoreStats",
    "open_disk_tier",
]

DirectIO = bool | Literal["auto"]
"""O_DIRECT setting: required (True), never (False), or where the filesystem supports it."""

DEFAULT_SLAB_FILE_BYTES = 1 << 30
"""Largest slab file a new store creates (rounded down to whole slots, at least one slot)."""


class DiskStore(StoreFacade):
    """`num_blocks` slots of `block_size` bytes in files under `directory`.

    The constructor opens the store (creating or checking its files, replaying its index and
    probing O_DIRECT); it does blocking file I/O, so from a coroutine build it with
    `await asyncio.to_thread(DiskStore, ...)` (or `DiskStore.open_async`). `restore()` then
    lists the blocks an earlier process stored. Close with `aclose()` (or `close()`).

    Args:
        directory: parent of the store's own directory `kvtier-<fingerprint>`.
        block_size: bytes per block; part of the fingerprint.
        num_blocks: slots; reopening with fewer drops the records of the slots that are gone.
        model_id: namespace of the blocks; part of the fingerprint.
        compression: "none" or "zstd"; a block that zstd cannot shrink is stored raw.
        zstd_level: zstd level, 1 to 22.
        direct_io: O_DIRECT: True (required; DirectIOError if unsupported), False, or "auto"
            (probed once at open; needs `block_size % 4096 == 0`).
        fsync: make every write group durable (slab fdatasync and index commit) before
            reporting its blocks stored. Without it a process crash still loses nothing, a
            power cut may.
        max_workers: threads that read (calls and large reads run in parallel), and helper
            threads of the one write lane (a large group's runs are written in parallel).
        io: the system calls on slab files; tests pass a `FaultyIO`.
        slab_file_bytes: largest slab file of a new store; an existing store keeps its own.
        inspect: open an existing store only to `check` it: nothing is created, resized,
            deleted or written (writes raise DiskTierError); a missing or damaged index is a
            DiskTierError instead of being rebuilt, and the records that opening would drop
            are kept for `check` to report.
        create_parents: create the missing ancestors of `directory` (0700); when false, only
            `directory` itself may be created and a missing parent is a DiskTierError (a
            config's explicit path: a typo should not grow a directory tree).
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
        direct_io: DirectIO = "auto",
        fsync: bool = True,
        max_workers: int = 4,
        io: FileIO | None = None,
        slab_file_bytes: int = DEFAULT_SLAB_FILE_BYTES,
        inspect: bool = False,
        create_parents: bool = True,
    ) -> None:
        for name, value in (("max_workers", max_workers), ("slab_file_bytes", slab_file_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidValueError(f"{name} must be a positive int, got {value!r}")
        layout = StoreLayout(num_blocks, block_size, 1, model_id)
        layout = layout.with_slots_per_file(max(1, slab_file_bytes // block_size))
        if not (isinstance(direct_io, bool) or direct_io == "auto"):
            raise InvalidValueError(f'direct_io must be true, false or "auto", got {direct_io!r}')
        if not isinstance(fsync, bool):
            raise InvalidValueError(f"fsync must be a bool, got {fsync!r}")
        self.block_size = layout.block_size
        self.num_blocks = layout.num_blocks
        self.model_id = layout.model_id
        self.fingerprint = layout.fingerprint
        self.fsync = fsync
        self.inspect = inspect
        self.directory = Path(directory)
        self.path = layout.store_dir(self.directory)
        """The store's own directory."""
        self.other_stores = [] if inspect else say_other_stores(self.directory, layout)
        """The stores beside this one in `directory` (another block size or model id: what a
        changed config leaves behind), each said in the log at open (neighbours.py)."""
        self._max_workers = max_workers
        self._codec = BlockCodec(compression, zstd_level)
        self._counters = StoreCounters()
        self._guard = Guard()
        recovery = Recovery(
            layout,
            self.directory,
            io=io if io is not None else FileIO(),
            codec=self._codec,
            counters=self._counters,
            fsync=fsync,
            inspect=inspect,
            create_parents=create_parents,
        )
        self._catalog = recovery.open(direct_io)
        self.rebuilt_index = recovery.rebuilt_index
        """Why the index was rebuilt from the slab headers when the store opened (missing,
        damaged, ...), or None when it was opened as it was."""
        self._assemble(recovery)
        self._catalog.start_loading()
        self._closed = False
        self._close_lock = threading.Lock()

    def _assemble(self, recovery: Recovery) -> None:
        """Build the parts that serve the store on what `recovery` opened."""
        self._layout = layout = recovery.layout
        self._files = files = recovery.files
        catalog, codec, counters, guard = self._catalog, self._codec, self._counters, self._guard
        self._checker = StoreChecker(
            layout,
            files,
            catalog,
            BlockVerifier(layout, files, codec),
            guard,
            open_problems=recovery.problems,
            inspect=self.inspect,
            interrupted=recovery.interrupted,
        )
        self._reader = BlockReader(layout, files, catalog, codec, counters, guard)
        self._lane = WriteLane(
            layout,
            files,
            catalog,
            codec,
            counters,
            guard,
            max_workers=self._max_workers,
            fsync=self.fsync,
        )
        # Reads and writes never share a thread: a read never waits behind a queued write.
        self._read_pool: ReadThreads | None = ReadThreads(self._max_workers, "kvtier-disk-read")

    @classmethod
    def from_config(
        cls, tier: DiskTierConfig, block_size: int, model_id: str = "", **kwargs: Any
    ) -> DiskStore:
        """A store for a validated disk tier config (`kwargs`: `max_workers`, `io`, ...).
        Only the default path (the per-user cache directory) gets its missing ancestors
        created; a configured path must have an existing parent."""
        kwargs.setdefault("create_parents", creates_parents(tier))
        return cls(tier.path, **store_options(tier, block_size, model_id), **kwargs)

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse new calls, finish every call already made (the write lane runs every group
        queued before the close; reads in flight end), then close the files and the index.
        Idempotent; blocking (use `aclose` from a coroutine)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._lane.close()
            if self._read_pool is not None:
                self._read_pool.shutdown(wait=True)
                self._read_pool = None
            clean = not self.inspect and self._guard.reason is None
            self._files.close(clean=clean, catalog=self._catalog)

    @property
    def disabled_reason(self) -> str | None:
        """Why the store disabled itself while open (its files were removed or replaced
        under it), or None while it serves. Once set it stays: every write fails, every read
        is a miss and it holds no block until it is closed; open the path again to start
        from what is there."""
        return self._guard.reason

    # -- introspection ------------------------------------------------------------------------

    @property
    def direct_io_active(self) -> bool:
        """Whether the slab files are read and written with O_DIRECT."""
        return self._files.direct_io

    def describe(self) -> str:
        """Where the bytes live: "files in DIR (O_DIRECT|buffered[, codec][, N other stores
        beside it])": stores of another block size or model in the same directory, not read
        by this tier, their space still taken (`other_stores`)."""
        mode = "O_DIRECT" if self.direct_io_active else "buffered"
        codec = "" if self.compression == "none" else f", {self.compression}"
        others = len(self.other_stores)
        if others:
            codec += f", {others} other store{'s' if others > 1 else ''} beside it"
        return f"files in {self.path} ({mode}{codec})"

    def __len__(self) -> int:
        return len(self._catalog)

    def __contains__(self, key: object) -> bool:
        return key in self._catalog

    def keys(self) -> list[OffloadKey]:
        """The keys indexed now."""
        return self._catalog.keys()

    def __iter__(self) -> Iterator[OffloadKey]:
        """The keys indexed now (a snapshot: writes meanwhile do not disturb it)."""
        return iter(self.keys())

    def record(self, key: OffloadKey) -> IndexRecord | None:
        """The index record of `key`, or None."""
        return self._catalog.get(key)

    def checksum_of(self, key: OffloadKey, record: IndexRecord, stored: Stored) -> int:
        """The checksum `record` must hold for `key` whose stored bytes are `stored` (what
        every read verifies: bytes, key, namespace, slot, length, codec and sequence)."""
        return self._layout.checksum(key, record, stored)

    def slot_location(self, slot: int) -> tuple[Path, int]:
        """(slab file, byte offset) where `slot` is stored, for tools and tests."""
        file, offset = self._layout.locate(check_slot(slot, self.num_blocks, "slot"))
        return self.path / slab_file_name(file), offset

    def restore(self) -> list[RestoredBlock]:
        """The blocks indexed when the store was opened, oldest (lowest sequence) first,
        less those forgotten or overwritten since. Builds one object per block (and waits
        for the background load of their keys): a chain uses `restore_cold` instead."""
        return self._catalog.restored()

    def restore_cold(self) -> RestoredBlocks | None:
        """The blocks indexed when the store was opened, as a compact view for a tier's
        bookkeeping (`kvtier.manager.cold`): their slots oldest first, and look-ups of a
        key's slot and a slot's key. None when the open restored them as objects (a rebuilt
        index, an index with malformed records, an open to inspect): use `restore`."""
        if self._catalog.cold is None:
            return None
        return RestoredBlocks(self._catalog)

    @property
    def loaded(self) -> bool:
        """Whether the background load of the restored blocks' keys has finished."""
        return self._catalog.wait_loaded(0)

    async def wait_loaded(self) -> None:
        """Until the background load of the restored blocks' keys has finished."""
        if not self.loaded:
            await asyncio.to_thread(self._catalog.wait_loaded)

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        elif self._guard.reason is not None:
            state = f"disabled: {self._guard.reason}"
        else:
            state = f"{len(self)} blocks"
        return (
            f"DiskStore({str(self.path)!r}, block_size={self.block_size}, "
            f"num_blocks={self.num_blocks}, compression={self.compression!r}, "
            f"direct_io={self.direct_io_active}, {state})"
        )

    # -- the calls ----------------------------------------------------------------------------

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        """Store the blocks (see `BlockStorage.write`). The batch joins the write lane's next
        group (lane.py): its slots' old records are dropped, its bytes written (one pwritev
        per run of consecutive slots of the group), fsynced once per group and file, and its
        blocks indexed in the group's one transaction. A failed run, fsync or index commit
        fails exactly its blocks, which are then not indexed.

        The buffers must not change until the call returns. Cancelling the call while it
        waits in the queue withdraws it (nothing is written); once its group has started,
        the group completes in its thread and its blocks may still be indexed (intact).
        Once the store has disabled itself (`disabled_reason`), every block fails."""
        self._check_open()
        key_list, slot_list, buffer_list = check_batch(
            self._layout, keys, slots, buffers, writable=False
        )
        if not key_list:
            return []
        lost = self._guard.reason
        if lost is not None:
            return self._lane.refuse(len(key_list), lost)
        self._check_writable()
        future: asyncio.Future[list[OSError | None]] = asyncio.get_running_loop().create_future()
        self._lane.submit(WriteJob(key_list, slot_list, buffer_list, future))
        return await future

    async def forget(self, keys: Sequence[OffloadKey]) -> None:
        """Remove the records of `keys` (absent keys are ignored); they are removed in the
        write lane's next group, durably when `fsync` is on, and their slots may then be
        overwritten. Raises DiskTierError if that group's index commit fails (the keys are
        no longer served either way)."""
        self._check_open()
        key_list = check_keys(keys)
        if not key_list or self._guard.reason is not None:
            return  # a disabled store holds no block: nothing to forget
        self._check_writable()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lane.submit(ForgetJob(list(dict.fromkeys(key_list)), future))
        await future

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        """Read the blocks (see `BlockStorage.read`): one preadv per run of consecutive
        slots (whole slots for raw blocks, the frame for compressed ones), each block checked
        against its index record (this key in this slot) and its bound checksum, then
        decompressed if it was stored compressed. Once the store has disabled itself
        (`disabled_reason`), every block is an IO_ERROR (a miss)."""
        self._check_open()
        key_list, slot_list, buffer_list = check_batch(
            self._layout, keys, slots, buffers, writable=True
        )
        if not key_list:
            return []
        if self._guard.reason is not None:
            return self._reader.refuse(len(key_list))
        parts = read_parts(slot_list, self.block_size, self._max_workers)
        return await self._run(  # one call; its parts read by the read threads at once
            functools.partial(
                read_in_parts,
                self._read_pool,
                self._reader.read,
                key_list,
                slot_list,
                buffer_list,
                parts,
            )
        )

    def check(self, repair: bool = False) -> CheckReport:
        """Verify the store (fsck.py): every index record against its slot's header and
        bytes, every header against the index (a sound block with no record is a lost
        record), and the files of the store directory. With `repair`, drop the bad records,
        index the lost blocks again and remove stray slab files (durably).

        Blocking; meant for `kvtier check`, tools and tests; run it with no batch in flight
        (an overlapping write could be reported as a problem). See also `acheck`."""
        self._check_open()
        return self._checker.check(repair)


async def open_disk_tier(config: DiskTierConfig, context: TierContext) -> BlockStorage:
    """The disk kind's opener: a store opened off the event loop (it may scan its index and
    preallocate files); `context.options` are `DiskStore`'s own (`max_workers`, `io`, ...).
    A tenant narrows the namespace of the store's blocks (and so its directory), as it does
    for the shared tiers; without one the store is the model's. `layout = "log"` (the
    default) opens a `LogStore` (log_store.py), `"slots"` a `DiskStore`; a store of the other
    layout in the tier's directory is refused first (open_checks.py: one line saying what
    it holds and what to do), and a log store's directories are trusted first (open_checks.py;
    the per-block store's recovery checks its own)."""
    model_id = (
        combined_model_id(context.model_id, context.tenant) if context.tenant else context.model_id
    )
    await asyncio.to_thread(
        refuse_other_layout, config.path, config.layout, context.block_size, model_id
    )
    if config.layout == "log":
        from kvtier.tiers.disk.log_store import LogStore

        store = store_dir_of(config.path, "log", context.block_size, model_id)
        await asyncio.to_thread(trust_log_dirs, config.path, store, creates_parents(config))
        await asyncio.to_thread(refuse_older_log_store, config.path, context.block_size, model_id)

        return await asyncio.to_thread(
            LogStore.from_config, config, context.block_size, model_id, **context.options
        )
    return await asyncio.to_thread(
        DiskStore.from_config, config, context.block_size, model_id, **context.options
    )
