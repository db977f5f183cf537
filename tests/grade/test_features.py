"""The features table: the rule per feature, the ladder's ``feature:`` tags, the upgrade of older
files, and every output of it — ``grade --require-feature`` (each exit path), ``--format json``,
JUnit, the terminal and the report's first screen.

Results files are built from the report factory's run plus checks tagged ``feature:NAME`` and
sealed (``RunResults.save``), so ``grade`` verifies them like a run's; the CLI runs in process
(tests/inprocess.py). docs/features.md, "The features table and --require-feature".
"""

from __future__ import annotations

import gzip
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from adaptcheck.base.errors import LadderError
from adaptcheck.base.features import FEATURES, FeatureStatus, Outcome, Planned, evaluate_feature, parse_feature_list
from adaptcheck.base.schemas.results import SCHEMA_VERSION, CheckResult, PlannedCheck, RunResults, Status
from adaptcheck.base.schemas.upgrade import upgrade_results
from adaptcheck.ladder.loader import parse_ladder
from adaptcheck.report.junit import junit_xml
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view
from adaptcheck.runfolder import regrade
from tests.conftest import ladder_text
from tests.inprocess import invoke
from tests.report.factory import PLANNED, make_results

DATA = Path(__file__).parents[1] / "base" / "schemas" / "data"
STORED_1_3 = DATA / "results-1.3.json"
STORED_1_1 = Path(__file__).parents[1] / "report" / "data" / "quick-run.results.json.gz"


# --- the rule, on plain values ------------------------------------------------------------


def _o(cid: str, status: str, *, tag: str = "feature:spec_decode", applicable: bool = True,
       message: str = "") -> Outcome:
    return Outcome(id=cid, status=status, applicable=applicable, message=message, tags=(tag, "other"))


def test_one_pass_and_no_failure_certifies() -> None:
    v = evaluate_feature("spec_decode", [_o("a", "pass"), _o("b", "skip", applicable=False, message="no")], [], [4])
    assert (v.status, v.reason, v.checks) == (FeatureStatus.CERTIFIED, "", ["a", "b"])


@pytest.mark.parametrize("bad", ["fail", "error"])
def test_any_failure_or_error_fails_the_feature_and_names_it(bad: str) -> None:
    v = evaluate_feature("spec_decode", [_o("a", "pass"), _o("b", bad, message="drafted 0\ntokens")], [], [4])
    assert v.status is FeatureStatus.FAILED
    assert v.reason == f"b {bad}: drafted 0 tokens"  # one line, whatever the message spans


def test_all_not_applicable_is_na_with_the_first_reason() -> None:
    outcomes = [_o("a", "skip", applicable=False, message="FP8 KV cache on CPU requires x86 with AVX-512 or AMX"),
                _o("b", "skip", applicable=False, message="second")]
    v = evaluate_feature("spec_decode", outcomes, [], [4])
    assert (v.status, v.reason) == (FeatureStatus.NOT_APPLICABLE, "FP8 KV cache on CPU requires x86 with AVX-512 or AMX")


def test_nothing_tagged_is_not_tested() -> None:
    v = evaluate_feature("spec_decode", [_o("a", "pass", tag="feature:fp8_kv_cache")], [], [4])
    assert (v.status, v.reason, v.checks) == (FeatureStatus.NOT_TESTED,
                                              "no check of this run is tagged feature:spec_decode", [])


def test_a_check_that_did_not_run_is_never_a_certificate() -> None:
    planned = [Planned("p5", 5, ("feature:spec_decode",)), Planned("p4", 4, ("feature:spec_decode",))]
    v = evaluate_feature("spec_decode", [_o("s", "skip", message="vLLM is not installed")], planned, [4])
    assert v.status is FeatureStatus.NOT_TESTED
    assert v.reason == ("s skipped: vLLM is not installed; p5 not run (step 5 not selected); "
                        "p4 has no result (run interrupted?)")
    # n/a beside a check that never ran is not n/a either: the missing one might have applied.
    v = evaluate_feature("spec_decode", [_o("s", "skip", applicable=False, message="no")], planned[:1], [4])
    assert v.status is FeatureStatus.NOT_TESTED


