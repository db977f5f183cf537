"""The comparison rules one by one, on small hand-made results: each numerical rule with a value
that must trip it and one that must not, the performance bound's exact value, what is not
compared and why, status changes, the environment's volatile fields, and the saved schema."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.errors import InvalidInputError
from adaptcheck.base.schemas.results import CheckResult, RunResults, Status
from adaptcheck.compare import ComparePolicy, Comparison, compare_results
from adaptcheck.compare.model import SCHEMA_VERSION as COMPARE_SCHEMA
from adaptcheck.compare.numeric import RULES, judge
from tests.compare.helpers import load_pair

POLICY = ComparePolicy()


def _run(*checks: CheckResult) -> RunResults:
    base, _ = load_pair()
    return base.model_copy(update={"checks": list(checks)})


def _check(cid: str, status: Status = Status.PASS, kind: str = "x.kind", **kw: Any) -> CheckResult:
    return CheckResult(step=5, id=cid, kind=kind, status=status, **kw)


def _row(median: float, spread: float, n: int = 20, **kw: Any) -> dict[str, Any]:
    row = {"name": "prefill m=64", "dtype": "bf16", "params": {"m": 64}, "status": "ok", "reason": "",
           "time_s": {"median": median, "spread": spread, "n": n}}
    row.update(kw)
    return row


def _micro(*rows: dict[str, Any], cid: str = "perf.gemm") -> CheckResult:
    return _check(cid, kind="perf.gemm", details={"rows": list(rows)})


def _figures(old: CheckResult, new: CheckResult, policy: ComparePolicy = POLICY) -> Comparison:
    return compare_results(_run(old), _run(new), policy)


# ---------------------------------------------------------------- numerical rules

@pytest.mark.parametrize(("metric", "before", "after", "expected"), [
    # ratio_to_tolerance: > 2× AND > +0.1 tolerance
    ("ratio_to_tolerance", 0.10, 0.25, "regression"),
    ("ratio_to_tolerance", 0.10, 0.19, None),          # +0.09 and 1.9×: neither part
    ("ratio_to_tolerance", 0.001, 0.09, None),         # 90× but +0.089 tolerance: noise far below tolerance
    ("ratio_to_tolerance", 0.30, 0.55, None),          # +0.25 but only 1.8×
    ("ratio_to_tolerance", 0.30, 0.10, "improvement"),
    ("ratio_to_tolerance", 0.20, 0.20, None),          # a same-seed rerun
    ("max_logprob_abs_diff", 0.09, 0.20, "regression"),
    ("max_logprob_abs_diff", 0.09, 0.17, None),        # 1.9×
    ("max_logprob_abs_diff", 0.0, 0.05, None),         # ∞× but +0.05 nats
    ("cases_failed", 0, 1, "regression"),
    ("cases_failed", 2, 1, "improvement"),
    ("sequences_failed", 1, 1, None),
    ("token_agreement", 0.90, 0.84, "regression"),     # drop 0.06
    ("token_agreement", 0.90, 0.86, None),             # drop 0.04
    ("token_agreement", 0.50, 0.60, "improvement"),
    ("ratio_to_tolerance", 0.10, math.inf, "regression"),
    ("ratio_to_tolerance", math.nan, 0.10, "improvement"),
    ("ratio_to_tolerance", math.nan, math.nan, None),
])
def test_numeric_rule(metric: str, before: float, after: float, expected: str | None) -> None:
    verdict, _ = judge(RULES[metric], before, after, POLICY)
    assert verdict == expected


def test_numeric_metrics_outside_the_rules_are_not_judged() -> None:
    old = _check("ops.x", metrics={"max_abs_error": 1.0, "max_rel_error": 0.01, "ratio_to_tolerance": 0.1})
    new = _check("ops.x", metrics={"max_abs_error": 60.0, "max_rel_error": 0.9, "ratio_to_tolerance": 0.1})
    c = _figures(old, new)
    assert c.regressions == [] and c.counts.numeric_compared == 1


def test_numeric_changes_survive_a_json_round_trip_with_non_finite_values() -> None:
    old = _check("ops.x", metrics={"ratio_to_tolerance": 0.1})
    new = _check("ops.x", metrics={"ratio_to_tolerance": "inf"})  # how results.json stores inf
    c = _figures(old, new)
    assert c.regressions[0].after == "inf"
    data = c.to_data()
    assert data["numeric"][0]["after"] == "Infinity"  # valid JSON, unlike a bare Infinity
    again = Comparison.from_data(json.loads(json.dumps(data, allow_nan=False)), "test")
    assert math.isinf(again.numeric[0].after)


# ---------------------------------------------------------------- performance rule

def test_bound_uses_the_larger_of_the_two_spreads() -> None:
    """A quiet baseline (1 %) and a noisy rerun (10 %): +20 % is inside 3 × 10 %; a rule that only
    trusted the baseline's spread (bound 3 %) would call it a regression."""
    c = _figures(_micro(_row(1.0, 0.01)), _micro(_row(1.2, 0.10)))
    (fig,) = c.perf
    assert fig.bound == pytest.approx(0.30) and fig.verdict == "within_noise" and not c.regressions
    c = _figures(_micro(_row(1.0, 0.10)), _micro(_row(1.2, 0.01)))
    assert c.perf[0].bound == pytest.approx(0.30) and not c.regressions


