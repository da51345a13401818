"""The bookkeeping benchmark's driver: what it counts, not how fast anything is."""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.policies import simulate
from kvtier_tools.bench.bookkeeping import (
    OVERALL,
    PHASES,
    VLLM_SKIPPED,
    Result,
    VllmClasses,
    capacity_for,
    format_table,
    import_vllm,
    load_requests,
    main,
    results_from_json,
    results_to_json,
    run_bookkeeping_benchmark,
    vllm_skipped,
)

LIMIT = 300
FRACTIONS = (0.01, 0.10, 0.50)


@pytest.fixture(scope="module")
def requests() -> list[list[int]]:
    return load_requests(LIMIT)


@pytest.fixture(scope="module")
def kvtier_results() -> list[Result]:
    return run_bookkeeping_benchmark(
        fractions=FRACTIONS,
        policies=("lru", "arc"),
        repeats=1,
        limit_requests=LIMIT,
        include_vllm=False,
    )


def rows(results: list[Result], policy: str, fraction: float) -> dict[str, Result]:
    return {r.phase: r for r in results if r.policy == policy and r.fraction == fraction}


def reference_lru(requests: list[list[int]], capacity: int) -> dict[str, int]:
    """The driver's protocol over a plain ordered-dict LRU, written independently: prefix
    lookup, touch the hit prefix head-last-touched-first (head most recent), store the rest
    (evicting from the old end, never a key of the request; a store that cannot be placed
    stores nothing)."""
    cache: OrderedDict[int, None] = OrderedDict()
    counts = dict.fromkeys(("lookup", "load", "store", "hits", "failed"), 0)
    for ids in requests:
        n, h = len(ids), 0
        while h < n and ids[h] in cache:
            h += 1
        counts["lookup"] += min(h + 1, n)
        counts["load"] += h
        counts["hits"] += h
        counts["store"] += n - h
        for key in reversed(ids[:h]):
            cache.move_to_end(key)
        rest = ids[h:]
        if not rest:
            continue
        new = [key for key in dict.fromkeys(rest) if key not in cache]
        need = len(cache) + len(new) - capacity
        victims = list(itertools.islice((k for k in cache if k not in set(rest)), max(need, 0)))
        if len(new) > capacity or len(victims) < need:
            counts["failed"] += 1
            continue
        for key in victims:
            del cache[key]
        cache.update(dict.fromkeys(new))
    return counts


@pytest.mark.parametrize("fraction", FRACTIONS)
@pytest.mark.slow
def test_lru_counts_match_an_independent_model(
    kvtier_results: list[Result], requests: list[list[int]], fraction: float
) -> None:
    unique = len({h for ids in requests for h in ids})
    capacity = capacity_for(fraction, unique)
    expected = reference_lru(requests, capacity)
    got = rows(kvtier_results, "lru", fraction)
    assert got[OVERALL].capacity == capacity
    assert got["lookup"].kvtier.ops == expected["lookup"]
    assert got["load"].kvtier.ops == expected["load"]
    assert got["store"].kvtier.ops == expected["store"]
    assert got[OVERALL].kvtier.hits == expected["hits"]
    assert got[OVERALL].kvtier.failed_stores == expected["failed"]


@pytest.mark.parametrize("fraction", [0.10, 0.50])
def test_lru_hits_equal_simulate(
    kvtier_results: list[Result], requests: list[list[int]], fraction: float
) -> None:
    # At 1 % some requests of this prefix are longer than the tier (a tier cannot store them;
    # simulate, one key at a time, can), so only the larger capacities are compared. On the
    # whole trace the two can also differ by a few hits at capacities where a resident block
    # follows a miss within a request (simulate counts it, a prefix lookup does not).
    accesses = [h for ids in requests for h in ids]
    row = rows(kvtier_results, "lru", fraction)[OVERALL]
    assert row.kvtier.failed_stores == 0
    assert row.kvtier.hits == simulate("lru", row.capacity, accesses).hits


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("fraction", FRACTIONS)
def test_ops_are_consistent(
    kvtier_results: list[Result], requests: list[list[int]], policy: str, fraction: float
) -> None:
    got = rows(kvtier_results, policy, fraction)
    assert set(got) == {*PHASES, OVERALL}
    accesses = sum(len(ids) for ids in requests)
    lookup, load, store, overall = (got[p].kvtier for p in (*PHASES, OVERALL))
    assert load.ops + store.ops == accesses == overall.accesses
    assert load.ops == overall.hits
    # each request looks up its hit prefix, plus the lookup that missed when it stores any key
    assert lookup.intervals == len(requests)
    assert store.intervals <= len(requests) and load.intervals <= len(requests)
    assert lookup.ops == load.ops + store.intervals
    assert overall.ops == lookup.ops + load.ops + store.ops
    assert got[OVERALL].requests == len(requests)
    for row in got.values():
        assert row.vllm is None
        assert row.kvtier.ns > 0
        assert 0 < row.kvtier_mops < math.inf
        assert row.ratio is None


