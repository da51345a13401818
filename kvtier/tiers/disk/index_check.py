"""Is a disk store's LMDB index safe to map? Checked before the store opens it.

LMDB maps its file and trusts it: a truncated `data.mdb`, or one with damaged pages, makes
the process that reads it die of SIGBUS (or SIGSEGV), which no `try` can catch. So before a
store maps its index:

1. `lmdb_file_problem` reads the two meta pages with plain file I/O and checks them (magic,
   version, page size, the last page and the roots inside the file). This catches a
   truncated or overwritten file, the common damage, for the cost of two small reads.
2. An index that was closed cleanly carries a stamp (`CLEAN_STAMP`: its size and xxh3-64,
   written after the last commit of a clean close). When the file still matches its stamp it
   is the file this store wrote and checked, and is opened at once.
3. Otherwise (a killed process, a copied or edited file) `probe_index` walks every record in
   a child process (`index_probe.py`): if that process dies of a signal, LMDB refuses the
   file, or records are malformed, the index is damaged.

A damaged index is moved aside (`move_aside`) and rebuilt from the slab headers; it is never
written further. What can still happen: damage done to the file while it is open (by
another program or the hardware) is found only at the next open; the checksums that bind
every block to its key keep it from serving wrong bytes meanwhile.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import xxhash

from kvtier.keys import OffloadKey

DATA_FILE = "data.mdb"
"""LMDB's data file in an index directory."""

CLEAN_STAMP = "clean"
"""The clean-close stamp, next to `data.mdb`."""

RECORDS_SNAPSHOT = "records.bin"
"""Every packed record of the index in key order, written at a clean close next to the stamp
(which records its digest): the next open reads it in one call instead of walking the index."""

PROBE_TIMEOUT_S = 120.0
"""The longest a probe may walk an index before it is declared damaged (a cycle of pages
could make the walk endless)."""

_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_VERSION = 1
_PAGE_HEADER = 16  # pgno (8), pad (2), flags (2), lower/upper (4)
_P_META = 0x08
_NO_PAGE = (1 << 64) - 1
_META = struct.Struct("<IIQQ" + "IHHQQQQQ" * 2 + "QQ")
_PROBE_SCRIPT = Path(__file__).with_name("index_probe.py")
LMDB_HOME_ENV = "KVTIER_PROBE_LMDB_HOME"
"""Where the probe finds lmdb: the folder that holds the lmdb this process imports. The probe
runs isolated (`python -I`: no PYTHONPATH, no user site, not the working directory), so an
lmdb found through PYTHONPATH or a `pip install --target` folder would be missing there."""


def _read_meta(data: bytes, offset: int) -> tuple[int, int, int, tuple[int, int]] | None:
    """(page size, last page, txn id, (free root, main root)) of the meta page at `offset`,
    or None when it is not a valid meta page."""
    if len(data) < offset + _PAGE_HEADER + _META.size:
        return None
    flags = struct.unpack_from("<H", data, offset + 10)[0]
    if not flags & _P_META:
        return None
    fields = _META.unpack_from(data, offset + _PAGE_HEADER)
    magic, version = fields[0], fields[1]
    free_pad, free_root, main_root = fields[4], fields[11], fields[19]
    last_page, txn_id = fields[20], fields[21]
    if magic != _LMDB_MAGIC or version != _LMDB_VERSION:
        return None
    return free_pad, last_page, txn_id, (free_root, main_root)


def lmdb_file_problem(path: Path) -> str | None:
    """What makes the LMDB data file at `path` unsafe to map, or None when its meta pages
    are sound and everything they point at is inside the file."""
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            head = file.read(_PAGE_HEADER + _META.size)
            first = _read_meta(head, 0)
            if first is None:
                return "the first meta page is not an LMDB meta page"
            page_size = first[0]
            if page_size < 512 or page_size > 65536 or page_size & (page_size - 1):
                return f"impossible page size {page_size}"
            file.seek(page_size)
            second = _read_meta(file.read(_PAGE_HEADER + _META.size), 0)
    except OSError as error:
        return f"cannot read it: {error}"
    if second is None:
        return "the second meta page is not an LMDB meta page"
    if size < 2 * page_size:
        return f"{size} bytes, shorter than its two meta pages"
    for name, meta in (("first", first), ("second", second)):
        _, last_page, _, roots = meta
        if (last_page + 1) * page_size > size:
            return (
                f"the {name} meta page ends the data at byte {(last_page + 1) * page_size}, "
                f"but the file has {size} bytes (truncated?)"
            )
        for root in roots:
            if root != _NO_PAGE and not 2 <= root <= last_page:
                return f"the {name} meta page has a root page {root} outside [2, {last_page}]"
    return None


