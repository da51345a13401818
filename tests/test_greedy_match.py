"""The rule that tells a top-2 tie from a wrong token (kvtier_tools.bench.greedy_match), on
synthetic greedy completions: no engine needed."""

from __future__ import annotations

import pytest

from kvtier_tools.bench.greedy_match import TIE_MARGIN, Step, compare_greedy, steps_of


def completion(*steps: tuple[int, dict[int, float]]) -> list[Step]:
    return list(steps)


REFERENCE = completion(
    (5, {5: -0.1, 7: -2.5, 9: -3.0}),
    (11, {11: -0.7, 12: -0.7, 13: -4.0}),  # a tie: 11 and 12 at exactly the same logprob
    (20, {20: -0.2, 21: -1.9, 22: -3.3}),
)


def test_identical_completions_are_identical() -> None:
    verdict = compare_greedy(REFERENCE, list(REFERENCE), logprob_tolerance=0.0)
    assert verdict.kind == "identical"
    assert verdict.ok
    assert verdict.steps == 3
    assert verdict.max_logprob_delta == 0.0
    assert verdict.describe().startswith("identical (3 tokens")


def test_parting_on_a_tie_is_reported_with_its_margin_not_failed() -> None:
    # The candidate breaks the tie at position 1 the other way, then goes its own way.
    candidate = completion(
        (5, {5: -0.1, 7: -2.5, 9: -3.0}),
        (12, {12: -0.69, 11: -0.71, 13: -4.0}),
        (40, {40: -0.3, 41: -1.5, 42: -2.0}),
    )
    verdict = compare_greedy(REFERENCE, candidate)
    assert verdict.kind == "tie"
    assert verdict.ok
    assert verdict.position == 1
    assert (verdict.reference_token, verdict.candidate_token) == (11, 12)
    # The larger of the two runs' gaps between the two tokens: 0.0 and 0.02.
    assert verdict.margin == pytest.approx(0.02)
    assert verdict.reference_logprobs == (-0.7, -0.7)
    assert verdict.candidate_logprobs == (-0.71, -0.69)
    assert "tie at position 1 of 3" in verdict.describe()
    assert "margin 0.02" in verdict.describe()


def test_parting_without_a_tie_fails_naming_the_position_and_both_logprobs() -> None:
    candidate = completion(
        (7, {7: -0.05, 5: -3.2, 9: -4.0}),  # 7 where the reference was sure of 5
        (11, {11: -0.7, 12: -0.7, 13: -4.0}),
        (20, {20: -0.2, 21: -1.9, 22: -3.3}),
    )
    verdict = compare_greedy(REFERENCE, candidate)
    assert verdict.kind == "mismatch"
    assert not verdict.ok
    assert verdict.position == 0
    assert (verdict.reference_token, verdict.candidate_token) == (5, 7)
    assert verdict.reference_logprobs == (-0.1, -2.5)
    assert verdict.candidate_logprobs == (-3.2, -0.05)
    line = verdict.describe()
    assert line.startswith("MISMATCH at position 0 of 3")
    assert "reference token 5, candidate token 7" in line
    assert "reference run (-0.1000, -2.5000)" in line
    assert "candidate run (-3.2000, -0.0500)" in line


def test_a_tie_in_the_reference_alone_is_not_enough() -> None:
    # The reference is tied, but the candidate is sure of its token: its KV differs.
    candidate = completion(
        (5, {5: -0.1, 7: -2.5, 9: -3.0}),
        (12, {12: -0.01, 11: -5.0, 13: -6.0}),
        (20, {20: -0.2, 21: -1.9, 22: -3.3}),
    )
    verdict = compare_greedy(REFERENCE, candidate)
    assert verdict.kind == "mismatch"
    assert verdict.position == 1
    assert verdict.margin == pytest.approx(4.99)


def test_a_token_outside_the_top_two_is_a_mismatch() -> None:
    candidate = completion(
        (5, {5: -0.1, 7: -2.5, 9: -3.0}),
        (13, {13: -0.5, 11: -0.6, 12: -0.6}),
    )
    verdict = compare_greedy(REFERENCE, candidate)
    assert verdict.kind == "mismatch"
    assert verdict.position == 1
    assert verdict.reference_logprobs == (-0.7, -4.0)
    assert "not the top two" in verdict.describe()


def test_a_gap_past_the_tie_margin_is_a_mismatch() -> None:
    gap = TIE_MARGIN * 3
    reference = completion((1, {1: -1.0, 2: -1.0 - gap}))
    candidate = completion((2, {2: -1.0, 1: -1.0 - gap}))
    assert compare_greedy(reference, candidate).kind == "mismatch"
    assert compare_greedy(reference, candidate, tie_margin=gap).kind == "tie"


def test_logprobs_are_judged_only_where_a_tolerance_is_asked_for() -> None:
    moved = completion(
        (5, {5: -0.1, 7: -2.5, 9: -3.0}),
        (11, {11: -0.7, 12: -0.7, 13: -4.0001}),
        (20, {20: -0.2, 21: -1.9, 22: -3.3}),
    )
    loose = compare_greedy(REFERENCE, moved)
    assert loose.kind == "identical"
    assert loose.max_logprob_delta == pytest.approx(1e-4)
    strict = compare_greedy(REFERENCE, moved, logprob_tolerance=0.0)
    assert strict.kind == "mismatch"
    assert strict.position == 1
    assert "token 13 moved by 0.0001" in strict.describe()


def test_a_shorter_completion_is_a_mismatch() -> None:
    verdict = compare_greedy(REFERENCE, REFERENCE[:2])
    assert verdict.kind == "mismatch"
    assert verdict.position == 2
    assert "2 tokens where the reference has 3" in verdict.describe()


def test_steps_of_reads_json_records_and_refuses_a_ragged_one() -> None:
    assert steps_of([5], [{"5": -0.1, "7": -2.5}]) == [(5, {5: -0.1, 7: -2.5})]
    with pytest.raises(ValueError, match="2 tokens but 1 steps"):
        steps_of([5, 6], [{"5": -0.1}])


def test_a_negative_tie_margin_is_refused() -> None:
    with pytest.raises(ValueError, match="tie_margin must be >= 0, not -1"):
        compare_greedy(REFERENCE, REFERENCE, tie_margin=-1)
