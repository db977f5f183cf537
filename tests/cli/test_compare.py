"""``adaptcheck compare`` and ``adaptcheck run --baseline`` as a user meets them: real processes,
exit codes (0 no regression, 1 regressions, 2 bad option, 3 unreadable file), one-line errors,
the JSON document on stdout, the HTML page, and the perf.regression check in a real run.

The recorded pair (tests/compare/data) is schema 1.0, without digest, which compare refuses
(exit 5, tests/cli/test_unverified.py): these tests compare sealed copies of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.compare.helpers import (
    BASELINE,
    RERUN,
    check,
    gemm_row,
    load_pair,
    scale_row_time,
    write_sealed,
)
from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

SMALL_LADDER = [
    {"id": "matrix.capture", "step": 1, "kind": "matrix.capture"},
    {"id": "smoke.device_visible", "step": 2, "kind": "smoke.device_visible"},
    {"id": "perf.regression", "step": 5, "kind": "perf.regression"},
    {"id": "perf.regression.lenient", "step": 5, "kind": "perf.regression", "params": {"require_perf": False}},
]


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("adaptcheck: error: "), stderr
    return lines[-1]


@pytest.fixture(name="sealed")
def sealed_fixture(tmp_path: Path) -> tuple[Path, Path]:
    """(baseline, rerun): the recorded pair with valid digests."""
    return write_sealed(BASELINE, tmp_path / "sealed" / "baseline.json"), write_sealed(RERUN, tmp_path / "sealed" / "rerun.json")


def test_same_machine_rerun_exits_0_with_json_and_html(tmp_path: Path, sealed: tuple[Path, Path]) -> None:
    html = tmp_path / "compare.html"
    done = run_cli(["compare", str(sealed[0]), str(sealed[1]), "--format", "json", "--html", str(html)])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["regressions"] == [] and data["comparable"] is True
    assert data["counts"]["perf_compared"] >= 40
    assert "no regression" in done.stderr and "ladder sha256" in done.stderr  # the human tables
    assert 'id="compare"' in html.read_text(encoding="utf-8")


def test_planted_regressions_exit_1_and_are_listed(tmp_path: Path, sealed: tuple[Path, Path]) -> None:
    _, rerun = load_pair()
    scale_row_time(gemm_row(rerun), 2.0)
    check(rerun, "ops.gemm.bf16").metrics["ratio_to_tolerance"] *= 3
    planted = write_sealed(rerun, tmp_path / "planted.json")
    done = run_cli(["compare", str(sealed[0]), str(planted), "--format", "json"])
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)  # the document is still printed for CI to keep
    assert {(r["category"], r["check_id"]) for r in data["regressions"]} == {
        ("performance", "perf.gemm"), ("numeric", "ops.gemm.bf16")}
    assert _error_line(done.stderr) == ("adaptcheck: error: 2 regression(s) of run 20261129-215455-cpu-942bc1 "
                                        "against baseline 20261129-213300-cpu-3b2105")
    # A looser policy from the command line: 7 × the row's 19.7 % spread (138 %) covers the
    # planted row, now 2.24 × the baseline's time.
    done = run_cli(["compare", str(sealed[0]), str(planted), "--format", "json", "--noise-multiplier", "7"])
    assert [r["category"] for r in json.loads(done.stdout)["regressions"]] == ["numeric"]


def test_unreadable_files_and_bad_options(tmp_path: Path, sealed: tuple[Path, Path]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    baseline, rerun = map(str, sealed)
    for args, code, words in [
        (["compare", str(tmp_path / "missing.json"), rerun], 3, "no such results file"),
        (["compare", baseline, str(bad)], 3, "not a readable JSON file"),
        (["compare", baseline, rerun, "--noise-multiplier", "0"], 2, "--noise-multiplier"),
    ]:
        done = run_cli(args)
        assert done.returncode == code, (args, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and words in lines[0], done.stderr
        assert done.stdout == ""


def test_help_documents_the_exit_codes() -> None:
    done = run_cli(["compare", "--help"])
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "0 no regression, 1 regressions found" in text and "3 unreadable file" in text
    assert "5 a file edited after its run or without digest" in text


@pytest.mark.slow
def test_run_with_baseline_end_to_end(tmp_path: Path, write_ladder) -> None:
    ladder = write_ladder(SMALL_LADDER)
    first, second = tmp_path / "first", tmp_path / "second"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(first), "--format", "json"])
    assert done.returncode == 0, done.stderr
    by_id = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
    assert by_id["perf.regression"]["status"] == "skip"
    assert by_id["perf.regression"]["message"].startswith("no baseline: pass --baseline")

    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(second), "--format", "json",
                    "--baseline", str(first / "results.json")])
    assert done.returncode == 0, done.stderr
    by_id = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
    strict, lenient = by_id["perf.regression"], by_id["perf.regression.lenient"]
    # Steps 1-2 only: nothing to say about performance, so the default is not a pass ...
    assert strict["status"] == "skip" and "no performance figure" in strict["message"], strict["message"]
    # ... while require_perf: false passes on the matched checks (the second run's own
    # perf.regression results are not compared with the first's).
    assert lenient["status"] == "pass", lenient["message"]
    assert lenient["details"]["counts"]["checks_matched"] == 2 and lenient["details"]["regressions"] == []
    # The run folder is self-contained: a verbatim copy of the baseline, and where it came from.
    assert (second / "baseline.json").read_text() == (first / "results.json").read_text()
    assert json.loads((second / "run.json").read_text())["baseline"] == str(first / "results.json")
    report = (second / "report.html").read_text(encoding="utf-8")
    assert 'id="compare"' in report and "Regression comparison" in report

    # A baseline that is not a results file stops the run before anything runs or is written.
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    third = tmp_path / "third"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(third), "--baseline", str(bad)])
    assert done.returncode == 3
    assert "expected a JSON object" in _error_line(done.stderr) and len(done.stderr.strip().splitlines()) == 1
    assert not third.exists()

    # An edited baseline could hide a regression: refused with the integrity exit code, and
    # nothing runs. (The first run's file is intact: its digest was checked above by use.)
    edited_data = json.loads((first / "results.json").read_text())
    edited_data["checks"][0]["status"] = "pass" if edited_data["checks"][0]["status"] != "pass" else "fail"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(edited_data, indent=2))
    fourth = tmp_path / "fourth"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(fourth), "--baseline", str(edited)])
    assert done.returncode == 5, done.stderr
    line = _error_line(done.stderr)
    assert "--baseline" in line and "edited after the run" in line and "adaptcheck verify" in line, line
    assert not fourth.exists()


def test_a_baseline_from_before_digests_is_refused_unless_allowed() -> None:
    """Schema 1.0 files carry no digest: nothing proves them intact. Issue 12 changed this
    from "accepted" to "refused (exit 5) unless --allow-unverified": a baseline nobody vouches
    for could hide a regression. Allowed, the copy is verbatim (perf.regression then marks it)."""
    from adaptcheck.base.errors import IntegrityError
    from adaptcheck.base.integrity import Integrity, verify_file
    from adaptcheck.session import _baseline_text

    assert verify_file(BASELINE).status is Integrity.NO_DIGEST
    with pytest.raises(IntegrityError) as refused:
        _baseline_text(BASELINE)
    assert refused.value.message.startswith(f"--baseline: {BASELINE}: carries no digest")
    assert "--allow-unverified" in (refused.value.hint or "")
    assert _baseline_text(BASELINE, allow_unverified=True) == BASELINE.read_text(encoding="utf-8")


def test_grade_change_leads_with_the_checks_that_caused_it(tmp_path: Path, sealed: tuple[Path, Path]) -> None:
    """L3 → L2: the first thing printed is the grade change, then the check that lost L3
    (before issue 12 the grade was not mentioned and a status change hid under "Other
    differences"). One word for not-applicable: an n/a check that now fails reads "n/a → fail",
    as the report calls it, never "skip → fail"."""
    from adaptcheck.base.schemas.results import Status

    _, rerun = load_pair()
    lost = check(rerun, "framework.transformers.concurrent")
    lost.status, lost.message = Status.FAIL, "2 of 8 concurrent sequences differ from the reference"
    na = check(rerun, "matrix.rules.vllm_numpy")  # n/a in the baseline; L3 compatible_stack selects it
    assert na.status is Status.SKIP and not na.applicable
    na.status, na.applicable, na.message = Status.ERROR, True, "rule crashed"
    new = write_sealed(rerun, tmp_path / "new.json")
    html = tmp_path / "compare.html"

    done = run_cli(["compare", str(sealed[0]), str(new), "--html", str(html)])
    assert done.returncode == 1, done.stderr
    lines = _lines(done.stderr)
    assert lines[0] == "grade lowered: L3 (service usable) → L2 (model runs)"
    assert lines[1].strip() == "caused by:"
    assert lines[2].strip() == ("- L3 concurrent: framework.transformers.concurrent: pass → fail: "
                                "2 of 8 concurrent sequences differ from the reference")
    assert lines[3].strip() == "- L3 compatible_stack: matrix.rules.vllm_numpy: n/a → error: rule crashed"
    assert lines[4].startswith("baseline: ")  # everything else comes after
    assert "matrix.rules.vllm_numpy" in done.stderr and "Other status changes" in done.stderr
    assert "│ n/a " in done.stderr and "skip → error" not in done.stderr
    assert _error_line(done.stderr).startswith("adaptcheck: error: grade lowered L3 → L2; ")

    data = json.loads(run_cli(["compare", str(sealed[0]), str(new), "--format", "json"]).stdout)
    assert (data["grade"]["before"], data["grade"]["after"], data["grade"]["change"]) == ("L3", "L2", "lowered")
    assert [(c["level"], c["check_id"], c["before"], c["after"]) for c in data["grade"]["causes"]] == [
        ("L3", "framework.transformers.concurrent", "pass", "fail"), ("L3", "matrix.rules.vllm_numpy", "n/a", "error")]
    na_change = next(s for s in data["status_changes"] if s["check_id"] == "matrix.rules.vllm_numpy")
    assert (na_change["before_label"], na_change["after_label"], na_change["verdict"]) == ("n/a", "error", "changed")

    page = html.read_text(encoding="utf-8")
    grade_at = page.index("grade lowered: L3 (service usable) → L2 (model runs)")
    assert grade_at < page.index("<h3>Regressions</h3>")
    assert page.index("framework.transformers.concurrent") > grade_at
    assert "matrix.rules.vllm_numpy: n/a → error" in page and "skip → error" not in page

    # The other way round the grade was raised, by the same two checks (the recorded pair's
    # other differences still regress that way: exit 1, but not for the grade).
    done = run_cli(["compare", str(new), str(sealed[0]), "--format", "json"])
    assert done.returncode == 1, done.stderr
    assert _lines(done.stderr)[0] == "grade raised: L2 (model runs) → L3 (service usable)"
    assert "grade lowered" not in _error_line(done.stderr)
    raised = json.loads(done.stdout)["grade"]
    assert [(c["check_id"], c["before"], c["after"]) for c in raised["causes"]] == [
        ("framework.transformers.concurrent", "fail", "pass"), ("matrix.rules.vllm_numpy", "error", "n/a")]


def test_unchanged_grade_is_said_first_too(sealed: tuple[Path, Path]) -> None:
    done = run_cli(["compare", str(sealed[0]), str(sealed[1])])
    assert done.returncode == 0, done.stderr
    assert _lines(done.stderr)[0] == "grade unchanged: L3 (service usable)"


def _lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]
