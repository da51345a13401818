"""`kvtier simulate`: the bounds (Belady's OPT, infinite cache), the capacity sweep, its
report files, and the command's happy and bad-input paths."""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.cli import main
from kvtier.errors import InvalidValueError, KvtierError, TraceFormatError, UnknownPolicyError
from kvtier.policies import simulate
from kvtier_tools.cli.charts import chart_sweep
from kvtier_tools.workloads.simulation import (
    BeladyOracle,
    belady_opt,
    infinite_cache_hits,
    load_trace,
    parse_capacities,
    parse_policies,
    reference_hit_ratio,
    run_sweep,
    write_sweep_outputs,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
UNIQUE_BLOCKS = 182_790
ACCESSES = 288_500
# Belady's OPT hits on the shipped trace: round(h / 288,500, 6) gives the reference table's
# 0.246319 at 1 % and 0.366412 (= the infinite cache, 105,710 hits) from 5 % up.
OPT_HITS = {1_827: 71_063, 9_139: 105_710, 18_279: 105_710, 45_697: 105_710, 91_395: 105_710}


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def brute_force_opt(capacity: int, keys: tuple[int, ...]) -> int:
    """Most hits any must-admit cache of `capacity` can get: try every eviction choice."""

    @cache
    def best(index: int, cached: frozenset[int]) -> int:
        if index == len(keys):
            return 0
        key = keys[index]
        if key in cached:
            return 1 + best(index + 1, cached)
        if len(cached) < capacity:
            return best(index + 1, cached | {key})
        return max(best(index + 1, (cached - {victim}) | {key}) for victim in cached)

    return best(0, frozenset())


small_traces = st.lists(st.integers(0, 5), max_size=14).map(tuple)


# -- bounds ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(keys=small_traces, capacity=st.integers(1, 4))
def test_opt_equals_the_brute_force_optimum(keys: tuple[int, ...], capacity: int) -> None:
    assert belady_opt(capacity, keys).hits == brute_force_opt(capacity, keys)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.integers(0, 30), max_size=300), capacity=st.integers(1, 25))
def test_opt_bounds_lru_and_arc_and_is_bounded_by_infinite(keys: list[int], capacity: int) -> None:
    opt = belady_opt(capacity, keys)
    for policy in ("lru", "arc"):
        assert simulate(policy, capacity, keys).hits <= opt.hits
    assert opt.hits <= infinite_cache_hits(keys).hits
    assert opt.accesses == len(keys)
    assert opt.evictions == max(0, opt.misses - capacity)  # must-admit: full after `capacity`


def test_opt_handles_mixed_key_types_and_ties_at_never_again() -> None:
    keys: list[Any] = ["a", 1, "a", b"x", 2, 1, "a", 3, 4, 5]
    ids = {key: number for number, key in enumerate(dict.fromkeys(keys))}
    assert belady_opt(2, keys).hits == brute_force_opt(2, tuple(ids[key] for key in keys))


def test_infinite_bound_misses_only_first_accesses() -> None:
    result = infinite_cache_hits([1, 2, 1, 3, 2, 1])
    assert (result.hits, result.accesses, result.capacity, result.evictions) == (3, 6, 3, 0)


def test_opt_rejects_a_capacity_below_one() -> None:
    with pytest.raises(InvalidValueError):
        BeladyOracle([1, 2]).simulate(0)


@pytest.mark.slow
def test_opt_matches_the_reference_and_bounds_lru_and_arc_on_the_shipped_trace() -> None:
    trace = load_trace()
    oracle = BeladyOracle(trace.accesses)
    infinite = infinite_cache_hits(trace.accesses)
    assert infinite.hits == 105_710
    for blocks, hits in OPT_HITS.items():
        assert oracle.simulate(blocks).hits == hits
    # ARC too, and every reference capacity: test_default_run_reproduces_the_reference_figures.
    for blocks in (1_827, 18_279):
        assert simulate("lru", blocks, trace.accesses).hits <= OPT_HITS[blocks] <= infinite.hits


# -- inputs ---------------------------------------------------------------------------------


