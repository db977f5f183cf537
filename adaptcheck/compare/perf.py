"""Performance regressions: step-5 figures (micro-benchmark rows by name and dtype; serving
levels' median TTFT, median TPOT and output tok/s over the undisturbed runs) judged against the
run-to-run noise both runs measured; figures that cannot be compared are listed with the
reason. Noise model: docs/perf.md, "Regression noise model"; docs/compare.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypedDict

from pydantic import JsonValue

from adaptcheck.base.schemas.micro_evidence import MicroEvidence, MicroRow, ParamValue
from adaptcheck.base.schemas.results import CheckResult
from adaptcheck.base.schemas.serving_evidence import LatencyStats, MeasuredRun, ServingEvidence, ServingLevel
from adaptcheck.compare.model import (
    Better,
    ComparePolicy,
    NotCompared,
    PerfFigure,
    Regression,
    num,
)
from adaptcheck.perf.stability import t_ppf

MIN_REPETITIONS = 3
"""Fewer timed repetitions than this give a spread that measures nothing."""
MIN_RUNS = 2
"""A serving level needs this many runs with completed requests on each side to know its noise."""
WORKLOAD_KEYS = ("arrival", "input_tokens", "output_tokens", "mixed", "num_requests", "duration_s")
"""Scenario fields that define the work measured; a change in any makes the figures incomparable."""

Verdict = Literal["regression", "improvement", "within_noise"]
Figure = tuple[float, float, int]
"""(value, relative spread, number of samples behind the spread)."""


def _pos(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _rows(check: CheckResult) -> dict[str, MicroRow]:
    """Micro rows by 'name dtype' (a repeated key gets '#2', '#3' so none is silently dropped);
    details that do not fit read as no rows."""
    evidence = check.evidence(MicroEvidence)
    out: dict[str, MicroRow] = {}
    for row in evidence.rows if evidence is not None else []:
        # A row written without a name keys as '?' (the model's default name is empty).
        key = row.label if "name" in row.model_fields_set else f"?{' ' + row.dtype if row.dtype else ''}"
        unique, n = key, 2
        while unique in out:
            unique, n = f"{key} #{n}", n + 1
        out[unique] = row
    return out


def _params(row: MicroRow) -> dict[str, ParamValue] | None:
    """The row's problem definition; None when it was written without one."""
    return row.params if "params" in row.model_fields_set else None


def _row_figure(row: MicroRow) -> Figure | str:
    """A row's (median time, spread, repetitions), or why it has none."""
    if row.status != "ok":
        return f"not run ({row.reason or (row.status if 'status' in row.model_fields_set else None)})"
    t = row.time_s
    median = _pos(t.median) if t is not None else None
    spread, n = (t.spread, t.n) if t is not None else (None, None)
    if median is None:
        return "no valid median time"
    if n is None or n < MIN_REPETITIONS or spread is None or not spread >= 0:
        return f"{n} timed repetitions: the noise is not measured (fewer than {MIN_REPETITIONS})"
    return median, float(spread), n


def _serving(check: CheckResult) -> ServingEvidence:
    """The check's serving evidence; details that do not fit read as none (nothing to compare)."""
    return check.evidence(ServingEvidence) or ServingEvidence()


def _workload(check: CheckResult) -> dict[str, JsonValue]:
    """The scenario fields that define the work (:data:`WORKLOAD_KEYS`, as stored) and the server."""
    ev = _serving(check)
    scenario = ev.scenario.dump() if ev.scenario is not None else {}
    out: dict[str, JsonValue] = {k: scenario.get(k) for k in WORKLOAD_KEYS}
    server = ev.server or {}  # the adapter's free-form facts
    out["server"] = server.get("framework") or server.get("name")
    return out


def _median_of(stats: LatencyStats | None) -> float | None:
    return stats.median if stats is not None else None


SERVING_FIGURES: tuple[tuple[str, str, str, Better, Callable[[MeasuredRun], float | None]], ...] = (
    # (figure, unit, perf.serving's stability metric key, better, the value in a run summary)
    ("TTFT median", "ms", "ttft_ms_median", "lower", lambda r: _median_of(r.ttft_ms)),
    ("TPOT median", "ms", "tpot_ms_median", "lower", lambda r: _median_of(r.tpot_ms)),
    ("output throughput", "tok/s", "output_tok_per_s", "higher", lambda r: r.output_throughput),
)


def _levels(check: CheckResult) -> dict[str, ServingLevel]:
    return {f"level {lv.level:g}": lv for lv in _serving(check).levels or [] if lv.level is not None}


