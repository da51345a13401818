"""The multi-turn workload of engine_ttft and its per-depth report
(kvtier_tools.bench.engine_turns), on synthetic traces: no engine needed."""

from __future__ import annotations

import pytest

from kvtier_tools.bench.engine_turns import (
    BLOCK,
    MIN_TURNS,
    conversations,
    depth_label,
    depth_rows,
    load,
    machine,
)
from kvtier_tools.workloads.traces import TraceRequest


def request(*hash_ids: int) -> TraceRequest:
    return TraceRequest(
        timestamp_ms=0, input_length=len(hash_ids) * BLOCK, output_length=1, hash_ids=hash_ids
    )


def conversation(first: int, turns: int) -> list[TraceRequest]:
    """`turns` requests sharing their first two hash ids, each one block longer."""
    return [request(first, first + 1, *range(first + 2, first + 3 + turn)) for turn in range(turns)]


def test_turns_are_counted_per_conversation_in_trace_order() -> None:
    long_a, long_b = conversation(100, MIN_TURNS), conversation(200, MIN_TURNS + 2)
    short = conversation(300, MIN_TURNS - 1)  # too short: left out
    trace = [long_a[0], short[0], long_b[0], long_a[1], long_b[1], *short[1:]]
    trace += long_a[2:] + long_b[2:]
    workload = conversations(2, 3, max_blocks=4, vocab=50, trace=trace)
    assert workload.conversations == 2
    # The first 3 turns of each, in trace order (interleaved as in the trace).
    assert workload.turns == [1, 1, 2, 2, 3, 3]
    lengths = [len(prompt) for prompt in workload.prompts]
    assert lengths == [3 * BLOCK, 3 * BLOCK, 4 * BLOCK, 4 * BLOCK, 4 * BLOCK, 4 * BLOCK]
    # A later turn's prompt begins with the earlier turn's: the same hash ids, same tokens.
    assert workload.prompts[2][: 3 * BLOCK] == workload.prompts[0]
    assert all(3 <= token < 50 for prompt in workload.prompts for token in prompt)
    assert workload.blocks == 3 + 3 + 4 * 4
    assert workload.unique_blocks == 2 * 4


def test_the_count_of_conversations_is_a_limit() -> None:
    trace = conversation(100, MIN_TURNS) + conversation(200, MIN_TURNS)
    assert conversations(1, 100, 64, 50, trace=trace).turns == list(range(1, MIN_TURNS + 1))
    with pytest.raises(ValueError, match="must be >= 1"):
        conversations(0, 1, 1, 50, trace=trace)


@pytest.mark.parametrize(
    ("turn", "label"),
    [(1, "1"), (2, "2-3"), (3, "2-3"), (4, "4-7"), (7, "4-7"), (8, "8+"), (40, "8+")],
)
def test_depth_buckets(turn: int, label: str) -> None:
    assert depth_label(turn) == label


def test_depth_label_refuses_turn_zero() -> None:
    with pytest.raises(ValueError, match="a turn is >= 1"):
        depth_label(0)


def test_depth_rows_sum_each_bucket_per_way() -> None:
    turns = [1, 2, 8, 9]
    served = {
        "a": [
            {"ttft_s": 1.0, "prompt_tokens": 100, "cached_tokens": 0},
            {"ttft_s": 0.5, "prompt_tokens": 200, "cached_tokens": 50},
            {"ttft_s": 0.2, "prompt_tokens": 300, "cached_tokens": 150},
            {"ttft_s": 0.4, "prompt_tokens": 100, "cached_tokens": 50},
        ]
    }
    header, *rows = depth_rows(turns, served, {"a": "way a"})
    assert header[0] == "turn" and header[-1] == "prefill saved"
    assert [row[:3] for row in rows] == [
        ["1", "way a", "1"],
        ["2-3", "way a", "1"],
        ["8+", "way a", "2"],
    ]
    deep = rows[-1]
    assert deep[3:5] == ["200 ms", "400 ms"]  # p50 and p99 of 0.2 and 0.4 s (nearest rank)
    assert deep[5:] == ["400", "200 (50%)"]


def test_the_machine_line_names_cores_and_load() -> None:
    assert "cores" in machine()
    assert load().startswith("load average ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-blocks", "0"], "--max-blocks must be in"),
        (["--max-blocks", "65"], "--max-blocks must be in"),
        (["--turn-device-blocks", "33"], "--turn-device-blocks must hold one request"),
    ],
)
def test_engine_ttft_refuses_a_workload_the_engine_cannot_hold(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvtier_tools.bench import engine_ttft

    with pytest.raises(SystemExit) as raised:
        engine_ttft.main(argv)  # refused before any engine starts
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