def test_capacities_are_percentages_or_block_counts() -> None:
    specs = parse_capacities("1%, 5%,4096,0.5%,100%")
    assert [s.resolve(UNIQUE_BLOCKS) for s in specs] == [1_827, 9_139, 4_096, 913, UNIQUE_BLOCKS]
    # Exact decimal arithmetic: 10% of 182,790 is 18,279 (a float product could floor lower).
    assert parse_capacities("10%")[0].resolve(UNIQUE_BLOCKS) == 18_279
    assert parse_capacities("1%")[0].resolve(10) == 1  # never an empty cache


@pytest.mark.parametrize("bad", ["abc", "0%", "150%", "0", "-5", "5%%", "", "1%,", "1e3"])
def test_bad_capacities_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidValueError, match="--capacity"):
        parse_capacities(bad)


def test_policies_are_validated_and_deduplicated() -> None:
    assert parse_policies("LRU, arc,lru") == ("lru", "arc")
    with pytest.raises(UnknownPolicyError, match="valid policies: arc, auto, lct, lru, s3fifo"):
        parse_policies("lru,fifo")
    with pytest.raises(InvalidValueError, match="empty name"):
        parse_policies("lru,,arc")


def test_reference_figures_apply_to_block_counts_too() -> None:
    assert reference_hit_ratio("lru", 1_827, UNIQUE_BLOCKS) == 0.052270
    assert reference_hit_ratio("opt", 1_827, UNIQUE_BLOCKS) == 0.246319
    assert reference_hit_ratio("lru", 1_828, UNIQUE_BLOCKS) is None


def test_key_files_and_mooncake_files_are_told_apart(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# a comment\nx\ny\nx\n7\n7\n\n")
    trace = load_trace(keys)
    assert trace.format == "keys"
    assert trace.accesses == ["x", "y", "x", 7, 7]
    assert trace.requests == [("x",), ("y",), ("x",), (7,), (7,)]
    assert not trace.is_shipped_trace
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [4, 5]}\n'
        '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [4]}\n'
    )
    trace = load_trace(mooncake)
    assert trace.format == "mooncake"
    assert trace.requests == [(4, 5), (4,)]
    assert trace.unique_blocks == 2
    assert load_trace(mooncake, limit=1).accesses == [4, 5]


def test_limit_stops_reading_before_a_later_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{oops\n'
    )
    assert load_trace(path, limit=1).accesses == [1]
    with pytest.raises(TraceFormatError, match=r"t.jsonl:2: invalid JSON"):
        load_trace(path)


def test_empty_trace_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("# nothing\n\n")
    with pytest.raises(TraceFormatError, match="no block accesses"):
        load_trace(path)


# -- the sweep and its files ----------------------------------------------------------------


