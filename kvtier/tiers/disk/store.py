"""`DiskStore`: the bytes of a disk tier, in preallocated slab files indexed by LMDB.

Layout under the configured directory::

    <directory>/kvtier-<fingerprint>/      0700, one per (block size, layout version, model id)
        lock                               0600, flock'ed while a store has it open
        slab-00000.bin ...                 0600, preallocated; slot s at a fixed offset
        index/                             0700, LMDB: key -> (slot, length, codec, xxh3, seq)

Durability follows python-diskcache's rule: the index never points at bytes that are not
completely on disk. A write first removes (durably) every record that points at a slot it is
about to overwrite, then writes the bytes, fsyncs the slab files once per batch, and only then
commits the new records in one transaction. A process killed at any point leaves every
indexed block intact, and every read verifies the block's checksum anyway, so a torn or rotten
block is a miss (`ReadFailure`), never data.

Consecutive slots move in one `pwritev` / `preadv` each. A raw block fills its slot; a zstd
frame fills only the start of its slot and is read back only that far (rounded up to 4 KiB
under O_DIRECT), so compression saves disk bandwidth both ways, though not disk space.

All file and index work runs in a bounded thread pool, never on the event loop; compression
and checksums (zstd and xxhash release the GIL) run there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import mmap
import operator
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import lmdb
import numpy as np
import xxhash

from kvtier.errors import (
    DirectIOError,
    DiskLayoutError,
    DiskLockedError,
    DiskTierError,
    InvalidValueError,
    KeyFormatError,
    StorageClosedError,
)
from kvtier.keys import OffloadKey
from kvtier.tiers.disk.codec import BlockCodec, Codec, CodecError, Compression, Stored
from kvtier.tiers.disk.index import LAYOUT_VERSION, BlockIndex, IndexRecord, layout_fingerprint
from kvtier.tiers.disk.io import FileIO, IOBuffer
from kvtier.tiers.disk.slab import ALIGNMENT, SlabLayout, round_up, slab_file_name
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
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)

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

    @property
    def ok(self) -> bool:
        """Whether every record is sound."""
        return not self.problems

    def __str__(self) -> str:
        head = f"{self.records} records, {len(self.problems)} problems"
        if self.repaired:
            head += f", {self.repaired} records dropped"
        return "\n".join([head, *(f"  {problem}" for problem in self.problems)])


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

    def copy(self) -> DiskStoreStats:
        """An independent copy."""
        return DiskStoreStats(
            self.blocks_written,
            self.raw_bytes_written,
            self.bytes_written,
            self.write_failures,
            self.blocks_read,
            self.bytes_read,
            Counter(self.read_failures),
            self.dropped_at_open,
        )


READ_SPLIT_BYTES = 8 << 20
"""A read of at least twice this many bytes is split over the worker threads (see
`DiskStore._read_parts`)."""

_STAGING_CACHE_BYTES = 64 << 20
"""Largest staging buffer a worker thread keeps for its next batch."""
_staging_cache = threading.local()


def _staging(nbytes: int) -> HostBuffer:
    """A page-aligned buffer of `nbytes` bytes (anonymous mmap memory), suitable for O_DIRECT.

    Each thread reuses one buffer (up to 64 MiB) from batch to batch, so that staging does not
    pay an mmap and a page fault per page every time; a batch is run by one thread and uses
    its staging memory only until it returns. The contents are left over from earlier use."""
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


def _checksum(data: Stored) -> int:
    return xxhash.xxh3_64_intdigest(data)


def _checksums(blocks: Sequence[Stored]) -> list[int]:
    return [_checksum(data) for data in blocks]


def _index_failure(error: Exception) -> OSError:
    """A per-block write failure for an index (LMDB) error."""
    return OSError(errno.EIO, f"disk tier index: {error}")


def _private_dir(path: Path) -> None:
    """Create `path` (if missing) and make it exactly 0700: a umask can neither widen nor,
    by making it unusable, narrow it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, _DIR_MODE)
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    os.chmod(path, _DIR_MODE)


