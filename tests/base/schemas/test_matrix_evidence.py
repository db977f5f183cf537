"""Step 1's evidence models: real details round-trip unchanged, malformed ones read as None.

The samples (tests/base/schemas/data/matrix_details.json) are the details of stored results
files of real runs: every rule type's ``compared`` record, telemetry, known-good before and
after entries carried dates.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptcheck.base.schemas.evidence import Evidence
from adaptcheck.base.schemas.matrix_evidence import (
    ArchCompared,
    BackendsCompared,
    CaptureEvidence,
    CudaCompared,
    DependenciesCompared,
    ExtensionCompared,
    KnownGoodEvidence,
    PluginsCompared,
    RequirementCompared,
    RuleCompared,
    RuleEvidence,
    TableCompared,
    TelemetryEvidence,
)
from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.report.matrix import build_known_good, build_rules
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view
from tests.report.factory import make_results
from tests.steps.matrix.factories import make_env

SAMPLES: dict[str, list[dict[str, object]]] = json.loads(
    (Path(__file__).parent / "data" / "matrix_details.json").read_text(encoding="utf-8"))
CASES = [(kind, s["from"], s["details"]) for kind, samples in SAMPLES.items() for s in samples]
MODELS: dict[str, type[Evidence]] = {"matrix.rules": RuleEvidence, "matrix.telemetry": TelemetryEvidence,
                                     "matrix.known_good": KnownGoodEvidence}


@pytest.mark.parametrize("kind, origin, details", CASES, ids=[f"{k}:{o}" for k, o, _ in CASES])
def test_stored_details_round_trip_unchanged(kind: str, origin: str, details: dict[str, object]) -> None:
    evidence = MODELS[kind].parse(details, where=origin)
    dumped = evidence.dump()
    assert json.dumps(dumped) == json.dumps(details)  # keys, values, order and number types


def test_each_rule_type_reads_as_its_own_record() -> None:
    by_origin = {s["from"]: RuleEvidence.parse(s["details"]) for s in SAMPLES["matrix.rules"]}  # type: ignore[arg-type]
    kinds = {type(e.compared) for e in by_origin.values()}
    assert {CudaCompared, RequirementCompared, PluginsCompared, ExtensionCompared, DependenciesCompared,
            TableCompared, ArchCompared, BackendsCompared} <= kinds
    for e in by_origin.values():
        assert e.compared is not None and e.compared.extras == {}, e.compared


def test_a_rule_that_could_not_run_records_an_empty_compared() -> None:
    assert RuleEvidence(verdict="not_applicable", rule="r", source="s", compared=RuleCompared()).dump()["compared"] == {}


def test_capture_keeps_every_environment_field() -> None:
    env = make_env()
    stored = {"environment": env.model_dump(mode="json")}
    assert CaptureEvidence.model_validate(stored).dump() == stored


def test_known_good_before_dates_shows_none() -> None:
    older = next(s for s in SAMPLES["matrix.known_good"] if "date" not in s["details"]["entry"])  # type: ignore[index]
    c = CheckResult(step=1, id="matrix.known_good", kind="matrix.known_good", status=Status.PASS, message="m",
                    details=older["details"])  # type: ignore[arg-type]
    view = build_known_good([c])
    assert view is not None and view.date == "not present" and view.entry == "cpu-x86_64-torch-2.13"


@pytest.mark.parametrize("details", [{"verdict": 3, "source": "s"}, {"verdict": "ok", "compared": [1, 2]}])
def test_malformed_rule_details_fall_back_to_the_status(details: dict[str, object]) -> None:
    c = CheckResult(step=1, id="matrix.rules.x", kind="matrix.rules", status=Status.FAIL, message="m", details=details)
    assert c.evidence(RuleEvidence) is None
    (row,) = build_rules([c], {"matrix.rules.x": "a"})
    assert (row.verdict, row.source) == ("incompatible", "")


def test_malformed_known_good_shows_no_section_and_the_report_renders() -> None:
    bad = CheckResult(step=1, id="matrix.known_good", kind="matrix.known_good", status=Status.FAIL, message="m",
                      details={"entry": "cpu-x86_64"})
    assert bad.evidence(KnownGoodEvidence) is None and build_known_good([bad]) is None
    results = make_results()
    results.checks.append(bad)
    assert "matrix.known_good" in render(build_view(results), "details")
