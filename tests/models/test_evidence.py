"""Typed evidence: the base mechanism, step 4's lifecycle models, and the upgrade of older files.

Built from constructed details and CheckResults (no framework is loaded here), plus the stored
results file of a real quick-ladder run written before schema 1.3.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from adaptcheck.base.schemas.evidence import Evidence, EvidenceError
from adaptcheck.base.schemas.framework_evidence import (
    LIFECYCLE_EVIDENCE,
    FrameworkCheckEvidence,
    FrameworkInfo,
    FrameworkRef,
    LoadEvidence,
    ModelInfo,
    ReferenceEvidence,
    SubcheckRow,
    lifecycle_evidence_model,
)
from adaptcheck.base.schemas.results import SCHEMA_VERSION, CheckResult, RunResults, Status
from adaptcheck.base.schemas.upgrade import parse_version, upgrade_results
from adaptcheck.grade import compute_grade
from adaptcheck.report.framework import build_framework
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view

STORED = Path(__file__).parents[1] / "report" / "data" / "quick-run.results.json.gz"
FRAMEWORK_STEP = 4


def _result(details: dict[str, Any], kind: str = "framework.load", status: Status = Status.PASS) -> CheckResult:
    return CheckResult(step=FRAMEWORK_STEP, id="framework.vllm.load", kind=kind, status=status, details=details)


# ---------------------------------------------------------------- the mechanism


class _Probe(Evidence):
    """A toy kind's evidence."""

    count: int = Field(description="How many.")
    note: str | None = Field(default=None, description="Optional words.")


def test_round_trip_keeps_known_and_extra_fields_and_stays_json() -> None:
    details = {"count": 3, "plugin_fact": {"nested": [1, 2]}}
    probe = _Probe.parse(details)
    assert probe.count == 3 and probe.extras == {"plugin_fact": {"nested": [1, 2]}}
    dumped = probe.dump()
    assert dumped == details  # unset optional fields are left out, extras are kept
    assert json.loads(json.dumps(dumped)) == dumped


def test_details_that_do_not_fit_raise_a_one_line_error_or_read_as_none() -> None:
    with pytest.raises(EvidenceError, match=r"x: not _Probe evidence: 'count'"):
        _Probe.parse({"count": "many"}, where="x")
    result = _result({"count": "many"})
    assert result.evidence(_Probe) is None
    assert _result({}).evidence(_Probe) is None  # a crashed worker's result: no details at all
    assert _result({"count": 2}).evidence(_Probe) == _Probe(count=2)


def test_every_evidence_field_is_described() -> None:
    models: list[type[Evidence]] = [FrameworkInfo, ModelInfo, SubcheckRow, FrameworkRef, *LIFECYCLE_EVIDENCE.values()]
    missing = [f"{m.__name__}.{name}" for m in models for name, f in m.model_fields.items() if not f.description]
    assert missing == []


# ---------------------------------------------------------------- step 4's lifecycle evidence


def test_lifecycle_evidence_round_trips() -> None:
    loaded = FrameworkInfo.model_validate({"name": "vllm", "loaded": True, "display_name": "vLLM", "load_s": 12.5,
                                           "loaded_by": "framework.vllm.load", "vllm": "0.32.0", "device_type": "cpu"})
    evidence = LoadEvidence(framework=loaded, model=ModelInfo(name="embedded:tiny-llama", num_layers=2),
                            subchecks=[SubcheckRow(name="weights cover config.json", ok=None, detail="not audited")],
                            weights_audit={"refused": False})
    dumped = evidence.dump()
    assert dumped["framework"]["vllm"] == "0.32.0" and dumped["subchecks"][0]["ok"] is None  # null kept: 'not run'
    again = _result(dumped).evidence(LoadEvidence)
    assert again == evidence and again.framework.extras == {"vllm": "0.32.0", "device_type": "cpu"}


def test_a_failed_load_has_the_same_framework_shape_as_a_loaded_one() -> None:
    from adaptcheck.ladder.check import Outcome
    from adaptcheck.steps.frameworks.lifecycle import not_loaded, with_evidence

    failed = with_evidence(Outcome.errored("vllm: no platform"), not_loaded("vllm"))
    passed = with_evidence(Outcome.passed("ok", details={"subchecks": [{"name": "a", "ok": True, "detail": ""}]}),
                           FrameworkInfo(name="vllm", loaded=True, display_name="vLLM", load_s=1.0,
                                         loaded_by="framework.vllm.load"),
                           ModelInfo(name="embedded:tiny-llama"))
    assert isinstance(failed.details["framework"], dict) and isinstance(passed.details["framework"], dict)
    assert failed.details["framework"] == {"name": "vllm", "loaded": False}
    for outcome in (failed, passed):
        ref = FrameworkRef.parse(outcome.details)
        assert ref.framework.name == "vllm"
    assert FrameworkRef.parse(passed.details).framework.loaded


