"""The greedy comparison rules: identical, excused near-ties, and the divergences that must fail."""

from __future__ import annotations

import pytest

from adaptcheck.frameworks.base import Generation
from adaptcheck.steps.frameworks.agreement import compare, compare_pair


def gen(ids: list[int], tops: list[dict[int, float]] | None = None, finish: str = "length") -> Generation:
    return Generation(token_ids=ids, text=" ".join(map(str, ids)), finish_reason=finish, top_logprobs=tops)


def tops_for(ids: list[int], alt: dict[int, dict[int, float]] | None = None) -> list[dict[int, float]]:
    """Top logprobs where the chosen token leads by 2 nats, except positions given in ``alt``."""
    out = []
    for pos, t in enumerate(ids):
        out.append((alt or {}).get(pos, {t: -0.1, t + 100: -2.1, t + 101: -3.0}))
    return out


def test_identical_sequences_are_exact() -> None:
    a = gen([1, 2, 3], tops_for([1, 2, 3]))
    v = compare_pair(0, a, gen([1, 2, 3], tops_for([1, 2, 3])), mode="top_n")
    assert v.ok and v.exact and v.common_prefix == 3 and v.max_logprob_diff == pytest.approx(0.0)


def test_divergence_within_each_others_top_n_is_excused() -> None:
    # Position 1 is a near tie between 2 and 9 on both sides.
    ref = gen([1, 2, 3], tops_for([1, 2, 3], {1: {2: -0.70, 9: -0.71}}))
    dev = gen([1, 9, 4], tops_for([1, 9, 4], {1: {9: -0.69, 2: -0.70}}))
    v = compare_pair(0, ref, dev, mode="top_n", top_n=2)
    assert v.ok and not v.exact and v.divergence == 1 and v.b_in_top_a and v.a_in_top_b


def test_divergence_outside_the_reference_top_n_fails() -> None:
    ref = gen([1, 2, 3], tops_for([1, 2, 3]))
    dev = gen([1, 55, 3], tops_for([1, 55, 3]))  # 55 is nowhere in the reference's top-N
    v = compare_pair(0, ref, dev, mode="top_n", top_n=5)
    assert not v.ok and "token 1 is 55 instead of 2" in v.reason


def test_the_reference_token_must_also_be_in_the_answers_top_n() -> None:
    ref = gen([1, 2], tops_for([1, 2], {1: {2: -0.7, 9: -0.8}}))
    dev = gen([1, 9], tops_for([1, 9]))  # the device's top-N at position 1 lacks 2
    assert not compare_pair(0, ref, dev, mode="top_n", top_n=5).ok


def test_answer_without_logprobs_is_judged_by_the_reference_side_only() -> None:
    ref = gen([1, 2], tops_for([1, 2], {1: {2: -0.7, 9: -0.8}}))
    assert compare_pair(0, ref, gen([1, 9]), mode="top_n").ok
    assert not compare_pair(0, ref, gen([1, 77]), mode="top_n").ok


def test_no_logprobs_on_either_side_cannot_excuse_a_divergence() -> None:
    v = compare_pair(0, gen([1, 2]), gen([1, 9]), mode="top_n")
    assert not v.ok and "no logprobs" in v.reason


def test_one_side_stopping_early_fails() -> None:
    v = compare_pair(0, gen([1, 2, 3], finish="length"), gen([1, 2], finish="stop"), mode="top_n")
    assert not v.ok and "stopped" in v.reason


def test_near_tie_mode_excuses_only_small_gaps() -> None:
    alone = gen([1, 2, 3], tops_for([1, 2, 3], {1: {2: -0.70, 9: -0.75}}))
    batched = gen([1, 9, 3], tops_for([1, 9, 3]))
    assert compare_pair(0, alone, batched, mode="near_tie", tie_margin=0.1).ok
    assert not compare_pair(0, alone, batched, mode="near_tie", tie_margin=0.01).ok
    # A confident token (2 nats ahead) flipping inside a batch is a bug whatever the margin.
    confident = gen([1, 2, 3], tops_for([1, 2, 3], {1: {2: -0.1, 9: -2.1}}))
    assert not compare_pair(0, confident, batched, mode="near_tie", tie_margin=0.5).ok


def test_exact_mode_excuses_nothing() -> None:
    ref = gen([1, 2], tops_for([1, 2], {1: {2: -0.70, 9: -0.70}}))
    assert not compare_pair(0, ref, gen([1, 9], tops_for([1, 9])), mode="exact").ok


def test_comparison_metrics_count_what_happened() -> None:
    ref = [gen([1, 2, 3], tops_for([1, 2, 3])), gen([4, 5, 6], tops_for([4, 5, 6])), gen([7, 8], tops_for([7, 8]))]
    dev = [gen([1, 2, 3], tops_for([1, 2, 3])), gen([4, 99, 6], tops_for([4, 99, 6])), gen([7, 8], tops_for([7, 8]))]
    c = compare(ref, dev, mode="top_n")
    m = c.metrics()
    assert not c.ok and m["sequences"] == 3 and m["sequences_exact"] == 2 and m["sequences_failed"] == 1
    assert m["token_agreement"] == pytest.approx(6 / 8)
    assert "first failure: prompt 1" in c.summary()
    with pytest.raises(ValueError):
        compare(ref, dev[:2], mode="top_n")
