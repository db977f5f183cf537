"""The teacher-forced statistics: the bucketed KL estimator, summaries and the bound rule."""

from __future__ import annotations

import math
import random

import pytest

from adaptcheck.base.schemas.numerics import Rule
from adaptcheck.steps.frameworks import divergence as dv


def _dist(rng: random.Random, vocab: int, spike: float = 4.0) -> list[float]:
    logits = [rng.gauss(0, 1) for _ in range(vocab)]
    logits[rng.randrange(vocab)] += spike
    z = math.log(sum(math.exp(x) for x in logits))
    return [x - z for x in logits]


def _true_kl(p: list[float], q: list[float]) -> float:
    return sum(math.exp(a) * (a - b) for a, b in zip(p, q, strict=False))


def _top(lp: list[float], k: int) -> dict[int, float]:
    order = sorted(range(len(lp)), key=lambda i: -lp[i])[:k]
    return {i: lp[i] for i in order}


def test_full_distributions_give_the_exact_kl_and_identical_ones_zero() -> None:
    rng = random.Random(1)
    p, q = _dist(rng, 50), _dist(rng, 50)
    full_p, full_q = dict(enumerate(p)), dict(enumerate(q))
    assert dv.position_kl(full_p, full_q) == pytest.approx(_true_kl(p, q), rel=1e-9)
    assert dv.position_kl(full_p, full_p) == 0.0


@pytest.mark.parametrize("k", [1, 3, 10, 40])
def test_top_k_buckets_never_exceed_the_true_kl_and_grow_with_k(k: int) -> None:
    rng = random.Random(k)
    for _ in range(50):
        p = _dist(rng, 64)
        q = [x + rng.gauss(0, 0.3) for x in p]
        z = math.log(sum(math.exp(x) for x in q))
        q = [x - z for x in q]
        est = dv.position_kl(dict(enumerate(p)), _top(q, k))
        assert 0.0 <= est <= _true_kl(p, q) + 1e-12
        assert dv.position_kl(dict(enumerate(p)), _top(q, 64)) >= est - 1e-12


def test_a_device_that_moves_mass_out_of_the_top_k_is_seen_through_the_rest_bucket() -> None:
    ref = {0: math.log(0.9), 1: math.log(0.05)}
    dev = {0: math.log(0.3), 1: math.log(0.05)}  # 0.6 of the mass went elsewhere
    assert dv.position_kl(ref, dev) > 0.5


def test_compare_positions_and_summary() -> None:
    ref_tops = [{1: -0.1, 2: -2.5}, {3: -0.2, 4: -1.8}]
    dev_tops = [{1: -0.1, 2: -2.5}, {4: -0.3, 3: -1.5}]  # position 1: the top token flipped
    stats = dv.compare_positions(ref_tops, [-0.1, -0.2], dev_tops, [-0.1, -1.5])
    assert stats.kl[0] == 0.0 and stats.kl[1] > 0
    assert stats.same_top == [True, False]
    assert stats.dlogprob == pytest.approx([0.0, 1.3])
    s = dv.summarize(stats)
    assert s["positions"] == 2 and s["same_top_rate"] == 0.5 and s["kl_max"] == stats.kl[1]
    with pytest.raises(ValueError):
        dv.compare_positions(ref_tops, [-0.1, -0.2], dev_tops[:1], [-0.1])


def test_quantile_matches_linear_interpolation() -> None:
    xs = [float(i) for i in range(101)]
    assert dv.quantile(xs, 0.99) == pytest.approx(99.0)
    assert dv.quantile([1.0, 2.0], 0.5) == pytest.approx(1.5)
    assert dv.quantile([], 0.99) == 0.0


def test_histogram_counts_every_value_once() -> None:
    values = [0.0, 1e-15, 1e-6, 3e-4, 0.05, 5.0, 500.0]
    counts = dv.histogram(values)
    assert sum(counts) == len(values)
    assert counts[0] == 2  # 0 and below the first edge
    assert counts[-1] == 2  # 5.0 (last bin, 10^0.5..10^1) and 500 (above the last edge)


def test_judge_applies_multiple_times_control_plus_floor() -> None:
    rule = Rule(multiple=4.0, floor={"fp32": 1e-5, "fp16": 1e-4, "bf16": 1e-3}, reason="unit test of the formula")
    out = dv.judge({"kl_mean": 0.0029}, {"kl_mean": 5e-4}, {"kl_mean": rule}, "bf16")
    assert out["kl_mean"].bound == pytest.approx(4 * 5e-4 + 1e-3)
    assert out["kl_mean"].ok is True
    assert dv.judge({"kl_mean": 0.0031}, {"kl_mean": 5e-4}, {"kl_mean": rule}, "bf16")["kl_mean"].ok is False
    # The verdict's JSON form: every field written, in this order.
    assert list(out["kl_mean"].dump()) == ["value", "bound", "multiple", "floor", "control", "ok"]
    with pytest.raises(KeyError):
        rule.bound(1.0, "fp8")
