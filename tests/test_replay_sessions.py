"""`kvtier replay --sessions`: a trace's sessions given to a real Hierarchy
(`kvtier_tools.workloads.replay_sessions`): an ended session's blocks are evicted first,
the replay still verifies every block, and bad uses are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.config import parse_config
from kvtier.errors import InvalidValueError
from kvtier_tools.workloads.replay import load_replay_trace, replay, replay_config
from kvtier_tools.workloads.replay_sessions import SessionPlan, load_session_plan, next_gaps

pytestmark = pytest.mark.timeout(120)

ONE_TIER = {
    "block_size": 4096,
    "tiers": [
        {"name": "cpu", "medium": "cpu", "capacity": 6, "policy": "lru", "pin_memory": False}
    ],
}
"""One tier of six blocks: the three sessions below fill it, and a fourth must evict."""

REQUESTS: list[dict[str, Any]] = [
    {"session": "a", "hash_ids": [1, 2]},
    {"session": "b", "hash_ids": [10, 11, 12]},
    {"session": "a", "hash_ids": [1, 2, 3], "session_end": True},  # a ends, last used
    {"session": "c", "hash_ids": [20, 21, 22]},  # needs three slots: a's, or b's (LRU)
    {"session": "b", "hash_ids": [10, 11, 12, 13]},  # b's next turn: hits only if b's stayed
]


def write_trace(path: Path) -> Path:
    lines = [
        {"timestamp": 1000 * i, "input_length": 512 * len(r["hash_ids"]), "output_length": 1, **r}
        for i, r in enumerate(REQUESTS)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


async def tier_hits(trace_path: Path, with_sessions: bool) -> tuple[int, int, dict[str, Any]]:
    config = replay_config(parse_config(ONE_TIER), 4096, None)
    trace = load_replay_trace(trace_path, None)
    plan = load_session_plan(trace_path, len(trace.requests)) if with_sessions else None
    result = await replay(config, trace, sessions=plan)
    report = result.to_dict()
    return result.counters.hits, result.counters.mismatches, report


async def test_an_ended_sessions_blocks_go_first_and_the_live_sessions_stay(
    tmp_path: Path,
) -> None:
    trace = write_trace(tmp_path / "trace.jsonl")
    # Without sessions, LRU evicts b's three blocks (least recently used) for c's, so b's
    # next turn misses them; a's next request "would" have hit, but a ended.
    hits, mismatches, report = await tier_hits(trace, with_sessions=False)
    assert (hits, mismatches) == (2, 0)  # request 3 re-reads a's two blocks, and no more
    assert report["sessions"] is None
    # With sessions, a's ended blocks go first: b's three survive and serve its next turn.
    hits, mismatches, report = await tier_hits(trace, with_sessions=True)
    assert (hits, mismatches) == (2 + 3, 0)
    assert report["sessions"]["ended"] == 1
    assert report["sessions"]["end_refused"] == 0


def test_next_gaps_are_each_requests_wait_for_its_sessions_next() -> None:
    assert next_gaps(["a", "b", "a", "b", "a"], [0.0, 1.0, 5.0, 6.5, 7.0]) == [
        5.0,
        5.5,
        2.0,
        None,
        None,
    ]


def test_the_oracle_expects_the_gap_plus_the_slack(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl")
    plan = load_session_plan(trace, len(REQUESTS), expect_slack_s=0.5)
    # a: 0 s then 2 s (ends); b: 1 s then 4 s; c alone.
    assert plan.expect_s == (2.5, 3.5, None, None, None)
    assert plan.ends == (False, False, True, False, False)


def test_a_trace_without_sessions_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(InvalidValueError, match=r"request 1 of .* names no session"):
        load_session_plan(path, 1)
    with pytest.raises(InvalidValueError, match="--expect-within must be more than 0"):
        load_session_plan(write_trace(tmp_path / "t.jsonl"), 1, expect_slack_s=0.0)


def test_the_command_reports_the_sessions_and_refuses_expect_alone(tmp_path: Path) -> None:
    trace = str(write_trace(tmp_path / "trace.jsonl"))
    config = tmp_path / "one.toml"
    config.write_text(
        'block_size = 4096\n[[tiers]]\nname = "cpu"\nmedium = "cpu"\ncapacity = 6\n'
        'policy = "lru"\npin_memory = false\n'
    )
    common = ["replay", "--config", str(config), "--trace", trace, "--no-plot", "--json"]
    result = CliRunner().invoke(
        main, [*common, "--out", str(tmp_path / "out"), "--sessions", "--expect-within", "1"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["hits"] == 5
    assert report["verification"]["mismatches"] == 0
    assert report["sessions"]["ended"] == 1 and report["sessions"]["expect_oracle"] is True
    alone = CliRunner().invoke(
        main, [*common, "--out", str(tmp_path / "o2"), "--expect-within", "1"]
    )
    assert alone.exit_code != 0
    assert "--expect-within and --hint-noise need --sessions" in alone.stderr


def test_the_sessions_clock_is_the_trace_time_of_the_request_served() -> None:
    plan = SessionPlan(("a", "a", "a"), (False, False, True), (3.0, 2.0, None), (0.0, 10.0, 40.0))
    assert plan.clock() == 0.0
    assert plan.expect_within(1) == 2.0 and plan.clock() == 10.0  # trace seconds, no pace
    assert plan.expect_within(2) is None and plan.clock() == 40.0  # the last one: ends
    assert plan.expected == 1


async def test_an_expectation_holds_until_the_sessions_next_request_in_trace_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay's Hierarchy reads deadlines on the trace's clock: however slowly the
    replay runs, a session expected within its gap plus S is still expected when its next
    request comes (on the wall clock, 18 % of them had lapsed on the agentic trace)."""
    import kvtier.sessions

    lapsed: list[str] = []
    seen_now: set[float] = set()
    real_read = kvtier.sessions.SessionTable.read

    def read(self: Any, session: str, keys: Any, now: float) -> Any:
        seen_now.add(now)
        deadline = self.deadline_of(session) if session in self else None
        if session in self and deadline is not None and deadline <= now:
            lapsed.append(session)
        return real_read(self, session, keys, now)

    monkeypatch.setattr(kvtier.sessions.SessionTable, "read", read)
    trace_path = write_trace(tmp_path / "trace.jsonl")
    config = replay_config(parse_config(ONE_TIER), 4096, None)
    trace = load_replay_trace(trace_path, None)
    plan = load_session_plan(trace_path, len(trace.requests), expect_slack_s=1e-3)
    result = await replay(config, trace, sessions=plan)
    assert result.counters.mismatches == 0 and plan.expected == 2
    assert seen_now == {0.0, 1.0, 2.0, 3.0, 4.0}  # the requests' trace times, not the wall's
    assert lapsed == []