def test_an_expanding_checks_results_count_for_its_planned_check() -> None:
    planned = [Planned("ops.x", 3, ("feature:spec_decode",))]
    v = evaluate_feature("spec_decode", [_o("ops.x.bf16", "pass")], planned, [3])
    assert (v.status, v.checks) == (FeatureStatus.CERTIFIED, ["ops.x.bf16"])


def test_parse_feature_list() -> None:
    assert parse_feature_list(["spec_decode, fp8_kv_cache", "spec_decode", ",preemption,"]) == (
        ["spec_decode", "fp8_kv_cache", "preemption"], [])
    names, problems = parse_feature_list(["spec_decod,fp8"])
    assert names == [] and problems[0] == "unknown feature 'spec_decod'; did you mean 'spec_decode'?"
    assert "did you mean 'fp8_kv_cache'" in problems[1]


# --- the ladder's feature: tags --------------------------------------------------------------


def test_a_known_feature_tag_is_data_and_an_unknown_one_a_ladder_error() -> None:
    spec = parse_ladder(ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass", "tags": ["feature:graph_capture"]}]),
                        "l.yaml")
    assert spec.checks[0].tags == ["feature:graph_capture"]
    text = ladder_text([{"id": "a", "step": 2, "kind": "dummy.pass", "tags": ["feature:prefix_cache"]}])
    with pytest.raises(LadderError) as err:
        parse_ladder(text, "l.yaml")
    assert "l.yaml" in err.value.message
    assert "unknown feature 'prefix_cache'; did you mean 'prefix_caching'" in err.value.message


# --- the schema and the upgrade of older files ------------------------------------------------


def test_older_files_get_the_table_on_load_and_it_says_not_tested() -> None:
    for results in (RunResults.load(STORED_1_3),
                    RunResults.model_validate(json.loads(gzip.decompress(STORED_1_1.read_bytes())))):
        assert results.schema_version == SCHEMA_VERSION == "1.7"
        assert [f.name for f in results.features] == list(FEATURES)
        # No older run took --serve: no deployment, and no row deployed (schema 1.7).
        assert results.deployment is None and not any(f.deployed for f in results.features)
        assert {f.status for f in results.features} == {FeatureStatus.NOT_TESTED}
        assert results.features[0].description == FEATURES["prefix_caching"]
        # The upgrade and the grade decide alike.
        assert regrade(results).features == results.features


def test_the_upgrade_computes_the_table_from_the_files_tags() -> None:
    raw = json.loads(STORED_1_3.read_text())
    raw["checks"][0]["tags"] = ["feature:tensor_parallel"]
    raw["checks"][0]["status"] = "fail"
    raw["checks"][0]["message"] = "rank 1 dropped"
    upgraded = upgrade_results(raw, SCHEMA_VERSION)
    row = next(f for f in upgraded["features"] if f["name"] == "tensor_parallel")
    assert row["status"] == "failed" and row["reason"] == f"{raw['checks'][0]['id']} fail: rank 1 dropped"
    assert "features" not in raw  # the caller's dict is not changed
    # Junk where lists belong is left for validation to judge, never a crash here.
    assert len(upgrade_results({"schema_version": "1.4", "checks": 5, "planned": [1], "steps": "x"},
                               SCHEMA_VERSION)["features"]) == len(FEATURES)


# --- results files for the CLI ---------------------------------------------------------------

TAGGED = [
    CheckResult(step=4, id="framework.vllm.spec_decode", kind="framework.spec_decode", status=Status.PASS,
                tags=["feature:spec_decode"], message="drafted 69, accepted 67"),
    CheckResult(step=4, id="framework.vllm.fp8_kv_cache", kind="framework.fp8_kv_cache", status=Status.FAIL,
                tags=["feature:fp8_kv_cache"], message="fp8_e4m3 vs auto: KL 0.4 above its bound 0.02"),
    CheckResult(step=4, id="framework.vllm.fp8_kv_cache.served", kind="framework.fp8_kv_cache", status=Status.PASS,
                tags=["feature:fp8_kv_cache"]),
    CheckResult(step=4, id="framework.vllm.tensor_parallel", kind="framework.tensor_parallel", status=Status.SKIP,
                applicable=False, tags=["feature:tensor_parallel"], message="needs more than one device"),
    CheckResult(step=4, id="framework.vllm.preemption", kind="framework.preemption", status=Status.SKIP,
                tags=["feature:preemption"], message="vLLM is not installed"),
]
LONG = PlannedCheck(id="perf.long_context", step=5, kind="perf.x", tags=["feature:long_context"], timeout_s=60)


