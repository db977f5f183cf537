"""A soak that decides: the memory trend judged at several looks, stopping once the interval clears the bound.

Every series is synthetic with a known answer (a line plus seeded noise), so each test knows
what the rule must find. The Monte Carlo cases run the exact rule, every look included
(:func:`adaptcheck.perf.trend.simulate_sequential`); the last tests show that these same
checks catch a weakened rule — deciding on the slope alone, or looking several times
without the stricter per-look confidence.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from adaptcheck.perf import trend
from adaptcheck.perf.trend import (
    GrowthVerdict,
    SequentialRule,
    SequentialVerdict,
    look_confidence,
    memory_growth_verdict,
    sequential_verdict,
    settled,
    simulate_sequential,
)

BOUND = 10.0
# A short soak sampled every second: 3 s warm-up, looks at 20, 33, 47 and 60 s.
RULE = SequentialRule(BOUND, first_s=20.0, last_s=60.0, looks=4, warmup_s=3.0)
WRONG_AT_BOUND = 0.075
"""Most either wrong decision may happen, over every look, for a series growing exactly at the
bound (nominal: 5 %; measured 1-5 % in these cases)."""


def line(slope: float, noise: float, *, seed: int, last_s: float = 60.0, rho: float = 0.0,
         base: float = 900.0) -> list[tuple[float, float | None]]:
    rng = random.Random(seed)
    n = int(last_s) + 1
    errors = trend.ar1_noise(rng, n, rho, noise)
    return [(float(t), base + slope * t / 60.0 + errors[t]) for t in range(n)]


def test_the_looks_are_evenly_spaced_and_each_one_is_stricter() -> None:
    assert RULE.times() == pytest.approx([20.0, 33.333, 46.667, 60.0], abs=1e-3)
    assert RULE.per_look_confidence == pytest.approx(1 - 0.05 / 4) == look_confidence(0.95, 4)
    one = SequentialRule(BOUND, first_s=30.0, last_s=30.0, looks=4)
    assert one.times() == [30.0] and one.per_look_confidence == pytest.approx(0.95)  # one look: no correction
    with pytest.raises(ValueError):
        SequentialRule(BOUND, first_s=30.0, last_s=20.0)


def test_a_flat_server_passes_at_the_first_look() -> None:
    v = sequential_verdict({"rss": line(0.0, 0.5, seed=1)}, RULE)
    assert v.stop == "decided" and v.look == 0 and v.at_s == 20.0
    rss = v.verdicts["rss"]
    assert rss.state == "within" and rss.ok is True and rss.bounds is not None and rss.bounds[1] <= BOUND
    assert rss.confidence == pytest.approx(0.9875) and rss.fit is not None and rss.fit.t_end_s == 20.0


def test_a_real_leak_fails_at_the_first_look() -> None:
    v = sequential_verdict({"rss": line(120.0, 2.0, seed=2)}, RULE)
    assert v.stop == "decided" and v.look == 0
    assert v.verdicts["rss"].state == "over" and v.verdicts["rss"].bounds is not None
    assert v.verdicts["rss"].bounds[0] > BOUND


def test_a_noisier_flat_server_runs_until_its_interval_clears_the_bound() -> None:
    # Too noisy for 20 s, decided later: the soak goes on instead of calling it inconclusive.
    series = line(0.0, 6.0, seed=3)
    first = RULE.judge(series, 20.0)
    assert first.state == "inconclusive"
    v = sequential_verdict({"rss": series}, RULE)
    assert v.stop == "decided" and v.look > 0 and v.verdicts["rss"].state == "within"


def test_growth_at_the_bound_runs_to_the_budget_and_stays_inconclusive() -> None:
    for seed in range(4, 8):
        v = sequential_verdict({"rss": line(BOUND, 2.0, seed=seed)}, RULE)
        assert v.stop == "budget" and v.look == 3 and v.at_s == 60.0, seed
        rss = v.verdicts["rss"]
        assert rss.state == "inconclusive" and rss.ok is None  # never a pass
        assert rss.bounds is not None and rss.bounds[0] < BOUND < rss.bounds[1]
        assert "inconclusive: run longer" in rss.reason and "straddles the bound 10 MiB/min" in rss.reason


def test_every_series_must_be_decided_and_one_over_ends_it() -> None:
    flat, noisy, leak = line(0.0, 0.5, seed=8), line(0.0, 6.0, seed=3), line(120.0, 2.0, seed=2)
    both = sequential_verdict({"rss": flat, "device": noisy}, RULE)
    assert both.look > 0 and {k: v.state for k, v in both.verdicts.items()} == {"rss": "within", "device": "within"}
    over = sequential_verdict({"rss": noisy, "device": leak}, RULE)
    assert over.look == 0 and over.verdicts["device"].state == "over"  # a fail whatever the other does
    assert settled(["within", "not judged"]) and not settled(["within", "inconclusive"])
    assert settled(["inconclusive", "over"])


@pytest.mark.parametrize(("rho", "seed"), [(0.0, 11), (0.5, 12)])
def test_at_the_bound_each_wrong_decision_stays_rare_over_all_looks(rho: float, seed: int) -> None:
    rates = simulate_sequential(RULE, BOUND, 2.0, rho, trials=200, seed=seed)
    assert rates["within"] <= WRONG_AT_BOUND and rates["over"] <= WRONG_AT_BOUND, rates
    assert rates["inconclusive"] >= 0.85 and rates["mean_stop_s"] > 55


def test_a_flat_server_and_a_leak_are_decided_early() -> None:
    flat = simulate_sequential(RULE, 0.0, 0.5, 0.5, trials=100, seed=13)
    assert flat["within"] >= 0.99 and flat["mean_stop_s"] < 35
    leak = simulate_sequential(RULE, 60.0, 0.5, 0.5, trials=100, seed=14)
    assert leak["over"] >= 0.99 and leak["mean_stop_s"] < 35


# ------------------------------------------------------------- a weakened rule is caught --

def _on_the_slope(series: Mapping[str, Sequence[tuple[float, float | None]]],
                  rule: SequentialRule) -> SequentialVerdict:
    """The weakened rule: the fitted slope against the bound, its interval ignored."""
    verdicts = {}
    for key, samples in series.items():
        v = rule.judge(samples, rule.times()[0])
        assert v.fit is not None
        ok = v.fit.slope_mib_per_min <= rule.bound_mib_per_min
        verdicts[key] = GrowthVerdict(ok, "", v.fit, "within" if ok else "over")
    return SequentialVerdict(0, rule.times()[0], verdicts, "decided")


def test_deciding_on_the_slope_alone_is_caught() -> None:
    rates = simulate_sequential(RULE, BOUND, 2.0, 0.0, trials=200, seed=11, judge=_on_the_slope)
    assert rates["within"] > WRONG_AT_BOUND and rates["over"] > WRONG_AT_BOUND  # about half and half
    # ... and one series at the bound shows it: a pass where the real rule says "run longer".
    series = line(BOUND, 2.0, seed=5)
    weak, real = _on_the_slope({"rss": series}, RULE), sequential_verdict({"rss": series}, RULE)
    assert real.verdicts["rss"].state == "inconclusive" and weak.verdicts["rss"].state != "inconclusive"


def test_looking_often_without_the_stricter_confidence_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    often = SequentialRule(BOUND, first_s=20.0, last_s=60.0, looks=10, warmup_s=3.0)
    honest = simulate_sequential(often, BOUND, 2.0, 0.0, trials=200, seed=15)
    assert honest["within"] + honest["over"] <= 2 * WRONG_AT_BOUND, honest
    monkeypatch.setattr(trend, "look_confidence", lambda confidence, looks: confidence)  # 95 % at every look
    naive = simulate_sequential(often, BOUND, 2.0, 0.0, trials=200, seed=15)
    # 11 % wrong at 95 % a look (above the 10 % two 5 % sides allow) against 0.5 % honest. Less
    # than before the two-model interval (each model is bound at 97.5 %, see Fit.slope_bounds),
    # which is why the comparison is with the nominal rate and with the honest rule.
    wrong = naive["within"] + naive["over"]
    assert wrong > 2 * (1 - 0.95) and wrong > 10 * (honest["within"] + honest["over"]), (naive, honest)


def test_the_single_look_verdict_is_the_rule_with_one_look() -> None:
    series = line(3.0, 2.0, seed=16, last_s=40.0)
    one = SequentialRule(BOUND, first_s=40.0, last_s=40.0, warmup_s=3.0)
    direct = memory_growth_verdict([(t, v) for t, v in series if t <= 40.0], BOUND, warmup_s=3.0)
    assert sequential_verdict({"rss": series}, one).verdicts["rss"] == direct