def test_a_malformed_subcheck_row_is_caught_where_it_is_written() -> None:
    from adaptcheck.ladder.check import Outcome
    from adaptcheck.steps.frameworks.lifecycle import not_loaded, with_evidence

    with pytest.raises(ValueError, match="subchecks"):
        with_evidence(Outcome.passed("ok", details={"subchecks": [{"ok": True}]}), not_loaded("vllm"))


def test_an_unknown_step4_kind_reads_the_shared_part() -> None:
    assert lifecycle_evidence_model("framework.reference") is ReferenceEvidence
    assert lifecycle_evidence_model("acme.step4_kind") is FrameworkCheckEvidence


def test_the_runner_names_the_framework_of_a_check_it_wrote_in_place() -> None:
    from adaptcheck.base.schemas.ladder import CheckSpec
    from adaptcheck.ladder.runner import error_results

    spec = CheckSpec(id="bringup.x", step=4, kind="framework.reference", params={"framework": "transformers"})
    [crashed] = error_results(spec, "worker crashed: SIGKILL")
    ref = crashed.evidence(FrameworkRef)
    assert ref is not None and ref.framework.name == "transformers" and not ref.framework.loaded


# ---------------------------------------------------------------- schema 1.3 and older files


def test_upgrade_brings_the_old_framework_forms_to_one_shape() -> None:
    old = {"schema_version": "1.2", "checks": [
        {"step": 4, "id": "framework.vllm.load", "kind": "framework.load",
         "details": {"framework": {"name": "vllm", "load_s": 2.0, "vllm": "0.32.0"}}},
        {"step": 4, "id": "framework.endpoint.load", "kind": "framework.load", "details": {"framework": "endpoint"}},
        {"step": 4, "id": "framework.vllm.tensor_parallel", "kind": "framework.tensor_parallel", "details": {}},
        {"step": 4, "id": "framework.collectives", "kind": "framework.collectives", "details": {"table": []}},
        {"step": 2, "id": "smoke.matmul", "kind": "smoke.matmul", "details": {}},
    ]}
    new = upgrade_results(old, SCHEMA_VERSION)
    assert old["checks"][1]["details"]["framework"] == "endpoint"  # the caller's dict is not changed
    fws = [c["details"].get("framework") for c in new["checks"]]
    assert fws == [{"name": "vllm", "load_s": 2.0, "vllm": "0.32.0", "loaded": True},
                   {"name": "endpoint", "loaded": False}, {"name": "vllm", "loaded": False}, None, None]
    assert new["schema_version"] == SCHEMA_VERSION
    assert upgrade_results({"schema_version": "1.9", "checks": []}, SCHEMA_VERSION)["schema_version"] == "1.9"
    assert parse_version("1.3") == (1, 3) and parse_version("x") == (0, 0)


def _stored_raw() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(gzip.decompress(STORED.read_bytes()))
    return raw


def test_the_stored_file_is_of_an_older_schema() -> None:
    """The file this module's upgrade tests rely on must stay an old one."""
    assert parse_version(_stored_raw()["schema_version"]) < (1, 3)


def test_a_stored_older_file_loads_grades_and_renders_with_the_same_framework_blocks(tmp_path: Path) -> None:
    raw = _stored_raw()
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    results = RunResults.load(path)
    assert results.schema_version == SCHEMA_VERSION
    # Every step-4 lifecycle result now carries the one framework shape, read typed.
    step4 = [c for c in results.checks if c.step == FRAMEWORK_STEP and c.kind != "framework.collectives"]
    assert step4 and all(c.evidence(FrameworkRef) is not None for c in step4)
    # The grade recomputed from the upgraded checks is the one the file recorded.
    grade = compute_grade(results.grade_rules, results.planned, results.checks, results.steps,
                          results.device.device_count, results.model.precision, results.model.quantization)
    assert (grade.level, grade.blockers) == (raw["grade"]["level"], raw["grade"]["blockers"])
    # The same blocks as the report built from the old shapes (names from the old file's id convention).
    view = build_framework(results, {})
    assert [(b.name, b.loaded) for b in view.frameworks] == [
        ("transformers", True), ("vllm", True), ("vllm_serve", True), ("endpoint", False)]
    vllm = next(b for b in view.frameworks if b.name == "vllm")
    assert "framework.vllm.tensor_parallel" in [r.id for r in vllm.checks]  # an old skip without details
    page = render(build_view(results))
    for block in view.frameworks:  # each block rendered, under its own anchor, with its name
        assert f'id="{block.anchor}"' in page and block.display_name in page