def test_floor_applies_only_to_a_spread_measured_as_zero() -> None:
    c = _figures(_micro(_row(1.0, 0.0)), _micro(_row(1.03, 0.0)))
    assert c.perf[0].bound == pytest.approx(POLICY.min_tolerance) and len(c.regressions) == 1
    c = _figures(_micro(_row(1.0, 0.0)), _micro(_row(1.01, 0.0)))
    assert not c.regressions
    # A real spread is used as measured: 3 × 5 % = 15 %, not 15 % + the floor.
    c = _figures(_micro(_row(1.0, 0.05)), _micro(_row(1.16, 0.05)))
    assert c.perf[0].bound == pytest.approx(0.15) and len(c.regressions) == 1


def test_faster_beyond_the_bound_is_an_improvement_not_a_regression() -> None:
    c = _figures(_micro(_row(1.0, 0.05)), _micro(_row(0.8, 0.05)))
    assert c.perf[0].verdict == "improvement" and c.perf[0].change == pytest.approx(-0.2)
    line = "perf.gemm prefill m=64 bf16: median time: 1000 ms → 800 ms (25.0% faster; bound 15.0%)"
    assert not c.regressions and c.improvements == [line]


@pytest.mark.parametrize(("spread", "after", "verdict"), [
    (0.05, 0.86, "improvement"),   # 1.0 / 0.86 = 1.163 > 1.15: faster by more than the bound's factor
    (0.05, 0.88, "within_noise"),  # 1.136 < 1.15
    (0.40, 0.30, "improvement"),   # bound 120 %: a time can only fall 100 %, but 3.3 × faster > 2.2 ×
    (0.40, 2.10, "within_noise"),  # 110 % slower < 120 %
    (0.40, 2.30, "regression"),
])
def test_improvement_is_the_mirror_image_of_a_regression(spread: float, after: float, verdict: str) -> None:
    c = _figures(_micro(_row(1.0, spread)), _micro(_row(after, spread)))
    assert c.perf[0].verdict == verdict


def test_throughput_change_is_taken_as_a_time() -> None:
    """A halved throughput is +100 %, like a doubled latency. With one run in three 30 % slow on
    each side (run-to-run CV 21 %, bound +200 % at 3 standard errors over 3 + 3 runs), a
    throughput falling to a fifth is +400 % as a time: a regression. Taken as a fraction of the
    baseline (−80 %, and never beyond −100 %) it would hide inside the bound."""
    old = _serving([95, 100, 105])
    new = _serving([95, 100, 105])
    for run in new.details["levels"][0]["runs"]:
        run["output_throughput"] = 100.0 / 5
    for check in (old, new):
        check.details["levels"][0]["runs"][0]["output_throughput"] *= 0.7
    c = _figures(old, new)
    thr = next(f for f in c.perf if f.figure == "level 4: output throughput")
    assert thr.bound > 1.0 and thr.change == pytest.approx(4.0) and thr.verdict == "regression"


@pytest.mark.parametrize(("old_row", "new_row", "reason"), [
    (_row(1.0, 0.05, n=2), _row(2.0, 0.05), "2 timed repetitions"),
    (_row(1.0, 0.05), _row(1.0, 0.05, status="not_run", reason="fp16 too slow here"), "not run (fp16 too slow here)"),
    (_row(1.0, 0.05), _row(9.0, 0.05, params={"m": 128}), "problem differs"),
    (_row(1.0, 0.05), _row(9.0, 0.05, name="decode m=1"), "only in the"),
])
def test_micro_rows_that_cannot_be_compared_say_why(old_row: dict[str, Any], new_row: dict[str, Any],
                                                     reason: str) -> None:
    c = _figures(_micro(old_row), _micro(new_row))
    assert not c.regressions and c.not_compared and reason in c.not_compared[0].reason


def test_micro_rows_missing_a_key_are_named_as_before() -> None:
    """Hand-written rows without a name, params or status compare as they did before the rows
    were typed: the model's defaults ('' name, {} params, '' status) do not show."""
    nameless, no_params = _row(1.0, 0.05), _row(9.0, 0.05)
    del nameless["name"], no_params["name"], no_params["params"]
    c = _figures(_micro(nameless), _micro(no_params))
    assert [(n.figure, n.reason) for n in c.not_compared] == [("? bf16", "problem differs: {'m': 64} → None")]
    statusless = _row(1.0, 0.05)
    del statusless["status"]
    c = _figures(_micro(_row(1.0, 0.05)), _micro(statusless))
    assert [n.reason for n in c.not_compared] == ["new: not run (None)"]


