"""tests/helpers/token_margin.py, the TPU tier's rule for a greedy token that differs from the reference: explained
only when the reference's gap to our token is below the logit error measured where the two agreed."""

from __future__ import annotations

import pytest

from helpers.token_margin import judge

V = 6


def _logits(best: int, second: int, margin: float) -> list[float]:
    row = [0.0] * V
    row[best], row[second] = 10.0, 10.0 - margin
    return row


def _plus(row: list[float], d: float) -> list[float]:
    return [x + d for x in row]


def test_equal_decodes_report_the_largest_error_and_are_explained():
    ref = [[_logits(1, 2, 3.0), _logits(4, 0, 3.0)]]
    ours = [[_plus(ref[0][0], 0.01), _plus(ref[0][1], -0.02)]]
    v = judge([[1, 4]], [[1, 4]], ours, ref)
    assert v.identical and v.explained and v.compared_steps == 2
    assert v.logit_error == pytest.approx(0.02)


def test_a_near_tie_within_the_error_is_explained_and_later_steps_are_not_compared():
    ref = [[_logits(1, 2, 3.0), _logits(4, 0, 0.01), _logits(5, 0, 9.0)]]
    ours = [[_plus(ref[0][0], 0.05), ref[0][1], [0.0] * V]]  # step 2 would be far off: its context differs, not read
    v = judge([[1, 0, 3]], [[1, 4, 5]], ours, ref)
    assert [(d.step, d.ours, d.reference) for d in v.divergences] == [(1, 0, 4)]
    assert v.divergences[0].top2_margin == pytest.approx(0.01) and v.compared_steps == 1
    assert v.explained, v.report()


def test_a_margin_above_the_error_is_not_explained():
    ref = [[_logits(1, 2, 3.0), _logits(4, 0, 0.5)]]
    ours = [[_plus(ref[0][0], 0.05), ref[0][1]]]
    v = judge([[1, 0]], [[1, 4]], ours, ref)
    assert not v.explained and "NOT below" in v.report()


def test_a_token_the_reference_ranks_far_down_is_not_explained_even_with_a_small_top2_margin():
    row = _logits(4, 0, 0.001)
    row[3] = 2.0  # ours: far below the top two
    ref = [[_logits(1, 2, 3.0), row]]
    ours = [[_plus(ref[0][0], 0.05), row]]
    v = judge([[1, 3]], [[1, 4]], ours, ref)
    d = v.divergences[0]
    assert d.top2_margin < v.logit_error < d.gap and not v.explained


def test_the_error_comes_from_every_prompt_and_no_agreeing_step_explains_nothing():
    first = [[_logits(1, 2, 0.01)]]
    assert not judge([[2]], [[1]], first, first).explained  # nothing agreed: no error measured (nan)
    ref = [[_logits(1, 2, 0.01)], [_logits(3, 2, 5.0)]]
    ours = [[ref[0][0]], [_plus(ref[1][0], 0.1)]]
    v = judge([[2], [3]], [[1], [3]], ours, ref)
    assert v.logit_error == pytest.approx(0.1) and v.explained


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="prompt 0"):
        judge([[1]], [[1, 2]], [[[0.0] * V]], [[[0.0] * V]])