def _tagged_results() -> RunResults:
    base = make_results()
    planned = [*PLANNED, *(PlannedCheck(id=c.id, step=c.step, kind=c.kind, tags=c.tags, timeout_s=60)
                           for c in TAGGED[:2] + TAGGED[3:]), LONG]
    return regrade(base.model_copy(update={"checks": [*base.checks, *TAGGED], "planned": planned}))


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("features") / "results.json"
    _tagged_results().save(path)
    return path


def test_the_table_of_a_run() -> None:
    rows = {f.name: f for f in _tagged_results().features}
    assert list(rows) == list(FEATURES)
    assert rows["spec_decode"].label == "certified"
    assert rows["spec_decode"].checks == ["framework.vllm.spec_decode"]
    assert rows["fp8_kv_cache"].label == ("failed: framework.vllm.fp8_kv_cache fail: fp8_e4m3 vs auto: "
                                          "KL 0.4 above its bound 0.02")
    assert rows["tensor_parallel"].label == "n/a: needs more than one device"
    assert rows["preemption"].label == "not tested: framework.vllm.preemption skipped: vLLM is not installed"
    assert rows["long_context"].label == "not tested: perf.long_context not run (step 5 not selected)"
    assert rows["graph_capture"].label == "not tested: no check of this run is tagged feature:graph_capture"


def _grade(path: Path, *args: str) -> tuple[int, str, str]:
    done = invoke(["grade", str(path), *args])
    return done.returncode, done.stdout, done.stderr