def _serving(ttft: list[float], level: float = 4, **scenario: Any) -> CheckResult:
    runs = [{"ttft_ms": {"median": t}, "tpot_ms": {"median": 5.0}, "output_throughput": 100.0} for t in ttft]
    details = {"scenario": {"arrival": "concurrency", "input_tokens": 128, "output_tokens": 64, "mixed": None,
                            "num_requests": 32, "duration_s": None, **scenario},
               "server": {"framework": "vllm_serve"}, "levels": [{"level": level, "runs": runs}]}
    return _check("perf.serving.s", kind="perf.serving", details=details)


def test_serving_figures_and_their_noise_over_runs() -> None:
    # baseline TTFT runs 95/100/105 → geometric mean 99.9, run-to-run CV 5 %; the new runs
    # 140/141/142 (CV 0.7 %): +41 %, beyond the bound (+31 %: 3 standard errors over 3 + 3 runs).
    c = _figures(_serving([95, 100, 105]), _serving([140, 141, 142]))
    ttft = next(f for f in c.perf if f.figure == "level 4: TTFT median")
    assert ttft.before == pytest.approx((95 * 100 * 105) ** (1 / 3))
    assert ttft.after == pytest.approx((140 * 141 * 142) ** (1 / 3))
    assert ttft.spread_before == pytest.approx(0.05, abs=0.001) and ttft.noise_kind == "run_cv"
    assert (ttft.runs_before, ttft.runs_after) == (3, 3) and 0.1 < ttft.bound < ttft.change
    assert [r.figure for r in c.regressions] == ["level 4: TTFT median"]
    assert {f.figure for f in c.perf} == {"level 4: TTFT median", "level 4: TPOT median", "level 4: output throughput"}


@pytest.mark.parametrize(("new", "reason"), [
    (_serving([130, 131, 132], num_requests=64), "workload differs: num_requests 32 → 64"),
    (_serving([130, 131, 132], level=8), "only in the"),
    (_serving([130]), "1 run(s) with a value"),
])
def test_serving_figures_that_cannot_be_compared_say_why(new: CheckResult, reason: str) -> None:
    c = _figures(_serving([95, 100, 105]), new)
    assert not c.regressions and any(reason in n.reason for n in c.not_compared), c.not_compared


# ---------------------------------------------------------------- status, ids, environment

def test_status_changes_added_removed_and_the_check_itself() -> None:
    old = _run(_check("a"), _check("b", Status.SKIP), _check("c", Status.FAIL), _check("gone"),
               _check("perf.regression", Status.PASS, kind="perf.regression"))
    new = _run(_check("a", Status.SKIP, message="could not run"), _check("b"), _check("c", Status.ERROR),
               _check("new"), _check("perf.regression", Status.FAIL, kind="perf.regression"))
    c = compare_results(old, new, POLICY)
    verdicts = {s.check_id: s.verdict for s in c.status_changes}
    assert verdicts == {"a": "regression", "b": "improvement", "c": "changed"}
    assert [r.line for r in c.regressions] == ["a: pass → skip: could not run"]
    assert (c.added_checks, c.removed_checks) == (["new"], ["gone"])


def test_volatile_readings_are_not_environment_changes() -> None:
    base, rerun = load_pair()
    assert base.environment is not None and rerun.environment is not None
    dev = rerun.environment.accelerators[0]
    dev.memory_used_mib, dev.temperature_c, dev.extra = 1.0, 77.0, {"mhz": "1"}
    rerun.environment.tools["lscpu"] = "/opt/bin/lscpu"
    assert [e.what for e in compare_results(base, rerun, POLICY).environment] == ["ladder sha256"]


def test_one_run_without_environment_is_one_line_not_every_package() -> None:
    base, rerun = load_pair()
    rerun.environment = None
    env = compare_results(base, rerun, POLICY).environment
    assert [(e.what, e.before, e.after) for e in env if e.what != "ladder sha256"] == [
        ("environment", "captured", None)]


def test_comparison_file_round_trip_and_version_check(tmp_path: Path) -> None:
    base, rerun = load_pair()
    c = compare_results(base, rerun, POLICY)
    path = tmp_path / "comparison.json"
    c.save(path)
    assert Comparison.load(path) == c
    assert f'"schema_version": "{COMPARE_SCHEMA}"' in path.read_text()
    path.write_text(path.read_text().replace(f'"schema_version": "{COMPARE_SCHEMA}"', '"schema_version": "2.0"', 1))
    with pytest.raises(InvalidInputError, match=r"comparison schema version 2.0 is not supported"):
        Comparison.load(path)


def test_policy_is_strict() -> None:
    with pytest.raises(ValueError):
        ComparePolicy(noise_multipler=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        ComparePolicy(noise_multiplier=0)
