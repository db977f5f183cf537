"""Run-to-run stability and within-run drift of a serving level: the CV with χ² confidence
bounds, the sequential stable/unstable rule and its Monte Carlo, the drift with its
autocorrelation-widened bounds, and the χ² and Student-t quantiles (no scipy). Pure functions,
no I/O. Method and measured false-failure rates: docs/perf.md, "Run-to-run stability".
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from adaptcheck.base.schemas.serving_evidence import DriftFigures

Verdict = Literal["stable", "unstable", "undecided"]
DEFAULT_CONFIDENCE = 0.95
MIN_DRIFT_POINTS = 8
"""Fewest requests (pooled over the runs) whose slope is worth a verdict."""
MAX_RHO = 0.9
"""Cap of the residual autocorrelation: beyond it the inflation factor (≥ 4.4) says 'no information' anyway."""
_EPS = 1e-13
_TINY = 1e-300


# ------------------------------------------------------------------------- special functions --

def gamma_p(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x) (Numerical Recipes' series / continued fraction)."""
    if a <= 0:
        raise ValueError("gamma_p needs a > 0")
    if x <= 0:
        return 0.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:  # the series converges fast here
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return min(1.0, total * math.exp(log_front))
    # Continued fraction for Q(a, x) (modified Lentz), P = 1 − Q.
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


def chi2_cdf(x: float, df: float) -> float:
    """P(χ²_df ≤ x)."""
    return gamma_p(df / 2.0, x / 2.0)


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (hi doubled until it brackets)."""
    while f(hi) < target:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@lru_cache(maxsize=1024)
def chi2_ppf(p: float, df: float) -> float:
    """The p-quantile of the chi-square law with df degrees of freedom."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError("chi2_ppf needs 0 < p < 1 and df > 0")
    return _bisect(lambda x: chi2_cdf(x, df), p, 0.0, max(1.0, 2.0 * df))


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Numerical Recipes' betacf, Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = _TINY if abs(d) < _TINY else d
    d = 1.0 / d
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = _TINY if abs(d) < _TINY else d
        c = 1.0 + aa / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = _TINY if abs(d) < _TINY else d
        c = 1.0 + aa / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            break
    return h


