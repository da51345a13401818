"""`DiskStore`: the bytes of a disk tier, in preallocated slab files indexed by LMDB.

Layout under the configured directory::

    <directory>/kvtier-<fingerprint>/      0700, one per (block size, layout version, model id)
        lock                               0600, flock'ed while a store has it open
        slab-00000.bin ...                 0600, preallocated; slot s at a fixed offset
        index/                             0700, LMDB: key -> (slot, length, codec, xxh3, seq)
        inflight                           0600, the slots of the write group in progress

Writes go through one write lane, which merges every `write` and `forget` call queued while
it was busy into one group (in call order, up to WRITE_GROUP_BYTES; a call that touches a slot
or key the group already touches waits for the next group). A group:

1. drops from memory the records of the slots it is about to overwrite and of the keys it
   forgets, so nothing in this process is served from a slot being rewritten (and a read
   that overlaps the rewrite re-checks its record, see `_read_blocks`);
2. writes the bytes: one `pwritev` per run of consecutive slots across the whole group (a
   large group's runs are spread over helper threads, so the disk sees several at once);
3. makes them durable: one `fdatasync` per slab file the group touched;
4. commits ONE LMDB transaction that deletes the stale records (overwritten slots,
   forgotten keys) and puts the records of the blocks that made it (durable with `fsync`);
5. checks that the files it wrote are still the store's files (see "Failing closed");
6. resolves every call with its own per-block results.

Durability: between steps 1 and 4 the index on disk may still hold an old record for a slot
whose bytes are being overwritten. After a crash there, that record points at new or torn
bytes, and the xxh3 checksum every read verifies turns it into a miss (`ReadFailure`), never
data (a record whose bytes are unchanged is still right). Before step 2 the group also notes
its slots in the in-flight log (`inflight.py`: one pwrite, no fsync), and opening the store
checks the records of those slots and drops the stale ones, so that after a killed process
`restore()` lists only blocks that read back intact; after a power cut the log may miss them,
and the checksums alone keep them from being served. A new block counts as stored only
once its group's fdatasync and commit are done, so a process killed at any point loses no
block reported stored, and an indexed block is never one whose bytes were not completely
on disk. A failed run (ENOSPC, EIO on `pwritev`) fails only its blocks; a failed fdatasync
fails that file's blocks of the group; a failed commit fails every block of the group (none
is indexed, in memory or on disk; the stale records are then dropped in a second
transaction where the index allows it). Without `fsync`, the same steps run with no
fdatasync and non-durable commits: a process crash still loses nothing, a power cut may.

Failing closed: a store's files can be taken from under it while it is open (the directory
`rm -rf`ed, a file unlinked, the lock file removed or replaced, so that another process may
open the same directory). Writes through the descriptors it holds still succeed, into files
nobody will ever read. So after every group's commit the store checks, with a few `stat`
calls (the lock file's path against the descriptor it holds, the index file's identity,
`st_nlink` of the slab and header files the group wrote), that they are still its files. If
not, none of the group's blocks is reported stored, and the store disables itself for good
(`disabled_reason`, one log line): every later write fails, every read is a miss, it claims
no block, and it gives its files (and so their disk space) back. Reopening the path starts
from what is really there.

Reads never wait behind writes: they run in their own thread pool, and the write lane is one
thread (with helpers) that always makes progress. Each read verifies its blocks' checksums,
so a torn or rotten block is a miss, never data.

Consecutive slots move in one `pwritev` / `preadv` each. A raw block fills its slot; a zstd
frame fills only the start of its slot and is read back only that far (rounded up to 4 KiB
under O_DIRECT), so compression saves disk bandwidth both ways, though not disk space.

All file and index work runs in threads, never on the event loop; compression (zstd
releases the GIL) runs there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import logging
import mmap
import operator
import os
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import lmdb
import numpy as np

from kvtier.errors import (
    DirectIOError,
    DiskLayoutError,
    DiskLockedError,
    DiskTierError,
    InvalidValueError,
    KvtierError,
    StorageClosedError,
)
from kvtier.keys import MAX_KEY_BYTES, OffloadKey, check_key
from kvtier.tiers.disk.codec import BlockCodec, Codec, CodecError, Compression, Stored
from kvtier.tiers.disk.header import (
    EMPTY_ENTRY,
    ENTRY_BYTES,
    ENTRY_DTYPE,
    HEADERS_FILE,
    BlockHeader,
    bound_checksum,
    entry_offset,
    group_entries,
    headers_file_bytes,
    namespace_bytes,
    pack_file_header,
    unpack_entry,
    unpack_file_header,
)
from kvtier.tiers.disk.index import LAYOUT_VERSION, BlockIndex, IndexRecord, layout_fingerprint
from kvtier.tiers.disk.index_check import (
    DATA_FILE,
    lmdb_file_problem,
    move_aside,
    probe_index,
    take_clean_stamp,
    write_clean_stamp,
)
from kvtier.tiers.disk.inflight import InflightLog
from kvtier.tiers.disk.io import FileIO, IOBuffer
from kvtier.tiers.disk.safety import (
    FileId,
    OpenFootprint,
    allocated_bytes,
    check_free_space,
    check_parent_dir,
    check_store_dir,
    create_or_open,
    file_id,
    file_moved,
    make_dirs,
    open_file,
    path_moved,
    preallocate,
    refuse_symlink,
)
from kvtier.tiers.disk.slab import ALIGNMENT, Run, SlabLayout, round_up, slab_file_name
from kvtier.tiers.storage import BlockStorage, HostBuffer, ReadFailure, RestoredBlock

if TYPE_CHECKING:
    from kvtier.config import DiskTierConfig

__all__ = [
    "DEFAULT_SLAB_FILE_BYTES",
    "CheckProblem",
    "CheckReport",
    "DirectIO",
    "DiskStore",
    "DiskStoreStats",
]

DirectIO = bool | Literal["auto"]
"""O_DIRECT setting: required (True), never (False), or where the filesystem supports it."""

DEFAULT_SLAB_FILE_BYTES = 1 << 30
"""Largest slab file a new store creates (rounded down to whole slots, at least one slot)."""

_INDEX_DIR = "index"
_LOCK_FILE = "lock"
_INFLIGHT_FILE = "inflight"
_REBUILDING = "rebuilding"
"""A file in the index directory while it is being rebuilt from the slot headers."""
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_log = logging.getLogger("kvtier.disk")
_Entries = np.ndarray[Any, np.dtype[np.void]]
"""A write group's header entries (`header.ENTRY_DTYPE` records)."""
_DAMAGE_ERRORS = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.PanicError,
    lmdb.InvalidError,
    lmdb.BadTxnError,
)
"""LMDB errors that mean the index file is damaged (not full, not busy)."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class CheckProblem:
    """One thing `DiskStore.check` found wrong: the record of `key` (in `slot`, None when the
    record itself is unreadable) and what is wrong with it."""

    key: OffloadKey
    slot: int | None
    what: str

    def __str__(self) -> str:
        where = "?" if self.slot is None else str(self.slot)
        return f"key {self.key.hex()} slot {where}: {self.what}"


@dataclass(frozen=True, slots=True)
class CheckReport:
    """The result of `DiskStore.check`: how many records were examined, every problem found,
    and how many bad records were dropped (0 unless `repair=True`)."""

    records: int
    problems: tuple[CheckProblem, ...]
    repaired: int = 0
    reindexed: int = 0
    """Blocks whose lost index record was written again from their header (`repair=True`)."""
    notes: tuple[str, ...] = ()
    """What is worth knowing but not wrong with a block (stray files, a removed one)."""

    @property
    def ok(self) -> bool:
        """Whether every record is sound."""
        return not self.problems

    def __str__(self) -> str:
        head = f"{self.records} records, {len(self.problems)} problems"
        if self.repaired:
            head += f", {self.repaired} records dropped"
        if self.reindexed:
            head += f", {self.reindexed} lost records restored"
        lines = [head, *(f"  {problem}" for problem in self.problems)]
        return "\n".join(lines + [f"  note: {note}" for note in self.notes])


@dataclass(slots=True)
class DiskStoreStats:
    """Counters of one open store (a snapshot when read through `DiskStore.stats`)."""

    blocks_written: int = 0
    """Blocks stored and indexed."""
    raw_bytes_written: int = 0
    """Bytes of those blocks before compression."""
    bytes_written: int = 0
    """Bytes written to slab files for them (after compression; padding not counted)."""
    write_failures: int = 0
    """Blocks whose write failed (reported as an OSError)."""
    blocks_read: int = 0
    """Blocks read back intact."""
    bytes_read: int = 0
    """Bytes read from slab files (whole slots)."""
    read_failures: Counter[ReadFailure] = field(default_factory=Counter)
    """Failed block reads, by reason."""
    dropped_at_open: int = 0
    """Index records dropped when the store was opened: slots beyond `num_blocks`, beyond the
    end of a (truncated) slab file, or a slot claimed by a newer record."""
    write_groups: int = 0
    """Groups run by the write lane (each merges one or more `write` / `forget` calls)."""
    write_batches: int = 0
    """`write` calls run in those groups (calls cancelled while queued are not counted)."""
    forget_batches: int = 0
    """`forget` calls run in those groups."""
    fsyncs: int = 0
    """Slab file fdatasyncs made by the groups (at most one per file and group)."""
    index_commits: int = 0
    """Index (LMDB) write transactions committed by the groups (at most one per group, plus
    one more after a failed commit)."""
    index_rebuilds: int = 0
    """Times a damaged index was found while the store was open and replaced by one written
    from memory (a rebuild from the headers at open is `DiskStore.rebuilt_index`)."""

    def copy(self) -> DiskStoreStats:
        """An independent copy."""
        return replace(self, read_failures=Counter(self.read_failures))


READ_SPLIT_BYTES = 8 << 20
"""A read of at least twice this many bytes is split over the worker threads (see
`DiskStore._read_parts`)."""

READS_FIRST_WAIT_S = 0.01
"""Longest a write group waits, before it starts, for the reads in flight to finish: on one
device a write in flight slows a read down, so reads go first; writes are never starved."""

WRITE_GROUP_BYTES = 32 << 20
"""Most block bytes one write group takes from the queue (a single larger call is a group of
its own): bounds the latency of one group, so that a call queued behind it waits little."""

WRITE_SPLIT_BYTES = 4 << 20
"""A write group of at least twice this many bytes spreads its runs over helper threads."""

_HASH_ASIDE_BYTES = 1 << 20
"""A write group of at least this many bytes takes its checksums in a helper thread while
the disk is busy (xxh3 holds the GIL, pwritev does not); a smaller one after its writes."""

_STAGING_CACHE_BYTES = 64 << 20
"""Largest staging buffer a worker thread keeps for its next batch."""
_staging_cache = threading.local()


def _staging(nbytes: int) -> HostBuffer:
    """A page-aligned buffer of `nbytes` bytes (anonymous mmap memory), suitable for O_DIRECT.

    Each thread reuses one buffer (up to 64 MiB) from call to call, so that staging does not
    pay an mmap and a page fault per page every time; a read part or a written run uses its
    thread's staging memory only until it returns. The contents are left over from earlier
    use."""
    if nbytes > _STAGING_CACHE_BYTES:
        return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)
    cached: HostBuffer | None = getattr(_staging_cache, "buffer", None)
    if cached is None or cached.nbytes < nbytes:
        size = min(max(round_up(nbytes, 1 << 20), 1 << 20), _STAGING_CACHE_BYTES)
        cached = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)
        _staging_cache.buffer = cached
    return cached[:nbytes]


def _is_aligned(buffer: HostBuffer) -> bool:
    return int(buffer.ctypes.data) % ALIGNMENT == 0


def _index_failure(error: Exception) -> OSError:
    """A per-block write failure for an index (LMDB) error."""
    return OSError(errno.EIO, f"disk tier index: {error}")


def _fsync_directory(path: Path) -> None:
    """fsync a directory (its entries); a filesystem that refuses is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC | _O_NOFOLLOW)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(eq=False, slots=True)
