"""The memory trend of the soak: a robust least-squares line, never a two-point comparison.

Every series is synthetic with a known answer (a line plus seeded Gaussian noise), so each
test knows what the fit must find; numpy's polyfit is the independent reference for the
plain least-squares part.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from adaptcheck.perf import trend
from adaptcheck.perf.trend import fit_trend, memory_growth_verdict


def series(slope_mib_per_min: float, *, n: int = 120, dt: float = 1.0, noise: float = 0.0, seed: int = 0,
           base: float = 2000.0) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    times = [i * dt for i in range(n)]
    return times, [base + slope_mib_per_min * t / 60.0 + rng.gauss(0.0, noise) for t in times]


def endpoint_slope(times: list[float], values: list[float]) -> float:
    """The wrong way: last minus first over the span (MiB/min)."""
    return (values[-1] - values[0]) / (times[-1] - times[0]) * 60.0


def test_an_exact_line_is_recovered_exactly() -> None:
    times, values = series(7.5)
    fit = fit_trend(times, values)
    assert fit is not None
    assert fit.slope_mib_per_min == pytest.approx(7.5, abs=1e-9)
    assert fit.intercept_mib == pytest.approx(2000.0, abs=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.residual_std_mib == pytest.approx(0.0, abs=1e-9)
    assert fit.growth_over_window_mib == pytest.approx(7.5 * 119 / 60)
    assert fit.growth_per_hour_mib == pytest.approx(450.0)
    assert fit.value_at(60.0) == pytest.approx(2007.5)


def test_a_noisy_line_gives_back_its_slope_and_noise() -> None:
    times, values = series(12.0, noise=2.0, seed=3)
    fit = fit_trend(times, values)
    assert fit is not None and fit.outliers == 0
    assert fit.slope_stderr_mib_per_min is not None
    # Within 3 standard errors of the truth, and the standard error is the textbook one:
    # sigma / sqrt(Sxx) = 2 / sqrt(n (n^2 - 1) / 12) MiB/s for unit spacing.
    assert abs(fit.slope_mib_per_min - 12.0) < 3 * fit.slope_stderr_mib_per_min
    assert fit.slope_stderr_mib_per_min == pytest.approx(60 * 2.0 / math.sqrt(120 * (120**2 - 1) / 12), rel=0.2)
    assert fit.residual_std_mib == pytest.approx(2.0, rel=0.2)
    ref_slope, ref_intercept = np.polyfit(times, values, 1)  # independent least squares
    assert fit.slope_mib_per_min == pytest.approx(ref_slope * 60.0, rel=1e-9)
    assert fit.intercept_mib == pytest.approx(ref_intercept, rel=1e-12)
    ss_res = sum((v - ref_intercept - ref_slope * t) ** 2 for t, v in zip(times, values, strict=True))
    ss_tot = sum((v - float(np.mean(values))) ** 2 for v in values)
    assert fit.r2 == pytest.approx(1 - ss_res / ss_tot, rel=1e-9)


def test_a_spike_at_the_end_fools_two_points_but_not_the_fit() -> None:
    # Flat memory with noise, and one sample at a momentary peak at the very end (a burst of
    # requests in flight when the last sample was taken): 300 MiB over the line.
    times, values = series(0.0, noise=1.0, seed=5)
    values[-1] += 300.0
    bound = 10.0
    wrong = endpoint_slope(times, values)
    assert wrong > 100.0  # the two-point "trend" says ~150 MiB/min: a false leak
    fit = fit_trend(times, values)
    assert fit is not None and fit.outliers == 1
    assert abs(fit.slope_mib_per_min) < 1.0 and fit.t_end_s == times[-2]
    assert memory_growth_verdict(zip(times, values, strict=True), bound).ok is True
    assert not wrong <= bound  # the wrong rule would have failed a flat server


def test_plain_least_squares_is_already_far_less_fooled_than_two_points(monkeypatch: pytest.MonkeyPatch) -> None:
    times, values = series(0.0, noise=1.0, seed=5)
    values[-1] += 300.0
    monkeypatch.setattr(trend, "MAX_OUTLIER_FRACTION", 0.0)  # no outlier step: ordinary least squares only
    fit = fit_trend(times, values)
    assert fit is not None and fit.outliers == 0
    # The spike moves OLS by its leverage, 300 * (t_n - t_mean) / Sxx, an order of magnitude less.
    expected_shift = 300.0 * (119 - 59.5) / (120 * (120**2 - 1) / 12) * 60
    assert fit.slope_mib_per_min == pytest.approx(expected_shift, abs=0.5)
    assert fit.slope_mib_per_min < endpoint_slope(times, values) / 10


def test_a_real_leak_is_not_explained_away_as_outliers() -> None:
    # A steady leak under heavy noise: at most 5 % of the points may be set aside, and the
    # slope found is still the leak's.
    times, values = series(30.0, noise=8.0, seed=11)
    fit = fit_trend(times, values)
    assert fit is not None and fit.outliers <= int(0.05 * len(times))
    assert fit.slope_mib_per_min == pytest.approx(30.0, abs=3 * (fit.slope_stderr_mib_per_min or 0))
    verdict = memory_growth_verdict(zip(times, values, strict=True), 10.0)
    assert verdict.ok is False and "> bound 10 MiB/min" in verdict.reason and verdict.fit is not None


def test_a_leak_that_starts_late_still_fails() -> None:
    # Flat for the first 70 %, then 60 MiB/min: the fitted slope over the whole window is
    # well above a 10 MiB/min bound (least squares weighs the late ramp by its leverage).
    times = [float(i) for i in range(200)]
    values = [1000.0 + (max(0.0, t - 140) * 1.0) for t in times]
    verdict = memory_growth_verdict(zip(times, values, strict=True), 10.0)
    assert verdict.ok is False and verdict.fit is not None and verdict.fit.slope_mib_per_min > 10.0


@pytest.mark.parametrize(("slope", "ok"), [(9.0, True), (11.0, False), (-50.0, True)])
def test_the_bound_is_on_the_fitted_slope(slope: float, ok: bool) -> None:
    times, values = series(slope, noise=0.2, seed=2)
    verdict = memory_growth_verdict(zip(times, values, strict=True), 10.0)
    assert verdict.ok is ok, verdict.reason


def test_the_warm_up_is_left_out_of_the_trend() -> None:
    # Memory climbs 500 MiB in the first 20 s (model load, caches filling), then is flat.
    times = [float(i) for i in range(120)]
    values = [1000.0 + 25.0 * min(t, 20.0) for t in times]
    with_warmup = memory_growth_verdict(zip(times, values, strict=True), 10.0, warmup_s=20.0)
    assert with_warmup.ok is True and with_warmup.fit is not None and with_warmup.fit.t_start_s == 20.0
    without = memory_growth_verdict(zip(times, values, strict=True), 10.0)
    assert without.ok is False


def test_too_few_samples_or_gaps_are_not_judged() -> None:
    few = memory_growth_verdict([(0.0, 1.0), (1.0, 2.0), (2.0, None), (3.0, 2.0), (4.0, float("nan"))], 10.0)
    assert few.ok is None and few.fit is None and "fewer than the 5" in few.reason
    same_time = memory_growth_verdict([(1.0, float(v)) for v in range(6)], 10.0)
    assert same_time.ok is None and "one time" in same_time.reason
    assert fit_trend([0.0], [1.0]) is None


def test_a_constant_series_has_zero_slope_and_no_r2() -> None:
    fit = fit_trend([float(i) for i in range(10)], [512.0] * 10)
    assert fit is not None and fit.slope_mib_per_min == 0.0 and fit.r2 is None and fit.outliers == 0
    assert fit.to_dict()["slope_mib_per_min"] == 0.0
    assert set(fit.to_dict()) == {"n", "outliers", "t_start_s", "t_end_s", "slope_mib_per_min",
                                  "slope_stderr_mib_per_min", "intercept_mib", "r2", "residual_std_mib",
                                  "growth_over_window_mib", "growth_per_hour_mib"}
