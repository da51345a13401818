"""Read request traces: Mooncake JSONL traces (plain or zstd-compressed) and plain key lists.

A Mooncake trace (Qin et al., FAST 2025) has one JSON object per line, one line per request:
`{"timestamp": <ms>, "input_length": <tokens>, "output_length": <tokens>, "hash_ids": [...]}`,
where each hash id names one 512-token prefix block. kvtier's agentic traces
(`kvtier_tools.workloads.agentic`) add three optional keys, which other readers ignore:
`"session"` (a non-empty string), `"parent_session"` (a string) and `"session_end"` (a bool:
the session ends once the request is served). kvtier ships the published conversation
trace (see `tools/kvtier_tools/workloads/data/NOTICE.md`); `read_mooncake()` with no
argument reads it.

Every line is validated: a bad line raises `TraceFormatError` with the message
`<file>:<line>: <what is wrong>` (lines counted from 1), so a user can fix the file directly.
A replay over a silently skipped or misread line would report a wrong hit ratio instead.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import zstandard

from kvtier.errors import TraceFormatError

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per block in a Mooncake trace: `len(hash_ids) == ceil(input_length / 512)`."""

SHIPPED_TRACE_NAME = "mooncake_fast25_conversation_trace.jsonl.zst"
"""File name of the trace shipped in `tools/kvtier_tools/workloads/data`."""

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_INT_FIELDS = ("timestamp", "input_length", "output_length")
_INT_KEY = re.compile(r"-?[0-9]+")
_SHOWN_CHARS = 60
_READ_CHUNK = 1 << 20


REFERENCE_FRACTIONS = (0.01, 0.05, 0.10, 0.25, 0.50)

# Reference hit ratios of the shipped conversation trace (data/NOTICE.md, computed
# independently with libCacheSim): fraction -> (LRU, ARC).
REFERENCE_HIT_RATIOS: dict[float, tuple[float, float]] = {
    0.01: (0.052270, 0.064562),
    0.05: (0.195432, 0.210118),
    0.10: (0.278416, 0.284250),
    0.25: (0.353477, 0.335473),
    0.50: (0.363116, 0.362679),
}
REFERENCE_INFINITE_HIT_RATIO = 0.366412
"""The shipped trace's hit ratio with an infinite cache (every block's first access misses)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a Mooncake trace: arrival time, token counts and its prefix blocks."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session: str | None = None
    """The agentic session the request belongs to (the optional `"session"` key)."""
    parent_session: str | None = None
    """A sub-agent's parent session (the optional `"parent_session"` key)."""
    session_end: bool = False
    """The session ends once this request is served (the optional `"session_end"` key)."""


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Size of a trace and the best hit ratio any cache could reach on it."""

    requests: int
    block_accesses: int
    unique_blocks: int

    @property
    def infinite_cache_hit_ratio(self) -> float:
        """Hit ratio of a cache that never evicts: every access but each block's first hits."""
        if not self.block_accesses:
            return 0.0
        return (self.block_accesses - self.unique_blocks) / self.block_accesses


def shipped_trace_path() -> Path:
    """Path of the Mooncake conversation trace shipped with kvtier (zstd-compressed JSONL)."""
    return Path(__file__).resolve().parent / "data" / SHIPPED_TRACE_NAME


def read_mooncake(path: str | os.PathLike[str] | None = None) -> Iterator[TraceRequest]:
    """The requests of the Mooncake trace at `path` (default: the shipped trace), in order.

    The file may be plain JSONL or zstd-compressed (recognized by its magic bytes, whatever
    its name). Blank lines are skipped. A missing file raises TraceFormatError at once; a
    malformed line raises it when iteration reaches that line.
    """
    source = shipped_trace_path() if path is None else Path(path)
    _check_readable(source)
    return _iter_mooncake(source)


def read_block_accesses(path: str | os.PathLike[str] | None = None) -> list[int]:
    """The block-access sequence of a Mooncake trace: each request's hash ids, left to right.

    This is what `kvtier.policies.simulate` replays (one access per block, in file order).
    """
    return block_accesses(read_mooncake(path))


def block_accesses(requests: Iterable[TraceRequest]) -> list[int]:
    """Flatten `requests` into their block accesses, request by request, left to right."""
    accesses: list[int] = []
    extend = accesses.extend
    for request in requests:
        extend(request.hash_ids)
    return accesses


def trace_stats(requests: Iterable[TraceRequest]) -> TraceStats:
    """Count the requests, block accesses and distinct blocks of `requests`."""
    count = 0
    accesses = 0
    unique: set[int] = set()
    for request in requests:
        count += 1
        accesses += len(request.hash_ids)
        unique.update(request.hash_ids)
    return TraceStats(requests=count, block_accesses=accesses, unique_blocks=len(unique))


def read_keys(path: str | os.PathLike[str]) -> Iterator[int | str]:
    """The keys of a plain key file, one per line (plain or zstd-compressed).

    A line that is an optionally negative decimal integer gives an int, any other line its
    stripped text. Blank lines and lines whose first non-blank character is `#` are skipped
    (a `#` later in a line is part of the key). A missing file raises TraceFormatError at once.
    """
    source = Path(path)
    _check_readable(source)
    return _iter_keys(source)


# -- implementation ------------------------------------------------------------------------


def _check_readable(source: Path) -> None:
    """Fail early, with a kvtier error naming the file, when `source` cannot be read."""
    if not source.exists():
        raise TraceFormatError(f"{source}: no such file")
    if not source.is_file():
        raise TraceFormatError(f"{source}: not a regular file")


