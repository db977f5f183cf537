"""Memory growth over a soak: a robust least-squares trend through every sample after the
warm-up, its slope's confidence interval (autocorrelation and the increments model included),
the verdict against a bound, and the sequential rule of a soak that looks several times. Pure
functions, no I/O. Method and simulated error rates: docs/perf.md, "Soak outcome" and "A soak
that decides".
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Literal

from adaptcheck.base.schemas.serving_evidence import MemoryTrend, TrendFit
from adaptcheck.perf.stability import t_ppf

OUTLIER_SIGMAS = 4.0
"""Residual (in robust standard deviations) beyond which a point is an outlier."""
MAX_OUTLIER_FRACTION = 0.05
"""Largest share of the points that may be set aside as outliers."""
MAD_TO_SIGMA = 1.4826
"""Median absolute deviation → standard deviation, for normally distributed noise."""
MIN_SAMPLES = 5
"""Fewest samples after the warm-up for a verdict (a line through 2-4 points is two points)."""
MAX_ITERATIONS = 5
DEFAULT_CONFIDENCE = 0.95
"""One-sided confidence of each bound of the slope: a flat-enough server fails, or a leaking one passes, at most 5 % of the time at the bound."""
MAX_RHO = 0.99
"""Cap of the residual autocorrelation (1 would mean no independent information at all)."""
RHO_SE_MARGIN = 1.0
"""Standard errors of the lag-1 estimate added to it (see :func:`_lag1`): ρ is read from the
same short series, and an underestimate would make the interval too narrow."""


@dataclass(frozen=True)
class Fit:
    """A straight line through (time s, value MiB) samples."""

    n: int
    """Samples the line was fitted to (outliers excluded)."""
    outliers: int
    """Samples set aside as outliers."""
    t_start_s: float
    t_end_s: float
    slope_mib_per_min: float
    slope_stderr_mib_per_min: float | None
    """Standard error of the slope (None with fewer than 3 points)."""
    intercept_mib: float
    """The line's value at t = 0 (the start of the sampling, not of the fitted window)."""
    r2: float | None
    """Share of the variance the line explains; None when the samples do not vary at all."""
    residual_std_mib: float
    """Standard deviation of the residuals: the noise around the line."""
    autocorrelation: float = 0.0
    """Lag-1 autocorrelation of the residuals in time order, bias-corrected plus one standard error, in [0, MAX_RHO]."""
    effective_n: float = 0.0
    """n (1 − ρ) / (1 + ρ): how many independent samples the series is worth."""
    increment_slope_mib_per_min: float | None = None
    """The growth rate read from the steps between consecutive samples (their sum over the time
    they span); None with fewer than 3 samples. See :func:`_increments`."""
    increment_stderr_mib_per_min: float | None = None
    increment_autocorrelation: float = 0.0
    """Lag-1 autocorrelation of those steps, treated as :func:`_lag1` treats the residuals."""
    increment_effective_n: float = 0.0

    def slope_bounds(self, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float] | None:
        """One-sided ``confidence`` lower and upper bounds of the growth rate (MiB/min).

        Two models of the series, each bound at 1 − (1 − c)/2 and the two intervals
        intersected (a union bound: the intersection covers the true rate with probability
        ≥ c whichever model holds). *Levels*: a line plus stationary noise (least squares,
        the residuals' autocorrelation included) — right for a flat or steadily growing
        server with noise around a level. *Increments*: the steps between samples as the
        draws — right for memory that grows a little at every completed request, a random
        walk with drift whose residuals from a line are one long wander (autocorrelation at
        its cap, 0.99 measured on a 2 MiB/request leak at R² 1.00), which makes the levels
        interval say nothing. Each interval stays valid (only wider) under the other model.
        None with fewer than 3 points (no standard error).
        """
        if self.slope_stderr_mib_per_min is None:
            return None
        each = 1.0 - (1.0 - confidence) / 2.0
        levels = _interval(self.slope_mib_per_min, self.slope_stderr_mib_per_min, self.autocorrelation,
                           self.effective_n - 2, each)
        if self.increment_slope_mib_per_min is None or self.increment_stderr_mib_per_min is None:
            return levels
        steps = _interval(self.increment_slope_mib_per_min, self.increment_stderr_mib_per_min,
                          self.increment_autocorrelation, self.increment_effective_n - 1, each)
        return max(levels[0], steps[0]), min(levels[1], steps[1])

    @property
    def growth_over_window_mib(self) -> float:
        """What the line grows from the first to the last fitted sample."""
        return self.slope_mib_per_min * (self.t_end_s - self.t_start_s) / 60.0

    @property
    def growth_per_hour_mib(self) -> float:
        return self.slope_mib_per_min * 60.0

    def value_at(self, t_s: float) -> float:
        return self.intercept_mib + self.slope_mib_per_min * t_s / 60.0

    def evidence(self) -> TrendFit:
        """The fit as a memory series' ``fit`` record (floats rounded to 6 places)."""
        values = {k: _round(v) for k, v in asdict(self).items()}
        return TrendFit.model_validate({**values, "growth_over_window_mib": _round(self.growth_over_window_mib),
                                        "growth_per_hour_mib": _round(self.growth_per_hour_mib)})