def _fsync_directory(path: Path) -> None:
    """fsync a directory (its entries); a filesystem that refuses is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
        fsync: make every batch durable (slab fdatasync and index commit) before reporting it
            stored. Without it a process crash still loses nothing, a power cut may.
        max_workers: threads that run the file I/O (batches run in parallel).
        io: the system calls on slab files; tests pass a `FaultyIO`.
        slab_file_bytes: largest slab file of a new store; an existing store keeps its own.
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
        self.directory = Path(directory)
        self.path = self.directory / f"kvtier-{self.fingerprint}"
        """The store's own directory."""
        self._codec = BlockCodec(compression, zstd_level)
        self._io = io if io is not None else FileIO()
        self._direct_io = False
        self._fds: list[int] = []
        self._lock_fd: int | None = None
        self._index: BlockIndex | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._hasher: ThreadPoolExecutor | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        # Writers of the index (LMDB transactions and the matching in-memory updates) take
        # _index_lock, in order; the in-memory maps themselves are guarded by _map_lock, which
        # readers hold only for lookups.
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
            if isinstance(error, OSError | lmdb.Error):
                raise DiskTierError(f"cannot open the disk tier at {self.path}: {error}") from error
            raise
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="kvtier-disk")
        # Checksums of a batch being written are taken here while its worker waits for the
        # disk (a separate pool: a worker never waits on a job queued behind itself).
        self._hasher = ThreadPoolExecutor(max_workers, thread_name_prefix="kvtier-disk-hash")

    @classmethod
    def from_config(
        cls, tier: DiskTierConfig, block_size: int, model_id: str = "", **kwargs: Any
    ) -> DiskStore:
        """A store for a validated disk tier config (`kwargs`: `max_workers`, `io`, ...)."""
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
        if not self.directory.exists():
            os.makedirs(self.directory, mode=_DIR_MODE, exist_ok=True)
        _private_dir(self.path)
        self._take_lock()
        index_path = self.path / _INDEX_DIR
        _private_dir(index_path)
        self._index = BlockIndex(
            index_path,
            map_size=max(1 << 24, round_up(self.num_blocks * 512, 1 << 20)),
            durable=self.fsync,
        )
        for name in ("data.mdb", "lock.mdb"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(index_path / name, _FILE_MODE)
        slots_per_file = self._check_layout(max(1, slab_file_bytes // self.block_size))
        self._layout = SlabLayout(self.num_blocks, self.block_size, slots_per_file)
        self._open_slabs(self._load_records())
        self._direct_io = self._setup_direct_io(direct_io)
        if self.fsync:
            # New files and directories survive a power cut only once their directory entries
            # are on disk too.
            for directory in (self.directory, self.path, index_path):
                _fsync_directory(directory)

    def _take_lock(self) -> None:
        fd = os.open(self.path / _LOCK_FILE, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, _FILE_MODE)
        try:
            os.fchmod(fd, _FILE_MODE)
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
        index.write_layout(recorded, self.num_blocks)
        return recorded_slots

    def _load_records(self) -> dict[OffloadKey, IndexRecord]:
        """The index's readable records (unreadable ones are left for `check`)."""
        records = {}
        for key, value in self._open_index.items():
            with contextlib.suppress(ValueError):
                records[key] = IndexRecord.unpack(value)
        return records

    def _open_slabs(self, records: dict[OffloadKey, IndexRecord]) -> None:
        """Open, size and preallocate the slab files; drop (durably, before any file shrinks)
        the records of slots that no longer exist or whose bytes were cut off."""
        index = self._open_index
        layout = self._layout
        sizes: list[int] = []
        for file in range(layout.num_files):
            path = str(self.path / slab_file_name(file))
            fd = self._io.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, _FILE_MODE)
            self._fds.append(fd)
            sizes.append(self._io.size(fd))
        dropped: list[OffloadKey] = []
        by_slot: dict[int, OffloadKey] = {}
        for key, record in sorted(records.items(), key=lambda item: -item[1].seq):
            slot = record.slot
            file, offset = layout.locate(slot) if slot < layout.num_blocks else (-1, 0)
            if file < 0 or sizes[file] < offset + max(record.length, 1) or slot in by_slot:
                dropped.append(key)
            else:
                by_slot[slot] = key
        if dropped:
            index.delete(dropped)
        self._stats.dropped_at_open = len(dropped)
        kept = {key: records[key] for key in by_slot.values()}
        self._records = kept
        self._slot_keys = {record.slot: key for key, record in kept.items()}
        self._restored = sorted(kept.items(), key=lambda item: item[1].seq)
        self._next_seq = max((record.seq for record in kept.values()), default=0) + 1
        for file, fd in enumerate(self._fds):
            wanted = layout.file_bytes(file)
            if sizes[file] > wanted:
                self._io.truncate(fd, wanted)
            self._io.allocate(fd, wanted)
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
        if self._index is not None:
            self._index.close()
            self._index = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def close(self) -> None:
        """Wait for the batches in flight, then close the files and the index. Idempotent;
        blocking (use `aclose` from a coroutine)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._hasher is not None:
                self._hasher.shutdown(wait=True)
                self._hasher = None
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
        state = "closed" if self._closed else f"{len(self)} blocks"
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
        if not isinstance(key, bytes):
            raise KeyFormatError(f"{what} must be bytes, got {type(key).__name__}")
        if not key or len(key) > 511:
            raise KeyFormatError(f"{what} must have 1 to 511 bytes, got {len(key)}")
        return OffloadKey(key)

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
        key_list = [self._check_key(key, f"keys[{i}]") for i, key in enumerate(keys)]
        slot_list = [self._check_slot(slot, f"slots[{i}]") for i, slot in enumerate(slots)]
        if len(set(slot_list)) != len(slot_list):
            twice = sorted(slot for slot in set(slot_list) if slot_list.count(slot) > 1)
            raise InvalidValueError(f"slots must be distinct within a batch, got {twice} twice")
        if len(set(key_list)) != len(key_list):
            raise InvalidValueError("keys must be distinct within a batch")
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
        return key_list, slot_list, list(buffers)

    async def _run(self, call: Callable[[], _T]) -> _T:
        executor = self._executor
        if self._closed or executor is None:
            raise StorageClosedError(f"the disk tier at {self.path} is closed")
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, call)
        except RuntimeError:  # the executor was shut down between the check and the submit
            raise StorageClosedError(f"the disk tier at {self.path} is closed") from None
        return await future

    # ----------------------------------------------------------------------------------------
    # Writing
    # ----------------------------------------------------------------------------------------

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        """Store the blocks (see `BlockStorage.write`): drop the records that point at these
        slots, write the bytes (one pwritev per run of consecutive slots), fsync once per
        batch and file, then index the blocks that made it in one transaction. A failed run,
        fsync or index commit fails exactly its blocks, which are then not indexed.

        The buffers must not change until the call returns. Cancelling the call does not stop
        the batch in its thread; its blocks may still be indexed (and are then intact)."""
        key_list, slot_list, buffer_list = self._check_batch(keys, slots, buffers, writable=False)
        if not key_list:
            return []
        return await self._run(
            functools.partial(self._write_blocks, key_list, slot_list, buffer_list)
        )

    def _write_blocks(
        self, keys: list[OffloadKey], slots: list[int], buffers: list[HostBuffer]
    ) -> list[OSError | None]:
        """The blocking body of `write` (runs in the executor)."""
        count = len(keys)
        try:
            self._unindex_slots(slots)
        except lmdb.Error as error:
            self._count_write_failures(count)
            return [_index_failure(error)] * count
        results: list[OSError | None] = [None] * count
        encoded = [self._codec.encode(buffer) for buffer in buffers]
        lengths = [memoryview(data).nbytes for _, data in encoded]
        stored_bytes = [data for _, data in encoded]
        # The checksums are taken alongside the writes (xxh3 holds the GIL, pwritev does
        # not), and are needed only to index the blocks once they are durable.
        hasher = self._hasher
        hashing = None if hasher is None else hasher.submit(_checksums, stored_bytes)
        checksums = _checksums(stored_bytes) if hashing is None else None
        payloads = self._write_payloads(encoded, lengths, buffers)
        runs = self._layout.runs(
            range(count),
            slots,
            ends_run=lambda member: memoryview(payloads[member]).nbytes < self.block_size,
        )
        written_files: dict[int, list[int]] = {}
        for run in runs:
            try:
                self._pwrite_all(
                    self._fds[run.file], [payloads[member] for member in run.members], run.offset
                )
            except OSError as error:
                for member in run.members:
                    results[member] = error
            else:
                written_files.setdefault(run.file, []).extend(run.members)
        if self.fsync:
            for file, members in written_files.items():
                try:
                    self._io.fsync(self._fds[file])
                except OSError as error:
                    for member in members:
                        results[member] = error
        if hashing is not None:
            checksums = hashing.result()  # also: the buffers are not read after we return
        assert checksums is not None
        stored = [member for member in range(count) if results[member] is None]
        if stored:
            try:
                self._index_put(
                    [
                        (keys[m], slots[m], lengths[m], int(encoded[m][0]), checksums[m])
                        for m in stored
                    ]
                )
            except lmdb.Error as error:
                failure = _index_failure(error)
                for member in stored:
                    results[member] = failure
                stored = []
        with self._map_lock:
            stats = self._stats
            stats.blocks_written += len(stored)
            stats.raw_bytes_written += len(stored) * self.block_size
            stats.bytes_written += sum(lengths[member] for member in stored)
            stats.write_failures += count - len(stored)
        return results

    def _write_payloads(
        self, encoded: list[tuple[Codec, Stored]], lengths: list[int], buffers: list[HostBuffer]
    ) -> list[IOBuffer]:
        """What to hand to pwritev per block. With O_DIRECT, a block whose buffer is not
        aligned, or whose stored length is not a multiple of 4096, is copied (zero-padded)
        into page-aligned staging memory."""
        if not self._direct_io:
            return [data for _, data in encoded]
        staged_sizes = [
            0 if codec == Codec.NONE and _is_aligned(buffer) else round_up(length, ALIGNMENT)
            for (codec, _), length, buffer in zip(encoded, lengths, buffers, strict=True)
        ]
        staging = _staging(sum(staged_sizes))
        payloads: list[IOBuffer] = []
        start = 0
        for (_, data), length, size in zip(encoded, lengths, staged_sizes, strict=True):
            if not size:
                payloads.append(data)
                continue
            target = staging[start : start + size]
            target[:length] = np.frombuffer(data, dtype=np.uint8)
            target[length:] = 0  # padding: deterministic bytes on disk, never read as data
            payloads.append(target.data)
            start += size
        return payloads

    def _pwrite_all(self, fd: int, buffers: Sequence[IOBuffer], offset: int) -> None:
        """Write all of `buffers` at `offset`, continuing after a partial write; raises the
        OSError of a failed call (a call that writes nothing is an EIO)."""
        views = [memoryview(buffer).cast("B") for buffer in buffers]
        first = 0
        while first < len(views):
            written = self._io.pwritev(fd, views[first:], offset)
            if written <= 0:
                raise OSError(errno.EIO, "pwritev wrote nothing")
            offset += written
            while first < len(views) and written >= views[first].nbytes:
                written -= views[first].nbytes
                first += 1
            if written:
                views[first] = views[first][written:]

    def _count_write_failures(self, count: int) -> None:
        with self._map_lock:
            self._stats.write_failures += count

    # ----------------------------------------------------------------------------------------
    # Index updates (each one LMDB transaction, then the in-memory maps)
    # ----------------------------------------------------------------------------------------

    def _unindex_slots(self, slots: Iterable[int]) -> None:
        """Durably drop every record that points at one of `slots` (they are about to be
        overwritten), so the index never points at bytes being changed."""
        index = self._open_index
        with self._index_lock:
            with self._map_lock:
                victims = [self._slot_keys[slot] for slot in slots if slot in self._slot_keys]
            if not victims:
                return
            index.delete(victims)
            self._drop_from_memory(victims)

    def _drop_from_memory(self, keys: Iterable[OffloadKey]) -> None:
        with self._map_lock:
            for key in keys:
                record = self._records.pop(key, None)
                if record is not None and self._slot_keys.get(record.slot) == key:
                    del self._slot_keys[record.slot]

    def _index_put(self, blocks: list[tuple[OffloadKey, int, int, int, int]]) -> None:
        """Index `blocks` ((key, slot, length, codec, checksum) each) in one transaction,
        with increasing sequence numbers."""
        index = self._open_index
        with self._index_lock:
            records = []
            for key, slot, length, codec, checksum in blocks:
                records.append((key, IndexRecord(slot, length, codec, checksum, self._next_seq)))
                self._next_seq += 1
            index.put(records)
            with self._map_lock:
                for key, record in records:
                    old = self._records.get(key)
                    if old is not None and self._slot_keys.get(old.slot) == key:
                        del self._slot_keys[old.slot]
                    squatter = self._slot_keys.get(record.slot)
                    if squatter is not None and squatter != key:
                        # Only a caller writing one slot from two concurrent batches gets here;
                        # the newer record wins (as it does when the index is reopened).
                        self._records.pop(squatter, None)
                    self._records[key] = record
                    self._slot_keys[record.slot] = key

    async def forget(self, keys: Sequence[OffloadKey]) -> None:
        """Remove the records of `keys` (absent keys are ignored) in one transaction, durable
        when `fsync` is on; their slots may then be overwritten."""
        self._check_open()
        key_list = [self._check_key(key, f"keys[{i}]") for i, key in enumerate(keys)]
        if key_list:
            await self._run(functools.partial(self._forget_keys, key_list))

    def _forget_keys(self, keys: list[OffloadKey]) -> None:
        index = self._open_index
        with self._index_lock:
            with self._map_lock:
                present = [key for key in keys if key in self._records]
            if present:
                index.delete(present)
                self._drop_from_memory(present)

    # ----------------------------------------------------------------------------------------
    # Reading
    # ----------------------------------------------------------------------------------------

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        """Read the blocks (see `BlockStorage.read`): one preadv per run of consecutive
        slots (whole slots for raw blocks, the frame for compressed ones), each block checked
        against its index record (this key in this slot) and its xxh3 checksum, then
        decompressed if it was stored compressed."""
        key_list, slot_list, buffer_list = self._check_batch(keys, slots, buffers, writable=True)
        if not key_list:
            return []
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
        """The blocking body of `read` (runs in the executor)."""
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
            if _checksum(stored) != record.checksum:
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
        """Verify every index record against the slab files: slot in range, no slot shared by
        two records, a sane length and codec, a file long enough, the checksum of the stored
        bytes, and that they decode. With `repair`, drop the bad records (durably).

        Blocking; meant for `kvtier check`, tools and tests; run it with no batch in flight
        (an overlapping write could be reported as a problem). See also `acheck`."""
        self._check_open()
        index = self._open_index
        with self._index_lock:
            problems: list[CheckProblem] = []
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
            scratch = _staging(2 * self.block_size).reshape(2, self.block_size)
            for slot in sorted(by_slot):
                entries = sorted(by_slot[slot], key=lambda entry: entry[1].seq)
                newest_key, newest = entries[-1]
                for key, _ in entries[:-1]:
                    shared = f"slot also claimed by the newer record of {newest_key.hex()}"
                    problems.append(CheckProblem(key, slot, shared))
                what = self._check_record(newest, scratch[0], scratch[1])
                if what is not None:
                    problems.append(CheckProblem(newest_key, slot, what))
            repaired = 0
            if repair and problems:
                bad = list(dict.fromkeys(problem.key for problem in problems))
                index.delete(bad)
                self._drop_from_memory(bad)
                repaired = len(bad)
        return CheckReport(examined, tuple(problems), repaired)

    def _check_record(self, record: IndexRecord, raw: HostBuffer, block: HostBuffer) -> str | None:
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
        actual = _checksum(stored)
        if actual != record.checksum:
            return f"checksum mismatch: indexed {record.checksum:016x}, stored {actual:016x}"
        try:
            self._codec.decode_into(record.codec, stored, block)
        except CodecError as error:
            return f"does not decode: {error}"
        return None

    async def acheck(self, repair: bool = False) -> CheckReport:
        """`check()` in the store's executor."""
        return await self._run(functools.partial(self.check, repair))
