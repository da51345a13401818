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
    u64 object id, u32 size, i64 next access), the format of the cacheMon cache datasets.
Text keys that are decimal integers become ints (as `kvtier_tools.workloads.traces.read_keys`
does). Any file may be compressed with gzip, xz, bzip2 or zstd (recognized by its magic
bytes, whatever its name).

`KNOWN` names the public traces the benchmark table uses, by file name, so that a directory
holding them (`--trace-dir`) is read without per-file flags.
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

FORMATS = ("lines", "csv:COLUMN", "u32be", "i32be", "i64be", "oracle")
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


KNOWN: dict[str, PublicTrace] = {
    "cloudPhysicsIO.txt": PublicTrace(
        "cloudphysics",
        "block I/O",
        "lines",
        "a VM's disk block reads and writes (CloudPhysics, libCacheSim's data/)",
    ),
    "w106.trace.xz": PublicTrace(
        "w106",
        "block I/O",
        "u32be",
        "CloudPhysics VM disk trace w106 (Caffeine simulator's bundled traces)",
    ),
    "web12.trace.xz": PublicTrace(
        "web12",
        "web",
        "i32be",
        "HTTP requests' object accesses of an e-commerce product page, December 2013 "
        "(cache2k traces, Caffeine simulator)",
    ),
    "scarab-recs.trace.xz": PublicTrace(
        "scarab",
        "key-value",
        "i64be",
        "key lookups of a product-recommendation service (Scarab Research, Caffeine simulator)",
    ),
    "orm-busy.trace.xz": PublicTrace(
        "orm-busy",
        "key-value",
        "i32be",
        "database object cache of an e-commerce web application, busy daytime (cache2k "
        "traces, Caffeine simulator)",
    ),
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
    if fmt not in _BINARY and fmt != "lines" and not fmt.startswith("csv:"):
        raise TraceFormatError(f"{source}: unknown trace format {fmt!r}; valid: {FORMATS}")
    try:
        with _open_decompressed(source) as stream:
            if fmt in _BINARY:
                return _binary_keys(source, stream, *_BINARY[fmt])
            text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
            if fmt == "lines":
                return list(_line_keys(text))
            return _csv_keys(source, text, fmt.removeprefix("csv:"))
    except (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError) as error:
        raise TraceFormatError(f"{source}: cannot read: {error}") from error


def known_traces(directory: str | os.PathLike[str]) -> list[tuple[PublicTrace, Path]]:
    """The `KNOWN` traces present in `directory`, in `KNOWN`'s order."""
    folder = Path(directory)
    if not folder.is_dir():
        raise TraceFormatError(f"{folder}: not a directory")
    return [(trace, folder / name) for name, trace in KNOWN.items() if (folder / name).is_file()]


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
