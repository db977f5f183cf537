"""JUnit XML: valid against the schema Jenkins validates with (tests/report/data/junit.xsd),
read the same way by a third-party parser CI tooling uses (junitparser), counts right,
text escaped and scrubbed."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import xmlschema
from junitparser import Error, Failure, JUnitXml, Skipped

from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.report.junit import MAX_BODY_CHARS, junit_xml
from tests.conftest import ladder_text, run_cli
from tests.report.factory import PLANNED, make_results

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

SCHEMA = xmlschema.XMLSchema11(Path(__file__).parent / "data" / "junit.xsd")

CHECKS = [
    {"id": "first", "step": 1, "kind": "dummy.pass"},
    {"id": "second", "step": 2, "kind": "dummy.fail"},
    {"id": "third", "step": 2, "kind": "dummy.raise"},
    {"id": "smoke.streams_events", "step": 2, "kind": "smoke.streams_events"},  # n/a on CPU
    {"id": "later", "step": 3, "kind": "dummy.skip", "params": {"why": "not implemented: a <b> & c"}},
    {"id": "perf.never", "step": 5, "kind": "dummy.pass"},  # its step is not selected
]


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real run with --junit and --require L2 (below it), then 'grade --junit' of its file."""
    root = tmp_path_factory.mktemp("junit")
    ladder = root / "ladder.yaml"
    ladder.write_text(ladder_text(CHECKS))
    run_xml, grade_xml = root / "ci" / "run.xml", root / "grade.xml"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--steps", "1-3", "--out", str(root / "run"),
                    "--junit", str(run_xml), "--require", "L2", "--quiet"])
    assert done.returncode == 1, done.stderr  # below --require, and the XML is written all the same
    graded = run_cli(["grade", str(root / "run" / "results.json"), "--junit", str(grade_xml)])
    assert graded.returncode == 0, graded.stderr
    return {"run": run_xml, "grade": grade_xml, "results": root / "run" / "results.json"}


def _cases(path: Path) -> dict[str, Any]:
    return {case.name: case for suite in JUnitXml.fromfile(str(path)) for case in suite}


def _props(path: Path) -> dict[str, str]:
    suite = next(iter(JUnitXml.fromfile(str(path))))
    return {p.name: p.value for p in suite.properties()}


def test_run_junit_is_valid_and_junitparser_counts_agree(produced: dict[str, Path]) -> None:
    SCHEMA.validate(str(produced["run"]))
    xml = JUnitXml.fromfile(str(produced["run"]))
    suites = {s.name: s for s in xml}
    assert list(suites) == ["adaptcheck.step1 compatibility matrix", "adaptcheck.step2 tensor smoke",
                            "adaptcheck.step3 operator numerics", "adaptcheck.step5 performance baseline",
                            "adaptcheck.grade", "adaptcheck.features", "adaptcheck.families"]
    expected = {  # tests, failures, errors, skipped
        "adaptcheck.step1 compatibility matrix": (1, 0, 0, 0), "adaptcheck.step2 tensor smoke": (3, 1, 1, 1),
        "adaptcheck.step3 operator numerics": (1, 0, 0, 1), "adaptcheck.step5 performance baseline": (1, 0, 0, 1),
        "adaptcheck.grade": (1, 1, 0, 0),
        "adaptcheck.features": (8, 0, 0, 8),  # no check tagged feature:NAME: every feature 'not tested'
        "adaptcheck.families": (11, 0, 0, 11),  # nor family:NAME: every family 'not tested'
    }
    for name, suite in suites.items():
        assert (suite.tests, suite.failures, suite.errors, suite.skipped) == expected[name], name
        assert len(list(suite)) == suite.tests
    xml.update_statistics()  # junitparser recounts from the cases: nothing may change
    assert (xml.tests, xml.failures, xml.errors) == (26, 2, 1)
    root = ET.parse(produced["run"]).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("26", "2", "1")