def beta_i(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T_df ≤ t) for Student's t law."""
    tail = 0.5 * beta_i(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@lru_cache(maxsize=1024)
def t_ppf(p: float, df: float) -> float:
    """The p-quantile of Student's t law with df degrees of freedom."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError("t_ppf needs 0 < p < 1 and df > 0")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    if p == 0.5:
        return 0.0
    return _bisect(lambda x: t_cdf(x, df), p, 0.0, 8.0)


# ---------------------------------------------------------------------------- dispersion --

def cv_of_sigma(sigma: float) -> float:
    """Coefficient of variation of a log-normal law whose log has standard deviation sigma."""
    return math.sqrt(math.expm1(sigma * sigma)) if sigma < 26 else math.inf


def sigma_of_cv(cv: float) -> float:
    """Inverse of :func:`cv_of_sigma`."""
    return math.sqrt(math.log1p(cv * cv))


@dataclass(frozen=True)
class Dispersion:
    """Run-to-run dispersion of one metric at one level: estimate and one-sided bounds, as CVs."""

    n: int
    cv: float
    lo: float
    """One-sided (confidence) lower bound of the true CV."""
    hi: float
    """One-sided (confidence) upper bound of the true CV."""

    def verdict(self, bound: float) -> Verdict:
        if self.lo > bound:
            return "unstable"
        if self.hi <= bound:
            return "stable"
        return "undecided"

def dispersion(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Dispersion | None:
    """The dispersion of positive run values; None with fewer than two (nothing to compare)."""
    logs = [math.log(v) for v in values if v > 0 and math.isfinite(v)]
    n = len(logs)
    if n < 2:
        return None
    mean = math.fsum(logs) / n
    s = math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (n - 1))  # statistics.stdev is exact, and slow
    df = n - 1
    lo = s * math.sqrt(df / chi2_ppf(confidence, df))
    hi = s * math.sqrt(df / chi2_ppf(1.0 - confidence, df))
    return Dispersion(n=n, cv=cv_of_sigma(s), lo=cv_of_sigma(lo), hi=cv_of_sigma(hi))


@dataclass(frozen=True)
class Rule:
    """The sequential stability rule of one scenario (its ladder params)."""

    max_cv: float
    min_runs: int
    max_runs: int
    confidence: float = DEFAULT_CONFIDENCE

    def __post_init__(self) -> None:
        if not (self.max_cv > 0 and 2 <= self.min_runs <= self.max_runs and 0.5 < self.confidence < 1):
            raise ValueError("a stability rule needs max_cv > 0, 2 ≤ min_runs ≤ max_runs and 0.5 < confidence < 1")


@dataclass(frozen=True)
class Decision:
    """The rule applied to the runs so far."""

    verdict: Verdict | Literal["too_few"]
    """too_few: fewer than min_runs runs; undecided: add a run if allowed."""
    metrics: dict[str, Dispersion]
    worst: str | None
    """The metric that decided an "unstable" verdict (highest lower bound), or the least settled one."""

    @property
    def decided(self) -> bool:
        return self.verdict in ("stable", "unstable")


def decide(values: Mapping[str, Sequence[float]], rule: Rule) -> Decision:
    """Apply the rule to each metric's run values (metrics with fewer than two values are left out)."""
    metrics = {k: d for k, v in values.items() if (d := dispersion(v, rule.confidence)) is not None}
    n = max((len(v) for v in values.values()), default=0)
    if n < rule.min_runs or not metrics:
        return Decision("too_few", metrics, None)
    verdicts = {k: d.verdict(rule.max_cv) for k, d in metrics.items()}
    if "unstable" in verdicts.values():
        worst = max((k for k, v in verdicts.items() if v == "unstable"), key=lambda k: metrics[k].lo)
        return Decision("unstable", metrics, worst)
    worst = max(metrics, key=lambda k: metrics[k].hi)
    if all(v == "stable" for v in verdicts.values()):
        return Decision("stable", metrics, worst)
    return Decision("undecided", metrics, worst)


def describe(metric: str, d: Dispersion) -> str:
    """'run-to-run CV of tpot_ms_median 38% [27%, 71%]'."""
    return f"run-to-run CV of {metric} {d.cv:.0%} [{d.lo:.0%}, {_pct_or_inf(d.hi)}]"


def _pct_or_inf(x: float) -> str:
    return f"{x:.0%}" if math.isfinite(x) and x < 100 else "∞"


# -------------------------------------------------------------------------------- drift --

@dataclass(frozen=True)
class Drift:
    """How much slower a run ends than it starts, for one per-request metric at one level."""

    n: int
    """Requests in the fit (pooled over the runs)."""
    drift: float
    """exp(slope) − 1: +0.3 = the last request of a run 30 % slower than the first."""
    lo: float
    hi: float
    """One-sided (confidence) bounds of the drift."""
    rho: float
    """Lag-1 autocorrelation of the residuals (within runs), used to widen the interval."""
    runs: int = 1
    """Runs with a slope of their own (at least 3 requests spread over time)."""
    run_drifts: tuple[float, ...] = ()
    """Each such run's own drift, exp(its slope) − 1: how alike the runs were."""

    def evidence(self, bound: float) -> DriftFigures:
        """The drift as a level's ``drift`` record, judged against ``bound`` (significant: lo > bound)."""
        return DriftFigures(n=self.n, drift=self.drift, lo=self.lo, hi=self.hi, rho=self.rho, runs=self.runs,
                            run_drifts=list(self.run_drifts), bound=bound, significant=self.lo > bound)


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y on x; None without 3 points spread in x."""
    if len(points) < 3:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else None


def drift(runs: Sequence[Sequence[tuple[float, float]]], confidence: float = DEFAULT_CONFIDENCE) -> Drift | None:
    """Drift over a run of a per-request metric: ``runs`` = per run, (send time, value) of its requests.

    Each run's send times are mapped to 0..1 and its values divided by the run's median (so
    a slower run does not look like drift); None with fewer than :data:`MIN_DRIFT_POINTS`
    usable requests or no spread of send times.

    Two intervals, and the wider one is reported. *Within runs*: the pooled slope's standard
    error from the residuals, widened by their lag-1 autocorrelation. *Between runs*: the
    runs' own slopes as the units (a random-effects view: Student t with runs − 1 degrees of
    freedom on their standard deviation). A host whose speed wanders over seconds tilts each
    run its own way (+37 % in one run, −24 % in the next on the 2-core VM); the within-run
    interval cannot see that, the between-run one does. A server that really slows down
    over every run tilts every run alike, and both intervals exclude no drift.
    """
    series: list[list[tuple[float, float]]] = []
    for run in runs:
        pts = sorted((t, v) for t, v in run if v > 0 and math.isfinite(v) and math.isfinite(t))
        if len(pts) < 2:
            continue
        t0, t1 = pts[0][0], pts[-1][0]
        if t1 <= t0:
            continue
        mid = statistics.median(v for _, v in pts)
        series.append([((t - t0) / (t1 - t0), math.log(v / mid)) for t, v in pts])
    xs = [u for s in series for u, _ in s]
    ys = [y for s in series for _, y in s]
    n = len(xs)
    if n < MIN_DRIFT_POINTS:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    resid = [[y - a - b * u for u, y in s] for s in series]
    sse = sum(r * r for rs in resid for r in rs)
    num = sum(p * q for rs in resid for p, q in itertools.pairwise(rs))
    rho = min(MAX_RHO, max(0.0, num / sse)) if sse > 0 else 0.0
    inflation = (1 + rho) / (1 - rho)
    df = max(1.0, n / inflation - 2)  # effective sample size − the two fitted coefficients
    se = math.sqrt(sse / max(1, n - 2) / sxx * inflation)
    t = t_ppf(confidence, df)
    half = t * se
    slopes = [b_r for s in series if (b_r := _slope(s)) is not None]
    if len(slopes) >= 2:
        between = t_ppf(confidence, len(slopes) - 1) * statistics.stdev(slopes) / math.sqrt(len(slopes))
        half = max(half, between)
    return Drift(n=n, drift=math.expm1(b), lo=math.expm1(b - half), hi=math.expm1(b + half), rho=rho,
                 runs=len(slopes), run_drifts=tuple(math.expm1(x) for x in slopes))


# ----------------------------------------------------------------- simulated false failures --

def simulate(draw: Callable[[Any], Any], verdict_at: Callable[[Any, int], str], rule: Rule, *,
             trials: int = 20_000, seed: int = 0) -> dict[str, float]:
    """The sequential loop of a Monte Carlo: per trial, ``draw(rng)`` makes the runs (a numpy
    Generator is passed) and ``verdict_at(trial, n)`` judges the first n of them, from
    ``min_runs`` to ``max_runs`` until one is "stable" or "unstable". Every trial uses all
    max_runs runs if undecided: a time budget that stops earlier only removes looks, so the
    failure rate is an upper bound. Returns the fraction of trials ending unstable / stable /
    undecided and the mean number of runs.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    ends = {"unstable": 0, "stable": 0, "undecided": 0}
    runs_total = 0
    for _ in range(trials):
        trial = draw(rng)
        verdict = "undecided"
        n = rule.min_runs
        for n in range(rule.min_runs, rule.max_runs + 1):
            v = verdict_at(trial, n)
            if v in ("stable", "unstable"):
                verdict = v
                break
        ends[verdict] += 1
        runs_total += n
    return {"fail": ends["unstable"] / trials, "stable": ends["stable"] / trials,
            "undecided": ends["undecided"] / trials, "mean_runs": runs_total / trials}


def false_failure_rate(sample: Callable[[Any, int], Sequence[Sequence[float]]], rule: Rule, *,
                       trials: int = 20_000, seed: int = 0) -> dict[str, float]:
    """Monte Carlo of the exact sequential rule (every look included) on simulated runs
    (:func:`simulate`): ``sample(rng, max_runs)`` returns, for one trial, each metric's
    ``max_runs`` run values."""
    def verdict_at(metrics: list[list[float]], n: int) -> str:
        return decide({str(i): m[:n] for i, m in enumerate(metrics)}, rule).verdict

    return simulate(lambda rng: [list(m) for m in sample(rng, rule.max_runs)], verdict_at, rule,
                    trials=trials, seed=seed)
