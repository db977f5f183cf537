"""The host-speed adjustment of the stability verdict: it acquits what the host's speed explains, nothing else.

Planted cases: a metric that follows the reference (host-driven) is explained; a server whose
runs jump while the reference stays flat keeps its dispersion however the slope comes out
(the clamp); a faster-when-the-host-is-slower relation is never used to acquit.
"""

from __future__ import annotations

import math
import random

import pytest

from adaptcheck.perf.host_adjust import B_MAX, HostSample, adjust_decision, adjusted, elasticity, judge
from adaptcheck.perf.host_adjust import false_failure_rate as mc_rate
from adaptcheck.perf.stability import Rule, decide, dispersion

CONF = 0.95


def host_driven(n: int, b: float, speed_sd: float, own_sd: float, seed: int) -> tuple[list[float], list[float]]:
    """n runs of a server whose log-metric is b × the host's log-speed plus its own noise."""
    rng = random.Random(seed)
    hs = [rng.gauss(0.0, speed_sd) for _ in range(n)]
    return [2.5 * math.exp(b * h + rng.gauss(0.0, own_sd)) for h in hs], [0.18 * math.exp(h) for h in hs]


def test_the_elasticity_recovers_a_planted_slope_pooled_over_levels() -> None:
    a = host_driven(8, 2.0, 0.1, 0.01, seed=1)
    # A second level at another load (5x the values) and another host mean: centring per level keeps the slope.
    v2, s2 = host_driven(8, 2.0, 0.1, 0.01, seed=2)
    b = elasticity([a, ([5 * v for v in v2], [1.3 * s for s in s2])], sign=1)
    assert b is not None and abs(b - 2.0) < 0.1
    # Throughput goes down when the host slows: sign -1 turns it into the same positive elasticity.
    tok = [1000.0 / v for v in a[0]]
    b_tok = elasticity([(tok, a[1])], sign=-1)
    assert b_tok is not None and abs(b_tok - 2.0) < 0.1


def test_the_elasticity_is_clamped_and_absent_without_evidence() -> None:
    steep = host_driven(6, 8.0, 0.1, 0.0, seed=3)
    assert elasticity([steep], sign=1) == B_MAX
    # Faster when the host is slower: not something the host can explain, slope 0.
    assert elasticity([host_driven(6, -1.0, 0.1, 0.0, seed=4)], sign=1) == 0.0
    assert elasticity([([1.0, 2.0, 3.0], [0.2, 0.2, 0.2])], sign=1) is None  # the reference never moved
    assert elasticity([([1.0, 2.0], [0.2, 0.3])], sign=1) is None  # two pairs: no slope worth the name


def test_adjusted_values_are_brought_to_the_mean_host_speed() -> None:
    out = adjusted([1.0, 4.0], [1.0, 4.0], b=1.0, sign=1)
    assert out == pytest.approx([2.0, 2.0])  # geometric-mean speed 2
    with pytest.raises(ValueError):
        adjusted([1.0, 2.0], [1.0], b=1.0, sign=1)


def test_a_host_driven_dispersion_is_explained_and_judged_stable() -> None:
    values, speeds = host_driven(8, 2.0, 0.12, 0.02, seed=5)
    raw = dispersion(values, CONF)
    assert raw is not None and raw.verdict(0.1) == "unstable"  # 24 % CV raw against a 10 % bound
    b = elasticity([(values, speeds)], sign=1)
    ha = judge(raw.verdict(0.1), values, speeds, b, 1, 0.1, CONF)
    assert ha is not None and ha.explained and ha.verdict == "stable" and ha.dispersion.cv < 0.05
    assert 0.08 < ha.speed_cv < 0.2 and ha.evidence().cv == ha.dispersion.cv


def test_every_other_run_twice_as_slow_is_not_explained_by_a_flat_reference() -> None:
    rng = random.Random(6)
    values = [2.0 * (2.0 if i % 2 else 1.0) for i in range(8)]
    speeds = [0.18 * math.exp(rng.gauss(0.0, 0.01)) for _ in range(8)]  # a quiet host: 1 % reference noise
    # Even the largest slope allowed moves a run by at most 3 × the reference's few percent.
    for b in (elasticity([(values, speeds)], sign=1), B_MAX):
        ha = judge("unstable", values, speeds, b, 1, 0.15, CONF)
        assert ha is not None and not ha.explained and ha.verdict == "unstable"


def test_nothing_is_formed_without_a_speed_for_every_run() -> None:
    assert judge("unstable", [1.0, 2.0, 3.0], None, 1.0, 1, 0.1, CONF) is None
    assert judge("unstable", [1.0, 2.0, 3.0], [0.2, 0.2], 1.0, 1, 0.1, CONF) is None
    assert judge("unstable", [1.0, 2.0, 3.0], [0.2, 0.3, 0.25], None, 1, 0.1, CONF) is None


def test_a_stable_metric_is_never_marked_explained() -> None:
    values, speeds = host_driven(6, 1.0, 0.02, 0.01, seed=7)
    ha = judge("stable", values, speeds, 1.0, 1, 0.2, CONF)
    assert ha is not None and not ha.explained


def test_adjust_decision_turns_only_an_explained_instability() -> None:
    values, speeds = host_driven(6, 2.0, 0.12, 0.02, seed=8)
    metrics = {"tpot_ms_median": values, "output_tok_per_s": [1000.0 / v for v in values]}
    rule = Rule(max_cv=0.1, min_runs=3, max_runs=6)
    raw = decide(metrics, rule)
    assert raw.verdict == "unstable"
    b = {k: elasticity([(metrics[k], speeds)], s) for k, s in (("tpot_ms_median", 1), ("output_tok_per_s", -1))}
    verdict, adjusted = adjust_decision(raw, metrics, speeds, b, rule)
    assert verdict in ("stable", "undecided") and all(a.explained for a in adjusted.values())
    # Without speeds nothing is formed and the raw verdict stands.
    assert adjust_decision(raw, metrics, None, b, rule) == ("unstable", {})
    # Too few runs stays too few.
    few = decide({k: v[:2] for k, v in metrics.items()}, rule)
    assert adjust_decision(few, metrics, speeds, b, rule)[0] == "too_few"


def test_the_monte_carlo_shows_fewer_false_failures_and_the_same_power() -> None:
    # A small run of benchmarks/stability_false_failures.py's host cases: the adjustment must lower the
    # false-failure rate on a host-driven machine and keep detecting every-other-run-2x on a flat host.
    import numpy as np

    def sample(alternating: bool, speed_sd: float) -> HostSample:
        def draw(rng: np.random.Generator, n: int) -> tuple[dict[str, list[float]], list[float]]:
            h = rng.normal(0.0, speed_sd, size=n)
            ln = 1.4 * h + rng.normal(0.0, 0.05, size=n) + [0.69 * (i % 2) if alternating else 0.0 for i in range(n)]
            return {"tpot_ms_median": list(np.exp(ln))}, list(0.2 * np.exp(h))
        return draw

    rule = Rule(max_cv=0.15, min_runs=3, max_runs=6)
    raw = mc_rate(sample(False, 0.15), rule, host=False, trials=300)
    adj = mc_rate(sample(False, 0.15), rule, host=True, trials=300)
    assert raw["fail"] > 0.3 and adj["fail"] < raw["fail"] / 3, (raw, adj)
    power = mc_rate(sample(True, 0.01), rule, host=True, trials=300)
    assert power["fail"] > 0.95, power
