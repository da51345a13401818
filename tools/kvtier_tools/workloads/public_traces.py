"""Read public cache traces of other kinds (block I/O, web, key-value) as key sequences.

kvtier's policies were tuned on LLM conversation traces; these traces check that they hold up
on workloads they were never tuned on (`kvtier_tools.bench.policy_traces --trace-dir DIR`). None of
them ships with kvtier (their licences and sizes differ): `docs/BENCHMARKS.md` says where
each comes from, under which licence, and how to fetch it. This module only parses a file
the user gives.

A trace is a sequence of keys, one per access (each access reads one unit-size object: a
disk block, a web object, a key). Formats (`FORMATS`):
  - `lines`: text, the first field of each line (fields split on commas or blanks) is the
    key; blank lines and lines starting with `#` are skipped;
  - `csv:COLUMN`: text with a header line; the key is the named column's value;
  - `u32be` / `i32be` / `i64be`: binary, one big-endian integer per access (the format of the
    Caffeine simulator's bundled traces: cache2k, CloudPhysics, Scarab, Corda);
  - `oracle`: libCacheSim's `oracleGeneral` binary (24-byte little-endian records: u32 time,
    u64 object id, u32 size, i64 next access), the format of the cacheMon cache datasets;
  - `arc`: the ARC paper's traces (Megiddo & Modha, FAST 2003: OLTP, P1-P14, DS1, S1-S3):
    text, one request a line, `start_block number_of_blocks ignored request_number`; a
    request reads its blocks `start_block` to `start_block + number_of_blocks - 1`, one
    access each (512-byte blocks).
Text keys that are decimal integers become ints (as `kvtier_tools.workloads.traces.read_keys`
does). Any file may be compressed with gzip, xz, bzip2 or zstd (recognized by its magic
bytes, whatever its name).

`KNOWN` names the public traces the benchmark table uses, by file name, so that a directory
holding them (`--trace-dir`) is read without per-file flags; a known trace may also be kept
compressed under its name plus `.zst`, `.gz`, `.xz` or `.bz2` (`OLTP.lis.zst`), and each
says where to fetch it (`PublicTrace.source`).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import lzma
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import zstandard

from kvtier.errors import TraceFormatError

FORMATS = ("lines", "csv:COLUMN", "u32be", "i32be", "i64be", "oracle", "arc")
"""The formats `read_trace` parses (`csv:` takes a column name)."""

_BINARY: dict[str, tuple[str, int]] = {  # format -> (struct code of one record, its key index)
    "u32be": (">I", 0),
    "i32be": (">i", 0),
    "i64be": (">q", 0),
    "oracle": ("<IQIq", 1),
}
_INT = re.compile(r"-?[0-9]+")
_SPLIT = re.compile(r"[,\s]+")
_READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class PublicTrace:
    """A public trace the benchmark knows by its file name."""

    name: str
    """The workload's name in the table."""
    kind: str
    """block I/O, web or key-value."""
    format: str
    """One of `FORMATS`."""
    what: str
    """What the trace records, and where it comes from."""
    source: str
    """A URL to fetch it from (a pinned commit of a public repository)."""


_CAFFEINE = (
    "https://raw.githubusercontent.com/ben-manes/caffeine/ccef95542a9181182a60f5c6c33d2a0642c73574"
    "/simulator/src/main/resources/com/github/benmanes/caffeine/cache/simulator/parser/"
)
_LIBCACHESIM = "https://raw.githubusercontent.com/1a1a11a/libCacheSim/aa0fc40914b2b786f4b9f4dafb099f8f332b216a/"
_ARC = (  # moka-rs/cache-trace, the ARC paper's traces (cite the paper: its condition of use)
    "https://raw.githubusercontent.com/moka-rs/cache-trace/ef0a9de8cf0202a1f2fee186a0af497774b0f0a9/arc/"
)