def _run_values(level: ServingLevel, key: str, get: Callable[[MeasuredRun], float | None]) -> list[float]:
    """The figure's value in each undisturbed run: the stability verdict's own values where recorded."""
    metric = level.stability.metrics.get(key) if level.stability is not None else None
    if metric is not None and "values" in metric.model_fields_set:
        return [v for x in metric.values if (v := _pos(x)) is not None]
    # Results written before the stability verdict (or by a hand): every run not marked disturbed.
    return [v for r in level.runs if not r.disturbed and (v := _pos(get(r))) is not None]


@dataclass(frozen=True)
class RunsFigure:
    """A serving figure over runs: the geometric mean, and the run-to-run dispersion of its log."""

    value: float
    sd_log: float
    """Sample standard deviation of ln(value) over the runs (≈ the run-to-run CV)."""
    n: int


def _level_figure(level: ServingLevel, key: str, get: Callable[[MeasuredRun], float | None]) -> RunsFigure | str:
    """The figure over the undisturbed runs, or why there is none."""
    values = _run_values(level, key, get)
    if len(values) < MIN_RUNS:
        return f"{len(values)} run(s) with a value: the run-to-run noise is not measured (fewer than {MIN_RUNS})"
    logs = [math.log(v) for v in values]
    return RunsFigure(value=math.exp(statistics.fmean(logs)), sd_log=statistics.stdev(logs), n=len(values))


def runs_bound(a: RunsFigure, b: RunsFigure, noise_multiplier: float) -> float:
    """Relative change the two sides' run-to-run noise explains: exp(t · SE) − 1 (see the module doc).

    SE = s · √(1/n_a + 1/n_b) with s the larger side's dispersion (a quiet baseline cannot
    make a noisy rerun look regressed), t Student's quantile at Φ(noise_multiplier) with
    n_a + n_b − 2 degrees of freedom: a two-sample t-test at the one-sided level of
    ``noise_multiplier`` normal standard errors, exact for log-normal run noise.
    """
    sd = max(a.sd_log, b.sd_log)
    if sd <= 0:
        return 0.0
    se = sd * math.sqrt(1 / a.n + 1 / b.n)
    q = statistics.NormalDist().cdf(noise_multiplier)
    if q >= 1.0:  # a multiplier beyond ~8.2 sigma: no figure can be told from the noise
        return math.inf
    # Few runs and a large multiplier give a t quantile in the millions: the bound is then
    # unbounded, not an overflow.
    exponent = t_ppf(q, a.n + b.n - 2) * se
    return math.expm1(exponent) if exponent < 700 else math.inf


class _RunsNoise(TypedDict, total=False):
    """The PerfFigure fields only a serving figure sets (a micro figure leaves them unset)."""

    noise_kind: Literal["run_cv"]
    runs_before: int
    runs_after: int


class PerfComparer:
    """Collects the figures, the not-compared entries and the verdicts of matched perf checks."""

    def __init__(self, policy: ComparePolicy) -> None:
        self.policy = policy
        self.figures: list[PerfFigure] = []
        self.not_compared: list[NotCompared] = []

    def skip(self, check_id: str, figure: str, reason: str) -> None:
        self.not_compared.append(NotCompared(check_id=check_id, figure=figure, reason=reason))

    def add(self, check_id: str, figure: str, unit: str, better: Better,
            old: Figure | RunsFigure | str, new: Figure | RunsFigure | str) -> None:
        if isinstance(old, str) or isinstance(new, str):
            why = [f"baseline: {old}" if isinstance(old, str) else "", f"new: {new}" if isinstance(new, str) else ""]
            self.skip(check_id, figure, "; ".join(w for w in why if w))
            return
        extra: _RunsNoise = {}
        if isinstance(old, RunsFigure) and isinstance(new, RunsFigure):
            before, s_before, after, s_after = old.value, old.sd_log, new.value, new.sd_log
            noise = runs_bound(old, new, self.policy.noise_multiplier)
            extra = {"noise_kind": "run_cv", "runs_before": old.n, "runs_after": new.n}
        elif isinstance(old, tuple) and isinstance(new, tuple):
            (before, s_before, _), (after, s_after, _) = old, new
            noise = self.policy.noise_multiplier * max(s_before, s_after)
        else:  # pragma: no cover - a serving figure is never paired with a micro row
            raise TypeError("figures of different kinds")
        # As a time either way: a halved throughput is +100 %, like a doubled latency, so a
        # throughput regression is never capped at 100 % while its bound is not.
        change = after / before - 1 if better == "lower" else before / after - 1
        bound = max(noise, self.policy.min_tolerance)
        # An improvement is the mirror image: the baseline took (1 + bound) × the new time or longer.
        faster = (1 + change) * (1 + bound) < 1
        verdict: Verdict = "regression" if change > bound else "improvement" if faster else "within_noise"
        self.figures.append(PerfFigure(check_id=check_id, figure=figure, unit=unit, better=better, before=before,
                                       after=after, change=change, spread_before=s_before, spread_after=s_after,
                                       bound=bound, verdict=verdict, **extra))

    def micro(self, old: CheckResult, new: CheckResult) -> None:
        a, b = _rows(old), _rows(new)
        for key in a.keys() | b.keys():
            if key not in a or key not in b:
                self.skip(new.id, key, "only in the " + ("new run" if key in b else "baseline"))
            elif a[key].params != b[key].params:
                self.skip(new.id, key, f"problem differs: {_params(a[key])} → {_params(b[key])}")
            else:
                self.add(new.id, f"{key}: median time", "s", "lower", _row_figure(a[key]), _row_figure(b[key]))

    def serving(self, old: CheckResult, new: CheckResult) -> None:
        wa, wb = _workload(old), _workload(new)
        if wa != wb:
            diff = ", ".join(f"{k} {wa[k]} → {wb[k]}" for k in wa if wa[k] != wb[k])
            self.skip(new.id, "*", f"workload differs: {diff}")
            return
        a, b = _levels(old), _levels(new)
        for key in a.keys() | b.keys():
            if key not in a or key not in b:
                self.skip(new.id, key, "only in the " + ("new run" if key in b else "baseline"))
                continue
            for name, unit, metric, better, get in SERVING_FIGURES:
                self.add(new.id, f"{key}: {name}", unit, better, _level_figure(a[key], metric, get),
                         _level_figure(b[key], metric, get))

    def compare(self, old: CheckResult, new: CheckResult) -> None:
        """Whatever figures the pair carries (a check with neither shape has none)."""
        if isinstance(old.details.get("levels"), list) or isinstance(new.details.get("levels"), list):
            self.serving(old, new)
        elif isinstance(old.details.get("rows"), list) or isinstance(new.details.get("rows"), list):
            self.micro(old, new)

    def sorted_figures(self) -> list[PerfFigure]:
        return sorted(self.figures, key=lambda f: (f.check_id, f.figure))


