"""The families table and the family-gated grade: the rule (a family needs a passing step-4 check
of a model of it), a family's checks counting only for a model of that family, ``grade
--require-family`` on every exit path, ``--format json``, JUnit, the report's first screen and
older files (docs/families.md).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from adaptcheck.base.families import FAMILIES, FAMILY_TABLE
from adaptcheck.base.features import FeatureStatus, Outcome
from adaptcheck.base.schemas.results import CheckResult, PlannedCheck, RunResults, Status
from adaptcheck.grade import compute_grade
from adaptcheck.report.junit import junit_xml
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view
from adaptcheck.runfolder import regrade
from tests.inprocess import invoke
from tests.report.factory import PLANNED, make_results

STORED_1_3 = Path(__file__).parents[1] / "base" / "schemas" / "data" / "results-1.3.json"


def _o(cid: str, status: str, step: int, tag: str = "family:mla", applicable: bool = True,
       message: str = "") -> Outcome:
    return Outcome(id=cid, status=status, applicable=applicable, message=message, tags=(tag,), step=step)


def _row(outcomes: list[Outcome]) -> tuple[FeatureStatus, str]:
    verdict = {v.name: v for v in FAMILY_TABLE.table(outcomes, [], [3, 4])}["mla"]
    return verdict.status, verdict.reason


def test_a_family_needs_a_passing_step4_check() -> None:
    assert _row([_o("ops.mla_decode", "pass", 3), _o("framework.vllm.reference.mla", "pass", 4)]) \
        == (FeatureStatus.CERTIFIED, "")
    status, reason = _row([_o("ops.mla_decode", "pass", 3)])
    assert status is FeatureStatus.NOT_TESTED and "no step-4 check passed" in reason


def test_operators_pass_but_the_model_cannot_be_served_here_is_na() -> None:
    status, reason = _row([_o("ops.int4", "pass", 3),
                           _o("framework.vllm.reference.gptq", "skip", 4, applicable=False,
                              message="vLLM 0.32 on CPU has no int4 kernel on this ISA")])
    assert status is FeatureStatus.NOT_APPLICABLE
    assert reason == "its step-4 checks cannot run here: vLLM 0.32 on CPU has no int4 kernel on this ISA"


def test_a_failing_operator_fails_the_family_even_when_the_model_passes() -> None:
    status, reason = _row([_o("ops.mla_decode", "fail", 3, message="normalized 0.3"),
                           _o("framework.vllm.reference.mla", "pass", 4)])
    assert status is FeatureStatus.FAILED and reason == "ops.mla_decode fail: normalized 0.3"


# --- the grade counts a family's checks only for a model of that family ---------------------

MLA_OP = CheckResult(step=3, id="ops.mla_decode.bf16", kind="ops.op", status=Status.FAIL, tags=["family:mla"],
                     message="absorbed up-projection: normalized error 0.4")
MLA_MODEL = CheckResult(step=4, id="framework.vllm.reference.tiny-deepseek-v3", kind="framework.reference",
                        status=Status.PASS, tags=["reference", "family:mla", "family:moe"])
MOE_MODEL = CheckResult(step=4, id="framework.vllm.reference.tiny-qwen3-moe", kind="framework.reference",
                        status=Status.PASS, tags=["reference", "family:moe"])


def _results(families: list[str]) -> RunResults:
    base = make_results()
    planned = [*PLANNED, *(PlannedCheck(id=c.id.removesuffix(".bf16"), step=c.step, kind=c.kind, tags=c.tags,
                                        timeout_s=60) for c in (MLA_OP, MLA_MODEL, MOE_MODEL))]
    model = base.model.model_copy(update={"families": families})
    return regrade(base.model_copy(update={"checks": [*base.checks, MLA_OP, MLA_MODEL, MOE_MODEL],
                                           "planned": planned, "model": model}))


def test_a_broken_mla_kernel_does_not_grade_a_dense_model_and_does_grade_deepseek() -> None:
    dense, deepseek = _results(["dense"]), _results(["mla", "moe"])
    assert "ops.mla_decode" in dense.grade.left_out
    assert "ops.mla_decode" not in deepseek.grade.left_out
    # The same evidence; the family's model sees the failure among its blockers, the dense one does not.
    assert not any("ops.mla_decode" in b for lv in dense.grade.levels for c in lv.conditions for b in [c.reason])
    assert any("ops.mla_decode.bf16 fail" in c.reason for lv in deepseek.grade.levels for c in lv.conditions)
    unknown = _results(["unknown"])
    assert "ops.mla_decode" not in unknown.grade.left_out  # the strict reading
    # Files without families (older than 1.6) grade as before: nothing left out for a family.
    same = compute_grade(dense.grade_rules, dense.planned, dense.checks, dense.steps, 1, "bf16", "none", [])
    assert "ops.mla_decode" not in same.left_out


def test_the_table_of_a_run_marks_the_models_families() -> None:
    rows = {r.name: r for r in _results(["mla", "moe"]).families}
    assert list(rows) == list(FAMILIES)
    assert rows["mla"].status is FeatureStatus.FAILED and rows["mla"].model
    assert rows["moe"].label == "certified" and rows["moe"].model
    assert rows["moe"].checks == ["framework.vllm.reference.tiny-deepseek-v3", "framework.vllm.reference.tiny-qwen3-moe"]
    assert rows["hybrid"].label == "not tested: no check of this run is tagged family:hybrid"
    assert not rows["hybrid"].model


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("families") / "results.json"
    _results(["dense"]).save(path)
    return path


def _grade(path: Path, *args: str) -> tuple[int, str, str]:
    done = invoke(["grade", str(path), *args])
    return done.returncode, done.stdout, done.stderr


def test_grade_json_carries_the_families(sealed: Path) -> None:
    code, out, _ = _grade(sealed, "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["required_families"] == [] and data["model_families"] == ["dense"]
    assert list(data["families"]) == list(FAMILIES)
    assert data["families"]["moe"] == {"status": "certified", "reason": "", "label": "certified",
                                       "checks": ["framework.vllm.reference.tiny-deepseek-v3",
                                                  "framework.vllm.reference.tiny-qwen3-moe"], "model": False}


def test_require_family_met_exits_0(sealed: Path) -> None:
    code, out, err = _grade(sealed, "--require-family", "moe", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["families_not_certified"] == []


def test_require_family_not_certified_exits_1_one_line_each(sealed: Path) -> None:
    code, out, err = _grade(sealed, "--require-family", "mla,moe,hybrid", "--format", "json")
    assert code == 1
    assert json.loads(out)["families_not_certified"] == ["mla", "hybrid"]
    assert "required family mla: failed: ops.mla_decode.bf16 fail: absorbed up-projection" in err
    assert "required family hybrid: not tested: no check of this run is tagged family:hybrid" in err


@pytest.mark.parametrize(("value", "words"), [
    ("multimodel", "did you mean 'multimodal'"),
    (",", "--require-family names no family"),
    ("warp", "known families: dense, moe, mla"),
])
def test_an_unknown_or_empty_family_is_exit_2(sealed: Path, value: str, words: str) -> None:
    code, _, err = _grade(sealed, "--require-family", value)
    assert code == 2 and words in err


def test_junit_has_a_families_suite_failing_only_required_ones() -> None:
    results = _results(["dense"])
    root = ET.fromstring(junit_xml(results, required_families=["mla"]))
    suite = root.find("testsuite[@name='adaptcheck.families']")
    assert suite is not None and suite.get("tests") == str(len(FAMILIES))
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    failure = cases["mla"].find("failure")
    assert failure is not None and failure.get("type") == "FamilyNotCertified"
    assert cases["moe"].find("failure") is None and cases["hybrid"].find("skipped") is not None
    props = {p.get("name"): p.get("value") for p in root.findall("testsuite[1]/properties/property")}
    assert props["adaptcheck.model.families"] == "dense" and props["adaptcheck.required_families"] == "mla"
    assert props["adaptcheck.family.moe"] == "certified"


def test_the_first_screen_shows_the_families_and_the_models_own() -> None:
    results = _results(["mla", "moe"])
    view = build_view(results)
    rows = {f.name: f for f in view.families}
    assert view.families_tested and rows["mla"].model and not rows["hybrid"].model
    page = render(view)
    grade_section = page[page.index('<section id="grade"'):page.index('<section id="steps"')]
    assert "<h3>Model families</h3>" in grade_section and "The model is read as: mla, moe" in grade_section
    old = render(build_view(RunResults.load(STORED_1_3)))
    assert "Model families: none tested" in old[old.index('<section id="grade"'):old.index('<section id="steps"')]


def test_older_files_get_a_not_tested_table_and_keep_their_grade() -> None:
    results = RunResults.load(STORED_1_3)
    assert [f.name for f in results.families] == list(FAMILIES)
    assert {f.status for f in results.families} == {FeatureStatus.NOT_TESTED}
    assert results.model.families == [] and regrade(results).grade.level == results.grade.level