def _used_bytes(file: BinaryIO, size: int) -> int:
    """How many bytes at the start of an LMDB data file its meta pages say are in use (the
    rest is preallocated space LMDB never reads); `size` when they cannot be read."""
    head = file.read(_PAGE_HEADER + _META.size)
    first = _read_meta(head, 0)
    if first is None or first[0] < 512 or first[0] & (first[0] - 1):
        return size
    page_size = first[0]
    file.seek(page_size)
    second = _read_meta(file.read(_PAGE_HEADER + _META.size), 0)
    if second is None:
        return size
    return min(size, (max(first[1], second[1]) + 1) * page_size)


def _file_digest(path: Path) -> tuple[int, int]:
    """(size, xxh3-64 of its used pages) of an LMDB data file: the pages its meta pages
    reach (LMDB reads nothing beyond them), so a large preallocated index is not read whole
    at every open and close."""
    digest = xxhash.xxh3_64()
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        left = _used_bytes(file, size)
        file.seek(0)
        while left > 0 and (chunk := file.read(min(left, 8 << 20))):
            digest.update(chunk)
            left -= len(chunk)
    return size, digest.intdigest()


def write_clean_stamp(index_dir: Path, records: tuple[bytes, int] | None = None) -> None:
    """Stamp the index as closed cleanly (call after its last commit and close); with
    `records` (its packed records joined in key order, and how many), write them as the
    records snapshot, its digest in the stamp."""
    size, digest = _file_digest(index_dir / DATA_FILE)
    recorded: dict[str, Any] = {"size": size, "xxh3": digest}
    if records is not None:
        raw, count = records
        snapshot = index_dir / RECORDS_SNAPSHOT
        temporary = snapshot.with_suffix(".tmp")
        temporary.write_bytes(raw)
        os.replace(temporary, snapshot)
        recorded["records"] = {"count": count, "xxh3": xxhash.xxh3_64_intdigest(raw)}
    stamp = index_dir / CLEAN_STAMP
    temporary = stamp.with_suffix(".tmp")
    temporary.write_text(json.dumps(recorded))
    os.replace(temporary, stamp)


def take_records_snapshot(
    index_dir: Path, stamp: dict[str, Any], keep: bool = False
) -> tuple[bytes, int] | None:
    """The records snapshot of a clean close whose `stamp` the index matched (packed records
    joined, count), or None when there is none or it does not match its digest. Removed
    either way, unless `keep`."""
    path = index_dir / RECORDS_SNAPSHOT
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    finally:
        if not keep:
            with contextlib.suppress(OSError):
                path.unlink()
    recorded = stamp.get("records")
    if not isinstance(recorded, dict) or recorded.get("xxh3") != xxhash.xxh3_64_intdigest(raw):
        return None
    count = recorded.get("count")
    return (raw, count) if isinstance(count, int) else None


def take_clean_stamp(index_dir: Path, keep: bool = False) -> dict[str, Any] | None:
    """The clean-close stamp when the index still matches it, else None; the stamp is
    removed either way (the index is about to be written), unless `keep` (it is only to be
    read)."""
    stamp = index_dir / CLEAN_STAMP
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    finally:
        if not keep:
            with contextlib.suppress(OSError):
                stamp.unlink()
    if not isinstance(recorded, dict):
        return None
    try:
        found = _file_digest(index_dir / DATA_FILE)
    except OSError:
        return None
    return recorded if found == (recorded.get("size"), recorded.get("xxh3")) else None