def test_json_round_trips(kvtier_results: list[Result], tmp_path: Path) -> None:
    text = results_to_json(kvtier_results)
    assert results_from_json(text) == kvtier_results
    document = json.loads(text)
    assert document["results"][0]["kvtier_mops"] == kvtier_results[0].kvtier_mops


def test_table_without_vllm(kvtier_results: list[Result]) -> None:
    table = format_table(kvtier_results, vllm_skipped(include_vllm=False))
    assert f"{VLLM_SKIPPED}: not asked for (--no-vllm)." in table
    assert "Hit counts" not in table
    assert table.count("\nlru ") + table.count("\narc ") == len(kvtier_results)


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's manager module cannot be imported (as where vLLM is not installed)."""
    import_vllm.cache_clear()
    monkeypatch.setitem(sys.modules, "vllm.v1.kv_offload.cpu.manager", None)
    yield
    import_vllm.cache_clear()


@pytest.mark.usefixtures("no_vllm")
def test_without_vllm_the_comparison_is_skipped_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = vllm_skipped()
    assert reason is not None and "CPUOffloadingManager cannot be imported" in reason
    assert "scripts/setup.sh --vllm" in reason
    with pytest.raises(RuntimeError, match="cannot be imported"):
        run_bookkeeping_benchmark(limit_requests=20, repeats=1, include_vllm=True)

    out = tmp_path / "results.json"
    argv = ["--limit-requests", "50", "--repeats", "1", "--fractions", "0.5"]
    assert main([*argv, "--policies", "lru", "--json", str(out)]) == 0
    printed = capsys.readouterr()
    assert f"{VLLM_SKIPPED}: {reason}" in printed.err
    assert f"{VLLM_SKIPPED}: {reason}." in printed.out
    assert "vLLM Mops/s" in printed.out  # the columns stay, with "-" in them
    document = json.loads(out.read_text())
    assert document["vllm_skipped"] == reason
    assert document["vllm_installed_version"] is None
    assert all(row["vllm"] is None for row in document["results"])


def test_command_line_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.json"
    argv = ["--limit-requests", "50", "--repeats", "1", "--fractions", "0.5"]
    argv += ["--policies", "lru", "--no-vllm", "--json", str(out)]
    assert main(argv) == 0
    results = results_from_json(out.read_text())
    assert [r.phase for r in results] == [*PHASES, OVERALL]
    assert "kvtier Mops/s" in capsys.readouterr().out


@pytest.mark.slow
def test_vllm_agrees_on_lru(requests: list[list[int]]) -> None:
    manager = pytest.importorskip("vllm.v1.kv_offload.cpu.manager")
    import vllm

    classes = import_vllm()
    assert isinstance(classes, VllmClasses)
    assert classes.manager is manager.CPUOffloadingManager  # vLLM's own, not a copy
    results = run_bookkeeping_benchmark(
        fractions=FRACTIONS,
        policies=("lru", "arc"),
        repeats=1,
        limit_requests=LIMIT,
        include_vllm=True,
    )
    accesses = sum(len(ids) for ids in requests)
    for row in results:
        assert row.vllm is not None
        assert 0 < row.vllm.mops < math.inf
        assert row.ratio is not None and row.ratio > 0
        if row.policy == "lru":
            assert row.hits_agree is True
            assert row.vllm.ops == row.kvtier.ops
            assert row.vllm.failed_stores == row.kvtier.failed_stores
        if row.phase == OVERALL:
            assert row.vllm.accesses == accesses
        assert row.vllm_version == vllm.__version__
    assert results_from_json(results_to_json(results)) == results
    assert "DISAGREE" not in format_table(results)
