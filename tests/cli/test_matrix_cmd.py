"""``adaptcheck matrix merge`` / ``export-known-good`` as a user runs them, on real runs of the tool,
and the loop they close: an exported entry makes the next run's matrix.known_good pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from adaptcheck.base.schemas.results import RunResults
from tests.conftest import run_cli
from tests.fleet.runs import FleetRuns, fleet_runs_fixture, run  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("adaptcheck: error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_merge_writes_html_json_yaml_and_prints_the_data(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    inputs = [str(p) for p in fleet_runs.all]
    for name in ("m.html", "m.json", "m.yaml"):
        done = run_cli(["matrix", "merge", *inputs, "-o", str(tmp_path / name), "--format", "json"])
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert [r["key"]["backend"] for r in data["rows"]] == ["cpu", "dummy"]
        assert f"matrix: {tmp_path / name}" in done.stderr and "fleet compatibility matrix" in done.stderr
    stored = json.loads((tmp_path / "m.json").read_text())
    assert stored["rows"] == data["rows"] and stored["schema_version"] == "1.0"
    assert yaml.safe_load((tmp_path / "m.yaml").read_text())["rows"] == data["rows"]
    page = (tmp_path / "m.html").read_text()
    assert page.startswith("<!doctype html>") and all(f'id="row-{r["id"]}"' in page for r in data["rows"])


def test_merge_names_bad_inputs_and_fails_only_when_nothing_merged(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    done = run_cli(["matrix", "merge", str(bad), str(fleet_runs.cpu_high), str(tmp_path / "gone.json")])
    assert done.returncode == 0, done.stderr
    assert f"skipped {bad}: not a readable JSON file" in done.stderr
    assert f"skipped {tmp_path / 'gone.json'}: no such results file" in done.stderr

    done = run_cli(["matrix", "merge", str(bad), str(tmp_path / "gone.json")])
    assert done.returncode == 3
    assert "nothing to merge: none of the 2 input(s)" in _error_line(done.stderr)
    assert f"skipped {bad}" in done.stderr  # the reasons come before the error


def test_merge_refuses_an_unknown_output_format_before_reading(tmp_path: Path) -> None:
    done = run_cli(["matrix", "merge", str(tmp_path / "gone.json"), "-o", str(tmp_path / "m.txt")])
    assert done.returncode == 2
    assert "unknown output format '.txt'" in _error_line(done.stderr)
    assert "skipped" not in done.stderr


def test_export_refuses_below_l4_with_exit_1_and_writes_nothing(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    out = tmp_path / "kg.yaml"
    done = run_cli(["matrix", "export-known-good", str(fleet_runs.dummy_high), "-o", str(out)])
    assert done.returncode == 1
    assert "L0, below L4" in done.stderr and "nothing written" in _error_line(done.stderr)
    assert not out.exists()


def test_exported_entry_makes_the_next_run_known_good(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    out = tmp_path / "known_good.local.yaml"
    done = run_cli(["matrix", "export-known-good", *map(str, fleet_runs.all), "-o", str(out), "--prefix", "ci",
                    "--format", "json"])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    [entry] = result["entries"]
    assert result["output"] == str(out) and len(result["refused"]) == 1  # the dummy (L0) combination
    assert "ADAPTCHECK_KNOWN_GOOD" in done.stderr

    # The same ladder (its known_good_file never matches) now reaches L5 through the site file.
    results_path = run(fleet_runs.high_ladder, tmp_path / "next", device="cpu", env={"ADAPTCHECK_KNOWN_GOOD": str(out)})
    results = RunResults.load(results_path)
    check = next(c for c in results.checks if c.id == "matrix.known_good")
    assert check.status.value == "pass", check.message
    assert check.details["entry"]["id"] == entry["id"] and check.details["entry_file"] == str(out)
    assert check.details["files"] == [str(fleet_runs.never_matches), str(out)]
    assert results.grade.level == "L5"
