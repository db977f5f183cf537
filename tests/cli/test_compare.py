"""``adaptcheck compare`` and ``adaptcheck run --baseline`` as a user meets them: real processes,
exit codes (0 no regression, 1 regressions, 2 bad option, 3 unreadable file), one-line errors,
the JSON document on stdout, the HTML page, and the perf.regression check in a real run."""

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
)
from tests.conftest import run_cli

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


def test_same_machine_rerun_exits_0_with_json_and_html(tmp_path: Path) -> None:
    html = tmp_path / "compare.html"
    done = run_cli(["compare", str(BASELINE), str(RERUN), "--format", "json", "--html", str(html)])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["regressions"] == [] and data["comparable"] is True
    assert data["counts"]["perf_compared"] >= 40
    assert "no regression" in done.stderr and "ladder sha256" in done.stderr  # the human tables
    assert 'id="compare"' in html.read_text(encoding="utf-8")


def test_planted_regressions_exit_1_and_are_listed(tmp_path: Path) -> None:
    _, rerun = load_pair()
    scale_row_time(gemm_row(rerun), 2.0)
    check(rerun, "ops.gemm.bf16").metrics["ratio_to_tolerance"] *= 3
    planted = tmp_path / "planted.json"
    planted.write_text(rerun.model_dump_json())
    done = run_cli(["compare", str(BASELINE), str(planted), "--format", "json"])
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)  # the document is still printed for CI to keep
    assert {(r["category"], r["check_id"]) for r in data["regressions"]} == {
        ("performance", "perf.gemm"), ("numeric", "ops.gemm.bf16")}
    assert _error_line(done.stderr) == ("adaptcheck: error: 2 regression(s) of run 20261129-215455-cpu-942bc1 "
                                        "against baseline 20261129-213300-cpu-3b2105")
    # A looser policy from the command line: 7 × the row's 19.7 % spread (138 %) covers the
    # planted row, now 2.24 × the baseline's time.
    done = run_cli(["compare", str(BASELINE), str(planted), "--format", "json", "--noise-multiplier", "7"])
    assert [r["category"] for r in json.loads(done.stdout)["regressions"]] == ["numeric"]


def test_unreadable_files_and_bad_options(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args, code, words in [
        (["compare", str(tmp_path / "missing.json"), str(RERUN)], 3, "no such results file"),
        (["compare", str(BASELINE), str(bad)], 3, "not a readable JSON file"),
        (["compare", str(BASELINE), str(RERUN), "--noise-multiplier", "0"], 2, "--noise-multiplier"),
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


def test_a_baseline_from_before_digests_is_accepted() -> None:
    """Schema 1.0 files carry no digest: nothing proves them intact, but nothing proves them
    edited either; they stay usable as baselines (the comparison names the run it used)."""
    from adaptcheck.integrity import Integrity, verify_file
    from adaptcheck.session import _baseline_text

    assert verify_file(BASELINE).status is Integrity.NO_DIGEST
    assert _baseline_text(BASELINE) == BASELINE.read_text(encoding="utf-8")