KNOWN: dict[str, PublicTrace] = {
    "cloudPhysicsIO.txt": PublicTrace(
        "cloudphysics",
        "block I/O",
        "lines",
        "a VM's disk block reads and writes (CloudPhysics, libCacheSim's data/)",
        _LIBCACHESIM + "data/cloudPhysicsIO.txt",
    ),
    "w106.trace.xz": PublicTrace(
        "w106",
        "block I/O",
        "u32be",
        "CloudPhysics VM disk trace w106 (Caffeine simulator's bundled traces)",
        _CAFFEINE + "cloud_physics/w106.trace.xz",
    ),
    "web12.trace.xz": PublicTrace(
        "web12",
        "web",
        "i32be",
        "HTTP requests' object accesses of an e-commerce product page, December 2013 "
        "(cache2k traces, Caffeine simulator)",
        _CAFFEINE + "cache2k/web12.trace.xz",
    ),
    "scarab-recs.trace.xz": PublicTrace(
        "scarab",
        "key-value",
        "i64be",
        "key lookups of a product-recommendation service (Scarab Research, Caffeine simulator)",
        _CAFFEINE + "scarab/scarab-recs.trace.xz",
    ),
    "orm-busy.trace.xz": PublicTrace(
        "orm-busy",
        "key-value",
        "i32be",
        "database object cache of an e-commerce web application, busy daytime (cache2k "
        "traces, Caffeine simulator)",
        _CAFFEINE + "cache2k/orm-busy.trace.xz",
    ),
    "sprite.trace.gz": PublicTrace(
        "sprite",
        "block I/O",
        "lines",
        "two days of requests to the Sprite network file system's server (the LIRS paper's "
        "traces, Jiang & Zhang SIGMETRICS 2002; Caffeine simulator)",
        _CAFFEINE + "lirs/sprite.trace.gz",
    ),
    "OLTP.lis": PublicTrace(
        "oltp",
        "block I/O",
        "arc",
        "an hour of page references to a CODASYL database (OLTP; the ARC paper's traces, "
        "Megiddo & Modha FAST 2003)",
        _ARC + "OLTP.lis.zst",
    ),
    **{
        f"P{n}.lis": PublicTrace(
            f"p{n}",
            "block I/O",
            "arc",
            f"disk reads of a Windows NT workstation, P{n} (Vtrace; the ARC paper's traces)",
            _ARC + f"P{n}.lis.zst",
        )
        for n in range(1, 15)
    },
    "DS1.lis": PublicTrace(
        "ds1",
        "block I/O",
        "arc",
        "seven days of a database server running an ERP application (the ARC paper's DS1)",
        _ARC + "DS1.lis.zst",
    ),
    **{
        f"S{n}.lis": PublicTrace(
            f"s{n}",
            "block I/O",
            "arc",
            f"disk reads of a commercial web search engine, S{n} (the ARC paper's traces)",
            _ARC + f"S{n}.lis.zst",
        )
        for n in (1, 2, 3)
    },
}
"""Public traces by file name (see docs/BENCHMARKS.md for sources and licences)."""


def read_trace(path: str | os.PathLike[str], fmt: str) -> list[int | str]:
    """The keys of trace `path` in format `fmt` (see the module doc), one per access.

    Raises TraceFormatError naming the file on a missing file, an unknown format, a bad
    record (a truncated binary record, a missing column) or a corrupt compressed stream.
    """
    source = Path(path)
    if not source.is_file():
        raise TraceFormatError(f"{source}: no such file")
    if fmt not in _BINARY and fmt not in ("lines", "arc") and not fmt.startswith("csv:"):
        raise TraceFormatError(f"{source}: unknown trace format {fmt!r}; valid: {FORMATS}")
    try:
        with _open_decompressed(source) as stream:
            if fmt in _BINARY:
                return _binary_keys(source, stream, *_BINARY[fmt])
            text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
            if fmt == "lines":
                return list(_line_keys(text))
            if fmt == "arc":
                return _arc_keys(source, text)
            return _csv_keys(source, text, fmt.removeprefix("csv:"))
    except (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError) as error:
        raise TraceFormatError(f"{source}: cannot read: {error}") from error