def compare_perf(pairs: list[tuple[CheckResult, CheckResult]], policy: ComparePolicy,
                 only_old: list[CheckResult], only_new: list[CheckResult]) -> tuple[list[PerfFigure], list[NotCompared]]:
    """Judge every performance figure of the matched checks; list what could not be compared
    (including the figures of step-5 checks present in one run only)."""
    comparer = PerfComparer(policy)
    for old, new in pairs:
        comparer.compare(old, new)
    for check, side in [(c, "baseline") for c in only_old] + [(c, "new run") for c in only_new]:
        if isinstance(check.details.get("levels"), list) or isinstance(check.details.get("rows"), list):
            comparer.skip(check.id, "*", f"check only in the {side}")
    return comparer.sorted_figures(), sorted(comparer.not_compared, key=lambda n: (n.check_id, n.figure))


def _fmt(value: float, unit: str) -> str:
    if unit == "s":  # micro times: ms or µs read better than 0.00209 s
        return f"{value * 1e3:.4g} ms" if value >= 1e-3 else f"{value * 1e6:.4g} µs"
    return f"{num(value)} {unit}"


def describe_change(change: float) -> str:
    """'59.0% slower' / '25.0% faster' — faster measured like slower, against the quicker side, so
    that an improvement reads as the mirror of a regression ('faster' > bound)."""
    if change > 0:
        return f"{change:.1%} slower"
    if change < 0:
        return f"{1 / (1 + change) - 1:.1%} faster"
    return "unchanged"


def as_regression(f: PerfFigure) -> Regression:
    """The regression line of a performance figure."""
    bound = f"worse by > {f.bound:.1%} (noise: {noise_text(f)})"
    line = (f"{f.check_id} {f.figure}: {_fmt(f.before, f.unit)} → {_fmt(f.after, f.unit)} "
            f"({describe_change(f.change)}; bound {f.bound:.1%})")
    return Regression(category="performance", check_id=f.check_id, figure=f.figure, before=_fmt(f.before, f.unit),
                      after=_fmt(f.after, f.unit), bound=bound, line=line)


def noise_text(f: PerfFigure) -> str:
    """'spread 5.0% before, 4.0% after' (micro) / 'run-to-run CV 3.1% (3 runs) before, 4.2% (5 runs) after' (serving)."""
    if f.noise_kind == "run_cv":
        return (f"run-to-run CV {f.spread_before:.1%} ({f.runs_before} runs) before, "
                f"{f.spread_after:.1%} ({f.runs_after} runs) after")
    return f"spread {f.spread_before:.1%} before, {f.spread_after:.1%} after"


def improvement_line(f: PerfFigure) -> str:
    return (f"{f.check_id} {f.figure}: {_fmt(f.before, f.unit)} → {_fmt(f.after, f.unit)} "
            f"({describe_change(f.change)}; bound {f.bound:.1%})")


def value_text(value: float, unit: str) -> str:
    """A figure with its unit, as the table and the report show it."""
    return _fmt(value, unit)