def _numbered_lines(source: Path) -> Iterator[tuple[int, bytes]]:
    """Each line of `source` with its 1-based number, decompressed on the fly if it is zstd.

    I/O and decompression errors (a corrupt or truncated file) raise TraceFormatError naming
    the file and the line being read.
    """
    try:
        raw = source.open("rb")
    except OSError as error:
        raise TraceFormatError(f"{source}: cannot open: {error.strerror or error}") from error
    with raw:
        is_zstd = raw.peek(len(_ZSTD_MAGIC))[: len(_ZSTD_MAGIC)] == _ZSTD_MAGIC
        lines = _zstd_lines(raw) if is_zstd else iter(raw)
        number = 0
        try:
            for number, line in enumerate(lines, start=1):
                yield number, line
        except (OSError, zstandard.ZstdError) as error:
            raise TraceFormatError(f"{source}:{number + 1}: cannot read: {error}") from error


def _zstd_lines(compressed: IO[bytes]) -> Iterator[bytes]:
    """The lines (without their newline) of a zstd stream of one or more frames.

    Unlike zstandard's stream reader, this notices a stream that ends inside a frame (a
    truncated download), which would otherwise read as a shorter but plausible trace.
    """
    decompressor = zstandard.ZstdDecompressor()
    frame = decompressor.decompressobj()
    in_frame = False
    tail = b""
    while chunk := compressed.read(_READ_CHUNK):
        while chunk:
            data = frame.decompress(chunk)
            chunk = b""
            in_frame = not frame.eof
            if frame.eof:  # the frame is complete; what follows it starts another one
                chunk = frame.unused_data
                frame = decompressor.decompressobj()
            if data:
                lines = (tail + data).split(b"\n")
                tail = lines.pop()
                yield from lines
    if in_frame:
        raise zstandard.ZstdError("the file ends inside a zstd frame (truncated?)")
    if tail:
        yield tail


def _iter_mooncake(source: Path) -> Iterator[TraceRequest]:
    for number, line in _numbered_lines(source):
        if not line.strip():
            continue
        yield _parse_mooncake_line(line, source, number)


def _parse_mooncake_line(line: bytes, source: Path, number: int) -> TraceRequest:
    """Parse and validate one non-blank line of a Mooncake trace."""

    def fail(problem: str) -> TraceFormatError:
        return TraceFormatError(f"{source}:{number}: {problem}")

    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise fail(f"invalid JSON: {error.msg} at column {error.colno}") from None
    except UnicodeDecodeError:
        raise fail("not valid UTF-8 text") from None
    if not isinstance(record, dict):
        raise fail(f"expected a JSON object, got {_show(record)}")
    for field in (*_INT_FIELDS, "hash_ids"):
        if field not in record:
            raise fail(f'missing key "{field}"')
    for field in _INT_FIELDS:
        value = record[field]
        # `type(...) is int` rejects bool (and float), which isinstance(..., int) would not.
        if type(value) is not int or value < 0:
            raise fail(f'"{field}" must be a non-negative integer, got {_show(value)}')
    input_length: int = record["input_length"]
    hash_ids = record["hash_ids"]
    if type(hash_ids) is not list:
        raise fail(f'"hash_ids" must be a list of non-negative integers, got {_show(hash_ids)}')
    for index, hash_id in enumerate(hash_ids):
        if type(hash_id) is not int or hash_id < 0:
            raise fail(
                f'"hash_ids" must be a list of non-negative integers, '
                f"got {_show(hash_id)} at index {index}"
            )
    expected = -(-input_length // MOONCAKE_BLOCK_TOKENS)
    if len(hash_ids) != expected:
        raise fail(
            f'"hash_ids" has {len(hash_ids)} ids, but "input_length" {input_length} needs '
            f"ceil({input_length} / {MOONCAKE_BLOCK_TOKENS}) = {expected}"
        )
    session, parent, end = _session_fields(record, fail)
    return TraceRequest(
        record["timestamp"],
        input_length,
        record["output_length"],
        tuple(hash_ids),
        session=session,
        parent_session=parent,
        session_end=end,
    )


def _session_fields(
    record: dict[str, Any], fail: Callable[[str], TraceFormatError]
) -> tuple[str | None, str | None, bool]:
    """The optional session keys of a line: `"session"`, `"parent_session"`, `"session_end"`."""
    session = record.get("session")
    parent = record.get("parent_session")
    end = record.get("session_end", False)
    for name, value in (("session", session), ("parent_session", parent)):
        if value is not None and (type(value) is not str or not value):
            raise fail(f'"{name}" must be a non-empty string, got {_show(value)}')
    if type(end) is not bool:
        raise fail(f'"session_end" must be true or false, got {_show(end)}')
    if (parent is not None or end) and session is None:
        raise fail('"parent_session" and "session_end" need a "session"')
    return session, parent, end


def _iter_keys(source: Path) -> Iterator[int | str]:
    for number, line in _numbered_lines(source):
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise TraceFormatError(f"{source}:{number}: not valid UTF-8 text") from None
        if not text or text.startswith("#"):
            continue
        yield int(text) if _INT_KEY.fullmatch(text) else text


def _show(value: Any) -> str:
    """`value` as JSON, shortened, for an error message."""
    shown = json.dumps(value)
    if len(shown) > _SHOWN_CHARS:
        shown = shown[: _SHOWN_CHARS - 3] + "..."
    return shown
