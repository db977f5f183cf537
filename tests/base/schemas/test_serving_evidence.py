"""Typed evidence of perf.serving and perf.soak: stored details read back and re-written unchanged.

The samples are excerpts of real results files (/work runs of the quick and standard ladders,
schema 1.1 and 1.3; lists cut to two items): the models must read every shape a stored file
holds and write back exactly what was read. Malformed details give no evidence, and the
report pages still render.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.base.schemas.serving_evidence import (
    LatencyStats,
    MemoryTrend,
    RunSummary,
    ServingEvidence,
    ServingLevel,
    SoakEvidence,
)
from adaptcheck.report.fmt import Label
from adaptcheck.report.perf_serving import build_scenario
from adaptcheck.report.soak import build_soak

SAMPLES: dict[str, Any] = json.loads((Path(__file__).parent / "serving_evidence_samples.json").read_text("utf-8"))
MODELS = {"serving": ServingEvidence, "soak": SoakEvidence}
PASS = Label(key="pass", label="pass", glyph="✓")


def _sample(name: str) -> dict[str, Any]:
    details: dict[str, Any] = SAMPLES[name]["details"]
    return details


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_stored_details_round_trip_unchanged(name: str) -> None:
    details = _sample(name)
    model = MODELS[name.split("_")[0]]
    dumped = model.parse(details).dump()
    assert dumped == details
    # Number types too (4 stays 4, 2.0 stays 2.0); and what this version writes keeps its key order
    # (an older file's workload block was written in another order: equal, re-ordered).
    assert json.dumps(dumped, sort_keys=True) == json.dumps(details, sort_keys=True)
    if name.endswith("1_3"):
        assert json.dumps(dumped) == json.dumps(details)


def test_older_serving_results_keep_their_spread_verdict_fields() -> None:
    ev = ServingEvidence.parse(_sample("serving_1_1"))
    assert ev.scenario is not None and not ev.scenario.has_stability
    assert ev.scenario.repeats is not None and ev.scenario.max_spread is not None
    assert ev.levels and ev.levels[0].stability is None and ev.levels[0].drift == {}


def test_current_serving_results_read_typed() -> None:
    ev = ServingEvidence.parse(_sample("serving_1_3"))
    assert ev.scenario is not None and ev.scenario.has_stability and ev.scenario.host is not None
    level = (ev.levels or [])[0]
    assert isinstance(level.level, int) and level.stability is not None
    metric = level.stability.metrics["tpot_ms_median"]
    assert metric.host_adjusted is not None and metric.is_judged and len(metric.values) == 2
    run = level.runs[0]
    assert run.host is not None and run.host.speed_ms is not None and run.disturbed is None
    assert ev.workload is not None and ev.workload.problems == []


def test_soak_results_read_typed_with_and_without_a_decision() -> None:
    now, before = SoakEvidence.parse(_sample("soak_1_3")), SoakEvidence.parse(_sample("soak_1_1"))
    assert now.decision is not None and now.decision.looks[0].states
    assert before.decision is None and before.memory[0].state is None
    assert now.memory[0].fit is not None and now.memory[0].slope_bounds_mib_per_min is not None
    assert now.telemetry is not None and now.telemetry.host is not None and "t_s" in now.telemetry.host


def test_an_unset_field_stays_absent_and_a_none_stays_none() -> None:
    summary = RunSummary(completed=3, goodput=None, ttft_ms=LatencyStats(median=1.5))
    assert summary.dump() == {"completed": 3, "goodput": None, "ttft_ms": {"median": 1.5}}
    # A stored median without 'median' (older shape) reads its p50.
    assert LatencyStats.model_validate({"p50": 2.0}).middle() == 2.0


def test_non_finite_figures_are_kept_as_numbers() -> None:
    level = ServingLevel.model_validate({"level": 4, "spread": {"ttft_ms_median": math.inf}})
    spread = level.dump()["spread"]["ttft_ms_median"]
    assert math.isinf(spread)
    # results.json stores inf as a string; read back, it is the number again.
    assert ServingLevel.model_validate({"spread": {"ttft_ms_median": "inf"}}).spread["ttft_ms_median"] == math.inf


def _result(kind: str, details: dict[str, Any]) -> CheckResult:
    return CheckResult(step=5, id=f"{kind}.x", kind=kind, status=Status.PASS, message="ran", details=details)


@pytest.mark.parametrize("details", [
    {"levels": "not a list"},
    {"levels": [{"level": 4, "runs": [{"completed": "many"}]}]},
    {"scenario": {"levels": {"a": 1}}},
])
def test_malformed_serving_details_give_no_evidence_and_the_page_still_renders(details: dict[str, Any]) -> None:
    result = _result("perf.serving", details)
    assert result.evidence(ServingEvidence) is None
    view = build_scenario(result, PASS, "a", "b", "1 s")
    assert view.levels == [] and view.offered == [] and view.name == "x" and view.message == "ran"


@pytest.mark.parametrize("details", [
    {"memory": [{"fit": "none"}]},
    {"counters": [{"counter": "ecc"}]},
    {"telemetry": {"host": {"t_s": "0"}}},
])
def test_malformed_soak_details_give_no_evidence_and_the_page_still_renders(details: dict[str, Any]) -> None:
    result = _result("perf.soak", details)
    assert result.evidence(SoakEvidence) is None
    view = build_soak(result, PASS, "a", "b", "1 s")
    assert view.fits == [] and view.sparks == [] and view.offered == []


def test_the_report_reads_the_stored_samples() -> None:
    view = build_scenario(_result("perf.serving", _sample("serving_1_3")), PASS, "a", "b", "1 s")
    assert view.levels and view.levels[0].stability.startswith("within the bound after")
    soak = build_soak(_result("perf.soak", _sample("soak_1_3")), PASS, "a", "b", "1 s")
    assert soak.fits[0].verdict.key == "pass" and soak.sparks
    assert MemoryTrend.model_validate(_sample("soak_1_3")["memory"][0]).bounded is True