def _interval(rate: float, stderr: float, rho: float, df: float, confidence: float) -> tuple[float, float]:
    """One-sided ``confidence`` bounds of ``rate`` with its standard error inflated for AR(1) ρ."""
    half = t_ppf(confidence, max(1.0, df)) * stderr * math.sqrt((1 + rho) / (1 - rho))
    return rate - half, rate + half


def _round(value: float | None) -> float | None:
    return round(value, 6) if isinstance(value, float) else value


def _ols(points: Sequence[tuple[float, float]]) -> tuple[float, float, float, float]:
    """(slope per s, intercept, SS residual, SS total) of the least-squares line; needs ≥ 2 distinct times."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    sxy = sum((t - mt) * (v - mv) for t, v in points)
    slope = sxy / sxx
    intercept = mv - slope * mt
    ss_res = sum((v - intercept - slope * t) ** 2 for t, v in points)
    ss_tot = sum((v - mv) ** 2 for _, v in points)
    return slope, intercept, ss_res, ss_tot


def _outliers(points: Sequence[tuple[float, float]], slope: float, intercept: float) -> set[int]:
    """Indices whose residual is beyond OUTLIER_SIGMAS robust sigmas, worst first, capped."""
    residuals = [v - intercept - slope * t for t, v in points]
    centre = statistics.median(residuals)
    sigma = MAD_TO_SIGMA * statistics.median(abs(r - centre) for r in residuals)
    if sigma <= 0:
        # Over half the points sit exactly on the line (quantised, flat memory): any point
        # off it is an outlier only if it is off by more than rounding noise.
        sigma = 1e-6 * max(1.0, max(abs(v) for _, v in points))
    far = sorted((i for i, r in enumerate(residuals) if abs(r - centre) > OUTLIER_SIGMAS * sigma),
                 key=lambda i: -abs(residuals[i] - centre))
    return set(far[: int(MAX_OUTLIER_FRACTION * len(points))])


def fit_trend(times_s: Sequence[float], values: Sequence[float | None], *, after_s: float = 0.0) -> Fit | None:
    """The robust least-squares line through the finite samples at ``t >= after_s``.

    None when fewer than two samples with distinct times remain (there is no line).
    """
    points = [(float(t), float(v)) for t, v in zip(times_s, values, strict=True)
              if v is not None and math.isfinite(t) and math.isfinite(v) and t >= after_s]
    if len({t for t, _ in points}) < 2:
        return None
    dropped: set[int] = set()
    for _ in range(MAX_ITERATIONS):
        kept = [p for i, p in enumerate(points) if i not in dropped]
        slope, intercept, _, _ = _ols(kept)
        # Judged against every point, so a point set aside by a biased first line comes back.
        again = _outliers(points, slope, intercept)
        if again == dropped or len({points[i][0] for i in range(len(points)) if i not in again}) < 2:
            break
        dropped = again
    kept = [p for i, p in enumerate(points) if i not in dropped]
    slope, intercept, ss_res, ss_tot = _ols(kept)
    n = len(kept)
    mt = sum(t for t, _ in kept) / n
    sxx = sum((t - mt) ** 2 for t, _ in kept)
    stderr = math.sqrt(ss_res / (n - 2) / sxx) * 60.0 if n > 2 else None
    rho = _lag1(sorted(kept), slope, intercept)
    inc_rate, inc_se, inc_rho, inc_n = _increments(sorted(kept))
    return Fit(n=n, outliers=len(dropped), t_start_s=min(t for t, _ in kept), t_end_s=max(t for t, _ in kept),
               slope_mib_per_min=slope * 60.0, slope_stderr_mib_per_min=stderr, intercept_mib=intercept,
               r2=1.0 - ss_res / ss_tot if ss_tot > 0 else None,
               residual_std_mib=math.sqrt(ss_res / (n - 2)) if n > 2 else 0.0,
               autocorrelation=rho, effective_n=n * (1 - rho) / (1 + rho),
               increment_slope_mib_per_min=inc_rate, increment_stderr_mib_per_min=inc_se,
               increment_autocorrelation=inc_rho, increment_effective_n=inc_n)


def _increments(points: Sequence[tuple[float, float]]) -> tuple[float | None, float | None, float, float]:
    """(rate MiB/min, its standard error, ρ, effective count) from the steps between
    consecutive samples (points in time order, outliers already set aside).

    The rate is the steps' sum over the time they span; its standard error is that of a mean
    of the per-second step rates weighted by their intervals, with the steps' lag-1
    autocorrelation handled as :func:`_lag1` handles the residuals (bias-corrected, one
    standard error added, negative set to 0). Steps of stationary noise are negatively
    correlated, so setting ρ to 0 there only widens this interval; a decelerating curve (a
    warm-up settling) has smoothly shrinking, positively correlated steps, which widen it too.
    """
    steps = [(b[0] - a[0], b[1] - a[1]) for a, b in pairwise(points) if b[0] > a[0]]
    m = len(steps)
    span = sum(dt for dt, _ in steps)
    if m < 2 or span <= 0:
        return None, None, 0.0, 0.0
    rate = sum(dv for _, dv in steps) / span
    dev = [dv - rate * dt for dt, dv in steps]  # each step's departure from the mean rate
    ss = sum(d * d for d in dev)
    se = math.sqrt(ss / (m - 1)) * math.sqrt(m) / span  # sd of the sum of m steps, over the span
    rho = _ar1(dev, fitted=1)
    return rate * 60.0, se * 60.0, rho, m * (1 - rho) / (1 + rho)


def _lag1(points: Sequence[tuple[float, float]], slope: float, intercept: float) -> float:
    """Lag-1 autocorrelation of the residuals (points in time order), bias-corrected plus
    :data:`RHO_SE_MARGIN` standard errors, clamped to [0, MAX_RHO]: the ρ the interval uses.

    The sample autocorrelation of residuals from a fitted line underestimates ρ by about
    (2 + 4ρ)/n on a short series, which would make the interval too narrow (with n = 31 and
    ρ = 0.8, 12 % of series at the bound were called over instead of 5 %); adding it back
    brings the rate to ~5-6 % (docs/perf.md, "Soak"). The estimate still scatters by about
    √((1 − ρ²)/n), and a low draw narrows the interval: harmless for one look at 95 %, but a
    soak that looks several times at a stricter confidence lives in the tail, where it
    doubled the wrong decisions (7-10 % per side at ρ = 0.5-0.8 instead of ≤ 5 %); one
    standard error added brings them to 1-5 %. Negative values are set to 0: they would
    narrow the interval below ordinary least squares, which short noisy series would do by
    chance alone.
    """
    return _ar1([v - intercept - slope * t for t, v in points], fitted=2)


def _ar1(res: Sequence[float], *, fitted: int) -> float:
    """The lag-1 autocorrelation the intervals use, of departures from ``fitted`` estimated
    parameters (2: a line, 1: a mean): the sample value plus its bias (fitted + 4ρ)/n, plus
    :data:`RHO_SE_MARGIN` standard errors, clamped to [0, MAX_RHO]; 0 without spread or with
    too few points."""
    ss = sum(r * r for r in res)
    n = len(res)
    if ss <= 0 or n <= fitted:
        return 0.0
    r = sum(a * b for a, b in pairwise(res)) / ss
    r = min(MAX_RHO, max(0.0, r + (fitted + 4 * r) / n))
    return min(MAX_RHO, r + RHO_SE_MARGIN * math.sqrt((1 - r * r) / n))


State = Literal["within", "over", "inconclusive", "not judged"]


@dataclass(frozen=True)
class GrowthVerdict:
    """Whether one memory series stayed within the growth bound."""

    ok: bool | None
    """True: within the bound; False: over it; None: inconclusive or not judged (never a pass)."""
    reason: str
    fit: Fit | None
    state: State = "not judged"
    bounds: tuple[float, float] | None = None
    """One-sided lower and upper confidence bounds of the slope (MiB/min)."""
    confidence: float = DEFAULT_CONFIDENCE
    decide_duration_s: float | None = None
    """Inconclusive: about how long (from the first sample) a soak would need to decide, if the slope and noise stay."""

    def evidence(self, *, series: str, source: str, label: str, bounded: bool) -> MemoryTrend:
        """The verdict as the ``memory`` entry of the series it judged."""
        return MemoryTrend(series=series, source=source, label=label, bounded=bounded, ok=self.ok, state=self.state,
                           reason=self.reason,
                           slope_bounds_mib_per_min=[round(b, 6) for b in self.bounds] if self.bounds else None,
                           confidence=self.confidence, decide_duration_s=_round(self.decide_duration_s),
                           fit=self.fit.evidence() if self.fit else None)


def decide_duration_s(fit: Fit, bounds: tuple[float, float], bound: float) -> float | None:
    """Soak length (from the first sample) that would likely decide, if the slope and the noise stay as they are.

    With evenly spaced samples and the same noise, the slope's standard error scales as
    T^-3/2 (Sxx grows as n T²). The window is stretched until the half-width h is half the
    gap |slope − bound| — T0 (2h / gap)^(2/3) — so that the estimate may move by half the
    gap and the interval still clear the bound (about 9 times in 10; tests/perf/test_trend.py
    checks it by simulation). None when the slope sits on the bound.
    """
    gap = abs(fit.slope_mib_per_min - bound)
    half = (bounds[1] - bounds[0]) / 2
    window = fit.t_end_s - fit.t_start_s
    if gap <= 1e-9 * max(1.0, abs(bound)) or window <= 0:
        return None
    return fit.t_start_s + window * max(1.0, 2 * half / gap) ** (2.0 / 3.0)


def memory_growth_verdict(samples: Iterable[tuple[float, float | None]], bound_mib_per_min: float, *,
                          warmup_s: float = 0.0, min_samples: int = MIN_SAMPLES,
                          confidence: float = DEFAULT_CONFIDENCE) -> GrowthVerdict:
    """Judge one memory series, ``(time s, MiB)`` samples, against a growth bound (MiB/min).

    Samples before ``warmup_s`` are left out (loading, first allocations and caches filling
    are not growth). The slope's one-sided ``confidence`` bounds decide: lower bound above
    the bound → over; upper bound at most the bound → within; else inconclusive (not a
    pass). Fewer than ``min_samples`` usable samples after the warm-up: not judged.
    """
    pairs = list(samples)
    usable = [(t, v) for t, v in pairs if v is not None and math.isfinite(v) and math.isfinite(t) and t >= warmup_s]
    if len(usable) < min_samples:
        return GrowthVerdict(None, f"{len(usable)} sample(s) after the {warmup_s:g} s warm-up, fewer than the "
                             f"{min_samples} a trend needs", None, confidence=confidence)
    fit = fit_trend([t for t, _ in usable], [v for _, v in usable], after_s=warmup_s)
    if fit is None:
        return GrowthVerdict(None, "the samples after the warm-up share one time: no trend", None,
                             confidence=confidence)
    bounds = fit.slope_bounds(confidence)
    if bounds is None:  # unreachable with MIN_SAMPLES ≥ 3 distinct points, kept for a caller's min_samples < 3
        return GrowthVerdict(None, f"{fit.n} points: no standard error for the slope", fit, confidence=confidence)
    lo, hi = bounds
    r2 = f", R² {fit.r2:.2f}" if fit.r2 is not None else ""
    text = (f"{fit.slope_mib_per_min:+.4g} MiB/min [{lo:+.4g}, {hi:+.4g}] over {fit.t_end_s - fit.t_start_s:.0f} s "
            f"({fit.n} samples{r2}, noise {fit.residual_std_mib:.3g} MiB, autocorrelation {fit.autocorrelation:.2f})")
    if lo > bound_mib_per_min:
        return GrowthVerdict(False, f"grows {text} > bound {bound_mib_per_min:g} MiB/min", fit, "over", bounds,
                             confidence)
    if hi <= bound_mib_per_min:
        return GrowthVerdict(True, f"{text} ≤ bound {bound_mib_per_min:g} MiB/min", fit, "within", bounds, confidence)
    need = decide_duration_s(fit, bounds, bound_mib_per_min)
    about = (f"about {max(1, math.ceil(need / 60))} min would decide" if need is not None
             else "the slope sits on the bound: no duration decides")
    return GrowthVerdict(None, f"{text}: inconclusive: run longer (the slope's interval [{lo:.3g}, {hi:.3g}] MiB/min "
                         f"straddles the bound {bound_mib_per_min:g} MiB/min; {about})",
                         fit, "inconclusive", bounds, confidence, need)


# ------------------------------------------------------------------------- a soak that decides --

def look_confidence(confidence: float, looks: int) -> float:
    """The confidence of each of ``looks`` looks so that all of them together keep each wrong
    decision at most ``1 − confidence`` (Bonferroni: α/K per look and side)."""
    if looks < 1 or not 0.0 < confidence < 1.0:
        raise ValueError("look_confidence needs looks ≥ 1 and 0 < confidence < 1")
    return 1.0 - (1.0 - confidence) / looks


def settled(states: Iterable[str]) -> bool:
    """Whether a soak may stop looking: some series is over the bound (the soak fails whatever
    the others do), or none is left inconclusive."""
    seen = list(states)
    return "over" in seen or "inconclusive" not in seen


@dataclass(frozen=True)
class SequentialRule:
    """When a soak judges its memory series, and at which confidence.

    Looks at ``looks`` times evenly spaced from ``first_s`` to ``last_s`` (seconds since
    sampling started; one look when they are equal). Each look fits the samples taken from
    ``warmup_s`` to the look and decides each series on its slope's one-sided bounds at
    :attr:`per_look_confidence`.
    """

    bound_mib_per_min: float
    first_s: float
    last_s: float
    looks: int = 1
    warmup_s: float = 0.0
    confidence: float = DEFAULT_CONFIDENCE
    min_samples: int = MIN_SAMPLES

    def __post_init__(self) -> None:
        if not (0.0 < self.first_s <= self.last_s and self.looks >= 1 and 0.5 < self.confidence < 1.0):
            raise ValueError("a sequential rule needs 0 < first_s ≤ last_s, looks ≥ 1 and 0.5 < confidence < 1")

    def times(self) -> list[float]:
        """The looks, in seconds since sampling started (the last one is ``last_s``)."""
        if self.looks == 1 or self.last_s <= self.first_s:
            return [self.last_s]
        step = (self.last_s - self.first_s) / (self.looks - 1)
        return [self.first_s + i * step for i in range(self.looks - 1)] + [self.last_s]

    @property
    def per_look_confidence(self) -> float:
        return look_confidence(self.confidence, len(self.times()))

    def judge(self, samples: Iterable[tuple[float, float | None]], at_s: float) -> GrowthVerdict:
        """One series at one look: the samples taken up to ``at_s``."""
        return memory_growth_verdict([(t, v) for t, v in samples if t <= at_s], self.bound_mib_per_min,
                                     warmup_s=self.warmup_s, min_samples=self.min_samples,
                                     confidence=self.per_look_confidence)


@dataclass(frozen=True)
class SequentialVerdict:
    """Where the looks stopped and what each series was there."""

    look: int
    """0-based index of the look that stopped."""
    at_s: float
    verdicts: dict[str, GrowthVerdict]
    stop: Literal["decided", "budget"]
    """decided: every series decided (or one over) at that look; budget: the last look, something undecided."""


def sequential_verdict(series: Mapping[str, Sequence[tuple[float, float | None]]],
                       rule: SequentialRule) -> SequentialVerdict:
    """The rule applied to complete series, look by look, as a soak applies it while it runs
    (used to simulate its error rates and in tests; the soak takes the same steps live)."""
    times = rule.times()
    for i, at in enumerate(times):
        verdicts = {key: rule.judge(samples, at) for key, samples in series.items()}
        if settled(v.state for v in verdicts.values()):
            return SequentialVerdict(i, at, verdicts, "decided")
    return SequentialVerdict(len(times) - 1, times[-1], verdicts, "budget")


# ------------------------------------------------------------------ simulated wrong decisions --

def ar1_noise(rng: random.Random, n: int, rho: float, sd: float) -> list[float]:
    """Stationary AR(1) noise of standard deviation ``sd`` and lag-1 correlation ``rho``: what
    memory sampled every second looks like (it moves in runs)."""
    out = [rng.gauss(0.0, sd)]
    for _ in range(n - 1):
        out.append(rho * out[-1] + math.sqrt(1 - rho * rho) * rng.gauss(0.0, sd))
    return out


def simulate_sequential(rule: SequentialRule, slope_mib_per_min: float, noise_mib: float, rho: float = 0.0, *,
                        interval_s: float = 1.0, trials: int = 1000, seed: int = 0,
                        judge: Callable[[Mapping[str, Sequence[tuple[float, float | None]]], SequentialRule],
                                        SequentialVerdict] | None = None) -> dict[str, float]:
    """Monte Carlo of the sequential rule, every look included, on a line of
    ``slope_mib_per_min`` under AR(1) noise sampled every ``interval_s``: the share of trials
    that end within / over / inconclusive (at the budget), and the mean time of the stopping
    look. ``judge`` replaces :func:`sequential_verdict` (to show what a weaker rule would do)."""
    rng = random.Random(seed)
    n = int(rule.last_s / interval_s) + 1
    ends = {"within": 0, "over": 0, "inconclusive": 0}
    stop_s = 0.0
    for _ in range(trials):
        noise = ar1_noise(rng, n, rho, noise_mib)
        samples: list[tuple[float, float | None]] = [
            (i * interval_s, 1000.0 + slope_mib_per_min * i * interval_s / 60.0 + e) for i, e in enumerate(noise)]
        verdict = (judge or sequential_verdict)({"memory": samples}, rule)
        state = verdict.verdicts["memory"].state
        ends[state if state in ("within", "over") else "inconclusive"] += 1
        stop_s += verdict.at_s
    return {k: v / trials for k, v in ends.items()} | {"mean_stop_s": stop_s / trials}
