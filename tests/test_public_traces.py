"""`kvtier_tools.workloads.public_traces`: every format and compression reads back the keys written,
and a bad file is refused with an error naming it."""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from kvtier.errors import TraceFormatError
from kvtier_tools.workloads.public_traces import (
    KNOWN,
    known_traces,
    missing_trace_hint,
    read_trace,
)

KEYS = [5, 3, 5, 2**31 - 1, 0, 3]

COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "plain": lambda data: data,
    "gzip": gzip.compress,
    "xz": lzma.compress,
    "bzip2": bz2.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


@pytest.mark.parametrize("compression", COMPRESSORS)
@pytest.mark.parametrize(
    ("fmt", "encode"),
    [
        ("u32be", lambda keys: b"".join(struct.pack(">I", key) for key in keys)),
        ("i32be", lambda keys: b"".join(struct.pack(">i", key) for key in keys)),
        ("i64be", lambda keys: b"".join(struct.pack(">q", key) for key in keys)),
        (
            "oracle",
            lambda keys: b"".join(
                struct.pack("<IQIq", t, key, 4096, -1) for t, key in enumerate(keys)
            ),
        ),
        ("lines", lambda keys: "".join(f"{key}\n" for key in keys).encode()),
        (
            "csv:lbn",
            lambda keys: (
                "version,time,op,size,lbn\n"
                + "".join(f"1,{t},2a,512,{key}\n" for t, key in enumerate(keys))
            ).encode(),
        ),
    ],
)
def test_every_format_and_compression_reads_back_the_keys(
    tmp_path: Path, compression: str, fmt: str, encode: Callable[[list[int]], bytes]
) -> None:
    path = tmp_path / "trace"
    path.write_bytes(COMPRESSORS[compression](encode(KEYS)))
    assert read_trace(path, fmt) == KEYS


def test_lines_take_the_first_field_skip_comments_and_keep_text_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_text("# a comment\n\n12 read 4096\nobj-a,GET\n-7\n  obj-a  \n")
    assert read_trace(path, "lines") == [12, "obj-a", -7, "obj-a"]


def test_a_truncated_binary_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cut.bin"
    path.write_bytes(struct.pack(">q", 1) + b"\x00\x01\x02")
    with pytest.raises(TraceFormatError, match=r"cut\.bin.*ends inside a record"):
        read_trace(path, "i64be")


def test_a_missing_column_or_field_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("time,key\n1,a\n2\n")
    with pytest.raises(TraceFormatError, match=r"t\.csv:1: no column 'lbn'"):
        read_trace(path, "csv:lbn")
    with pytest.raises(TraceFormatError, match=r"t\.csv:3: no field 'key'"):
        read_trace(path, "csv:key")


def test_unknown_format_missing_file_and_corrupt_stream_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        read_trace(tmp_path / "absent", "lines")
    path = tmp_path / "t"
    path.write_bytes(b"1\n")
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        read_trace(path, "u16le")
    corrupt = tmp_path / "corrupt.xz"
    corrupt.write_bytes(lzma.compress(b"1\n2\n" * 1000)[:40])
    with pytest.raises(TraceFormatError, match=r"corrupt\.xz: cannot read"):
        read_trace(corrupt, "lines")


def test_known_traces_are_found_by_file_name(tmp_path: Path) -> None:
    (tmp_path / "web12.trace.xz").write_bytes(lzma.compress(struct.pack(">i", 9)))
    (tmp_path / "unrelated.txt").write_text("1\n")
    found = known_traces(tmp_path)
    assert [(trace.name, path.name) for trace, path in found] == [("web12", "web12.trace.xz")]
    assert read_trace(found[0][1], found[0][0].format) == [9]
    assert {trace.kind for trace in KNOWN.values()} == {"block I/O", "web", "key-value"}
    with pytest.raises(TraceFormatError, match="not a directory"):
        known_traces(tmp_path / "web12.trace.xz")


def test_an_arc_trace_reads_each_request_as_its_run_of_blocks(tmp_path: Path) -> None:
    # the ARC paper's format: start_block number_of_blocks ignored request_number
    path = tmp_path / "OLTP.lis"
    path.write_bytes(
        zstandard.ZstdCompressor().compress(b"110765 3 0 0\n7 1 0 1\n\n110766 2 0 2\n")
    )
    assert read_trace(path, "arc") == [110765, 110766, 110767, 7, 110766, 110767]


@pytest.mark.parametrize("line", ["12\n", "a 2 0 0\n", "5 0 0 0\n"])
def test_a_bad_arc_line_is_refused_with_its_number(tmp_path: Path, line: str) -> None:
    path = tmp_path / "P3.lis"
    path.write_text("1 1 0 0\n" + line)
    with pytest.raises(TraceFormatError, match=r"P3\.lis:2: "):
        read_trace(path, "arc")


def test_a_known_trace_is_found_compressed_under_its_name_plus_a_suffix(tmp_path: Path) -> None:
    (tmp_path / "OLTP.lis.zst").write_bytes(zstandard.ZstdCompressor().compress(b"4 2 0 0\n"))
    found = known_traces(tmp_path)
    assert [(trace.name, path.name) for trace, path in found] == [("oltp", "OLTP.lis.zst")]
    assert read_trace(found[0][1], found[0][0].format) == [4, 5]


def test_a_missing_known_trace_says_in_one_line_where_to_fetch_it(tmp_path: Path) -> None:
    hint = missing_trace_hint("oltp", tmp_path)
    assert "\n" not in hint and "OLTP.lis" in hint and str(tmp_path) in hint
    assert "curl -LO https://raw.githubusercontent.com/moka-rs/cache-trace/" in hint
    assert missing_trace_hint("no-such-trace", tmp_path) == ""
    assert all(trace.source.startswith("https://") for trace in KNOWN.values())
