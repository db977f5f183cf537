"""``adaptcheck verify`` and the CI face of ``adaptcheck grade``, as a pipeline meets them:
real runs, real files, real exit codes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ladder_text, run_cli

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

CHECKS = [
    {"id": "first", "step": 1, "kind": "dummy.pass"},
    {"id": "second", "step": 2, "kind": "dummy.fail"},
    {"id": "third", "step": 2, "kind": "dummy.raise"},
]
# Two unmet L2 conditions, so the grade has two blockers to print.
GRADE = """
grade:
  levels:
    - level: L1
      name: device usable
      conditions:
        - id: first
          description: the first check passes
          checks: [first]
    - level: L2
      name: model runs
      conditions:
        - id: second
          description: the second check passes
          checks: [second]
        - id: third
          description: the third check passes
          checks: [third]
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One real run: (run folder, the finished process with its --format json stdout)."""
    root = tmp_path_factory.mktemp("verify")
    ladder = root / "ladder.yaml"
    ladder.write_text(ladder_text(CHECKS, grade=GRADE))
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(root / "run"), "--format", "json"])
    assert done.returncode == 0, done.stderr
    return root / "run", done


@pytest.fixture
def results(run: tuple[Path, Any], tmp_path: Path) -> Path:
    """A private copy of the run's results.json, free to edit."""
    copy = tmp_path / "results.json"
    shutil.copy(run[0] / "results.json", copy)
    return copy


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("adaptcheck: error: "), stderr
    return lines[0]


def _edit(path: Path, change: Any, indent: int | None = 2) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=indent))


def _fail_to_pass(data: dict[str, Any]) -> None:
    second = next(c for c in data["checks"] if c["id"] == "second")
    assert second["status"] == "fail"
    second["status"] = "pass"


def test_intact_file_exits_0(results: Path) -> None:
    done = run_cli(["verify", str(results)])
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # table format: the verdict is for humans, on stderr
    digest = json.loads(results.read_text())["digest"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert "intact" in done.stderr and digest in done.stderr
    as_json = run_cli(["verify", str(results), "--format", "json"])
    assert as_json.returncode == 0
    data = json.loads(as_json.stdout)
    assert data["status"] == "intact" and data["stored"] == data["computed"] == digest


def test_edited_file_exits_5_with_one_line(results: Path) -> None:
    _edit(results, _fail_to_pass)
    done = run_cli(["verify", str(results)])
    assert done.returncode == 5
    assert "was edited after the run" in _one_error_line(done.stderr)
    as_json = run_cli(["verify", str(results), "--format", "yaml"])
    assert as_json.returncode == 5
    assert "status: edited" in as_json.stdout


def test_whitespace_only_reformat_still_verifies(results: Path) -> None:
    _edit(results, lambda data: None, indent=None)
    assert "\n" not in results.read_text()
    assert run_cli(["verify", str(results)]).returncode == 0


def test_no_digest_exits_5_and_unreadable_exits_3(results: Path, tmp_path: Path) -> None:
    _edit(results, lambda data: data.pop("digest"))
    done = run_cli(["verify", str(results)])
    assert done.returncode == 5 and "carries no digest" in _one_error_line(done.stderr)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    done = run_cli(["verify", str(garbage)])
    assert done.returncode == 3 and "not a readable JSON file" in _one_error_line(done.stderr)
    done = run_cli(["verify", str(tmp_path / "missing.json")])
    assert done.returncode == 3 and "no such results file" in _one_error_line(done.stderr)


def test_run_json_on_stdout_is_the_sealed_file(run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    """``adaptcheck run -f json > r.json`` gives a file that verifies, like the one in the run folder."""
    run_dir, done = run
    assert json.loads(done.stdout) == json.loads((run_dir / "results.json").read_text())
    captured = tmp_path / "captured.json"
    captured.write_text(done.stdout)
    assert run_cli(["verify", str(captured)]).returncode == 0


def test_report_shows_the_digest_of_the_file(run: tuple[Path, Any], tmp_path: Path) -> None:
    run_dir, _ = run
    digest = json.loads((run_dir / "results.json").read_text())["digest"]
    html = (run_dir / "report.html").read_text()
    assert f'<code class="digest">{digest}</code>' in html
    assert "adaptcheck verify results.json" in html
    rerendered = tmp_path / "r.html"
    assert run_cli(["report", str(run_dir / "results.json"), "-o", str(rerendered)]).returncode == 0
    assert f'<code class="digest">{digest}</code>' in rerendered.read_text()


def test_grade_refuses_an_edited_file_unless_allowed(results: Path) -> None:
    # Issue 12: this used to grade with a note on stderr and exit 0 (CI certified a forged file).
    _edit(results, _fail_to_pass)
    done = run_cli(["grade", str(results), "--format", "json"])
    assert done.returncode == 5 and done.stdout == ""
    assert "was edited after the run" in done.stderr and "adaptcheck verify" in done.stderr
    done = run_cli(["grade", str(results), "--format", "json", "--allow-unverified"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["integrity"] == "edited" and json.loads(done.stdout)["verified"] is False
    assert "was edited after the run" in done.stderr


def test_grade_prints_each_blocker_on_its_own_line(results: Path) -> None:
    done = run_cli(["grade", str(results), "--require", "L2", "--format", "json"])
    assert done.returncode == 1
    data = json.loads(done.stdout)
    assert data["integrity"] == "intact" and len(data["blockers"]) == 2
    lines = done.stderr.splitlines()
    start = lines.index("Blockers for the next level:")
    shown = [line for line in lines[start + 1:] if line.startswith("  - ")]
    assert shown == ["  - " + b for b in data["blockers"]]
    assert any("second fail: failed on purpose" in b for b in shown)
    assert any("third error:" in b for b in shown)


def test_grade_help_documents_the_exit_codes() -> None:
    text = " ".join(run_cli(["grade", "--help"]).stdout.split())
    for line in ("0 the grade meets --require and every --require-feature / --require-family is certified",
                 "1 the grade is below --require, or a required feature or family is not certified (one line each)",
                 "2 usage error (e.g. --require L9, an unknown --require-feature or --require-family name)",
                 "3 the file is unreadable or not a valid results.json",
                 "5 the file was edited after its run or carries no digest"):
        assert line in text, line
    text = " ".join(run_cli(["verify", "--help"]).stdout.split())
    for line in ("0 intact", "3 the file is missing or not readable JSON", "5 edited after the run"):
        assert line in text, line


def test_a_multiline_blocker_still_prints_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from adaptcheck.cli.output import Output
    from adaptcheck.cli.render import print_grade
    from tests.report.factory import make_results

    results = make_results()
    results.grade.blockers = ["L2 ops: Required step-3 ops pass — ops.rmsnorm error: worker crashed:\n  SIGSEGV\n"]
    print_grade(Output(), results)
    lines = capsys.readouterr().err.splitlines()
    assert "  - L2 ops: Required step-3 ops pass — ops.rmsnorm error: worker crashed: SIGSEGV" in lines
    assert not any(line.strip() == "SIGSEGV" for line in lines)
