"""Tests of kvtier_tools.workloads.traces: the shipped Mooncake trace, the JSONL reader and the key
reader."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import zstandard

from kvtier.errors import KvtierError, TraceFormatError
from kvtier_tools.workloads.traces import (
    MOONCAKE_BLOCK_TOKENS,
    TraceRequest,
    TraceStats,
    block_accesses,
    read_block_accesses,
    read_keys,
    read_mooncake,
    shipped_trace_path,
    trace_stats,
)

# sha256 of upstream FAST25-release/traces/conversation_trace.jsonl
# (tools/kvtier_tools/workloads/data/NOTICE.md).
SHIPPED_SHA256 = "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"

SMALL_TRACE = (
    '{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]}\n'
    "\n"
    '{"timestamp": 5, "input_length": 1025, "output_length": 0, "hash_ids": [0, 1, 2]}\n'
    "   \n"
    '{"timestamp": 9, "input_length": 0, "output_length": 3, "hash_ids": []}\n'
    '{"timestamp": 12, "input_length": 1, "output_length": 7, "hash_ids": [7], "extra": "ok"}\n'
)
SMALL_REQUESTS = [
    TraceRequest(timestamp_ms=0, input_length=1024, output_length=10, hash_ids=(0, 1)),
    TraceRequest(timestamp_ms=5, input_length=1025, output_length=0, hash_ids=(0, 1, 2)),
    TraceRequest(timestamp_ms=9, input_length=0, output_length=3, hash_ids=()),
    TraceRequest(timestamp_ms=12, input_length=1, output_length=7, hash_ids=(7,)),
]

GOOD_LINE = '{"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [3, 4]}'


def write(path: Path, text: str, *, compress: bool = False) -> Path:
    data = text.encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if compress else data)
    return path


# -- the shipped trace ---------------------------------------------------------------------


def test_shipped_trace_decompresses_to_the_upstream_bytes() -> None:
    path = shipped_trace_path()
    assert path.name == "mooncake_fast25_conversation_trace.jsonl.zst"
    with path.open("rb") as compressed:
        data = zstandard.ZstdDecompressor().stream_reader(compressed).read()
    assert len(data) == 3_029_533
    assert hashlib.sha256(data).hexdigest() == SHIPPED_SHA256


def test_shipped_trace_counts_match_the_published_figures() -> None:
    requests = list(read_mooncake())
    stats = trace_stats(requests)
    assert stats == TraceStats(requests=12_031, block_accesses=288_500, unique_blocks=182_790)
    assert round(stats.infinite_cache_hit_ratio, 6) == 0.366412
    assert requests[0] == TraceRequest(
        timestamp_ms=0, input_length=6758, output_length=500, hash_ids=tuple(range(14))
    )


def test_read_block_accesses_flattens_the_shipped_trace_in_order() -> None:
    accesses = read_block_accesses()
    assert len(accesses) == 288_500
    assert accesses[:16] == [*range(14), 0, 14]
    assert accesses == block_accesses(read_mooncake())


def test_shipped_notice_keeps_the_attribution() -> None:
    notice = (shipped_trace_path().parent / "NOTICE.md").read_text()
    for required in (
        "kvcache-ai/Mooncake",
        "3b5a594133958449a1feaf1c9e0fc1b553e34a28",
        "FAST25-release/traces/conversation_trace.jsonl",
        "Apache",
        SHIPPED_SHA256,
    ):
        assert required in notice


# -- reading Mooncake JSONL ------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "zstd"])
def test_small_trace_reads_the_same_plain_or_compressed(tmp_path: Path, compress: bool) -> None:
    path = write(tmp_path / "small.jsonl", SMALL_TRACE, compress=compress)
    assert list(read_mooncake(path)) == SMALL_REQUESTS
    assert list(read_mooncake(str(path))) == SMALL_REQUESTS


def test_compression_is_detected_by_content_not_by_name(tmp_path: Path) -> None:
    disguised = write(tmp_path / "trace.jsonl", SMALL_TRACE, compress=True)
    plain = write(tmp_path / "trace.jsonl.zst", SMALL_TRACE)
    assert list(read_mooncake(disguised)) == list(read_mooncake(plain)) == SMALL_REQUESTS


def test_small_trace_stats_and_accesses(tmp_path: Path) -> None:
    path = write(tmp_path / "small.jsonl", SMALL_TRACE)
    assert read_block_accesses(path) == [0, 1, 0, 1, 2, 7]
    stats = trace_stats(read_mooncake(path))
    assert stats == TraceStats(requests=4, block_accesses=6, unique_blocks=4)
    assert stats.infinite_cache_hit_ratio == pytest.approx(2 / 6)
    assert TraceStats(0, 0, 0).infinite_cache_hit_ratio == 0.0


def test_empty_and_blank_files_hold_no_requests(tmp_path: Path) -> None:
    assert list(read_mooncake(write(tmp_path / "empty.jsonl", ""))) == []
    assert list(read_mooncake(write(tmp_path / "blank.jsonl", "\n  \n\t\n"))) == []
    assert list(read_mooncake(write(tmp_path / "empty.zst", "", compress=True))) == []


def test_last_line_without_newline_is_read(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", GOOD_LINE)
    assert list(read_mooncake(path)) == [TraceRequest(1, 600, 2, (3, 4))]


def test_block_size_is_512_tokens() -> None:
    assert MOONCAKE_BLOCK_TOKENS == 512


BAD_LINES = {
    "bad JSON": ('{"timestamp": 1, "input_length": ', "invalid JSON"),
    "not an object": ("[1, 2, 3]", "expected a JSON object, got [1, 2, 3]"),
    "missing key": (
        '{"timestamp": 1, "input_length": 600, "output_length": 2}',
        'missing key "hash_ids"',
    ),
    "string where int": (
        '{"timestamp": "1", "input_length": 600, "output_length": 2, "hash_ids": [3, 4]}',
        '"timestamp" must be a non-negative integer, got "1"',
    ),
    "float where int": (
        '{"timestamp": 1, "input_length": 600.0, "output_length": 2, "hash_ids": [3, 4]}',
        '"input_length" must be a non-negative integer, got 600.0',
    ),
    "bool where int": (
        '{"timestamp": 1, "input_length": 600, "output_length": true, "hash_ids": [3, 4]}',
        '"output_length" must be a non-negative integer, got true',
    ),
    "null where int": (
        '{"timestamp": null, "input_length": 600, "output_length": 2, "hash_ids": [3, 4]}',
        '"timestamp" must be a non-negative integer, got null',
    ),
    "negative": (
        '{"timestamp": -1, "input_length": 600, "output_length": 2, "hash_ids": [3, 4]}',
        '"timestamp" must be a non-negative integer, got -1',
    ),
    "hash_ids not a list": (
        '{"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": "abc"}',
        '"hash_ids" must be a list of non-negative integers, got "abc"',
    ),
    "hash id a string": (
        '{"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [3, "4"]}',
        '"hash_ids" must be a list of non-negative integers, got "4" at index 1',
    ),
    "hash id a bool": (
        '{"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [true, 4]}',
        '"hash_ids" must be a list of non-negative integers, got true at index 0',
    ),
    "hash id negative": (
        '{"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [3, -4]}',
        '"hash_ids" must be a list of non-negative integers, got -4 at index 1',
    ),
    "too few hash ids": (
        '{"timestamp": 1, "input_length": 1025, "output_length": 2, "hash_ids": [3, 4]}',
        '"hash_ids" has 2 ids, but "input_length" 1025 needs ceil(1025 / 512) = 3',
    ),
    "too many hash ids": (
        '{"timestamp": 1, "input_length": 512, "output_length": 2, "hash_ids": [3, 4]}',
        '"hash_ids" has 2 ids, but "input_length" 512 needs ceil(512 / 512) = 1',
    ),
}


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "zstd"])
@pytest.mark.parametrize("case", list(BAD_LINES))
def test_malformed_line_names_file_and_line(tmp_path: Path, case: str, compress: bool) -> None:
    bad_line, problem = BAD_LINES[case]
    # Good line 1, blank line 2 (still counted), good line 3, the bad line 4, a good line 5.
    text = f"{GOOD_LINE}\n\n{GOOD_LINE}\n{bad_line}\n{GOOD_LINE}\n"
    path = write(tmp_path / "trace.jsonl", text, compress=compress)
    reader = read_mooncake(path)
    assert next(reader) == next(reader) == TraceRequest(1, 600, 2, (3, 4))
    with pytest.raises(TraceFormatError) as raised:
        next(reader)
    message = str(raised.value)
    assert message.startswith(f"{path}:4: ")
    assert problem in message


def test_trace_format_error_is_a_value_error_and_a_kvtier_error(tmp_path: Path) -> None:
    path = write(tmp_path / "trace.jsonl", "nonsense\n")
    with pytest.raises(ValueError):
        list(read_mooncake(path))
    with pytest.raises(KvtierError):
        list(read_mooncake(path))


def test_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(GOOD_LINE.encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceFormatError, match=r"trace\.jsonl:2: not valid UTF-8"):
        list(read_mooncake(path))


def test_missing_file_raises_at_once_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(TraceFormatError, match=r"nowhere\.jsonl: no such file"):
        read_mooncake(missing)
    with pytest.raises(TraceFormatError, match=r"nowhere\.jsonl: no such file"):
        read_keys(missing)
    with pytest.raises(TraceFormatError, match="not a regular file"):
        read_mooncake(tmp_path)


def test_truncated_zstd_file_raises_trace_format_error(tmp_path: Path) -> None:
    lines = "".join(
        json.dumps({"timestamp": i, "input_length": 512, "output_length": 1, "hash_ids": [i]})
        + "\n"
        for i in range(2000)
    )
    path = write(tmp_path / "trace.jsonl.zst", lines, compress=True)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(TraceFormatError, match=r"trace\.jsonl\.zst:\d+: cannot read: .*truncated"):
        list(read_mooncake(path))


def test_concatenated_zstd_frames_are_read_as_one_file(tmp_path: Path) -> None:
    first, second = SMALL_TRACE[:100], SMALL_TRACE[100:]  # split mid-line on purpose
    compressor = zstandard.ZstdCompressor()
    path = tmp_path / "trace.jsonl.zst"
    path.write_bytes(compressor.compress(first.encode()) + compressor.compress(second.encode()))
    assert list(read_mooncake(path)) == SMALL_REQUESTS


def test_corrupt_zstd_file_raises_trace_format_error(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00garbage" * 10)
    with pytest.raises(TraceFormatError, match=r"trace\.jsonl\.zst:1: cannot read"):
        list(read_mooncake(path))


# -- reading plain key files -----------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "zstd"])
def test_read_keys_parses_ints_strings_and_skips_comments(tmp_path: Path, compress: bool) -> None:
    text = (
        "# a header comment\n"
        "1\n"
        "  42  \n"
        "\n"
        "-7\n"
        "block-a\n"
        "   # an indented comment\n"
        "0x10\n"
        "3.5\n"
        "a#b\n"
        "007\n"
        "  spaced key  \n"
    )
    path = write(tmp_path / "keys.txt", text, compress=compress)
    keys = list(read_keys(path))
    assert keys == [1, 42, -7, "block-a", "0x10", "3.5", "a#b", 7, "spaced key"]
    assert [type(key) for key in keys[:3]] == [int, int, int]


def test_read_keys_rejects_invalid_utf8_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_bytes(b"1\n2\n\xff\n")
    with pytest.raises(TraceFormatError, match=r"keys\.txt:3: not valid UTF-8"):
        list(read_keys(path))