async def test_the_oracle_rides_on_the_requests_puts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oracle's expectation goes with each put of a request whose session goes on (as
    `simulate --hints` gives it), never after the request: ranked idle while they are
    stored, a request's blocks went before every expected session's, so its later parts
    evicted its earlier ones (0.21 at 1 % of the agentic trace instead of 0.32)."""
    from kvtier import Hierarchy

    puts: list[tuple[str | None, bool]] = []
    expected_after: list[str] = []
    real_put = Hierarchy.put

    async def put(self: Hierarchy, keys: Any, blocks: Any, **kwargs: Any) -> int:
        puts.append((kwargs.get("session"), kwargs.get("expect_within_s") is not None))
        return await real_put(self, keys, blocks, **kwargs)

    monkeypatch.setattr(Hierarchy, "put", put)
    monkeypatch.setattr(Hierarchy, "expect_session", lambda self, s, w: expected_after.append(s))
    trace_path = write_trace(tmp_path / "trace.jsonl")
    config = replay_config(parse_config(ONE_TIER), 4096, None)
    trace = load_replay_trace(trace_path, None)
    plan = load_session_plan(trace_path, len(trace.requests), expect_slack_s=1.0)
    result = await replay(config, trace, sessions=plan)
    assert result.counters.mismatches == 0
    assert expected_after == []
    # a (goes on) and b (goes on) expect with every put; a's last, c's, b's last do not
    assert {s for s, expect in puts if expect} == {"a", "b"}
    assert {s for s, expect in puts if not expect} == {"a", "b", "c"}
    assert plan.expected == 2


def test_noisy_predictions_follow_the_simulators_noise_model() -> None:
    from kvtier_tools.workloads.replay_sessions import noisy_predictions
    from kvtier_tools.workloads.simulation.hints import HintNoise
    from kvtier_tools.workloads.simulation.sessions import FALSE_EXPECT_S

    gaps: list[float | None] = [2.0, 3.0, None] * 200
    ends, expect = noisy_predictions(gaps, 1.0, HintNoise(recall=1.0, fpr=0.0))
    assert ends == [False, False, True] * 200  # perfect: the oracle itself
    assert expect == [3.0, 4.0, None] * 200
    ends, expect = noisy_predictions(gaps, 1.0, HintNoise(recall=0.0, fpr=0.0))
    assert not any(ends) and expect == [None] * 600  # nothing said
    ends, expect = noisy_predictions(gaps, 1.0, HintNoise(recall=0.5, fpr=0.5, seed=3))
    for gap, end, within in zip(gaps, ends, expect, strict=True):
        assert not (end and within is not None)  # one prediction a request at most
        assert end or within is not None  # recall + fpr = 1: always one
        if gap is None and within is not None:
            assert within == FALSE_EXPECT_S  # a false expectation of an ending session
    false_ends = sum(end for gap, end in zip(gaps, ends, strict=True) if gap is not None)
    assert 0 < false_ends < 400
    with pytest.raises(InvalidValueError, match="--hint-noise needs --expect-within"):
        load_session_plan(None, 1, None, HintNoise(recall=1.0, fpr=0.0))
