"""``adaptcheck ladder show``: the resolved ladder, in process through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from adaptcheck.base.errors import ExitCode
from adaptcheck.cli.app import app, main
from adaptcheck.ladder.loader import load_ladder, parse_ladder

RUNNER = CliRunner()


def test_show_prints_what_a_run_would_store() -> None:
    done = RUNNER.invoke(app, ["ladder", "show", "quick"])
    assert done.exit_code == 0, done.output
    quick = load_ladder("quick")
    assert done.stdout == quick.text  # the run folder's ladder.yaml, byte for byte
    assert parse_ladder(done.stdout, "shown.yaml") == quick.spec
    assert "extends" not in yaml.safe_load(done.stdout)


def test_show_of_a_flat_ladder_is_its_own_text_with_the_grade_written_out() -> None:
    done = RUNNER.invoke(app, ["ladder", "show", "standard"])
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("# The `standard` ladder")  # its comments kept
    assert "include:" not in done.stdout.split("\ngrade:\n", 1)[1]


def test_show_json_is_the_resolved_mapping() -> None:
    done = RUNNER.invoke(app, ["ladder", "show", "quick", "--format", "json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert data["id"] == "quick" and len(data["checks"]) == 94  # 92 + the two long_context.deployed (add:)
    assert data["checks"] == json.loads(json.dumps(load_ladder("quick").data["checks"]))


def test_show_table_says_where_each_check_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    done = RUNNER.invoke(app, ["ladder", "show", "quick", "--format", "table"])
    assert done.exit_code == 0, done.output
    assert done.stdout == ""  # the table is for humans: stderr
    assert "quick extends standard" in done.stderr
    rows = {ln.split("│")[1].strip(): ln for ln in done.stderr.splitlines() if ln.count("│") > 4}
    assert "standard, quick" in rows["smoke.matmul"] and "quick" not in rows["matrix.capture"]


def test_show_a_ladder_file_that_extends_a_built_in(tmp_path: Path) -> None:
    child = tmp_path / "site.yaml"
    child.write_text("schema_version: 1\nextends: quick\nid: site\ndefaults: {timeout_s: 30}\n"
                     "checks:\n  perf.soak:\n    params: {duration_s: 3600, max_duration_s: 7200}\n")
    done = RUNNER.invoke(app, ["ladder", "show", str(child)])
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"# The ladder {child} extends quick extends standard, resolved")
    soak = next(c for c in yaml.safe_load(done.stdout)["checks"] if c["id"] == "perf.soak")
    assert soak["params"]["duration_s"] == 3600 and soak["params"]["looks"] == 6  # the rest is quick's


@pytest.mark.parametrize(("args", "code", "fragment"), [
    (["ladder", "show", "quik"], ExitCode.USAGE, "unknown ladder 'quik' (did you mean 'quick'?)"),
    (["ladder", "show", "bad.yaml"], ExitCode.INVALID_INPUT, "bad.yaml:5: checks: standard has no check "
                                                             "'smoke.matmull' (did you mean 'smoke.matmul'"),
])
def test_a_bad_ladder_is_one_line_and_its_exit_code(args: list[str], code: int, fragment: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("schema_version: 1\nextends: standard\nid: bad\n"
                                       "checks:\n  smoke.matmull: {params: {max_n: 64}}\n")
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == code
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("adaptcheck: error: ") and fragment in lines[0], lines