def test_sweep_on_a_key_file_matches_hand_counts(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    # a b c a b d a: LRU(2) hits nothing; OPT(2) keeps a and hits it twice; infinite hits 3.
    keys.write_text("a\nb\nc\na\nb\nd\na\n")
    trace = load_trace(keys)
    report = run_sweep(trace, ("lru",), parse_capacities("2,100%"))
    assert [c.blocks for c in report.capacities] == [2, 4]
    assert report.row("lru", 2).result.hits == 0
    assert report.row("opt", 2).result.hits == 2
    assert report.row("lru", 4).result.hits == 3
    assert report.infinite.hits == 3
    assert not report.shipped and all(row.reference is None for row in report.rows)
    path = write_sweep_outputs(report, tmp_path / "out")
    assert path.name == "simulate.json"
    document = json.loads(path.read_text())
    assert document["trace"]["format"] == "keys"
    assert document["infinite_cache"]["hits"] == 3
    assert {(r["policy"], r["blocks"], r["hits"]) for r in document["results"]} == {
        ("lru", 2, 0),
        ("opt", 2, 2),
        ("lru", 4, 3),
        ("opt", 4, 3),
    }
    assert chart_sweep(report, tmp_path / "out" / "simulate.png").read_bytes().startswith(PNG_MAGIC)


def test_capacities_that_resolve_alike_are_reported_once(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("a\nb\nc\nd\n")
    report = run_sweep(load_trace(keys), ("lru",), parse_capacities("50%,2,100%,4"))
    assert [(c.label, c.blocks) for c in report.capacities] == [("50%", 2), ("100%", 4)]


# -- the command ----------------------------------------------------------------------------


def test_simulate_happy_path_prints_the_table_and_writes_json_and_png(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = run(
        "simulate", "--limit", "400", "--capacity", "1%,5%,2048", "--out", str(out)
    )
    assert code == 0, stderr
    assert "400 requests" in stdout and "Mooncake JSONL" in stdout
    assert "Block hit ratio by capacity" in stdout
    for word in ("lru", "arc", "OPT", "infinite", "2,048"):
        assert word in stdout
    assert "reference" not in stdout.split("Block hit ratio")[1].split("wrote")[0]
    assert f"wrote {out / 'simulate.json'}" in stdout and f"wrote {out / 'simulate.png'}" in stdout
    assert stderr == ""  # not a terminal: no progress bar
    png = (out / "simulate.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    document = json.loads((out / "simulate.json").read_text())
    assert document["trace"]["requests"] == 400
    assert document["trace"]["limited"] is True and document["trace"]["shipped"] is False
    assert document["policies"] == ["lru", "arc"]
    assert [c["label"] for c in document["capacities"]][-1] == "2048"
    assert len(document["results"]) == 3 * 3
    infinite = document["infinite_cache"]["hits"]
    accesses = load_trace(None, 400).accesses
    for blocks in (c["blocks"] for c in document["capacities"]):
        rows = {r["policy"]: r for r in document["results"] if r["blocks"] == blocks}
        assert max(rows["lru"]["hits"], rows["arc"]["hits"]) <= rows["opt"]["hits"] <= infinite
        assert rows["lru"]["hits"] == simulate("lru", blocks, accesses).hits


def test_simulate_json_flag_prints_only_json_on_stdout(tmp_path: Path) -> None:
    code, stdout, stderr = run(
        "simulate",
        "--limit",
        "50",
        "--policy",
        "lru",
        "--capacity",
        "10",
        "--json",
        "--no-plot",
        "--out",
        str(tmp_path),
    )
    assert code == 0, stderr
    document = json.loads(stdout)
    assert [(r["policy"], r["blocks"]) for r in document["results"]] == [("lru", 10), ("opt", 10)]
    assert "simulate.json" in stderr and not (tmp_path / "simulate.png").exists()


@pytest.mark.slow
def test_default_run_reproduces_the_reference_figures(tmp_path: Path) -> None:
    code, stdout, stderr = run("simulate", "--json", "--out", str(tmp_path))
    assert code == 0, stderr
    document = json.loads(stdout)
    assert document["trace"]["shipped"] is True
    assert document["trace"]["block_accesses"] == ACCESSES
    assert document["infinite_cache"]["hit_ratio"] == pytest.approx(0.366412, abs=5e-7)
    lru_hits = {1_827: 15_080, 9_139: 56_382, 18_279: 80_323, 45_697: 101_978, 91_395: 104_759}
    rows = document["results"]
    assert sorted({r["blocks"] for r in rows}) == sorted(lru_hits)
    for row in rows:
        assert row["reference_hit_ratio"] is not None
        if row["policy"] == "lru":
            assert row["hits"] == lru_hits[row["blocks"]]
        elif row["policy"] == "arc":
            assert abs(row["difference_pp"]) <= 0.2
        else:
            assert row["policy"] == "opt" and row["hits"] == OPT_HITS[row["blocks"]]
    for blocks in lru_hits:
        by_policy = {r["policy"]: r["hits"] for r in rows if r["blocks"] == blocks}
        assert max(by_policy["lru"], by_policy["arc"]) <= by_policy["opt"] <= 105_710
    assert (tmp_path / "simulate.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.slow
def test_the_table_shows_reference_figures_on_the_shipped_trace(tmp_path: Path) -> None:
    # One cheap capacity of the whole trace: LRU at 1 % is exact, so its diff prints +0.0000.
    code, stdout, stderr = run(
        "simulate", "--policy", "lru", "--capacity", "1%", "--no-plot", "--out", str(tmp_path)
    )
    assert code == 0, stderr
    assert "reference" in stdout and "0.052270" in stdout and "0.246319" in stdout
    assert "+0.0000" in stdout and "-0.0000" not in stdout
    assert "largest difference from the reference figures: lru 0.0000 pp, OPT 0.0000 pp" in stdout


def one_line_error(args: list[str], *needles: str) -> None:
    code, stdout, stderr = run(*args)
    assert code == 2, (stdout, stderr)
    # One message; rich's stderr console hard-wraps it at 80 columns when not a terminal.
    message = stderr.rstrip("\n").replace("\n", "")
    assert message.startswith("kvtier: error:") and message.count("kvtier:") == 1, stderr
    assert "Traceback" not in stdout + stderr
    squeezed = "".join(message.split())  # the wrap may eat the space it breaks at
    for needle in needles:
        assert "".join(needle.split()) in squeezed, stderr


def test_unknown_policy_lists_the_valid_ones(tmp_path: Path) -> None:
    one_line_error(
        ["simulate", "--policy", "lru,belady", "--out", str(tmp_path)],
        "'belady'",
        "valid policies: arc, auto, lct, lru, s3fifo",
    )


@pytest.mark.parametrize("bad", ["abc", "0%", "150%", "0"])
def test_bad_capacity_is_one_line(bad: str, tmp_path: Path) -> None:
    one_line_error(["simulate", "--capacity", f"1%,{bad}", "--out", str(tmp_path)], repr(bad))


def test_missing_trace_file_is_one_line(tmp_path: Path) -> None:
    one_line_error(
        ["simulate", "--trace", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)],
        "nope.jsonl",
        "no such file",
    )


def test_malformed_trace_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}\n'
    )
    one_line_error(["simulate", "--trace", str(path), "--out", str(tmp_path)], "t.jsonl:2:")


def test_missing_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    one_line_error(["simulate", "--limit", "10", "--out", str(tmp_path)], "pip install matplotlib")
    code, _, stderr = run("simulate", "--limit", "10", "--no-plot", "--out", str(tmp_path))
    assert code == 0, stderr


def test_plot_helpers_raise_a_kvtier_error_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvtier_tools.cli.charts import plot_hit_ratio_vs_capacity

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(KvtierError, match=r"pip install matplotlib"):
        plot_hit_ratio_vs_capacity(tmp_path / "x.png", title="t", unique_blocks=1, curves={})


def test_help_has_examples() -> None:
    code, stdout, _ = run("simulate", "--help")
    assert code == 0
    assert "Examples:" in stdout and "--capacity" in stdout and "--policy" in stdout


def test_skip_partial_blocks_stores_no_partial_block(tmp_path: Path) -> None:
    code, stdout, stderr = run(
        "simulate",
        "--policy",
        "lru",
        "--capacity",
        "2%",
        "--limit",
        "400",
        "--skip-partial-blocks",
        "--json",
        "--no-plot",
        "--out",
        str(tmp_path / "a"),
    )
    assert code == 0, stderr
    skipping = json.loads(stdout)
    code, stdout, stderr = run(
        "simulate",
        "--policy",
        "lru",
        "--capacity",
        "2%",
        "--limit",
        "400",
        "--json",
        "--no-plot",
        "--out",
        str(tmp_path / "b"),
    )
    plain = json.loads(stdout)
    assert code == 0, stderr
    assert skipping != plain  # the partial blocks took no room
    written = {}
    for flag in ("--skip-partial-blocks", None):
        args = ["simulate", "--tiers", "1%,2%", "--limit", "400", "--json", "--no-plot"]
        code, stdout, stderr = run(*args, *([flag] if flag else []), "--out", str(tmp_path / "c"))
        assert code == 0, stderr
        chain = json.loads(stdout)["chain"]
        written[flag] = sum(tier["blocks_written"] for tier in chain["tiers"])
        assert (chain["counters"]["partial_refused"] > 0) == (flag is not None)
    assert written["--skip-partial-blocks"] < written[None]
