"""`kvtier simulate --hints`: the parser, the noisy hints derived from a trace's future
(their definition, determinism), `simulate_hinted`, and what hints are worth on the
shipped trace's prefix: perfect hints never lower the hit ratio, uninformative ones
(recall = fpr) do not raise it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import InvalidValueError
from kvtier.hints import Reuse
from kvtier.policies import simulate
from kvtier.policies.simulate import simulate_hinted
from kvtier_tools.workloads.simulation import load_trace, parse_capacities, run_sweep
from kvtier_tools.workloads.simulation.hints import (
    NEVER_AGAIN,
    HintNoise,
    draws,
    next_uses,
    noisy_hints,
    parse_hint_noise,
    run_hinted,
)

# -- the parser ------------------------------------------------------------------------------


def test_the_parser_reads_every_field_and_defaults_the_optional_ones() -> None:
    assert parse_hint_noise("recall=0.9,fpr=0.1") == HintNoise(0.9, 0.1, 1.0, 0)
    assert parse_hint_noise(" fpr=0 , recall=1 ,horizon=2.5,seed=7") == HintNoise(1, 0, 2.5, 7)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("recall=1.5,fpr=0", r"recall=1\.5 must be a number from 0 to 1"),
        ("recall=0.9,fpr=-0.1", r"fpr=-0\.1 must be a number from 0 to 1"),
        ("recall=nan,fpr=0.1", r"recall=nan must be a number from 0 to 1"),
        ("recall=0.9", "fpr missing"),
        ("horizon=2", "recall and fpr missing"),
        ("recall=0.9,fpr=0.2", r"recall=0\.9 and fpr=0\.2 add up to more than 1"),
        ("recall=0.3,fpr=0.6", r"fpr=0\.6 is above 0\.5"),
        ("recall=0.9,fpr=0.1,horizon=0", "horizon=0 must be a positive multiple"),
        ("recall=0.9,fpr=0.1,seed=-1", "seed=-1 is not a non-negative integer"),
        ("recall=0.9,fpr=0.1,foo=1", "'foo=1' is not one of recall=R"),
        ("recall=0.9,recall=0.8,fpr=0", "recall given twice"),
        ("0.9,0.1", "'0.9' is not one of"),
    ],
)
def test_the_parser_names_the_bad_value(text: str, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        parse_hint_noise(text)


# -- the hints -------------------------------------------------------------------------------


def test_next_uses() -> None:
    assert next_uses(["a", "b", "a", "c", "b"]) == [2, 4, NEVER_AGAIN, NEVER_AGAIN, NEVER_AGAIN]


def test_perfect_hints_are_the_truth() -> None:
    accesses = ["a", "b", "a", "c", "c", "b", "d"]
    following = next_uses(accesses)
    hints = noisy_hints(following, draws(len(accesses), 0), HintNoise(1.0, 0.0), horizon=2)
    # a: next in 2 (soon); b: next in 4 (later); a: never again; c: next in 1 (soon); ...
    assert hints == ["likely", None, "never", "likely", "never", "never", "never"]


def test_hints_are_deterministic_and_err_at_the_given_rates() -> None:
    accesses = [i % 500 for i in range(20_000)] + [i % 7 for i in range(20_000)]
    following = next_uses(accesses)
    noise = HintNoise(0.8, 0.1, seed=3)
    hints = noisy_hints(following, draws(len(accesses), 3), noise, horizon=100)
    assert hints == noisy_hints(following, draws(len(accesses), 3), noise, horizon=100)
    assert hints != noisy_hints(following, draws(len(accesses), 4), noise, horizon=100)
    by_truth: dict[str, Counter[str | None]] = {"soon": Counter(), "later": Counter()}
    by_truth["never"] = Counter()
    for index, (nxt, given) in enumerate(zip(following, hints, strict=True)):
        truth: str = "never" if nxt == NEVER_AGAIN else "soon" if nxt - index <= 100 else "later"
        by_truth[truth][given] += 1

    def rate(truth: str, hint: str) -> float:
        return by_truth[truth][hint] / sum(by_truth[truth].values())

    assert all(sum(counts.values()) >= 500 for counts in by_truth.values())
    assert rate("soon", "likely") == pytest.approx(0.8, abs=0.03)  # recall
    assert rate("never", "never") == pytest.approx(0.8, abs=0.03)
    for truth, hint in [("soon", "never"), ("never", "likely"), ("later", "likely")]:
        assert rate(truth, hint) == pytest.approx(0.1, abs=0.03), (truth, hint)  # fpr
    assert rate("later", "never") == pytest.approx(0.1, abs=0.03)


# -- simulate_hinted -------------------------------------------------------------------------


def test_no_hints_replay_as_simulate_does() -> None:
    keys = [i % 37 for i in range(2_000)] + [i % 91 for i in range(2_000)]
    for policy in ("lru", "arc", "lct"):
        plain = simulate(policy, 40, keys)
        hinted = simulate_hinted(policy, 40, keys, [None] * len(keys), likely_ttl=10)
        assert (hinted.hits, hinted.evictions) == (plain.hits, plain.evictions), policy


def test_likely_protects_for_its_ttl_and_never_goes_first() -> None:
    # LRU of 2: without hints, a b c a evicts a (a misses again); "likely" on a keeps it
    keys = ["a", "b", "c", "a"]
    assert simulate("lru", 2, keys).hits == 0
    hints: list[Reuse | None] = ["likely", None, None, None]
    assert simulate_hinted("lru", 2, keys, hints, likely_ttl=3).hits == 1
    assert simulate_hinted("lru", 2, keys, hints, likely_ttl=1).hits == 0  # expired at b
    # "never" on b: c evicts b rather than the older a
    assert simulate_hinted("lru", 2, keys, [None, "never", None, None]).hits == 1


def test_simulate_hinted_refuses_mismatched_hints() -> None:
    with pytest.raises(InvalidValueError, match="2 hints for 3 accesses"):
        simulate_hinted("lru", 2, ["a", "b", "c"], [None, None])
    with pytest.raises(InvalidValueError, match="likely_ttl must be a positive"):
        simulate_hinted("lru", 2, ["a"], [None], likely_ttl=0)


# -- what hints are worth on the shipped trace -----------------------------------------------

PREFIX = 600
"""Requests of the shipped trace (about 48,000 block accesses)."""


@pytest.fixture(scope="module")
def sweep():  # type: ignore[no-untyped-def]
    return run_sweep(load_trace(None, PREFIX), ("lru", "arc", "lct"), parse_capacities("1%,5%"))


@pytest.mark.slow
def test_perfect_hints_never_lower_the_hit_ratio(sweep) -> None:  # type: ignore[no-untyped-def]
    rows = run_hinted(sweep, HintNoise(1.0, 0.0))
    assert len(rows) == 6
    for row in rows:
        assert row.hinted >= row.without, row
    assert max(row.gain for row in rows) > 0.01  # and they are worth something


@pytest.mark.slow
def test_uninformative_hints_do_not_help(sweep) -> None:  # type: ignore[no-untyped-def]
    for level in (0.1, 0.3):
        for row in run_hinted(sweep, HintNoise(level, level, seed=1)):
            assert row.gain <= 0.005, (level, row)


# -- the command line ------------------------------------------------------------------------


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_simulate_hints_reports_both_hit_ratios(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    code, stdout, stderr = run(
        "simulate", "--limit", "200", "--policy", "lru", "--capacity", "5%", "--no-plot",
        "--hints", "recall=1,fpr=0", "--out", str(out), "--json",
    )  # fmt: skip
    assert code == 0, stderr
    document = json.loads(stdout)
    hints = document["hints"]
    assert (hints["recall"], hints["fpr"], hints["horizon"], hints["seed"]) == (1, 0, 1, 0)
    (row,) = hints["results"]
    (plain,) = [r for r in document["results"] if r["policy"] == "lru"]
    assert row["policy"] == "lru" and row["hit_ratio"] == plain["hit_ratio"]
    assert row["hinted_hit_ratio"] >= row["hit_ratio"]
    assert json.loads((out / "simulate.json").read_text())["hints"] == hints


def test_simulate_hints_errors_name_the_value(tmp_path: Path) -> None:
    code, _, stderr = run("simulate", "--hints", "recall=1.5,fpr=0", "--out", str(tmp_path))
    assert code == 2 and "recall=1.5 must be a number from 0 to 1" in stderr
    code, _, stderr = run(
        "simulate", "--tiers", "1%,5%", "--hints", "recall=1,fpr=0", "--out", str(tmp_path)
    )
    assert code == 2 and "--hints is for the policy sweep" in stderr