def _lmdb_home() -> str:
    """The folder holding the lmdb package this process imports ("" when there is none)."""
    spec = importlib.util.find_spec("lmdb")
    if spec is None or spec.origin is None:
        return ""
    origin = Path(spec.origin)
    return str(origin.parent.parent if origin.name == "__init__.py" else origin.parent)


def probe_index(
    index_dir: Path,
    record_bytes: int,
    max_key_bytes: int,
    timeout_s: float = PROBE_TIMEOUT_S,
    records_out: Path | None = None,
) -> str | None:
    """Walk every record of the index in a child process; what is wrong with it, or None
    when every record was read and is well formed (then, with `records_out`, the child has
    written every packed record there, joined in key order, and the keys next to it, at
    that path + `PROBED_KEYS_SUFFIX`: `ProbedKeys`)."""
    command = [
        sys.executable,
        "-I",
        str(_PROBE_SCRIPT),
        str(index_dir),
        str(record_bytes),
        str(max_key_bytes),
    ]
    if records_out is not None:
        command.append(str(records_out))
    env = {**os.environ, LMDB_HOME_ENV: _lmdb_home()}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"walking the index took longer than {timeout_s:.0f} s"
    except OSError as error:
        return f"cannot start the index probe: {error}"
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return f"reading the index killed a process with {name}"
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"the index probe failed: {done.stderr.strip()[-300:] or done.returncode}"
    if not isinstance(answer, dict):
        return f"the index probe answered {answer!r}"
    if "error" in answer:
        return f"LMDB refuses the index: {answer['error']}"
    if answer.get("bad"):
        return f"{answer['bad']} of {answer.get('records')} index records are malformed"
    return None


PROBED_KEYS_SUFFIX = ".keys"
"""Appended to the probe's records path: where it writes the keys (index_probe.KEYS_SUFFIX)."""


class ProbedKeys:
    """The keys the probe's walk wrote, in key order, mapped read-only from its file (page
    cache, not process memory): their positions answered without walking the index again in
    the serving process."""

    def __init__(self, mapped: bytes | mmap.mmap, count: int) -> None:
        self._mapped = mapped
        self._sizes = np.frombuffer(mapped, dtype=np.uint8, count=count)

    @classmethod
    def open(cls, path: Path, count: int) -> ProbedKeys:
        """The probe's keys file at `path`, of `count` keys (their sizes, one byte each,
        then the keys joined); ValueError when it does not hold `count` keys of sizes >= 1,
        OSError when it cannot be read. The file may be removed afterwards."""
        with path.open("rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                return cls(b"", 0) if count == 0 else cls._malformed("empty")
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        if len(mapped) < count:
            return cls._malformed("shorter than their sizes")
        keys = cls(mapped, count)
        if count and int(keys._sizes.min()) < 1:
            return cls._malformed("a key of size 0")
        if len(mapped) != count + int(keys._sizes.sum(dtype=np.int64)):
            return cls._malformed("of the wrong length")
        return keys

    @staticmethod
    def _malformed(why: str) -> ProbedKeys:
        raise ValueError(f"probed keys: {why}")

    def keys_at(self, positions: Iterable[int]) -> dict[int, OffloadKey]:
        """The keys at these positions of the key order (as `BlockIndex.keys_at`); in
        position order, each start summed from the previous one (no array per key)."""
        found: dict[int, OffloadKey] = {}
        sizes = self._sizes
        at, start = 0, len(sizes)  # key 0 starts right after the sizes
        for position in sorted(set(positions)):
            if not 0 <= position < len(sizes):
                continue
            start += int(sizes[at:position].sum(dtype=np.int64))
            end = start + int(sizes[position])
            found[position] = OffloadKey(bytes(self._mapped[start:end]))
            at = position
        return found


def move_aside(index_dir: Path) -> Path:
    """Rename a damaged index directory out of the way (kept for inspection), returning its
    new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        suffix = f".damaged-{stamp}" + (f"-{attempt}" if attempt else "")
        target = index_dir.with_name(index_dir.name + suffix)
        if not target.exists():
            os.rename(index_dir, target)
            return target
    raise FileExistsError(f"no free name to move {index_dir} aside")