class _WriteJob:
    """One `write` call (validated); its future (None for `_write_blocks`) gets one result
    per block."""

    keys: list[OffloadKey]
    slots: list[int]
    buffers: list[HostBuffer]
    future: asyncio.Future[list[OSError | None]] | None


@dataclass(eq=False, slots=True)
class _ForgetJob:
    """One `forget` call (validated, keys distinct)."""

    keys: list[OffloadKey]
    future: asyncio.Future[None]


_Job = _WriteJob | _ForgetJob
_Settlement = tuple["asyncio.Future[Any]", Any, BaseException | None]


def _settle(settlements: list[_Settlement]) -> None:
    """Resolve the futures of a group (on their event loop); a caller that was cancelled
    meanwhile has a done future, which is left alone."""
    for future, result, error in settlements:
        if future.done():
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


_UINT8 = np.dtype(np.uint8)


def _split_runs(runs: list[Run], lengths: list[int], ways: int) -> list[list[Run]]:
    """`runs` (in slot order) cut into at most `ways` consecutive parts of about equal bytes."""
    if ways <= 1 or len(runs) <= 1:
        return [runs]
    sizes = [sum(lengths[member] for member in run.members) for run in runs]
    share = sum(sizes) / min(ways, len(runs))
    parts: list[list[Run]] = [[]]
    done = 0
    for run, size in zip(runs, sizes, strict=True):
        if parts[-1] and done >= share * len(parts):
            parts.append([])
        parts[-1].append(run)
        done += size
    return parts