def test_grade_json_carries_the_table(sealed: Path) -> None:
    code, out, _ = _grade(sealed, "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["meets"] is True and data["required_features"] == []
    assert list(data["features"]) == list(FEATURES)
    assert data["features"]["fp8_kv_cache"]["status"] == "failed"
    assert data["features"]["fp8_kv_cache"]["checks"] == ["framework.vllm.fp8_kv_cache",
                                                          "framework.vllm.fp8_kv_cache.served"]
    assert data["features"]["tensor_parallel"]["label"] == "n/a: needs more than one device"


def test_require_feature_met_exits_0(sealed: Path) -> None:
    code, out, err = _grade(sealed, "--require-feature", "spec_decode", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["meets"] is True and data["features_not_certified"] == [] and data["required_features"] == ["spec_decode"]
    assert "Features certified: spec_decode" in err


@pytest.mark.parametrize(("name", "line"), [
    ("fp8_kv_cache", "required feature fp8_kv_cache: failed: framework.vllm.fp8_kv_cache fail: fp8_e4m3 vs auto"),
    ("tensor_parallel", "required feature tensor_parallel: n/a: needs more than one device"),
    ("preemption", "required feature preemption: not tested: framework.vllm.preemption skipped"),
    ("long_context", "required feature long_context: not tested: perf.long_context not run (step 5 not selected)"),
    ("chunked_prefill", "required feature chunked_prefill: not tested: no check of this run is tagged"),
])
def test_require_feature_not_certified_exits_1_naming_it(sealed: Path, name: str, line: str) -> None:
    code, _, err = _grade(sealed, "--require-feature", f"spec_decode,{name}")
    assert code == 1
    lines = [x for x in err.splitlines() if x.startswith("required feature ")]
    assert len(lines) == 1 and lines[0].startswith(line)  # the certified one is not listed
    assert f"required feature(s) not certified: {name} (" in err


def test_each_missing_feature_gets_its_own_line_and_json_says_which(sealed: Path) -> None:
    code, out, err = _grade(sealed, "--require-feature", "fp8_kv_cache", "--require-feature", "graph_capture,spec_decode",
                            "--format", "json")
    assert code == 1
    assert [x.split(":")[0] for x in err.splitlines() if x.startswith("required feature ")] == [
        "required feature fp8_kv_cache", "required feature graph_capture"]
    data = json.loads(out)
    assert data["meets"] is False and data["features_not_certified"] == ["fp8_kv_cache", "graph_capture"]


def test_level_and_features_gate_together(sealed: Path) -> None:
    assert _grade(sealed, "--require", "L1", "--require-feature", "spec_decode")[0] == 0
    code, _, err = _grade(sealed, "--require", "L1", "--require-feature", "graph_capture")
    assert code == 1 and "required feature graph_capture: not tested" in err
    code, _, err = _grade(sealed, "--require", "L5", "--require-feature", "spec_decode")
    assert code == 1 and "is below the required L5" in err and "required feature" not in err


@pytest.mark.parametrize(("value", "words"), [
    ("spec_decod", "unknown feature 'spec_decod'; did you mean 'spec_decode'?"),
    ("spec_decode,fp8-kv-cache", "did you mean 'fp8_kv_cache'?"),
    ("warp_drive", "known features: prefix_caching, graph_capture"),
    (",", "--require-feature names no feature"),
])
def test_an_unknown_or_empty_feature_name_is_exit_2(sealed: Path, value: str, words: str) -> None:
    code, out, err = _grade(sealed, "--require-feature", value)
    assert code == 2 and out == ""
    assert words in err
    # Checked before the file is read: a wrong name is the user's to fix first.
    assert _grade(sealed.parent / "missing.json", "--require-feature", value)[0] == 2


def test_an_edited_file_is_still_refused_first(sealed: Path, tmp_path: Path) -> None:
    edited = tmp_path / "results.json"
    edited.write_text(sealed.read_text().replace("drafted 69", "drafted 70"))
    code, _, err = _grade(edited, "--require-feature", "spec_decode")
    assert code == 5 and "edited" in err
    code, _, err = _grade(edited, "--require-feature", "spec_decode", "--allow-unverified")
    assert code == 0 and "UNVERIFIED" in err


def test_a_file_older_than_the_table_is_not_tested(tmp_path: Path) -> None:
    code, _, err = _grade(STORED_1_3, "--require-feature", "prefix_caching", "--allow-unverified")
    assert code == 1
    assert "required feature prefix_caching: not tested: no check of this run is tagged feature:prefix_caching" in err
    assert "Features: none tested" in err


# --- JUnit ----------------------------------------------------------------------------------


def _feature_cases(xml: str) -> dict[str, ET.Element]:
    root = ET.fromstring(xml)
    suite = root.find("testsuite[@name='adaptcheck.features']")
    assert suite is not None
    return {c.get("name", ""): c for c in suite.findall("testcase")}


def test_junit_fails_a_feature_only_when_required() -> None:
    results = _tagged_results()
    free = _feature_cases(junit_xml(results))
    assert list(free) == list(FEATURES)
    assert free["spec_decode"].find("*") is not None  # system-out only: a pass
    assert free["spec_decode"].find("failure") is None and free["spec_decode"].find("skipped") is None
    skipped = free["fp8_kv_cache"].find("skipped")
    assert skipped is not None and skipped.get("message", "").startswith("failed: framework.vllm.fp8_kv_cache fail")
    assert skipped.get("type") == "failed"
    required = _feature_cases(junit_xml(results, required_features=["fp8_kv_cache", "tensor_parallel", "spec_decode"]))
    failure = required["fp8_kv_cache"].find("failure")
    assert failure is not None and failure.get("type") == "FeatureNotCertified"
    assert failure.get("message", "").startswith("required feature fp8_kv_cache: failed:")
    assert required["tensor_parallel"].find("failure") is not None
    assert required["spec_decode"].find("failure") is None
    assert required["graph_capture"].find("skipped") is not None  # not required: informational


def test_junit_properties_carry_every_status(sealed: Path, tmp_path: Path) -> None:
    xml_path = tmp_path / "g.xml"
    code, _, _ = _grade(sealed, "--require-feature", "spec_decode,long_context", "--junit", str(xml_path))
    assert code == 1  # the XML is written all the same
    root = ET.parse(xml_path).getroot()
    props = {p.get("name"): p.get("value") for p in root.findall("testsuite[1]/properties/property")}
    assert props["adaptcheck.required_features"] == "spec_decode,long_context"
    assert props["adaptcheck.feature.spec_decode"] == "certified"
    assert props["adaptcheck.feature.tensor_parallel"] == "n/a: needs more than one device"
    assert root.find(".//testcase[@name='long_context']/failure") is not None
    suite = root.find("testsuite[@name='adaptcheck.features']")
    assert suite is not None and (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("8", "1", "6")


# --- the report's first screen ----------------------------------------------------------------


def test_the_first_screen_shows_the_table_with_the_checks_behind_it() -> None:
    results = _tagged_results()
    view = build_view(results)
    rows = {f.name: f for f in view.features}
    assert view.features_tested and list(rows) == list(FEATURES)
    assert (rows["spec_decode"].status.key, rows["spec_decode"].status.label) == ("pass", "certified")
    assert (rows["fp8_kv_cache"].status.key, rows["fp8_kv_cache"].status.label) == ("fail", "failed")
    assert rows["tensor_parallel"].status.label == "n/a" and rows["long_context"].status.key == "notrun"
    assert [r.id for r in rows["spec_decode"].checks] == ["framework.vllm.spec_decode"]
    assert rows["spec_decode"].checks[0].anchor  # links to its evidence
    page = render(build_view(results))
    grade_section = page[page.index('<section id="grade"'):page.index('<section id="steps"')]
    assert "<h3>Serving features</h3>" in grade_section
    assert "fp8_e4m3 vs auto: KL 0.4 above its bound 0.02" in grade_section
    assert "needs more than one device" in grade_section


def test_the_first_screen_says_in_one_line_when_nothing_was_tested() -> None:
    results = RunResults.load(STORED_1_3)
    assert not build_view(results).features_tested
    page = render(build_view(results))
    grade_section = page[page.index('<section id="grade"'):page.index('<section id="steps"')]
    assert "Serving features: none tested" in grade_section and "Serving features</h3>" not in grade_section


# --- beside the level, never folded into it: a real run of a small ladder --------------------

RUN_CHECKS = [
    {"id": "first", "step": 1, "kind": "dummy.pass"},
    {"id": "fw.compile", "step": 2, "kind": "dummy.fail", "tags": ["compile", "feature:graph_capture"]},
    {"id": "fw.spec", "step": 2, "kind": "dummy.pass", "tags": ["feature:spec_decode"]},
    {"id": "smoke.streams_events", "step": 2, "kind": "smoke.streams_events", "tags": ["feature:tensor_parallel"]},
]
# L2 as the shipped grade's L3 becomes: what the level names, no graph-capture condition.
RUN_GRADE = """
grade:
  levels:
    - level: L1
      name: device usable
      conditions:
        - {id: first, description: the first check passes, checks: [first]}
    - level: L2
      name: service usable
      conditions:
        - {id: serving, description: the serving check passes, checks: [fw.spec]}
"""


@pytest.fixture(scope="module")
def run_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import finished_run

    return finished_run(tmp_path_factory.mktemp("features-run"), RUN_CHECKS, grade=RUN_GRADE) / "results.json"


@pytest.mark.slow
def test_a_run_writes_the_table_beside_its_grade(run_results: Path) -> None:
    results = RunResults.load(run_results)
    assert results.schema_version == SCHEMA_VERSION and results.grade.level == "L2"  # the failed feature costs no level
    rows = {f.name: f for f in results.features}
    assert rows["graph_capture"].label.startswith("failed: fw.compile fail")
    assert rows["spec_decode"].status is FeatureStatus.CERTIFIED
    assert rows["tensor_parallel"].status is FeatureStatus.NOT_APPLICABLE
    assert rows["preemption"].status is FeatureStatus.NOT_TESTED
    assert "<h3>Serving features</h3>" in (run_results.parent / "report.html").read_text()
    assert _grade(run_results, "--require", "L2", "--require-feature", "spec_decode")[0] == 0
    code, _, err = _grade(run_results, "--require", "L2", "--require-feature", "spec_decode,graph_capture")
    assert code == 1 and "required feature graph_capture: failed: fw.compile fail" in err
