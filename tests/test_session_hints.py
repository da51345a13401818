"""Session hints end to end: the session table (ranks, ends, expectations), ranks in every
built-in policy's eviction, the Hierarchy verbs (`put(session=)`, `end_session`,
`expect_session`), their bad input, and the session simulation behind `simulate --hints`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hierarchy_helpers import BLOCK, blocks_of, key

from kvtier import Hierarchy
from kvtier.blocks import BlockStatus
from kvtier.errors import InvalidValueError, UnknownSessionError
from kvtier.policies import get_policy_class
from kvtier.sessions import MAX_EXPECT_S, SessionTable
from kvtier_tools.workloads.simulation.bounds import belady_opt
from kvtier_tools.workloads.simulation.hints import HintNoise
from kvtier_tools.workloads.simulation.sessions import session_truth, simulate_sessions

pytestmark = pytest.mark.timeout(120)

# -- the table -------------------------------------------------------------------------------


def test_ranks_put_the_least_recently_active_session_first_and_its_tail_first() -> None:
    table = SessionTable()
    a = table.read("a", ["a0", "a1"], now=0.0).ranks
    b = table.read("b", ["b0"], now=1.0).ranks
    assert a["a1"] < a["a0"] < b["b0"]  # a is idle longer; its tail before its head
    again = table.read("a", ["a0", "a1", "a2"], now=2.0).ranks
    assert again["a0"] > b["b0"]  # a is now the most recent


def test_an_expected_session_goes_after_idle_ones_the_latest_first_until_its_deadline() -> None:
    table = SessionTable()
    table.read("a", ["a0"], now=0.0)
    table.read("b", ["b0"], now=0.0)
    table.read("c", ["c0"], now=0.0)
    ranks = table.expect("a", 10.0, now=0.0).ranks
    ranks |= table.expect("b", 100.0, now=0.0).ranks
    idle_c = table.read("c", [], now=0.0).ranks["c0"]
    assert idle_c < ranks["b0"] < ranks["a0"]  # b is expected later than a: it goes first
    lapsed = table.expire(now=11.0).ranks
    assert set(lapsed) == {"a0"} and lapsed["a0"] < idle_c  # a is idle again, and older


def test_an_ended_session_s_blocks_are_never_but_not_those_another_session_read() -> None:
    table = SessionTable()
    table.read("parent", ["p0", "p1"], now=0.0)
    table.read("child", ["p0", "p1", "c0"], now=1.0)
    changes = table.end("child", now=2.0)
    assert changes.never == ["c0"]
    assert changes.ranks["c0"] is None and changes.ranks["p0"] is not None
    with pytest.raises(UnknownSessionError, match="end_session: no live session 'child'"):
        table.end("child", now=3.0)


@pytest.mark.parametrize(
    ("within", "message"),
    [
        (-1.0, "within_s must be a number of seconds above 0"),
        (0, "above 0"),
        (math.inf, "above 0 and at most"),
        (math.nan, "above 0 and at most"),
        (MAX_EXPECT_S * 2, "a week"),
        ("5", "got '5'"),
        (True, "got True"),
    ],
)
def test_a_bad_expectation_is_one_line_and_changes_nothing(within: Any, message: str) -> None:
    table = SessionTable()
    table.read("a", ["a0"], now=0.0)
    with pytest.raises(InvalidValueError, match=message):
        table.expect("a", within, now=0.0)
    assert table.expire(now=1e12).ranks == {}  # no expectation was recorded


@pytest.mark.parametrize("session", [7, None, "", b"a", "x" * 300])
def test_a_session_id_that_is_not_a_short_string_is_refused(session: Any) -> None:
    with pytest.raises(InvalidValueError, match="session must be a non-empty string"):
        SessionTable().expect(session, 1.0, now=0.0)


# -- ranks in the policies -------------------------------------------------------------------


def _ready() -> BlockStatus:
    block = BlockStatus(0)
    block.ref_cnt = 0
    return block


@pytest.mark.parametrize("name", ["lru", "arc", "lct", "auto"])
def test_every_policy_evicts_ranked_blocks_lowest_first_after_never(name: str) -> None:
    policy = get_policy_class(name)(8)
    for i in range(6):
        policy.insert(i, _ready())  # type: ignore[arg-type]
    policy.touch([0, 1, 2, 3, 4, 5])  # type: ignore[list-item]
    policy.rank(4, (0, 1.0, 0))  # type: ignore[arg-type]
    policy.rank(5, (0, 0.0, 0))  # type: ignore[arg-type]
    policy.hint(3, "never")  # type: ignore[arg-type]
    victims = policy.evict(3)
    assert victims is not None
    assert [k for k, _ in victims] == [3, 5, 4]
    policy.rank(99, (0, 0.0, 0))  # type: ignore[arg-type]  # not resident: ignored
    assert 99 not in policy


@pytest.mark.parametrize("name", ["lru", "arc"])
def test_a_block_ranked_again_with_the_same_rank_is_evicted_once(name: str) -> None:
    # A rank carried down to a tier that holds the block with that very rank already (the
    # chain gives one rank object to every tier), or ranked A, B, then A again: one victim.
    policy = get_policy_class(name)(8)
    for i in range(4):
        policy.insert(i, _ready())  # type: ignore[arg-type]
    low, high = (0, 0.0, 0), (0, 5.0, 0)
    policy.rank(0, low)  # type: ignore[arg-type]
    policy.rank(0, low)  # type: ignore[arg-type]
    policy.rank(1, low)  # type: ignore[arg-type]
    policy.rank(1, high)  # type: ignore[arg-type]
    policy.rank(1, low)  # type: ignore[arg-type]
    policy.rank(2, high)  # type: ignore[arg-type]
    victims = policy.evict(3)
    assert victims is not None
    assert sorted(k for k, _ in victims) == [0, 1, 2]
    assert len(policy) == 1


def test_when_only_likely_blocks_are_left_the_ranked_ones_go_lowest_first() -> None:
    policy = get_policy_class("lru")(4)
    for i in range(4):
        policy.insert(i, _ready())  # type: ignore[arg-type]
        policy.hint(i, "likely")  # type: ignore[arg-type]
    policy.rank(3, (1, -50.0, 0))  # type: ignore[arg-type]
    policy.rank(2, (1, -10.0, 0))  # type: ignore[arg-type]
    victims = policy.evict(3)
    assert victims is not None
    assert [k for k, _ in victims] == [3, 2, 0]  # then the policy's own order (LRU)
    assert len(policy) == 1


# -- the hierarchy ---------------------------------------------------------------------------


def one_tier() -> dict[str, Any]:
    tier = {"name": "cpu0", "medium": "cpu", "capacity": 4, "high_watermark": 1.0}
    return {"block_size": BLOCK, "write_policy": "write-back", "tiers": [tier]}


async def test_sessions_through_the_hierarchy() -> None:
    async with Hierarchy.from_config(one_tier()) as h:
        a, b = [key(0), key(1)], [key(2), key(3)]
        await h.put(a, blocks_of(a), session="a")
        await h.put(b, blocks_of(b), session="b", expect_within_s=60)
        await h.put(a, blocks_of(a), session="a")  # a's next request: a is the most recent
        # b is expected: idle a goes first, its tail (1) first, despite being used last
        await h.put([key(4)], blocks_of([key(4)]))
        assert [h.where(k) for k in (key(1), key(0), key(2), key(3))] == [None, "cpu0"] + [
            "cpu0"
        ] * 2
        h.end_session("b")  # b's blocks now go first ("never"), before idle a's and 4
        await h.put([key(5)], blocks_of([key(5)]))
        assert [h.where(key(i)) for i in (2, 3, 0, 4, 5)] == [None] + ["cpu0"] * 4
        assert h.stats().chain.hint_dropped == 1
        with pytest.raises(UnknownSessionError):
            h.end_session("b")  # ended already
        h.check()


def test_sync_hierarchy_has_the_session_verbs() -> None:
    from kvtier import SyncHierarchy

    with SyncHierarchy(one_tier()) as h:
        keys = [key(0), key(1)]
        h.put(keys, blocks_of(keys), session="a", expect_within_s=30)
        h.expect_session("a", 10)
        h.end_session("a")
        h.put([key(2)], blocks_of([key(2)]))
        h.put([key(3)], blocks_of([key(3)]))
        h.put([key(4)], blocks_of([key(4)]))  # a's "never" blocks go first
        assert [h.where(key(i)) for i in range(5)] == [None] + ["cpu0"] * 4


async def test_bad_session_input_is_one_line_and_changes_nothing() -> None:
    async with Hierarchy.from_config(one_tier()) as h:
        keys = [key(1)]
        with pytest.raises(InvalidValueError, match="put: session must be a non-empty string"):
            await h.put(keys, blocks_of(keys), session=5)  # type: ignore[arg-type]
        with pytest.raises(InvalidValueError, match="put: session must be"):
            await h.put(keys, blocks_of(keys), expect_within_s=5)
        with pytest.raises(InvalidValueError, match="expect_within_s: within_s must be"):
            await h.put(keys, blocks_of(keys), session="a", expect_within_s=-1)
        assert h.where(key(1)) is None  # refused before anything changed
        with pytest.raises(UnknownSessionError, match="end_session: no live session 'nope'"):
            h.end_session("nope")
        with pytest.raises(UnknownSessionError, match="expect_session: no live session"):
            h.expect_session("nope", 5.0)


# -- the simulation --------------------------------------------------------------------------


def test_opt_on_a_tiny_known_trace() -> None:
    # capacity 2, by hand: 1 2 miss | 3 evicts 2 (next at 4, 1's at 3) | 1 hits | 2 evicts
    # 1 (next at 6, 3's at 5) | 3 hits | 1 evicts 3 (never again) | 2 hits
    trace = [1, 2, 3, 1, 2, 3, 1, 2]
    result = belady_opt(2, trace)
    assert (result.hits, result.evictions) == (3, 3)
    assert belady_opt(3, trace).hits == 5  # every access but the first three


def test_the_session_truth_is_each_request_s_gap_to_its_session_s_next() -> None:
    assert session_truth(["a", "b", "a", "b"], [0.0, 1.0, 5.0, 6.0]) == [5.0, 5.0, None, None]


def test_session_hints_beat_blocks_alone_on_two_alternating_sessions() -> None:
    # two sessions of 3 blocks, a cache of 4: LRU thrashes, session ranks keep one session
    a, b = [1, 2, 3], [11, 12, 13]
    requests = [a, b] * 10
    sessions = ["a", "b"] * 10
    times = [float(i) for i in range(20)]
    plain = simulate_sessions("lru", 4, requests, sessions, times, None)
    hinted = simulate_sessions("lru", 4, requests, sessions, times, HintNoise(1.0, 0.0))
    opt = belady_opt(4, [k for r in requests for k in r])
    assert hinted.hits >= plain.hits > 0
    assert hinted.hits <= opt.hits
    again = simulate_sessions("lru", 4, requests, sessions, times, HintNoise(1.0, 0.0))
    assert again == hinted  # deterministic


def test_simulate_hints_on_an_agentic_trace_gives_session_hints(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from kvtier.cli import main
    from kvtier_tools.workloads.agentic import AgenticParams, generate, write_trace

    trace = write_trace(generate(AgenticParams(sessions=6, seed=5)), tmp_path / "a.jsonl")
    args = ["simulate", "--trace", str(trace), "--policy", "lru", "--capacity", "5%"]
    args += ["--hints", "recall=1,fpr=0", "--no-plot", "--json", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{") :])
    assert report["hints"]["kind"] == "session"
    assert report["trace"]["sessions"] >= 6
    (row,) = report["hints"]["results"]
    opt = next(r for r in report["results"] if r["policy"] == "opt")
    assert row["hit_ratio"] <= row["hinted_hit_ratio"] <= opt["hit_ratio"]


async def test_the_session_clock_is_the_one_deadlines_are_read_on() -> None:
    with pytest.raises(InvalidValueError, match="session_clock must be callable, got 5"):
        Hierarchy.from_config(one_tier(), session_clock=5)
    now = [0.0]
    async with Hierarchy.from_config(one_tier(), session_clock=lambda: now[0]) as h:
        a = [key(0), key(1)]
        await h.put(a, blocks_of(a), session="a", expect_within_s=10)
        assert h._sessions.deadline_of("a") == 10.0
        now[0] = 10.0  # a's deadline passes on the given clock: a is idle again
        await h.put([key(2)], blocks_of([key(2)]), session="b")
        assert h._sessions.deadline_of("a") is None
