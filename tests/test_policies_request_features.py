"""`kvtier_tools.bench.policy_request_features`: the reuse counted per group is the trace's,
request features are what is known when the request arrives, the request-driven replay is
`simulate`'s, its class-2 refusal stores nothing of class 2, and reading lct's prices does not
change lct."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

import kvtier.policies.lct as lct_module
from kvtier.policies import simulate
from kvtier_tools.bench.policy_request_features import (
    NEVER,
    SPANS,
    Reuse,
    flatten,
    main,
    marginal_prices,
    next_uses,
    replay,
    trace_reuse,
)
from kvtier_tools.workloads.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest


def whole(*requests: list[int]) -> list[TraceRequest]:
    """Requests of whole blocks (no partial last block), one a millisecond."""
    return [
        TraceRequest(t, len(ids) * MOONCAKE_BLOCK_TOKENS, 1, tuple(ids))
        for t, ids in enumerate(requests)
    ]


def conversations(seed: int, count: int = 400) -> list[TraceRequest]:
    """Turns of conversations: each re-reads its previous prompt and adds new blocks."""
    rng = random.Random(seed)
    fresh = itertools.count(1_000)
    prompts: list[list[int]] = [[0, 1]]
    requests = []
    for t in range(count):
        if rng.random() < 0.3:
            prompts.append([0, 1])  # a new conversation on the shared system prompt
        prompt = rng.choice(prompts)
        prompt.extend(next(fresh) for _ in range(rng.randrange(1, 4)))
        length = len(prompt) * MOONCAKE_BLOCK_TOKENS - rng.choice((0, 100))
        requests.append(TraceRequest(t, length, 1, tuple(prompt)))
    return requests


def test_density_counts_reuses_per_slot_held() -> None:
    reuse = Reuse()
    reuse.add(30, 10)  # read again 30 accesses later (capacity 10: spans 10 to 80)
    reuse.add(NEVER, 10)
    reuse.add(35, 10)
    assert reuse.arrivals == 3
    assert reuse.reused == [0, 0, 2, 2, 2]  # within 10, 20, 40, 60, 80 accesses
    assert reuse.held == [30.0, 60.0, 105.0, 125.0, 145.0]
    assert reuse.density(2, 10) == pytest.approx(2 / 105 * 10)
    assert reuse.density(0, 10) == 0.0
    assert reuse.best(10) == 2  # 2 / 105 beats 2 / 125 and 2 / 145
    assert len(SPANS) == 5


def test_next_uses_and_flatten() -> None:
    assert next_uses([1, 2, 1, 3, 2]) == [2, 4, NEVER, NEVER, NEVER]
    requests = [TraceRequest(0, MOONCAKE_BLOCK_TOKENS + 1, 1, (7, 8)), *whole([9])]
    assert flatten(requests) == ([7, 8, 9], [False, True, False])


def test_trace_reuse_groups_by_class_and_request_features() -> None:
    groups = trace_reuse(whole([1, 2, 3], [1, 2, 4], [1, 2, 3]), capacity=1)
    assert {cls: groups[(cls, "all", "all")].arrivals for cls in (1, 2, 3)} == {1: 4, 2: 3, 3: 2}
    # request 2's new block 4: two of its three blocks seen, right past the seen prefix
    assert groups[(1, "seen share", "0.1-0.7")].arrivals == 1
    assert groups[(1, "seen share", "0-0.1")].arrivals == 3  # request 1, nothing seen
    assert groups[(1, "past the seen prefix", "0-1")].arrivals == 2  # block 1, block 4
    assert groups[(1, "past the seen prefix", "1-8")].arrivals == 2  # blocks 2 and 3
    # request 3's block 3 (class 2) is in its request's seen prefix
    assert groups[(2, "past the seen prefix", "in it")].arrivals == 3
    # capacity 1: spans of 1, 2, 4, 6, 8 accesses; blocks 1 and 2 are read again 3 accesses
    # after their first, block 3 6 accesses after, block 4 never
    assert groups[(1, "all", "all")].reused == [0, 0, 2, 3, 3]
    assert groups[(1, "combined", "0-8 / 0-16 / 0-0.1 / 1-8")].arrivals == 2


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("capacity", [8, 40])
def test_the_replay_is_simulates(seed: int, capacity: int) -> None:
    requests = conversations(seed)
    keys, flags = flatten(requests)
    expected = simulate("lct", capacity, keys, flags)
    run = replay(requests, capacity)
    assert (run.hits, run.accesses) == (expected.hits, expected.accesses)
    assert run.groups[(1, "all", "all")].arrivals > 0


def test_refusing_class_2_stores_none_of_it() -> None:
    requests = whole([1], [2], [3], [1], [1])  # 1's second access misses (evicted), then?
    assert replay(requests, 2).hits == 1  # stored at its second access, hit at its third
    assert replay(requests, 2, refuse=lambda share: True).hits == 0
    assert replay(requests, 2, refuse=lambda share: share < 1.0).hits == 1  # 1 was seen


def test_reading_the_prices_changes_nothing_and_restores_lct() -> None:
    requests = conversations(5, count=2_000)
    keys, flags = flatten(requests)
    original = lct_module._allocate
    prices: list[float] = []
    with marginal_prices(prices):
        patched = simulate("lct", 30, keys, flags)
    assert lct_module._allocate is original
    assert prices and all(price > 0 for price in prices)
    assert simulate("lct", 30, keys, flags) == patched


def test_main_prints_the_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [
        json.dumps(
            {
                "timestamp": r.timestamp_ms,
                "input_length": r.input_length,
                "output_length": 1,
                "hash_ids": list(r.hash_ids),
            }
        )
        for r in conversations(7, count=1_500)
    ]
    trace.write_text("\n".join(lines) + "\n")
    assert main(["--trace", str(trace), "--fraction", "0.02"]) == 0
    out = capsys.readouterr().out
    assert "price per slot" in out and "| 1 | seen share |" in out
    assert "| 0.1-0.7 |" in out and "request-driven replay" in out
