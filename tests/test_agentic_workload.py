"""The agentic-session generator (`kvtier_tools.workloads.agentic`): deterministic by seed,
statistics near its parameters, sub-agents sharing their parent's prefix, every session
ending once, and its trace read back with its session keys."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kvtier.errors import InvalidValueError, TraceFormatError
from kvtier_tools.workloads.agentic import AgenticParams, generate, trace_stats, write_trace
from kvtier_tools.workloads.traces import read_mooncake

pytestmark = pytest.mark.timeout(120)

SMALL = AgenticParams(sessions=30, seed=3)


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    assert generate(SMALL) == generate(AgenticParams(sessions=30, seed=3))
    assert generate(SMALL) != generate(AgenticParams(sessions=30, seed=4))


def test_the_statistics_follow_the_parameters() -> None:
    requests = generate(AgenticParams(sessions=60, seed=1))
    stats = trace_stats(requests)
    top = {}
    for request in requests:
        if request.parent_session is None:
            top[request.session] = top.get(request.session, 0) + 1
    turns = sorted(top.values())
    assert len(top) == 60
    assert 25 <= turns[len(turns) // 2] <= 60  # median 40 drawn log-normally
    assert 3.0 <= stats.gap_median_s <= 12.0  # median 6 s (plus decode and sub-agents)
    assert stats.ended == stats.sessions  # every session ends exactly once
    assert stats.subagents > 0
    assert all(r.input_length <= AgenticParams().max_context_tokens for r in requests)
    assert [r.timestamp_ms for r in requests] == sorted(r.timestamp_ms for r in requests)


def test_a_session_prefix_grows_and_a_sub_agent_starts_with_its_parent_s() -> None:
    requests = generate(SMALL)
    by_session: dict[str, list] = {}
    for request in requests:
        by_session.setdefault(request.session, []).append(request)
    for own in by_session.values():
        for before, after in itertools.pairwise(own):
            full = before.input_length // 512
            assert after.hash_ids[:full] == before.hash_ids[:full]  # full blocks are kept
            assert after.input_length > before.input_length
        assert [r.session_end for r in own] == [False] * (len(own) - 1) + [True]
    children = [own for own in by_session.values() if own[0].parent_session is not None]
    assert children
    for own in children:
        parent = by_session[own[0].parent_session]
        shared = set(own[0].hash_ids) & {key for r in parent for key in r.hash_ids}
        assert len(shared) >= 8  # at least the system prompt and the task


def test_partial_blocks_are_never_repeated() -> None:
    requests = generate(SMALL)
    partial = [r.hash_ids[-1] for r in requests if r.input_length % 512]
    every = [key for r in requests for key in r.hash_ids]
    assert len(set(partial)) == len(partial)
    assert all(every.count(key) == 1 for key in partial[:50])


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst"])
def test_the_trace_reads_back_with_its_sessions(tmp_path: Path, suffix: str) -> None:
    requests = generate(AgenticParams(sessions=5, seed=2))
    path = write_trace(requests, tmp_path / f"agentic{suffix}")
    read = list(read_mooncake(path))
    assert read == [r.to_trace_request() for r in requests]
    assert read[-1].session_end and read[0].session is not None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"session": 7}, '"session" must be a non-empty string, got 7'),
        ({"session": ""}, '"session" must be a non-empty string'),
        ({"session": "a", "session_end": "yes"}, '"session_end" must be true or false'),
        ({"session_end": True}, 'need a "session"'),
        ({"session": "a", "parent_session": 1}, '"parent_session" must be a non-empty string'),
    ],
)
def test_a_bad_session_key_is_one_line_naming_it(tmp_path: Path, extra: dict, message: str) -> None:
    line = {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1], **extra}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(TraceFormatError, match=f"bad.jsonl:1: .*{message}"):
        list(read_mooncake(path))


@pytest.mark.parametrize(
    "params",
    [{"sessions": 0}, {"sessions": -1}, {"span_s": float("nan")}, {"subagent_p": 1.5}],
)
def test_bad_parameters_are_refused(params: dict) -> None:
    with pytest.raises(InvalidValueError):
        AgenticParams(**params)


def test_the_command_writes_a_trace_that_simulate_reads(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kvtier_tools.cli.workloads import workloads
    from kvtier_tools.workloads.simulation import load_trace

    target = tmp_path / "agentic.jsonl"
    result = CliRunner().invoke(
        workloads, ["agentic", "--sessions", "4", "--out", str(target), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["sessions"] >= 4
    trace = load_trace(target)
    assert trace.format == "mooncake" and trace.accesses