def test_each_outcome_maps_to_its_element(produced: dict[str, Path]) -> None:
    cases = _cases(produced["run"])
    assert cases["first"].is_passed and cases["first"].classname == "adaptcheck.step1.first"
    assert "pid = " in (cases["first"].system_out or "")  # metrics travel in system-out
    (fail,) = cases["second"].result
    assert isinstance(fail, Failure) and fail.message == "failed on purpose" and fail.type == "dummy.fail"
    (err,) = cases["third"].result
    assert isinstance(err, Error) and "ValueError" in err.message and "Traceback" in (err.text or "")
    (na,) = cases["smoke.streams_events"].result
    assert isinstance(na, Skipped) and na.message.startswith("n/a: ")
    assert cases["smoke.streams_events"].classname == "adaptcheck.step2.smoke"
    (skip,) = cases["later"].result
    assert isinstance(skip, Skipped) and skip.message == "not implemented: a <b> & c"
    (not_run,) = cases["perf.never"].result
    assert isinstance(not_run, Skipped) and not_run.message.startswith("not run: step 5 was not selected")
    (below,) = cases["grade"].result
    assert isinstance(below, Failure) and below.message == "grade L1 is below the required L2"
    assert "second fail: failed on purpose" in (below.text or "")
    assert float(cases["smoke.streams_events"].time) > 0


def test_grade_junit_without_require_passes_and_carries_the_digest(produced: dict[str, Path]) -> None:
    SCHEMA.validate(str(produced["grade"]))
    grade = _cases(produced["grade"])["grade"]
    assert grade.is_passed  # informational only when nothing was required
    assert "grade: L1 (device usable)" in (grade.system_out or "")
    assert "blockers for the next level:" in (grade.system_out or "")
    data = json.loads(produced["results"].read_text())
    for path in (produced["run"], produced["grade"]):
        props = _props(path)
        assert props["adaptcheck.digest"] == data["digest"]
        assert props["adaptcheck.run_id"] == data["run_id"]
        assert props["adaptcheck.grade"] == "L1"
        assert props["adaptcheck.version"] == data["adaptcheck_version"]


def _mutations() -> list[tuple[str, Any]]:
    def count_off(root: ET.Element) -> None:
        suite = root.find("testsuite[@name='adaptcheck.step2 tensor smoke']")
        assert suite is not None
        suite.set("failures", str(int(suite.get("failures", "0")) + 1))

    def total_off(root: ET.Element) -> None:
        root.set("tests", str(int(root.get("tests", "0")) - 1))

    def skipped_off(root: ET.Element) -> None:
        suite = root.find("testsuite[@name='adaptcheck.step3 operator numerics']")
        assert suite is not None
        suite.set("skipped", "0")

    def nameless(root: ET.Element) -> None:
        case = root.find(".//testcase")
        assert case is not None
        del case.attrib["name"]

    def two_outcomes(root: ET.Element) -> None:
        case = root.find(".//testcase[failure]")
        assert case is not None
        case.insert(0, ET.Element("error", message="x"))

    def unknown_attribute(root: ET.Element) -> None:
        root.set("skipped", "3")  # not an attribute of testsuites in Jenkins' schema

    def exponent_time(root: ET.Element) -> None:
        case = root.find(".//testcase")
        assert case is not None
        case.set("time", "1e-3")

    return [("failure count off", count_off), ("total off", total_off), ("skipped count off", skipped_off),
            ("testcase without name", nameless), ("two outcomes", two_outcomes),
            ("unknown attribute", unknown_attribute), ("exponent time", exponent_time)]


@pytest.mark.parametrize("name,mutate", _mutations(), ids=[m[0] for m in _mutations()])
def test_schema_rejects_broken_documents(produced: dict[str, Path], name: str, mutate: Any) -> None:
    root = ET.parse(produced["run"]).getroot()
    assert SCHEMA.is_valid(ET.tostring(root, encoding="unicode"))
    broken = copy.deepcopy(root)
    mutate(broken)
    assert not SCHEMA.is_valid(ET.tostring(broken, encoding="unicode")), name