COMPRESSED_SUFFIXES = ("", ".zst", ".gz", ".xz", ".bz2")
"""A known trace's file is its name plus one of these (read by magic bytes either way)."""


def known_traces(directory: str | os.PathLike[str]) -> list[tuple[PublicTrace, Path]]:
    """The `KNOWN` traces present in `directory`, in `KNOWN`'s order (each under its name or
    its name plus a `COMPRESSED_SUFFIXES` suffix, the first found)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise TraceFormatError(f"{folder}: not a directory")
    found: list[tuple[PublicTrace, Path]] = []
    for name, trace in KNOWN.items():
        paths = [folder / (name + suffix) for suffix in COMPRESSED_SUFFIXES]
        found += [(trace, path) for path in paths if path.is_file()][:1]
    return found


def missing_trace_hint(name: str, directory: str | os.PathLike[str] | None) -> str:
    """One line saying where the `KNOWN` trace named `name` (its workload name) was looked
    for and how to fetch it; "" if no known trace has that name."""
    for file_name, trace in KNOWN.items():
        if trace.name == name:
            where = f"in {directory}" if directory is not None else "(no --trace-dir)"
            return (
                f"{name}: {file_name} not found {where}; fetch it into the trace folder: "
                f"curl -LO {trace.source}"
            )
    return ""


# -- implementation ------------------------------------------------------------------------


def _open_decompressed(source: Path) -> IO[bytes]:
    """`source` opened for reading, decompressed on the fly by its magic bytes."""
    raw = source.open("rb")
    magic = raw.peek(6)[:6]
    if magic.startswith(b"\x1f\x8b"):
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw))
    if magic.startswith(b"\xfd7zXZ\x00"):
        return cast(IO[bytes], lzma.LZMAFile(raw))
    if magic.startswith(b"BZh"):
        return cast(IO[bytes], bz2.BZ2File(raw))
    if magic.startswith(b"\x28\xb5\x2f\xfd"):
        return cast(IO[bytes], zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return raw


def _key(text: str) -> int | str:
    return int(text) if _INT.fullmatch(text) else text


def _line_keys(text: IO[str]) -> Iterator[int | str]:
    for line in text:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield _key(_SPLIT.split(stripped, maxsplit=1)[0])


def _csv_keys(source: Path, text: IO[str], column: str) -> list[int | str]:
    reader = csv.reader(text)
    header = [name.strip() for name in next(reader, [])]
    if column not in header:
        raise TraceFormatError(f"{source}:1: no column {column!r} in the header {header!r}")
    index = header.index(column)
    keys: list[int | str] = []
    for number, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) <= index:
            raise TraceFormatError(f"{source}:{number}: no field {column!r} in {row!r}")
        keys.append(_key(row[index].strip()))
    return keys


def _arc_keys(source: Path, text: IO[str]) -> list[int | str]:
    keys: list[int | str] = []
    for number, line in enumerate(text, start=1):
        fields = line.split()
        if not fields:
            continue
        try:
            start, count = int(fields[0]), int(fields[1])
        except (IndexError, ValueError):
            raise TraceFormatError(
                f"{source}:{number}: an ARC trace line is 'start_block number_of_blocks ...', "
                f"got {line.strip()!r}"
            ) from None
        if count < 1:
            raise TraceFormatError(f"{source}:{number}: number_of_blocks must be >= 1, got {count}")
        keys.extend(range(start, start + count))
    return keys


def _binary_keys(source: Path, stream: IO[bytes], code: str, index: int) -> list[int | str]:
    record = struct.Struct(code)
    keys: list[int | str] = []
    tail = b""
    while chunk := stream.read(_READ_CHUNK):
        data = tail + chunk
        usable = len(data) - len(data) % record.size
        keys.extend(fields[index] for fields in record.iter_unpack(data[:usable]))
        tail = data[usable:]
    if tail:
        raise TraceFormatError(
            f"{source}: ends inside a record ({len(tail)} of {record.size} bytes; truncated?)"
        )
    return keys