class DiskStore(BlockStorage):
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
        for name, value in (
            ("block_size", block_size),
            ("num_blocks", num_blocks),
            ("max_workers", max_workers),
            ("slab_file_bytes", slab_file_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(model_id, str):
            raise InvalidValueError(f"model_id must be a str, got {model_id!r}")
        if not (isinstance(direct_io, bool) or direct_io == "auto"):
            raise InvalidValueError(f'direct_io must be true, false or "auto", got {direct_io!r}')
        if not isinstance(fsync, bool):
            raise InvalidValueError(f"fsync must be a bool, got {fsync!r}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.model_id = model_id
        self.fsync = fsync
        self._max_workers = max_workers
        self.fingerprint = layout_fingerprint(block_size, model_id)
        self._namespace = namespace_bytes(self.fingerprint)
        self.directory = Path(directory)
        self.path = self.directory / f"kvtier-{self.fingerprint}"
        """The store's own directory."""
        # Checked after every write group (see `_ground_problem`): made once, as strings.
        self._lock_path = str(self.path / _LOCK_FILE)
        self._index_data_path = str(self.path / _INDEX_DIR / DATA_FILE)
        self._codec = BlockCodec(compression, zstd_level)
        self._io = io if io is not None else FileIO()
        self._direct_io = False
        self._fds: list[int] = []
        self._lock_fd: int | None = None
        self._index: BlockIndex | None = None
        self._index_file: FileId | None = None
        """The identity of the index's data file, to tell when it was removed or replaced."""
        self._inflight: InflightLog | None = None
        self._headers_fd: int | None = None
        self._lost: str | None = None
        """Why the store disabled itself while open (see `disabled_reason`), or None."""
        self._index_sound = False
        """Whether the index may be stamped as cleanly closed (set once it is known good)."""
        self.inspect = inspect
        self._create_parents = create_parents
        self._footprint: OpenFootprint | None = None
        self._open_problems: list[CheckProblem] = []
        """To inspect: what a normal open would have dropped, for `check` to report."""
        self.rebuilt_index: str | None = None
        """Why the index was rebuilt from the slab headers when the store opened (missing,
        damaged, ...), or None when it was opened as it was."""
        self._reader: ThreadPoolExecutor | None = None
        self._lane: ThreadPoolExecutor | None = None
        self._helpers: ThreadPoolExecutor | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        # The write lane's queue; _draining says whether a drain task is queued or running.
        # _closed is set under _queue_lock too, so nothing is queued after close() drains.
        self._queue: deque[_Job] = deque()
        self._queue_lock = threading.Lock()
        self._reads_in_flight = 0
        self._reads_done = threading.Condition()
        self._draining = False
        # Writers of the index (a write group from its first step to its commit, `check`,
        # test backdoors) take _index_lock, in order; the in-memory maps themselves are
        # guarded by _map_lock, which readers hold only for lookups.
        self._index_lock = threading.Lock()
        self._map_lock = threading.Lock()
        self._records: dict[OffloadKey, IndexRecord] = {}
        self._slot_keys: dict[int, OffloadKey] = {}
        self._restored: list[tuple[OffloadKey, IndexRecord]] = []
        self._next_seq = 1
        self._stats = DiskStoreStats()
        self._layout = SlabLayout(num_blocks, block_size, 1)
        try:
            self._open(direct_io, slab_file_bytes)
        except BaseException as error:
            self._release()
            self._roll_back_open()
            if isinstance(error, Exception) and not isinstance(error, KvtierError):
                # Whatever went wrong (a file, the index, bytes that do not parse): one line.
                raise DiskTierError(f"cannot open the disk tier at {self.path}: {error}") from error
            raise
        # Reads and writes never share a thread: a read never waits behind a queued write.
        self._reader = ThreadPoolExecutor(max_workers, thread_name_prefix="kvtier-disk-read")
        # The write lane is one thread; its helpers only ever run parts of the lane's current
        # group (never anything that waits on the lane), so the lane always makes progress.
        self._lane = ThreadPoolExecutor(1, thread_name_prefix="kvtier-disk-write")
        self._helpers = ThreadPoolExecutor(max_workers, thread_name_prefix="kvtier-disk-write-io")

    @classmethod
    def from_config(
        cls, tier: DiskTierConfig, block_size: int, model_id: str = "", **kwargs: Any
    ) -> DiskStore:
        """A store for a validated disk tier config (`kwargs`: `max_workers`, `io`, ...).
        Only the default path (the per-user cache directory) gets its missing ancestors
        created; a configured path must have an existing parent."""
        from kvtier.config import default_cache_dir

        kwargs.setdefault("create_parents", tier.path == default_cache_dir())
        return cls(
            tier.path,
            block_size=block_size,
            num_blocks=tier.num_blocks,
            model_id=model_id,
            compression=tier.compression,
            zstd_level=tier.zstd_level,
            direct_io=tier.direct_io,
            fsync=tier.fsync,
            **kwargs,
        )

    @classmethod
    async def open_async(cls, directory: str | os.PathLike[str], **kwargs: Any) -> DiskStore:
        """The constructor, run in a thread so the event loop does not wait on the disk."""
        return await asyncio.to_thread(functools.partial(cls, directory, **kwargs))

    # ----------------------------------------------------------------------------------------
    # Opening and closing
    # ----------------------------------------------------------------------------------------

    def _open(self, direct_io: DirectIO, slab_file_bytes: int) -> None:
        if self.inspect:
            self._open_to_inspect()
            return
        created = make_dirs(self.directory, create_parents=self._create_parents)
        check_parent_dir(self.directory)
        created += make_dirs(self.path, create_parents=False)
        check_store_dir(self.path)
        self._footprint = OpenFootprint(self.path, created)
        self._take_lock()
        self._check_space()
        index_path = self.path / _INDEX_DIR
        recorded = self._open_headers()
        damage = self._index_damage(index_path, recorded is not None)
        if damage is not None and index_path.exists():
            aside = move_aside(index_path)
            _log.warning("disk tier %s: index moved aside to %s: %s", self.path, aside, damage)
        make_dirs(index_path, create_parents=False)
        check_store_dir(index_path)
        self._index = self._new_index(index_path)
        self._index_file = file_id(index_path / DATA_FILE)
        if damage is not None and recorded is not None:
            # The slab headers say how the store was laid out; the index is rebuilt to match.
            self._open_index.write_layout(recorded, self.num_blocks)
        slots_per_file = self._check_layout(max(1, slab_file_bytes // self.block_size))
        self._layout = SlabLayout(self.num_blocks, self.block_size, slots_per_file)
        if recorded is None:
            self._write_file_header(self._layout_meta(slots_per_file))
        self._inflight = InflightLog(self.path / _INFLIGHT_FILE, _FILE_MODE)
        sizes = self._open_slab_files()
        if damage is not None:
            self.rebuilt_index = damage
            # Until the rebuild is committed, the new index is marked: a process killed
            # meanwhile leaves an index that the next open rebuilds again, not one that
            # silently lacks records.
            marker = index_path / _REBUILDING
            os.close(create_or_open(marker))
            records = self._rebuild_from_headers(sizes)
            marker.unlink()
        else:
            records = self._load_records()
        self._settle_records(records, sizes)
        self._index_sound = True
        self._direct_io = self._setup_direct_io(direct_io)
        if self.fsync:
            # New files and directories survive a power cut only once their directory entries
            # are on disk too.
            for directory in (self.directory, self.path, index_path):
                _fsync_directory(directory)

    def _replace_index(self, pending: list[tuple[OffloadKey, IndexRecord]], why: str) -> None:
        """Move the damaged index aside and write a new one holding every record in memory
        plus `pending` (the caller holds _index_lock). Raises lmdb.Error / OSError when
        that fails too (the index is then left closed: no further commit can succeed)."""
        old = self._open_index
        index_path = old.path
        self._index = None
        with contextlib.suppress(lmdb.Error):
            old.close()
        aside = move_aside(index_path)
        _log.error("disk tier %s: %s; moved it aside to %s, rebuilding", self.path, why, aside)
        make_dirs(index_path, create_parents=False)
        fresh = self._new_index(index_path)
        try:
            fresh.write_layout(self._layout_meta(self._layout.slots_per_file), self.num_blocks)
            with self._map_lock:
                records = [(key, record.pack()) for key, record in self._records.items()]
            records += [(key, record.pack()) for key, record in pending]
            for start in range(0, len(records), 65536):
                fresh.update((), records[start : start + 65536])
        except BaseException:
            fresh.close()
            raise
        self._index = fresh
        try:
            self._index_file = file_id(index_path / DATA_FILE)
        except OSError:
            self._index_file = None  # not examined from now on; the other files still are
        with self._map_lock:
            self._stats.index_rebuilds += 1

    def _open_to_inspect(self) -> None:
        """`_open` for `inspect`: open what exists, change nothing."""
        if not self.path.is_dir():
            raise DiskTierError(f"no disk store at {self.path}")
        self._take_lock(create=False)
        index_path = self.path / _INDEX_DIR
        recorded = self._open_headers(create=False)
        if not (index_path / DATA_FILE).exists():
            raise DiskTierError(
                f"{self.path}: the index is missing; `kvtier check --repair` rebuilds it from "
                "the slab headers"
            )
        damage = self._index_damage(index_path, recorded is not None)
        if damage is not None:
            raise DiskTierError(
                f"{self.path}: {damage}; `kvtier check --repair` moves it aside and rebuilds it "
                "from the slab headers"
            )
        self._index = BlockIndex(index_path, map_size=1 << 20, durable=False)
        slots_per_file = self._check_layout(max(1, DEFAULT_SLAB_FILE_BYTES // self.block_size))
        self._layout = SlabLayout(self.num_blocks, self.block_size, slots_per_file)
        sizes = self._open_slab_files()
        self._settle_records(self._load_records(), sizes)
        self._index_sound = True

    def _index_reserve(self) -> int:
        """Bytes reserved for the index file (about 512 per slot, at least 1 MiB)."""
        return max(1 << 20, round_up(self.num_blocks * 512, 1 << 20))

    def _check_space(self) -> None:
        """DiskTierError, before anything is allocated, when the file system cannot hold what
        this open still has to allocate (slab files, header file, index reserve)."""
        wanted = (
            self.num_blocks * self.block_size
            + headers_file_bytes(self.num_blocks)
            + self._index_reserve()
        )
        held = sum(allocated_bytes(path) for path in self.path.glob("slab-*.bin"))
        held += allocated_bytes(self.path / HEADERS_FILE)
        held += allocated_bytes(self.path / _INDEX_DIR / DATA_FILE)
        check_free_space(self.path, wanted - held, f"the disk tier at {self.path}")

    def _new_index(self, index_path: Path) -> BlockIndex:
        """Open (or create) the LMDB index, its file mode tightened and its space reserved:
        the map is preallocated, so a full disk fails here, not at a later commit."""
        reserve = self._index_reserve()
        new_files = []
        for name in (DATA_FILE, "lock.mdb"):
            refuse_symlink(index_path / name)  # LMDB opens them itself, following links
            if not (index_path / name).exists():
                new_files.append(index_path / name)
        index = BlockIndex(index_path, map_size=reserve, durable=self.fsync)
        try:
            for path in new_files:  # only what this open created: a umask may narrow it
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(path, _FILE_MODE)
            fd = open_file(index_path / DATA_FILE, os.O_RDWR)
            try:
                if os.fstat(fd).st_size < reserve:
                    preallocate(fd, reserve, index_path / DATA_FILE)
            finally:
                os.close(fd)
        except BaseException:
            index.close()
            raise
        return index

    def _index_damage(self, index_path: Path, has_headers: bool) -> str | None:
        """Why the index cannot be opened as it is (it is then rebuilt from the headers), or
        None when it is sound, or absent in a new store. See `index_check.py`."""
        data = index_path / DATA_FILE
        for path in (index_path, data, index_path / "lock.mdb"):
            refuse_symlink(path)  # never read, moved or mapped through a planted link
        if not data.exists():
            return "the index is missing" if has_headers else None
        if (index_path / _REBUILDING).exists():
            return "a rebuild of the index was interrupted"
        problem = lmdb_file_problem(data)
        if problem is not None:
            return f"damaged index file: {problem}"
        if take_clean_stamp(index_path, keep=self.inspect):
            return None
        problem = probe_index(index_path, IndexRecord.FORMAT.size, MAX_KEY_BYTES)
        return None if problem is None else f"damaged index: {problem}"

    def _open_headers(self, create: bool = True) -> dict[str, Any] | None:
        """Open (or create) `headers.bin`; the layout its first page records, or None for a
        new (or unreadable, or with `create` false missing) header file."""
        # Plain system calls, not `self._io`: the header file is small metadata beside the
        # slab files, whose calls tests count and fault.
        path = self.path / HEADERS_FILE
        if create:
            fd = create_or_open(path)
        else:
            try:
                fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
            except FileNotFoundError:
                return None
        self._headers_fd = fd
        first = os.pread(fd, 4096, 0)
        recorded = unpack_file_header(first)
        if recorded is not None and recorded != self._layout_meta(
            recorded.get("slots_per_file", 0)
        ):
            raise DiskLayoutError(
                f"{self.path}: its header file records layout {recorded}, expected fingerprint "
                f"{self.fingerprint}; refusing to serve its blocks"
            )
        return recorded

    def _write_file_header(self, layout: dict[str, Any]) -> None:
        fd = self._headers_fd
        if fd is not None:
            os.pwrite(fd, pack_file_header(layout), 0)

    def _roll_back_open(self) -> None:
        """After a failed open: remove what it created, shrink what it grew."""
        if self._footprint is not None:
            self._footprint.rollback()
            self._footprint = None

    def _take_lock(self, create: bool = True) -> None:
        """Hold the store's lock file (flock), so no two stores open the same directory. With
        `create` false, a store without a lock file is opened unlocked (nothing holds it)."""
        if create:
            fd = create_or_open(self.path / _LOCK_FILE)
        else:
            try:
                fd = os.open(self.path / _LOCK_FILE, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
            except FileNotFoundError:
                return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DiskLockedError(
                f"the disk tier at {self.path} is already open in another store"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def _layout_meta(self, slots_per_file: int) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "layout_version": LAYOUT_VERSION,
            "block_size": self.block_size,
            "model_id": self.model_id,
            "slots_per_file": slots_per_file,
        }

    def _check_layout(self, slots_per_file: int) -> int:
        """The slots per slab file of this store: recorded at creation, checked on reopen."""
        index = self._open_index
        try:
            recorded = index.read_layout()
        except ValueError as error:
            raise DiskLayoutError(f"{self.path}: unreadable layout in the index: {error}") from None
        if recorded is None:
            if self.inspect:
                raise DiskLayoutError(f"{self.path}: the index records no layout")
            index.write_layout(self._layout_meta(slots_per_file), self.num_blocks)
            return slots_per_file
        expected = self._layout_meta(recorded.get("slots_per_file", 0))
        if recorded.get("fingerprint") != self.fingerprint or recorded != expected:
            raise DiskLayoutError(
                f"{self.path}: the index records layout {recorded}, expected fingerprint "
                f"{self.fingerprint} (layout version {LAYOUT_VERSION}, block_size "
                f"{self.block_size}, model_id {self.model_id!r}); refusing to serve its blocks"
            )
        recorded_slots = recorded["slots_per_file"]
        if isinstance(recorded_slots, bool) or not isinstance(recorded_slots, int):
            raise DiskLayoutError(f"{self.path}: bad slots_per_file {recorded_slots!r}")
        if recorded_slots < 1:
            raise DiskLayoutError(f"{self.path}: bad slots_per_file {recorded_slots!r}")
        if not self.inspect:
            index.write_layout(recorded, self.num_blocks)
        return recorded_slots

    def _load_records(self) -> dict[OffloadKey, IndexRecord]:
        """The index's readable records (unreadable ones are left for `check`)."""
        records = {}
        for key, value in self._open_index.items():
            with contextlib.suppress(ValueError):
                records[key] = IndexRecord.unpack(value)
        return records

    def _open_slab_files(self) -> list[int]:
        """Open (creating the missing) slab files; their sizes before this open. To inspect,
        a missing file is not created: its descriptor is -1 and its size 0."""
        sizes: list[int] = []
        for file in range(self._layout.num_files):
            path = str(self.path / slab_file_name(file))
            if self.inspect:
                try:
                    fd = self._io.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
                except FileNotFoundError:
                    self._fds.append(-1)
                    sizes.append(0)
                    continue
            else:
                flags = os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW
                fd = self._io.open(path, flags, _FILE_MODE)
            self._fds.append(fd)
            sizes.append(self._io.size(fd))
        return sizes

    def _rebuild_from_headers(self, sizes: list[int]) -> dict[OffloadKey, IndexRecord]:
        """Rebuild the (fresh, empty) index from the slab headers: the newest header of each
        key whose bytes verify becomes its record. A full scan of the stored blocks; logged
        with progress."""
        headers_fd = self._headers_fd
        layout = self._layout
        if headers_fd is None:
            return {}
        size = os.fstat(headers_fd).st_size
        slots = min(layout.num_blocks, max(0, size - entry_offset(0)) // ENTRY_BYTES)
        _log.warning("disk tier %s: rebuilding the index from %d slot headers", self.path, slots)
        candidates: dict[OffloadKey, list[tuple[int, BlockHeader]]] = {}
        chunk_slots = 4096
        for first in range(0, slots, chunk_slots):
            count = min(chunk_slots, slots - first)
            data = os.pread(headers_fd, count * ENTRY_BYTES, entry_offset(first))
            view = memoryview(data)
            for i in range(len(data) // ENTRY_BYTES):
                entry = view[i * ENTRY_BYTES : (i + 1) * ENTRY_BYTES]
                header = unpack_entry(entry, self._namespace, first + i)
                if header is not None:
                    candidates.setdefault(header.key, []).append((first + i, header))
        scratch = _staging(2 * self.block_size).reshape(2, self.block_size)
        records: dict[OffloadKey, IndexRecord] = {}
        report_every = max(1, len(candidates) // 10)
        for done, (key, found) in enumerate(candidates.items(), 1):
            for slot, header in sorted(found, key=lambda item: -item[1].seq):
                record = IndexRecord(slot, header.length, header.codec, header.checksum, header.seq)
                file, offset = layout.locate(slot)
                if sizes[file] < offset + max(record.length, 1):
                    continue
                if self._check_record(key, record, *scratch) is None:
                    records[key] = record
                    break
            if done % report_every == 0:
                _log.info("disk tier %s: verified %d of %d keys", self.path, done, len(candidates))
        index = self._open_index
        packed = [(key, record.pack()) for key, record in records.items()]
        for start in range(0, len(packed), 65536):
            index.update((), packed[start : start + 65536])
        _log.warning(
            "disk tier %s: index rebuilt: %d blocks recovered from %d headers",
            self.path,
            len(records),
            sum(len(found) for found in candidates.values()),
        )
        return records

    def _settle_records(self, records: dict[OffloadKey, IndexRecord], sizes: list[int]) -> None:
        """Size and preallocate the slab files and the header file; drop (durably, before any
        file shrinks) the records of slots that no longer exist or whose bytes were cut off,
        and those of the slots in the in-flight log whose bytes no longer match them (a write
        group was interrupted: see `inflight.py`)."""
        index = self._open_index
        inflight = self._inflight
        layout = self._layout
        suspects = set(inflight.read()) if inflight is not None else set()
        scratch = _staging(2 * self.block_size).reshape(2, self.block_size)
        dropped: list[OffloadKey] = []
        by_slot: dict[int, OffloadKey] = {}
        problems = self._open_problems
        for key, record in sorted(records.items(), key=lambda item: -item[1].seq):
            slot = record.slot
            file, offset = layout.locate(slot) if slot < layout.num_blocks else (-1, 0)
            why = None
            if file < 0:
                why = f"slot beyond the store's {layout.num_blocks} slots"
            elif self._fds and self._fds[file] < 0:
                why = f"its slab file {slab_file_name(file)} is missing"
            elif sizes[file] < offset + max(record.length, 1):
                why = f"its slab file ends at byte {sizes[file]}, before the block"
            elif slot in by_slot:
                why = f"slot also claimed by the newer record of {by_slot[slot].hex()}"
            elif slot in suspects:
                what = self._check_record(key, record, *scratch)
                if what is not None:
                    why = f"rewritten by a write group that did not finish: {what}"
            if why is None:
                by_slot[slot] = key
            else:
                dropped.append(key)
                problems.append(CheckProblem(key, slot, why))
        if self.inspect:
            self._stats.dropped_at_open = 0
            kept = {key: records[key] for key in by_slot.values()}
            self._records = kept
            self._slot_keys = {record.slot: key for key, record in kept.items()}
            return
        if dropped:
            index.delete(dropped)
        if suspects and inflight is not None:
            inflight.clear()
        self._stats.dropped_at_open = len(dropped)
        kept = {key: records[key] for key in by_slot.values()}
        self._records = kept
        self._slot_keys = {record.slot: key for key, record in kept.items()}
        self._restored = sorted(kept.items(), key=lambda item: item[1].seq)
        self._next_seq = max((record.seq for record in records.values()), default=0) + 1
        for file, fd in enumerate(self._fds):
            wanted = layout.file_bytes(file)
            if sizes[file] > wanted:
                self._io.truncate(fd, wanted)
            self._io.allocate(fd, wanted)
        if self._headers_fd is not None:
            wanted = headers_file_bytes(layout.num_blocks)
            if os.fstat(self._headers_fd).st_size > wanted:
                os.ftruncate(self._headers_fd, wanted)
            preallocate(self._headers_fd, wanted, self.path / HEADERS_FILE)
        for extra in self.path.glob("slab-*.bin"):
            number = extra.name.removeprefix("slab-").removesuffix(".bin")
            if number.isdigit() and int(number) >= layout.num_files:
                extra.unlink()

    def _setup_direct_io(self, mode: DirectIO) -> bool:
        """Whether to use O_DIRECT; when so, the slab files are reopened with it."""
        if mode is False:
            return False
        reason = None
        if not _O_DIRECT:
            reason = "this platform has no O_DIRECT"
        elif self.block_size % ALIGNMENT:
            reason = f"block_size {self.block_size} is not a multiple of {ALIGNMENT}"
        fds: list[int] = []
        if reason is None:
            try:
                for file in range(self._layout.num_files):
                    path = str(self.path / slab_file_name(file))
                    fds.append(self._io.open(path, os.O_RDWR | _O_DIRECT | _O_CLOEXEC))
                probe = _staging(ALIGNMENT)
                got = self._io.preadv(fds[0], [probe.data], 0)
                if got != ALIGNMENT:
                    reason = f"an aligned O_DIRECT read returned {got} bytes, not {ALIGNMENT}"
            except OSError as error:
                reason = f"O_DIRECT does not work in {self.path}: {error}"
        if reason is not None:
            for fd in fds:
                with contextlib.suppress(OSError):
                    self._io.close(fd)
            if mode is True:
                raise DirectIOError(f"direct_io = true, but {reason}")
            return False
        for fd in self._fds:
            with contextlib.suppress(OSError):
                self._io.close(fd)
        self._fds = fds
        return True

    def _release(self) -> None:
        """Close every file and the index (after the executor is gone, or on a failed open)."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                self._io.close(fd)
        self._fds = []
        if self._inflight is not None:
            with contextlib.suppress(OSError):
                if self._index_sound and not self.inspect:  # every group has ended
                    self._inflight.clear()
                self._inflight.close()
            self._inflight = None
        if self._headers_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._headers_fd)
            self._headers_fd = None
        if self._index is not None:
            index_path = self._index.path
            self._index.close()
            self._index = None
            if self._index_sound and not self.inspect:
                # Next open trusts the index without a probe while it matches this stamp.
                with contextlib.suppress(OSError):
                    write_clean_stamp(index_path)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def close(self) -> None:
        """Refuse new calls, finish every call already made (the write lane runs every group
        queued before the close; reads in flight end), then close the files and the index.
        Idempotent; blocking (use `aclose` from a coroutine)."""
        with self._close_lock:
            if self._closed:
                return
            with self._queue_lock:
                self._closed = True
            for executor in (self._lane, self._helpers, self._reader):
                if executor is not None:
                    executor.shutdown(wait=True)
            self._lane = self._helpers = self._reader = None
            self._release()

    async def aclose(self) -> None:
        """`close()` in a thread. Idempotent."""
        if not self._closed:
            await asyncio.to_thread(self.close)

    @property
    def closed(self) -> bool:
        """Whether the store was closed."""
        return self._closed

    # ----------------------------------------------------------------------------------------
    # Failing closed (module docstring)
    # ----------------------------------------------------------------------------------------

    @property
    def disabled_reason(self) -> str | None:
        """Why the store disabled itself while open (its files were removed or replaced
        under it), or None while it serves. Once set it stays: every write fails, every read
        is a miss and it holds no block until it is closed; open the path again to start
        from what is there."""
        return self._lost

    def _lost_error(self, why: str) -> OSError:
        """The per-block error of a write the store does not report stored because its
        files were lost (`why`)."""
        return OSError(errno.ESTALE, f"the disk tier at {self.path} is disabled: {why}")

    def _refuse_writes(self, count: int, why: str) -> list[OSError | None]:
        """`count` failed results for a write after the store disabled itself (counted)."""
        error = self._lost_error(why)
        with self._map_lock:
            self._stats.write_failures += count
        return [error] * count

    def _refuse_reads(self, count: int) -> list[ReadFailure | None]:
        """`count` failed reads (IO_ERROR: misses) after the store disabled itself."""
        with self._map_lock:
            self._stats.read_failures[ReadFailure.IO_ERROR] += count
        return [ReadFailure.IO_ERROR] * count

    def _ground_problem(self, files: Iterable[int]) -> str | None:
        """Why the files this store holds open are no longer its files on disk, or None
        while they are: the lock file removed or replaced (its path against the descriptor
        held), the index's data file removed or replaced, or one of the slab `files` (numbers)
        or the header file unlinked. One or two stat calls per file; a file that cannot be
        examined (EACCES, EIO) counts as lost too."""
        try:
            if self._lock_fd is not None:
                moved = file_moved(self._lock_path, self._lock_fd)
                if moved is not None:
                    return f"the lock file {self._lock_path} {moved}"
            if self._index_file is not None:
                moved = path_moved(self._index_data_path, self._index_file)
                if moved is not None:
                    return f"the index file {self._index_data_path} {moved}"
            for file in sorted(set(files)):
                if os.fstat(self._fds[file]).st_nlink == 0:
                    return f"the slab file {self.path / slab_file_name(file)} was removed"
            if self._headers_fd is not None and os.fstat(self._headers_fd).st_nlink == 0:
                return f"the header file {self.path / HEADERS_FILE} was removed"
        except OSError as error:
            return f"the files in {self.path} cannot be examined: {error}"
        return None

    def _lose(self, why: str) -> None:
        """Disable the store for good (called by a write group, holding _index_lock):
        no read starts any more and those in flight finish, the blocks are forgotten in
        memory (they are in files nobody will read), one line is logged, and the files are
        closed, so the space of removed files is given back now, not when the process ends."""
        with self._reads_done:
            if self._lost is not None:
                return
            self._lost = why
            self._reads_done.wait_for(lambda: self._reads_in_flight == 0)
        with self._map_lock:
            self._records.clear()
            self._slot_keys.clear()
            self._restored = []
        _log.error(
            "disk tier at %s disabled while open: %s; its writes fail and its reads are misses "
            "from now on (blocks it stored may be gone: open the path again to start from what "
            "is there)",
            self.path,
            why,
        )
        self._index_sound = False  # not stamped clean: the next open checks what it finds
        self._release()

    # ----------------------------------------------------------------------------------------
    # Introspection
    # ----------------------------------------------------------------------------------------

    @property
    def persistent(self) -> bool:
        return True

    @property
    def direct_io_active(self) -> bool:
        """Whether the slab files are read and written with O_DIRECT."""
        return self._direct_io

    @property
    def compression(self) -> Compression:
        """The codec new blocks are written with ("none" or "zstd")."""
        return self._codec.compression

    @property
    def stats(self) -> DiskStoreStats:
        """A snapshot of the store's counters."""
        with self._map_lock:
            return self._stats.copy()

    def __len__(self) -> int:
        with self._map_lock:
            return len(self._records)

    def __contains__(self, key: object) -> bool:
        with self._map_lock:
            return key in self._records

    def keys(self) -> list[OffloadKey]:
        """The keys indexed now."""
        with self._map_lock:
            return list(self._records)

    def __iter__(self) -> Iterator[OffloadKey]:
        """The keys indexed now (a snapshot: writes meanwhile do not disturb it)."""
        return iter(self.keys())

    def record(self, key: OffloadKey) -> IndexRecord | None:
        """The index record of `key`, or None."""
        with self._map_lock:
            return self._records.get(key)

    def checksum_of(self, key: OffloadKey, record: IndexRecord, stored: Stored) -> int:
        """The checksum `record` must hold for `key` whose stored bytes are `stored` (what
        every read verifies: bytes, key, namespace, slot, length, codec and sequence)."""
        return bound_checksum(
            self._namespace, key, record.slot, record.length, record.codec, record.seq, stored
        )

    def slot_location(self, slot: int) -> tuple[Path, int]:
        """(slab file, byte offset) where `slot` is stored, for tools and tests."""
        self._check_slot(slot, "slot")
        file, offset = self._layout.locate(slot)
        return self.path / slab_file_name(file), offset

    def restore(self) -> list[RestoredBlock]:
        """The blocks indexed when the store was opened, oldest (lowest sequence) first,
        less those forgotten or overwritten since."""
        with self._map_lock:
            return [
                RestoredBlock(key, record.slot)
                for key, record in self._restored
                if self._records.get(key) == record
            ]

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        elif self._lost is not None:
            state = f"disabled: {self._lost}"
        else:
            state = f"{len(self)} blocks"
        return (
            f"DiskStore({str(self.path)!r}, block_size={self.block_size}, "
            f"num_blocks={self.num_blocks}, compression={self.compression!r}, "
            f"direct_io={self._direct_io}, {state})"
        )

    # ----------------------------------------------------------------------------------------
    # Validation
    # ----------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError(f"the disk tier at {self.path} is closed")

    @property
    def _open_index(self) -> BlockIndex:
        """The index; StorageClosedError once the store is closed."""
        index = self._index
        if index is None:
            raise StorageClosedError(f"the disk tier at {self.path} is closed")
        return index

    def _check_slot(self, slot: object, what: str) -> int:
        if isinstance(slot, bool):
            raise InvalidValueError(f"{what} must be an int, got {slot!r}")
        try:
            value = operator.index(slot)  # type: ignore[arg-type]
        except TypeError:
            raise InvalidValueError(f"{what} must be an int, got {slot!r}") from None
        if not 0 <= value < self.num_blocks:
            raise InvalidValueError(f"{what} must be in [0, {self.num_blocks}), got {value}")
        return value

    def _check_key(self, key: object, what: str) -> OffloadKey:
        return check_key(key, what)

    def _check_batch(
        self,
        keys: Sequence[OffloadKey],
        slots: Sequence[int],
        buffers: Sequence[HostBuffer],
        *,
        writable: bool,
    ) -> tuple[list[OffloadKey], list[int], list[HostBuffer]]:
        """The batch as lists, or an InvalidValueError / KeyFormatError naming what is wrong."""
        self._check_open()
        if not len(keys) == len(slots) == len(buffers):
            raise InvalidValueError(
                f"keys, slots and buffers must have the same length, got {len(keys)}, "
                f"{len(slots)} and {len(buffers)}"
            )
        key_list, slot_list, buffer_list = list(keys), list(slots), list(buffers)
        if not self._plain_batch(key_list, slot_list, buffer_list, writable):
            key_list, slot_list = self._checked_batch(key_list, slot_list, buffer_list, writable)
        if len(set(slot_list)) != len(slot_list):
            twice = sorted(slot for slot in set(slot_list) if slot_list.count(slot) > 1)
            raise InvalidValueError(f"slots must be distinct within a batch, got {twice} twice")
        if len(set(key_list)) != len(key_list):
            raise InvalidValueError("keys must be distinct within a batch")
        return key_list, slot_list, buffer_list

    def _plain_batch(
        self, keys: list[Any], slots: list[Any], buffers: list[Any], writable: bool
    ) -> bool:
        """Whether every key, slot and buffer is of the plain valid kind (bytes, int, a
        contiguous block-sized uint8 array): the quick check of every call, a few type and
        attribute comparisons per block. False sends the batch to `_checked_batch`, which
        converts what it can and names what is wrong."""
        for key in keys:
            if type(key) is not bytes or not 0 < len(key) <= 511:
                return False
        num_blocks = self.num_blocks
        for slot in slots:
            if type(slot) is not int or not 0 <= slot < num_blocks:
                return False
        shape = (self.block_size,)
        for buffer in buffers:
            if (
                type(buffer) is not np.ndarray
                or buffer.dtype is not _UINT8
                or buffer.shape != shape
                or buffer.strides != (1,)
                or (writable and not buffer.flags.writeable)
            ):
                return False
        return True

    def _checked_batch(
        self, keys: list[Any], slots: list[Any], buffers: list[Any], writable: bool
    ) -> tuple[list[OffloadKey], list[int]]:
        """Every key, slot and buffer checked one by one (keys and slots converted), or the
        error that names the first bad one."""
        key_list = [self._check_key(key, f"keys[{i}]") for i, key in enumerate(keys)]
        slot_list = [self._check_slot(slot, f"slots[{i}]") for i, slot in enumerate(slots)]
        for i, buffer in enumerate(buffers):
            if not isinstance(buffer, np.ndarray):
                raise InvalidValueError(
                    f"buffers[{i}] must be a numpy uint8 array, got {type(buffer).__name__}"
                )
            if (
                buffer.dtype != np.uint8
                or buffer.ndim != 1
                or buffer.shape[0] != self.block_size
                or not buffer.flags.c_contiguous
            ):
                raise InvalidValueError(
                    f"buffers[{i}] must be a contiguous 1-D uint8 array of block_size "
                    f"{self.block_size} bytes, got dtype {buffer.dtype} shape {buffer.shape}"
                    f"{'' if buffer.flags.c_contiguous else ' (not contiguous)'}"
                )
            if writable and not buffer.flags.writeable:
                raise InvalidValueError(f"buffers[{i}] is read-only; a read must fill it")
        return key_list, slot_list

    async def _run(self, call: Callable[[], _T]) -> _T:
        """`call` in the read pool (reads and `acheck`; never the write lane)."""
        executor = self._reader
        if self._closed or executor is None:
            raise StorageClosedError(f"the disk tier at {self.path} is closed")
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, call)
        except RuntimeError:  # the executor was shut down between the check and the submit
            raise StorageClosedError(f"the disk tier at {self.path} is closed") from None
        return await future

    # ----------------------------------------------------------------------------------------
    # Writing: the write lane
    # ----------------------------------------------------------------------------------------

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        """Store the blocks (see `BlockStorage.write`). The batch joins the write lane's next
        group (see the module docstring): its slots' old records are dropped, its bytes
        written (one pwritev per run of consecutive slots of the group), fsynced once per
        group and file, and its blocks indexed in the group's one transaction. A failed run,
        fsync or index commit fails exactly its blocks, which are then not indexed.

        The buffers must not change until the call returns. Cancelling the call while it
        waits in the queue withdraws it (nothing is written); once its group has started,
        the group completes in its thread and its blocks may still be indexed (intact).
        Once the store has disabled itself (`disabled_reason`), every block fails."""
        key_list, slot_list, buffer_list = self._check_batch(keys, slots, buffers, writable=False)
        if not key_list:
            return []
        lost = self._lost
        if lost is not None:
            return self._refuse_writes(len(key_list), lost)
        future: asyncio.Future[list[OSError | None]] = asyncio.get_running_loop().create_future()
        self._enqueue(_WriteJob(key_list, slot_list, buffer_list, future))
        return await future

    async def forget(self, keys: Sequence[OffloadKey]) -> None:
        """Remove the records of `keys` (absent keys are ignored); they are removed in the
        write lane's next group, durably when `fsync` is on, and their slots may then be
        overwritten. Raises DiskTierError if that group's index commit fails (the keys are
        no longer served either way)."""
        self._check_open()
        key_list = [self._check_key(key, f"keys[{i}]") for i, key in enumerate(keys)]
        if not key_list or self._lost is not None:
            return  # a disabled store holds no block: nothing to forget
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(_ForgetJob(list(dict.fromkeys(key_list)), future))
        await future

    def _enqueue(self, job: _Job) -> None:
        """Queue `job` for the write lane, starting a drain task if none is queued or running;
        StorageClosedError once the store is closing."""
        with self._queue_lock:
            lane = self._lane
            if self._closed or lane is None:
                raise StorageClosedError(f"the disk tier at {self.path} is closed")
            if self.inspect:
                raise DiskTierError(f"the disk tier at {self.path} is open only to be checked")
            self._queue.append(job)
            if not self._draining:
                lane.submit(self._drain)
                self._draining = True

    def _drain(self) -> None:
        """The write lane's task: run groups until the queue is empty; each group lets the
        reads in flight finish first (for at most READS_FIRST_WAIT_S)."""
        while True:
            with self._reads_done:
                self._reads_done.wait_for(lambda: self._reads_in_flight == 0, READS_FIRST_WAIT_S)
            with self._queue_lock:
                jobs = self._take_group()
                if not jobs:
                    self._draining = False
                    return
            self._run_group(jobs)

    def _take_group(self) -> list[_Job]:
        """Pop the jobs of the next group (the caller holds _queue_lock): queued jobs in
        order, up to WRITE_GROUP_BYTES of blocks (at least one job), stopping before a job
        that touches a slot or a key the group already touches, so that merging never
        reorders two operations on one slot or key. Jobs cancelled while queued are dropped
        (a caller cancelled after this point finds its group run anyway)."""
        queue = self._queue
        jobs: list[_Job] = []
        slots: set[int] = set()
        keys: set[OffloadKey] = set()
        nbytes = 0
        while queue:
            job = queue[0]
            size = len(job.keys) * self.block_size if isinstance(job, _WriteJob) else 0
            if jobs and (
                nbytes + size > WRITE_GROUP_BYTES
                or not keys.isdisjoint(job.keys)
                or (isinstance(job, _WriteJob) and not slots.isdisjoint(job.slots))
            ):
                break
            queue.popleft()
            if job.future is not None and job.future.cancelled():
                continue
            jobs.append(job)
            nbytes += size
            keys.update(job.keys)
            if isinstance(job, _WriteJob):
                slots.update(job.slots)
        return jobs

    def _run_group(self, jobs: list[_Job]) -> None:
        """Run one group and settle the futures of its jobs, with one callback per event
        loop (not one wake-up per call). Never raises: an unexpected error (a bug) fails
        every job of the group with it."""
        writes = [job for job in jobs if isinstance(job, _WriteJob)]
        forgets = [job for job in jobs if isinstance(job, _ForgetJob)]
        settlements: list[_Settlement] = []
        try:
            results, forget_error = self._commit_group(writes, forgets)
        except Exception as error:
            settlements = [(job.future, None, error) for job in jobs if job.future is not None]
        else:
            start = 0
            for write in writes:
                end = start + len(write.keys)
                if write.future is not None:
                    settlements.append((write.future, results[start:end], None))
                start = end
            settlements += [(forget.future, None, forget_error) for forget in forgets]
        by_loop: dict[asyncio.AbstractEventLoop, list[_Settlement]] = {}
        for settlement in settlements:
            by_loop.setdefault(settlement[0].get_loop(), []).append(settlement)
        for loop, some in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, some)

    def _write_blocks(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> list[OSError | None]:
        """Write one validated batch as a group of its own, in the calling thread (for tools
        and tests; `write` goes through the lane)."""
        results, _ = self._commit_group([_WriteJob(keys, slots, buffers, None)], [])
        return results

    def _commit_group(
        self, writes: list[_WriteJob], forgets: list[_ForgetJob]
    ) -> tuple[list[OSError | None], DiskTierError | None]:
        """The body of a group (module docstring, steps 1 to 4): the results of the blocks of
        `writes`, in order, and the error of the forgets (None when committed)."""
        keys = [key for write in writes for key in write.keys]
        slots = [slot for write in writes for slot in write.slots]
        buffers = [buffer for write in writes for buffer in write.buffers]
        forgotten = [key for forget in forgets for key in forget.keys]
        count = len(keys)
        block_size = self.block_size
        with self._index_lock:
            lost = self._lost
            if lost is not None:  # queued before the store disabled itself
                return self._refuse_writes(count, lost), None
            index = self._open_index
            # 1. Nothing in this process is served from a slot about to be rewritten, nor
            # under a forgotten key, from now on.
            with self._map_lock:
                slot_keys, records = self._slot_keys, self._records
                dropped = [slot_keys[slot] for slot in slots if slot in slot_keys]
                dropped += [key for key in forgotten if key in records]
                dropped = list(dict.fromkeys(dropped))
                records_before = {key: records[key] for key in dropped}
                self._drop_locked(dropped)
            # 2. The bytes (their slots noted in the in-flight log first), and 3. one
            # fdatasync per slab file.
            if count and self._inflight is not None:
                with contextlib.suppress(OSError):  # see inflight.py: only weakens cleanup
                    self._inflight.record(slots)
            first_seq = self._next_seq
            seqs = range(first_seq, first_seq + count)
            self._next_seq = first_seq + count
            codecs, lengths, results, entries, files = self._write_data(keys, slots, seqs, buffers)
            # 2b. The headers of the blocks written, and cleared ones for forgotten blocks
            # whose slots this group does not rewrite.
            rewritten = set(slots)
            cleared = [
                record.slot
                for key in dropped
                if (record := records_before.get(key)) is not None and record.slot not in rewritten
            ]
            headers_written = self._write_headers(entries, slots, results, cleared)
            checksums = entries["checksum"].tolist()
            fsyncs = 0
            if self.fsync:
                for file, members in files.items():
                    fsyncs += 1
                    try:
                        self._io.fsync(self._fds[file])
                    except OSError as error:
                        for member in members:
                            results[member] = error
                if headers_written and self._headers_fd is not None:
                    try:
                        os.fdatasync(self._headers_fd)
                    except OSError as error:
                        results = [error if result is None else result for result in results]
            # 4. One transaction: the stale records out, the new ones in.
            pack = IndexRecord.FORMAT.pack
            new: list[tuple[OffloadKey, IndexRecord]] = []
            packed: list[tuple[OffloadKey, bytes]] = []
            for key, slot, length, codec, checksum, seq, result in zip(
                keys, slots, lengths, codecs, checksums, seqs, results, strict=True
            ):
                if result is None:
                    new.append((key, IndexRecord(slot, length, codec, checksum, seq)))
                    packed.append((key, pack(slot, length, codec, checksum, seq)))
            stored_keys = {key for key, _ in new}
            deleted = [key for key in dropped if key not in stored_keys]
            commits = 0
            forget_error: DiskTierError | None = None
            if deleted or packed:
                try:
                    try:
                        index.update(deleted, packed)
                    except _DAMAGE_ERRORS as damage:
                        # A damaged index is not written further: it is replaced by one
                        # written from memory, which is the truth in this process.
                        self._replace_index(new, f"a commit found the index damaged: {damage}")
                    commits += 1
                except lmdb.Error as error:
                    failure = _index_failure(error)
                    for member in range(count):
                        if results[member] is None:
                            results[member] = failure
                    # Their headers go too (best effort): a block reported failed is not
                    # brought back by a rebuild, nor reported lost by `check`.
                    self._write_headers(entries[:0], [], [], [r.slot for _, r in new])
                    new = []
                    forget_error = DiskTierError(
                        f"the disk tier at {self.path} could not commit its index: {error}"
                    )
                    # The index still holds the records dropped from memory in step 1; try
                    # once more to drop them there too, so that the two agree (if this fails
                    # as well, those records point at rewritten bytes, and a read after a
                    # reopen finds their checksums wrong: a miss).
                    if dropped:
                        with contextlib.suppress(lmdb.Error):
                            index.update(dropped, ())
                            commits += 1
            # 5. Are the files this group wrote still the store's files? If the directory
            # was removed or the lock replaced, its blocks are in files nobody will read
            # again: none is reported stored, and the store disables itself.
            problem = self._ground_problem(files)
            if problem is not None:
                results = [self._lost_error(problem)] * count
                new = []
                forget_error = None  # a disabled store holds no block, forgotten or not
            with self._map_lock:
                self._remember_locked(new)
                stats = self._stats
                stats.write_groups += 1
                stats.write_batches += len(writes)
                stats.forget_batches += len(forgets)
                stats.fsyncs += fsyncs
                stats.index_commits += commits
                stats.blocks_written += len(new)
                stats.raw_bytes_written += len(new) * block_size
                stats.bytes_written += sum(record.length for _, record in new)
                stats.write_failures += count - len(new)
            if problem is not None:
                self._lose(problem)
        return results, forget_error

    def _write_data(
        self,
        keys: list[OffloadKey],
        slots: list[int],
        seqs: Sequence[int],
        buffers: list[HostBuffer],
    ) -> tuple[list[int], list[int], list[OSError | None], _Entries, dict[int, list[int]]]:
        """Encode and write the blocks of a group: (codec, stored length, error or None) per
        block, their header entries (with their bound checksums), and the blocks written per
        slab file. A large group's runs are
        cut into parts written in parallel (the lane thread writes one, helpers the others),
        and the checksums of all but a small group are taken in a helper meanwhile."""
        count = len(slots)
        if not count:
            return [], [], [], np.zeros(0, dtype=ENTRY_DTYPE), {}
        block_size = self.block_size
        codecs, stored, lengths = self._encode(buffers)
        total = sum(lengths)
        helpers = self._helpers
        big = helpers is not None and total >= 2 * WRITE_SPLIT_BYTES
        ways = min(self._max_workers, total // WRITE_SPLIT_BYTES) if big else 1
        short = total < count * block_size
        runs = self._layout.runs(
            range(count), slots, ends_run=(lambda m: lengths[m] < block_size) if short else None
        )
        parts = _split_runs(runs, lengths, ways)
        pending: list[Future[list[tuple[Run, OSError | None]]]] = []
        hashing: Future[_Entries] | None = None
        try:
            hash_all = functools.partial(
                group_entries, self._namespace, keys, slots, lengths, codecs, seqs, stored
            )
            if helpers is not None and total >= _HASH_ASIDE_BYTES:
                hashing = helpers.submit(hash_all)
            if helpers is not None:
                pending = [helpers.submit(self._write_runs, p, stored, lengths) for p in parts[1:]]
            outcomes = self._write_runs(parts[0], stored, lengths)
            for part in pending:
                outcomes += part.result()
            entries = hash_all() if hashing is None else hashing.result()
        finally:
            # Also on an unexpected error: the buffers are not touched once we return.
            wait_all(pending)
            if hashing is not None:
                wait_all([hashing])
        results: list[OSError | None] = [None] * count
        files: dict[int, list[int]] = {}
        for run, error in outcomes:
            if error is None:
                files.setdefault(run.file, []).extend(run.members)
            else:
                for member in run.members:
                    results[member] = error
        return codecs, lengths, results, entries, files

    def _write_headers(
        self,
        entries: _Entries,
        slots: list[int],
        results: list[OSError | None],
        cleared: list[int],
    ) -> bool:
        """Write the header entries of the group's written blocks (`entries[member]` for
        the block in `slots[member]`) and clear those of `cleared` slots: one pwrite per run
        of consecutive slots. A failed run fails its blocks (in `results`); a failed clear is
        left (its block stays verifiable, and an index rebuild may bring a forgotten block
        back: right bytes, never wrong ones). Whether anything was written."""
        fd = self._headers_fd
        if fd is None:
            return False
        raw = entries.view(np.uint8).data
        chosen: dict[int, tuple[int | None, bytes | memoryview]] = {}
        for slot in cleared:
            chosen[slot] = (None, EMPTY_ENTRY)
        for member, result in enumerate(results):
            if result is None:
                start = member * ENTRY_BYTES
                chosen[slots[member]] = (member, raw[start : start + ENTRY_BYTES])
        if not chosen:
            return False
        order = sorted(chosen)
        first = 0
        while first < len(order):
            end = first + 1
            while end < len(order) and order[end] == order[end - 1] + 1:
                end += 1
            run = order[first:end]
            payload = b"".join(chosen[slot][1] for slot in run)
            try:
                if os.pwrite(fd, payload, entry_offset(run[0])) != len(payload):
                    raise OSError(errno.EIO, "short write of slot headers")
            except OSError as error:
                for slot in run:
                    owner = chosen[slot][0]
                    if owner is not None:
                        results[owner] = error
            first = end
        return True

    def _encode(self, buffers: list[HostBuffer]) -> tuple[list[int], list[Stored], list[int]]:
        """(codec, bytes to store, their length) per block; zstd work is spread over the
        helpers for a large group (zstd releases the GIL)."""
        count = len(buffers)
        block_size = self.block_size
        if self._codec.compression == "none":
            return (
                [int(Codec.NONE)] * count,
                [buffer.data for buffer in buffers],
                [block_size] * count,
            )
        helpers = self._helpers
        ways = min(self._max_workers, count * block_size // WRITE_SPLIT_BYTES)
        if helpers is None or ways <= 1:
            encoded = self._encode_some(buffers)
        else:
            size = -(-count // ways)
            chunks = [buffers[start : start + size] for start in range(0, count, size)]
            futures = [helpers.submit(self._encode_some, chunk) for chunk in chunks]
            encoded = [item for future in futures for item in future.result()]
        codecs = [int(codec) for codec, _ in encoded]
        stored = [data for _, data in encoded]
        lengths = [memoryview(data).nbytes for data in stored]
        return codecs, stored, lengths

    def _encode_some(self, buffers: list[HostBuffer]) -> list[tuple[Codec, Stored]]:
        encode = self._codec.encode
        return [encode(buffer) for buffer in buffers]

    def _write_runs(
        self, runs: list[Run], stored: list[Stored], lengths: list[int]
    ) -> list[tuple[Run, OSError | None]]:
        """Write `runs`, one after another; each with the OSError that failed it, or None."""
        outcomes: list[tuple[Run, OSError | None]] = []
        for run in runs:
            try:
                self._write_run(run, stored, lengths)
            except OSError as error:
                outcomes.append((run, error))
            else:
                outcomes.append((run, None))
        return outcomes

    def _write_run(self, run: Run, stored: list[Stored], lengths: list[int]) -> None:
        """Write one run of consecutive slots with one pwritev (more after a partial write).

        Under O_DIRECT, a zstd frame (always the last block of its run) is copied, zero-padded
        to whole pages, into page-aligned staging memory, and raw blocks are written straight
        from the caller's buffers. O_DIRECT refuses (EINVAL, before writing anything) memory
        that is not page-aligned; the run is then written again from staging memory. That
        costs one failed system call for the rare unaligned buffer, instead of an address
        check of every block of every batch."""
        fd = self._fds[run.file]
        members = run.members
        payloads: list[IOBuffer] = [stored[member] for member in members]
        nbytes = sum(lengths[member] for member in members)
        if not self._direct_io:
            self._pwrite_all(fd, payloads, run.offset, nbytes)
            return
        last = members[-1]
        if lengths[last] % ALIGNMENT:
            padded = self._staged([last], stored, lengths)
            payloads[-1] = padded
            nbytes += padded.nbytes - lengths[last]
        try:
            self._pwrite_all(fd, payloads, run.offset, nbytes)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            staged = self._staged(list(members), stored, lengths)
            self._pwrite_all(fd, [staged], run.offset, staged.nbytes)

    def _staged(self, members: list[int], stored: list[Stored], lengths: list[int]) -> memoryview:
        """The stored bytes of `members`, each zero-padded to whole pages (padding: bytes on
        disk that are never read as data), one after another in this thread's page-aligned
        staging memory (valid until the thread stages again)."""
        sizes = [round_up(lengths[member], ALIGNMENT) for member in members]
        staging = _staging(sum(sizes))
        start = 0
        for member, size in zip(members, sizes, strict=True):
            length = lengths[member]
            staging[start : start + length] = np.frombuffer(stored[member], dtype=np.uint8)
            staging[start + length : start + size] = 0
            start += size
        return staging.data

    def _pwrite_all(self, fd: int, buffers: Sequence[IOBuffer], offset: int, nbytes: int) -> None:
        """Write all of `buffers` (`nbytes` in all) at `offset`, continuing after a partial
        write; raises the OSError of a failed call (a call that writes nothing is an EIO)."""
        written = self._io.pwritev(fd, buffers, offset)
        if written == nbytes:
            return
        views = [memoryview(buffer).cast("B") for buffer in buffers]
        first = 0
        while True:
            if written <= 0:
                raise OSError(errno.EIO, "pwritev wrote nothing")
            offset += written
            while first < len(views) and written >= views[first].nbytes:
                written -= views[first].nbytes
                first += 1
            if first == len(views):
                return
            if written:
                views[first] = views[first][written:]
            written = self._io.pwritev(fd, views[first:], offset)

    # ----------------------------------------------------------------------------------------
    # The in-memory maps, and index updates outside the lane (tools and test backdoors)
    # ----------------------------------------------------------------------------------------

    def _drop_locked(self, keys: Iterable[OffloadKey]) -> None:
        """Drop the records of `keys` from memory (the caller holds _map_lock)."""
        records, slot_keys = self._records, self._slot_keys
        for key in keys:
            record = records.pop(key, None)
            if record is not None and slot_keys.get(record.slot) == key:
                del slot_keys[record.slot]

    def _drop_from_memory(self, keys: Iterable[OffloadKey]) -> None:
        with self._map_lock:
            self._drop_locked(keys)

    def _remember_locked(self, new: list[tuple[OffloadKey, IndexRecord]]) -> None:
        """Add committed records to memory (the caller holds _map_lock): a key's record
        replaces its old one (and frees its old slot), a slot's record its old owner."""
        records, slot_keys = self._records, self._slot_keys
        for key, record in new:
            old = records.get(key)
            if old is not None and slot_keys.get(old.slot) == key:
                del slot_keys[old.slot]
            squatter = slot_keys.get(record.slot)
            if squatter is not None and squatter != key:
                # Not reached through the lane (a group drops its slots' records first);
                # a backdoor write may get here. The newer record wins, as on reopening.
                records.pop(squatter, None)
            records[key] = record
            slot_keys[record.slot] = key

    def _unindex_slots(self, slots: Iterable[int]) -> None:
        """Durably drop every record that points at one of `slots` (for test backdoors that
        are about to overwrite them behind the store's back)."""
        index = self._open_index
        with self._index_lock:
            with self._map_lock:
                victims = [self._slot_keys[slot] for slot in slots if slot in self._slot_keys]
            if not victims:
                return
            index.delete(victims)
            self._drop_from_memory(victims)

    def _index_put(self, blocks: list[tuple[OffloadKey, int, int, bytes]]) -> None:
        """Index `blocks` ((key, slot, codec, stored bytes) each) in one transaction, with
        increasing sequence numbers and their headers written (for test backdoors that wrote
        the bytes behind the store's back)."""
        index = self._open_index
        with self._index_lock:
            new = []
            for key, slot, codec, stored in blocks:
                seq = self._next_seq
                self._next_seq += 1
                checksum = bound_checksum(
                    self._namespace, key, slot, len(stored), codec, seq, stored
                )
                new.append((key, IndexRecord(slot, len(stored), codec, checksum, seq)))
            if self._headers_fd is not None:
                for key, record in new:
                    header = BlockHeader(
                        key, record.seq, record.length, record.codec, record.checksum
                    )
                    os.pwrite(
                        self._headers_fd,
                        header.pack(self._namespace, record.slot),
                        entry_offset(record.slot),
                    )
            index.update((), [(key, record.pack()) for key, record in new])
            with self._map_lock:
                self._remember_locked(new)

    # ----------------------------------------------------------------------------------------
    # Reading
    # ----------------------------------------------------------------------------------------

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        """Read the blocks (see `BlockStorage.read`): one preadv per run of consecutive
        slots (whole slots for raw blocks, the frame for compressed ones), each block checked
        against its index record (this key in this slot) and its xxh3 checksum, then
        decompressed if it was stored compressed. Once the store has disabled itself
        (`disabled_reason`), every block is an IO_ERROR (a miss)."""
        key_list, slot_list, buffer_list = self._check_batch(keys, slots, buffers, writable=True)
        if not key_list:
            return []
        if self._lost is not None:
            return self._refuse_reads(len(key_list))
        parts = self._read_parts(slot_list)
        if len(parts) == 1:
            return await self._run(
                functools.partial(self._read_blocks, key_list, slot_list, buffer_list)
            )
        outcomes = await asyncio.gather(
            *(
                self._run(
                    functools.partial(
                        self._read_blocks,
                        [key_list[m] for m in part],
                        [slot_list[m] for m in part],
                        [buffer_list[m] for m in part],
                    )
                )
                for part in parts
            )
        )
        results: list[ReadFailure | None] = [None] * len(key_list)
        for part, outcome in zip(parts, outcomes, strict=True):
            for member, result in zip(part, outcome, strict=True):
                results[member] = result
        return results

    def _read_parts(self, slots: list[int]) -> list[list[int]]:
        """The batch positions, cut into parts of consecutive slots to read in parallel: one
        part per worker thread, each at least READ_SPLIT_BYTES (a small batch is one part).
        Several reads in flight keep the disk busier than one, and one part's checksums run
        while another part waits for the disk."""
        ways = min(self._max_workers, len(slots) * self.block_size // READ_SPLIT_BYTES)
        if ways <= 1:
            return [list(range(len(slots)))]
        order = sorted(range(len(slots)), key=slots.__getitem__)
        size = -(-len(order) // ways)
        return [order[start : start + size] for start in range(0, len(order), size)]

    def _read_blocks(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> list[ReadFailure | None]:
        """The blocking body of `read` (runs in the read pool), counted as in flight so the
        write lane lets it finish before starting a group (and a store disabling itself
        before closing its files)."""
        with self._reads_done:
            refused = self._lost is not None
            if not refused:
                self._reads_in_flight += 1
        if refused:
            return self._refuse_reads(len(keys))
        try:
            return self._read_blocks_now(keys, slots, buffers)
        finally:
            with self._reads_done:
                self._reads_in_flight -= 1
                if self._reads_in_flight == 0:
                    self._reads_done.notify_all()

    def _read_blocks_now(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> list[ReadFailure | None]:
        count = len(keys)
        block_size = self.block_size
        results: list[ReadFailure | None] = [None] * count
        with self._map_lock:
            records = [self._records.get(key) for key in keys]
        found: dict[int, IndexRecord] = {}  # batch position -> its record, for indexed blocks
        for member, record in enumerate(records):
            if record is None or record.slot != slots[member]:
                results[member] = ReadFailure.NOT_INDEXED
            else:
                found[member] = record
        # Raw blocks are read straight into the caller's buffer (when O_DIRECT allows it);
        # zstd frames into page-aligned staging memory, then decoded into the buffer. A frame
        # is read only as far as it goes (rounded up to 4 KiB under O_DIRECT), so it ends its
        # run of slots, as it did when it was written.
        direct = self._direct_io
        targets: dict[int, HostBuffer] = {}
        staged: dict[int, int] = {}  # member -> bytes to read into staging
        for member, record in found.items():
            buffer = buffers[member]
            if record.codec == Codec.NONE and (not direct or _is_aligned(buffer)):
                targets[member] = buffer
            elif record.codec == Codec.NONE:
                staged[member] = block_size
            else:
                wanted = round_up(record.length, ALIGNMENT) if direct else record.length
                staged[member] = max(1, min(wanted, block_size))
        if staged:
            staging = _staging(sum(staged.values()))
            start = 0
            for member, size in staged.items():
                targets[member] = staging[start : start + size]
                start += size
        bytes_read = 0
        runs = self._layout.runs(
            list(found), slots, ends_run=lambda member: targets[member].nbytes < block_size
        )
        for run in runs:
            fd = self._fds[run.file]
            views = [targets[member] for member in run.members]
            try:
                got = self._pread_all(fd, views, run.offset)
            except OSError:
                got = 0
            bytes_read += got
            start = 0
            for member, view in zip(run.members, views, strict=True):
                record = found[member]
                offset, start = run.offset + start, start + view.nbytes
                if got >= offset - run.offset + record.length:
                    continue
                # Not (completely) read by the run's one call: retry this block alone, so a
                # bad sector or the end of a truncated file fails only the blocks it touches.
                try:
                    alone = self._pread_all(fd, [view], offset)
                except OSError:
                    results[member] = ReadFailure.IO_ERROR
                    continue
                bytes_read += alone
                if alone < record.length:
                    results[member] = ReadFailure.SHORT_READ
        for member, record in found.items():
            if results[member] is not None:
                continue
            target = targets[member]
            stored = target[: record.length].data
            if self.checksum_of(keys[member], record, stored) != record.checksum:
                results[member] = ReadFailure.CHECKSUM
                continue
            if target is buffers[member] and record.length == block_size:
                continue
            try:
                self._codec.decode_into(record.codec, stored, buffers[member])
            except CodecError:
                results[member] = ReadFailure.CODEC
        with self._map_lock:
            # A record that changed while the bytes were read means a write or a forget
            # overlapped: the bytes may be the new block's, so they are not served, and a
            # checksum mismatch they caused is no sign of a damaged disk. Either way, a miss.
            for member, record in found.items():
                if self._records.get(keys[member]) != record:
                    results[member] = ReadFailure.NOT_INDEXED
            stats = self._stats
            stats.bytes_read += bytes_read
            for result in results:
                if result is None:
                    stats.blocks_read += 1
                else:
                    stats.read_failures[result] += 1
        return results

    def _pread_all(self, fd: int, buffers: Sequence[HostBuffer], offset: int) -> int:
        """Read into all of `buffers` from `offset`, continuing after a partial read, until
        they are full or the file ends; the bytes read. The first call's OSError propagates;
        a later call's ends the read (the caller sees it as short)."""
        views = [buffer.data.cast("B") for buffer in buffers]
        total = 0
        first = 0
        while first < len(views):
            try:
                got = self._io.preadv(fd, views[first:], offset)
            except OSError:
                if total == 0:
                    raise
                break
            if got <= 0:
                break
            total += got
            offset += got
            while first < len(views) and got >= views[first].nbytes:
                got -= views[first].nbytes
                first += 1
            if got:
                views[first] = views[first][got:]
        return total

    # ----------------------------------------------------------------------------------------
    # Checking
    # ----------------------------------------------------------------------------------------

    def check(self, repair: bool = False) -> CheckReport:
        """Verify the store: every index record against its slot's header and bytes (slot in
        range and not shared, the header of the same key and sequence, a sane length and
        codec, a file long enough, the bound checksum, and that the bytes decode), every
        header against the index (a sound block with no record is a lost record), and the
        files of the store directory. With `repair`, drop the bad records, index the lost
        blocks again and remove stray slab files (durably).

        Blocking; meant for `kvtier check`, tools and tests; run it with no batch in flight
        (an overlapping write could be reported as a problem). See also `acheck`."""
        self._check_open()
        if repair and self.inspect:
            raise DiskTierError(f"{self.path} is open only to be checked; reopen it to repair")
        with self._index_lock:
            if self._lost is not None:
                raise DiskTierError(f"the disk tier at {self.path} is disabled: {self._lost}")
            index = self._open_index
            # Opening to inspect keeps what a normal open drops; a normal open has dropped it.
            problems: list[CheckProblem] = list(self._open_problems) if self.inspect else []
            by_slot: dict[int, list[tuple[OffloadKey, IndexRecord]]] = {}
            examined = 0
            for key, value in index.items():
                examined += 1
                try:
                    record = IndexRecord.unpack(value)
                except ValueError as error:
                    problems.append(CheckProblem(key, None, f"unreadable index record: {error}"))
                    continue
                by_slot.setdefault(record.slot, []).append((key, record))
            headers = self._read_headers()
            scratch = _staging(2 * self.block_size).reshape(2, self.block_size)
            sound: dict[OffloadKey, int] = {}  # key -> seq of its sound record
            reported = {problem.key for problem in problems}
            for slot in sorted(by_slot):
                entries = sorted(by_slot[slot], key=lambda entry: entry[1].seq)
                newest_key, newest = entries[-1]
                for key, _ in entries[:-1]:
                    if key not in reported:
                        shared = f"slot also claimed by the newer record of {newest_key.hex()}"
                        problems.append(CheckProblem(key, slot, shared))
                if newest_key in reported:
                    continue
                what = self._check_header(newest_key, newest, headers.get(slot))
                if what is None:
                    what = self._check_record(newest_key, newest, scratch[0], scratch[1])
                if what is None:
                    sound[newest_key] = newest.seq
                else:
                    problems.append(CheckProblem(newest_key, slot, what))
            lost = self._lost_blocks(headers, sound, scratch)
            bad = list(dict.fromkeys(problem.key for problem in problems))
            for key, record in lost:
                problems.append(
                    CheckProblem(
                        key,
                        record.slot,
                        "lost record: the slot holds this key's sound block (header and "
                        "checksum agree) but the index has no record of it",
                    )
                )
            strays = self._stray_files()
            notes = [f"unknown file in the store directory: {path.name}" for path in strays]
            repaired = reindexed = 0
            if repair and problems:
                index.delete(bad)
                self._drop_from_memory(bad)
                repaired = len(bad)
                claimed = {record.slot for record in self._records.values()}
                restore = [(key, record) for key, record in lost if record.slot not in claimed]
                index.update((), [(key, record.pack()) for key, record in restore])
                with self._map_lock:
                    self._remember_locked(restore)
                reindexed = len(restore)
            if repair:
                for path in strays:
                    if path.name.startswith("slab-") and path.name.endswith(".bin"):
                        with contextlib.suppress(OSError):
                            path.unlink()
                            notes.append(f"removed the stray slab file {path.name}")
        return CheckReport(examined, tuple(problems), repaired, reindexed, tuple(notes))

    def _read_headers(self) -> dict[int, BlockHeader | None]:
        """Every slot's header (None for an empty or unreadable entry), by slot."""
        fd = self._headers_fd
        found: dict[int, BlockHeader | None] = {}
        if fd is None:
            return found
        chunk = 4096
        for first in range(0, self.num_blocks, chunk):
            count = min(chunk, self.num_blocks - first)
            data = os.pread(fd, count * ENTRY_BYTES, entry_offset(first))
            view = memoryview(data)
            for i in range(len(data) // ENTRY_BYTES):
                entry = view[i * ENTRY_BYTES : (i + 1) * ENTRY_BYTES]
                found[first + i] = unpack_entry(entry, self._namespace, first + i)
        return found

    @staticmethod
    def _check_header(
        key: OffloadKey, record: IndexRecord, header: BlockHeader | None
    ) -> str | None:
        """What the slot's header says is wrong with `record`, or None when it agrees (or
        is unreadable: the checksum then decides)."""
        if header is None:
            return None
        if header.key != key:
            return (
                f"the slot holds the block of another key ({header.key.hex()}, seq "
                f"{header.seq}): a swapped or stale record"
            )
        if header.seq != record.seq:
            return (
                f"stale record (seq {record.seq}): the slot was rewritten with this key's "
                f"block seq {header.seq}"
            )
        if (header.length, header.codec, header.checksum) != (
            record.length,
            record.codec,
            record.checksum,
        ):
            return "the record and the slot's header disagree on length, codec or checksum"
        return None

    def _lost_blocks(
        self,
        headers: dict[int, BlockHeader | None],
        sound: dict[OffloadKey, int],
        scratch: np.ndarray[Any, np.dtype[np.uint8]],
    ) -> list[tuple[OffloadKey, IndexRecord]]:
        """Sound blocks that have a header and no sound record newer than it (newest per
        key), in slot order."""
        newest: dict[OffloadKey, tuple[int, BlockHeader]] = {}
        for slot, header in headers.items():
            if header is None or sound.get(header.key, -1) >= header.seq:
                continue
            if header.key in newest and newest[header.key][1].seq >= header.seq:
                continue
            newest[header.key] = (slot, header)
        lost = []
        for key, (slot, header) in newest.items():
            record = IndexRecord(slot, header.length, header.codec, header.checksum, header.seq)
            file = self._layout.locate(slot)[0]
            if self._fds[file] < 0:
                continue
            if self._check_record(key, record, scratch[0], scratch[1]) is None:
                lost.append((key, record))
        return sorted(lost, key=lambda item: item[1].slot)

    def _stray_files(self) -> list[Path]:
        """Files of the store directory that this store does not use."""
        known = {_LOCK_FILE, _INFLIGHT_FILE, HEADERS_FILE, _INDEX_DIR}
        known.update(slab_file_name(file) for file in range(self._layout.num_files))
        strays = []
        for path in sorted(self.path.iterdir()):
            name = path.name
            if name in known or name.startswith(f"{_INDEX_DIR}.damaged-"):
                continue
            strays.append(path)
        return strays

    def _check_record(
        self, key: OffloadKey, record: IndexRecord, raw: HostBuffer, block: HostBuffer
    ) -> str | None:
        """What is wrong with `record` and its bytes, or None."""
        if not 0 <= record.slot < self.num_blocks:
            return f"slot out of range [0, {self.num_blocks})"
        if record.codec not in tuple(Codec):
            return f"unknown codec {record.codec}"
        if not 1 <= record.length <= self.block_size or (
            record.codec == Codec.NONE and record.length != self.block_size
        ):
            return f"stored length {record.length} is impossible for codec {record.codec}"
        file, offset = self._layout.locate(record.slot)
        fd = self._fds[file]
        if fd < 0:
            return f"its slab file {slab_file_name(file)} is missing"
        try:
            size = self._io.size(fd)
        except OSError as error:
            return f"cannot stat the slab file: {error}"
        end = offset + record.length
        if size < end:
            return f"slab file ends at byte {size}, before the block's end at byte {end}"
        try:
            got = self._pread_all(fd, [raw], offset)
        except OSError as error:
            return f"read failed: {error}"
        if got < record.length:
            return f"short read: {got} of {record.length} bytes"
        stored = raw[: record.length].data
        actual = self.checksum_of(key, record, stored)
        if actual != record.checksum:
            return (
                f"checksum mismatch: indexed {record.checksum:016x}, stored bytes give "
                f"{actual:016x} (damaged, or another block's)"
            )
        try:
            self._codec.decode_into(record.codec, stored, block)
        except CodecError as error:
            return f"does not decode: {error}"
        return None

    async def acheck(self, repair: bool = False) -> CheckReport:
        """`check()` in the store's executor."""
        return await self._run(functools.partial(self.check, repair))