def test_interrupted_run_reports_missing_checks_as_errors() -> None:
    """A check that should have run but has no result is never green (nor merely skipped)."""
    checks = [c for c in make_results().checks if c.step < 3]  # steps 3 and 4 selected, never reached
    results = make_results(checks=checks, complete=False)
    text = junit_xml(results)
    SCHEMA.validate(text)
    root = ET.fromstring(text)
    for cid in ("ops.rmsnorm", "framework.batch"):
        case = root.find(f".//testcase[@name='{cid}']")
        assert case is not None and case.find("error") is not None, cid
        assert case.find("error").get("message") == "not run: the run was interrupted before this check"  # type: ignore[union-attr]
    perf = root.find(".//testcase[@name='perf.gemm']")  # step 5 was not selected: skipped, not an error
    assert perf is not None and perf.find("skipped") is not None
    grade = root.find(".//testcase[@name='grade']")
    assert grade is not None and "incomplete" in (grade.findtext("system-out") or "")


def test_text_is_escaped_scrubbed_and_xml_safe() -> None:
    token = "hf_" + "Q" * 30
    nasty = f"bad \x1b[31mred\x1b[0m \x00 <script>alert(1)</script> & \"quotes\" key={token}\nline two"
    checks = [CheckResult(step=2, id='smoke.x"<y>', kind="smoke.matmul", status=Status.FAIL, message=nasty,
                          metrics={"weird": "<&>"}, details={"token": token, "tag": "</failure>"}, duration_s=0.5)]
    text = junit_xml(make_results(checks=checks, steps=[2]))
    SCHEMA.validate(text)  # parses and validates: no raw control character reached the file
    assert token not in text
    case = ET.fromstring(text).find(".//testcase[@classname='adaptcheck.step2.smoke']")
    assert case is not None and case.get("name") == 'smoke.x"<y>'
    failure = case.find("failure")
    assert failure is not None
    message = failure.get("message", "")
    assert "<script>alert(1)</script> & \"quotes\"" in message and "\\x1b[31mred" in message and "\\x00" in message
    assert "\nline two" in message  # attribute newlines survive as &#10;
    assert "</failure>" in (failure.text or "") and "***REDACTED***" in (failure.text or "")


def test_times_timestamp_and_truncation() -> None:
    local = timezone(timedelta(hours=8))
    results = make_results()
    results.started_at = datetime(2026, 11, 3, 17, 30, 5, tzinfo=local)
    big = CheckResult(step=3, id="ops.rmsnorm", kind="ops.op", status=Status.FAIL, message="off",
                      details={"worst": ["x" * 100] * 1000}, duration_s=1.23456)
    results.checks = [c for c in results.checks if c.step != 3] + [big]
    root = ET.fromstring(junit_xml(results))
    suites = root.findall("testsuite")
    assert {s.get("timestamp") for s in suites} == {"2026-11-03T09:30:05"}  # UTC, no zone (Ant's form)
    for suite in suites:
        case_times = [float(c.get("time", "nan")) for c in suite.findall("testcase")]
        assert float(suite.get("time", "nan")) == pytest.approx(sum(case_times), abs=5e-4 * len(case_times))
    assert float(root.get("time", "nan")) == pytest.approx(sum(c.duration_s for c in results.checks), abs=0.01)
    body = root.find(".//testcase[@name='ops.rmsnorm']/failure")
    assert body is not None and body.text is not None
    assert len(body.text) < MAX_BODY_CHARS + 100 and body.text.endswith("(truncated; see results.json)")
    assert root.find(".//testcase[@name='ops.rmsnorm']").get("time") == "1.235"  # type: ignore[union-attr]
    names = [c.get("name", "") for c in root.iter("testcase")]
    for planned in PLANNED:  # each planned check appears, as itself or as its expanded results
        assert any(n == planned.id or n.startswith(planned.id + ".") for n in names), planned.id


def test_unwritable_junit_path_is_a_one_line_usage_error(produced: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "is_a_dir"
    target.mkdir()
    done = run_cli(["grade", str(produced["results"]), "--junit", str(target)])
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("adaptcheck: error: ")]
    assert len(lines) == 1 and f"cannot write JUnit XML to {target}" in lines[0]
    assert not list(target.iterdir())  # no temporary file left behind
