"""perf.regression's noise model for serving figures: the runs' dispersion, not their range.

A serving figure (median TTFT, median TPOT, output tok/s of one level) is the geometric mean
over the undisturbed runs; it regresses beyond noise_multiplier standard errors of the log
change, Student-corrected for the few runs. Simulations check the false-regression rate on
an unchanged server and the power against a real slowdown.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest

from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.compare import ComparePolicy, Comparison, compare_results
from adaptcheck.compare.perf import RunsFigure, runs_bound
from tests.compare.helpers import load_pair

POLICY = ComparePolicy()


def run_summary(ttft: float, **kw: Any) -> dict[str, Any]:
    return {"ttft_ms": {"median": ttft}, "tpot_ms": {"median": 5.0}, "output_throughput": 100.0, **kw}


def serving(runs: list[dict[str, Any]], stability: dict[str, Any] | None = None) -> CheckResult:
    level: dict[str, Any] = {"level": 4, "runs": runs}
    if stability is not None:
        level["stability"] = stability
    details = {"scenario": {"arrival": "concurrency", "input_tokens": 128, "output_tokens": 64, "mixed": None,
                            "num_requests": 32, "duration_s": None},
               "server": {"framework": "vllm_serve"}, "levels": [level]}
    return CheckResult(step=5, id="perf.serving.s", kind="perf.serving", status=Status.PASS, details=details)


def compare(old: CheckResult, new: CheckResult) -> Comparison:
    base, _ = load_pair()
    return compare_results(base.model_copy(update={"checks": [old]}), base.model_copy(update={"checks": [new]}),
                           POLICY)


def ttft(c: Comparison) -> Any:
    return next(f for f in c.perf if f.figure == "level 4: TTFT median")


def figure(values: list[float]) -> RunsFigure:
    logs = [math.log(v) for v in values]
    return RunsFigure(math.exp(statistics.fmean(logs)), statistics.stdev(logs), len(values))


def test_a_disturbed_run_is_left_out_of_the_figure_and_its_noise() -> None:
    # The new run repeated one disturbed run (2x slow, marked by the host sampler): it is in the
    # records, not in the figure — with it the level would look 30 % slower and very noisy.
    old = serving([run_summary(v) for v in (98, 100, 102)])
    runs = [run_summary(99), run_summary(200, disturbed="other processes used 0.93 cores (bound 0.30)"),
            run_summary(100), run_summary(101)]
    with_stability = serving(runs, {"metrics": {"ttft_ms_median": {"cv": 0.01, "lo": 0.005, "hi": 0.05,
                                                                    "values": [99, 100, 101]}}})
    for new in (serving(runs), with_stability):  # legacy (the mark only) and current shape
        f = ttft(compare(old, new))
        assert f.after == pytest.approx(100.0, rel=1e-3) and f.runs_after == 3 and f.spread_after < 0.02
        assert f.verdict == "within_noise"


def test_the_stability_values_are_the_ones_used() -> None:
    # perf.serving's verdict recorded its values: those, not a recomputation from the runs.
    runs = [run_summary(v) for v in (100, 100, 100)]
    recorded = serving(runs, {"metrics": {"ttft_ms_median": {"values": [90, 100, 110]}}})
    f = ttft(compare(serving([run_summary(v) for v in (98, 100, 102)]), recorded))
    assert f.spread_after == pytest.approx(statistics.stdev(math.log(v) for v in (90, 100, 110)))


def test_an_old_baseline_with_runs_only_compares_with_a_new_run() -> None:
    old = serving([run_summary(v) for v in (95, 100, 105)])  # no stability block, no disturbed marks
    new = serving([run_summary(v) for v in (160, 161, 162, 163)],
                  {"metrics": {"ttft_ms_median": {"values": [160, 161, 162, 163]}}})
    c = compare(old, new)
    assert not c.not_compared and [r.figure for r in c.regressions] == ["level 4: TTFT median"]
    assert "run-to-run CV 5.0% (3 runs) before" in c.regressions[0].bound


def test_more_runs_give_a_tighter_bound() -> None:
    # The same dispersion measured over more runs is known better: the bound shrinks towards
    # 3 standard errors of the mean, instead of the ~6 Student gives for 3 + 3 runs.
    few = runs_bound(RunsFigure(100, 0.05, 3), RunsFigure(100, 0.05, 3), 3.0)
    many = runs_bound(RunsFigure(100, 0.05, 8), RunsFigure(100, 0.05, 8), 3.0)
    assert many < few / 2
    assert many == pytest.approx(math.expm1(3.0 * 0.05 * math.sqrt(2 / 8)), rel=0.25)


def test_a_quiet_baseline_does_not_make_a_noisy_rerun_regress() -> None:
    quiet, noisy = RunsFigure(100, 0.001, 3), RunsFigure(100, 0.1, 3)
    assert runs_bound(quiet, noisy, 3.0) == runs_bound(noisy, quiet, 3.0) == runs_bound(noisy, noisy, 3.0)


def _rate(rng: random.Random, cv: float, slowdown: float, n: int, trials: int) -> float:
    sigma = math.sqrt(math.log1p(cv * cv))
    hits = 0
    for _ in range(trials):
        a = figure([math.exp(rng.gauss(0.0, sigma)) * 100 for _ in range(n)])
        b = figure([math.exp(rng.gauss(0.0, sigma)) * 100 * (1 + slowdown) for _ in range(n)])
        hits += b.value / a.value - 1 > max(runs_bound(a, b, POLICY.noise_multiplier), POLICY.min_tolerance)
    return hits / trials


def test_an_unchanged_server_almost_never_regresses() -> None:
    # One-sided level Φ(−3) = 0.13 % per figure; taking the larger side's dispersion makes it rarer.
    rate = _rate(random.Random(1), cv=0.10, slowdown=0.0, n=3, trials=4000)
    assert rate < 0.004


def test_a_real_slowdown_is_caught() -> None:
    # 50 % slower with a 5 % run-to-run CV: 3 runs a side catch it ~80 % of the time (the
    # dispersion of 3 runs is barely known); 5 runs a side catch even a 25 % slowdown ~90 % —
    # where the old range rule caught 7.5 %: the range grows with the runs, the standard error shrinks.
    assert _rate(random.Random(2), cv=0.05, slowdown=0.5, n=3, trials=400) > 0.7
    assert _rate(random.Random(3), cv=0.05, slowdown=0.25, n=5, trials=400) > 0.85


def test_a_run_results_round_trip_keeps_the_noise_fields() -> None:
    c = compare(serving([run_summary(v) for v in (98, 100, 102)]), serving([run_summary(v) for v in (99, 101)]))
    again = Comparison.model_validate_json(c.model_dump_json())
    f = ttft(again)
    assert (f.noise_kind, f.runs_before, f.runs_after) == ("run_cv", 3, 2)
