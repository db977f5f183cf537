"""No terminal control reaches the terminal (issue 12): a results file, a plugin or a device can
carry text with escape sequences (``EPYC\\x1b]0;…\\x07\\x1b[2J`` retitles the window and clears
the screen). Every line printed to stderr goes through :func:`adaptcheck.base.terminal.terminal_safe`,
which shows each control as its escaped text; the stdout document stays valid JSON / YAML.

The hostile files are sealed with a valid digest (the digest is not a signature: anyone can
re-seal), so what is tested is the printing, not the integrity refusal.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from adaptcheck.base.schemas.results import CheckResult, Status
from adaptcheck.base.terminal import terminal_safe
from adaptcheck.cli.output import Output
from adaptcheck.grade import compute_grade
from tests.compare.helpers import BASELINE, check, load_pair, write_sealed
from tests.conftest import run_cli
from tests.report.factory import make_results

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

HOSTILE_DEVICE = "EPYC\x1b]0;owned\x07\x1b[2J\x9b31m"
HOSTILE_MESSAGE = "vLLM pins torch\r\x1b[1A\x1b[2Kall good\x07 \u202eevil"
# Any C0 control but newline and tab, DEL, any C1 control, and the bidi overrides.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _hostile_results(path: Path) -> Path:
    results = make_results(device_name=HOSTILE_DEVICE)
    # ops.rmsnorm blocks the next level: its message is printed as a blocker.
    next(c for c in results.checks if c.id == "ops.rmsnorm").message = HOSTILE_MESSAGE
    results.grade = compute_grade(results.grade_rules, results.planned, results.checks, results.steps, 1)
    results.save(path)  # sealed: a valid file whose content is hostile
    return path


def _assert_clean(text: str) -> None:
    found = CONTROL.findall(text)
    assert not found, f"control characters reached the terminal: {found!r}"


def test_terminal_safe_escapes_controls_and_keeps_layout() -> None:
    assert terminal_safe("EPYC\x1b]0;x\x07") == "EPYC\\x1b]0;x\\x07"
    assert terminal_safe("a\r\x9bb\x7f") == "a\\x0d\\x9bb\\x7f"
    assert terminal_safe("\u202eevil") == "\\u202eevil"
    assert terminal_safe("line 1\nline 2\tcol") == "line 1\nline 2\tcol"
    assert terminal_safe("line 1\nline 2", newlines=False) == "line 1\\x0aline 2"
    assert terminal_safe("ümlaut ✓ 中文") == "ümlaut ✓ 中文"  # printable text is untouched


def test_grade_prints_no_control_characters(tmp_path: Path) -> None:
    path = _hostile_results(tmp_path / "results.json")
    done = run_cli(["grade", str(path)])
    assert done.returncode == 0, done.stderr
    _assert_clean(done.stderr)
    # Visible, as escaped text: the reader sees what the file held.
    assert "EPYC\\x1b]0;owned\\x07\\x1b[2J\\x9b31m" in done.stderr
    assert "\\x1b[1A\\x1b[2Kall good\\x07 \\u202eevil" in done.stderr

    done = run_cli(["grade", str(path), "--format", "json"])
    _assert_clean(done.stdout + done.stderr)
    assert json.loads(done.stdout)["blockers"]  # still the document, controls escaped by JSON


def test_compare_prints_no_control_characters(tmp_path: Path) -> None:
    baseline = write_sealed(BASELINE, tmp_path / "baseline.json")
    _, rerun = load_pair()
    rerun.device.device_name = HOSTILE_DEVICE
    flipped = check(rerun, "framework.transformers.concurrent")
    flipped.status, flipped.message = Status.FAIL, HOSTILE_MESSAGE
    new = write_sealed(rerun, tmp_path / "new.json")
    done = run_cli(["compare", str(baseline), str(new)])
    assert done.returncode == 1, done.stderr
    _assert_clean(done.stderr)
    assert "\\x1b]0;owned\\x07" in done.stderr

    done = run_cli(["compare", str(baseline), str(new), "--format", "yaml"])
    _assert_clean(done.stdout + done.stderr)
    assert yaml.safe_load(done.stdout)["new"]["device_name"] == HOSTILE_DEVICE  # the data is kept, escaped


def test_error_line_naming_a_hostile_path_is_clean(tmp_path: Path) -> None:
    done = run_cli(["grade", str(tmp_path / "x\x1b[2J\x07.json")])
    assert done.returncode == 3
    _assert_clean(done.stderr)
    assert "x\\x1b[2J\\x07.json" in done.stderr


def _captured_output() -> tuple[Output, io.StringIO]:
    out = Output()
    buffer = io.StringIO()
    out.err = Console(file=buffer, force_terminal=False, width=200, highlight=False)
    return out, buffer


def test_table_cells_and_titles_are_made_safe() -> None:
    out, buffer = _captured_output()
    out.table("T\x1b[2J", ["col\x07"], [[HOSTILE_DEVICE], ["[bold]not markup[/]"]])
    text = buffer.getvalue()
    _assert_clean(text)
    assert "T\\x1b[2J" in text and "col\\x07" in text and "[bold]not markup[/]" in text


@pytest.mark.parametrize("quiet", [False, True])
def test_run_progress_lines_go_through_the_sanitiser(quiet: bool) -> None:
    from adaptcheck.base.schemas.ladder import CheckSpec
    from adaptcheck.cli.progress import RichProgress

    out, buffer = _captured_output()
    out.quiet = quiet
    progress = RichProgress(out)
    spec = CheckSpec(id="smoke.x", step=2, kind="smoke.device_visible")
    progress.planned([spec])
    progress.started(spec)
    progress.finished(spec, [CheckResult(step=2, id="smoke.x", kind="smoke.device_visible", status=Status.FAIL,
                                         message=HOSTILE_MESSAGE),
                             CheckResult(step=2, id="smoke.y", kind="smoke.device_visible", status=Status.SKIP,
                                         applicable=False, message="no streams [red]x[/]")])
    progress.stop()
    text = buffer.getvalue()
    _assert_clean(text)
    if quiet:
        assert text == ""
    else:
        assert " fail smoke.x" in text and "\\x1b[1A\\x1b[2Kall good\\x07" in text
        assert "  n/a smoke.y" in text and "no streams [red]x[/]" in text  # one word, and no markup injection
