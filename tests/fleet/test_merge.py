"""merge_results on real runs: rows are combinations, grades are recomputed, bad inputs are named."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from adaptcheck.base.schemas.results import RunResults
from adaptcheck.fleet import merge_results
from adaptcheck.fleet.stack import key_versions

from .runs import FleetRuns, derive, fleet_runs_fixture  # noqa: F401 - a fixture

HOSTILE = '<script>alert("x")</script>'


def _later(path: Path, hours: int) -> str:
    return (RunResults.load(path).started_at + timedelta(hours=hours)).isoformat()


def test_rows_are_combinations_with_hosts_and_runs_grouped(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    # A second node of the same combination: the real file with another host name and run id.
    node_b = derive(fleet_runs.cpu_high_again, tmp_path / "node-b.json", run_id="node-b-run",
                    started_at=_later(fleet_runs.cpu_high_again, 1), **{"environment.hostname": "node-b"})
    matrix = merge_results([*fleet_runs.all, node_b])
    assert matrix.inputs == 5 and matrix.merged_runs == 5 and matrix.skipped == []
    by_backend = {r.key.backend: r for r in matrix.rows}
    assert sorted(by_backend) == ["cpu", "dummy"]  # hosts never split a row; backends do

    cpu = by_backend["cpu"]
    here = RunResults.load(fleet_runs.cpu_high).environment
    assert here is not None
    assert cpu.hosts == sorted({here.hostname, "node-b"})
    assert [r.run_id for r in cpu.runs][-1] == "node-b-run" and len(cpu.runs) == 4  # oldest first
    assert cpu.key.versions == key_versions(here)
    assert cpu.key.versions["torch"] == here.torch and cpu.key.versions["python"] == here.python
    assert "hostname" not in cpu.key.model_dump_json()
    assert (cpu.latest_run_id, cpu.latest_grade, cpu.best_grade) == ("node-b-run", "L4", "L4")
    assert [r.grade for r in cpu.runs] == ["L1", "L4", "L4", "L4"]
    assert cpu.latest_blockers and cpu.latest_blockers[0].startswith("L5 known_good")
    assert cpu.ladders == ["fleet-high 1", "fleet-low 1"]
    assert cpu.first_started == RunResults.load(fleet_runs.cpu_low).started_at
    assert cpu.known_good is True

    dummy = by_backend["dummy"]
    assert (dummy.key.device_count, dummy.latest_grade, dummy.known_good) == (2, "L0", False)
    assert dummy.latest_blockers[0].startswith("L1 visible")
    assert "below L4" in dummy.known_good_reason
    assert cpu.id != dummy.id and len({cpu.id, dummy.id}) == 2


def test_argument_order_does_not_change_the_matrix(fleet_runs: FleetRuns) -> None:
    forward = merge_results(fleet_runs.all)
    backward = merge_results(list(reversed(fleet_runs.all)))
    strip: Any = {"generated_at": True, "rows": {"__all__": {"runs": {"__all__": {"path"}}}}}
    assert forward.model_dump(exclude=strip) == backward.model_dump(exclude=strip)
    cpu = next(r for r in forward.rows if r.key.backend == "cpu")
    assert cpu.latest_run_id == RunResults.load(fleet_runs.cpu_high_again).run_id


def test_stored_grade_is_not_trusted(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    # Someone edits the low run's grade to L5 (and re-seals the digest, which anyone can):
    # its checks and rules still give L1.
    forged = derive(fleet_runs.cpu_low, tmp_path / "forged.json", run_id="forged",
                    **{"grade.level": "L5", "grade.name": "production sustainable", "grade.blockers": []})
    matrix = merge_results([forged, fleet_runs.cpu_high])
    cpu = matrix.rows[0]
    run = next(r for r in cpu.runs if r.run_id == "forged")
    assert (run.grade, run.stored_grade) == ("L1", "L5")
    assert cpu.best_grade == "L4"


def test_edited_file_is_skipped_unless_allowed_then_marked(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    # The same forgery without re-sealing: the digest the run wrote no longer matches.
    forged = derive(fleet_runs.cpu_low, tmp_path / "forged.json", seal=False, run_id="forged",
                    **{"grade.level": "L5", "grade.name": "production sustainable", "grade.blockers": []})
    matrix = merge_results([forged, fleet_runs.cpu_high])
    assert matrix.merged_runs == 1 and [s.path for s in matrix.skipped] == [str(forged)]
    assert matrix.skipped[0].unverified and "edited after the run" in matrix.skipped[0].reason
    assert matrix.rows[0].verified

    matrix = merge_results([forged, fleet_runs.cpu_high], allow_unverified=True)
    cpu = matrix.rows[0]
    run = next(r for r in cpu.runs if r.run_id == "forged")
    assert (run.grade, run.stored_grade, run.integrity, run.verified) == ("L1", "L5", "edited", False)
    assert cpu.verified is False and matrix.skipped == []


def test_latest_run_decides_known_good_not_the_best(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    # The combination regressed: its newest run (the low-rules file, restamped later) grades L1.
    newest = derive(fleet_runs.cpu_low, tmp_path / "newest.json", run_id="regressed",
                    started_at=_later(fleet_runs.cpu_high_again, 2))
    cpu = merge_results([fleet_runs.cpu_high, fleet_runs.cpu_high_again, newest]).rows[0]
    assert (cpu.best_grade, cpu.latest_grade, cpu.latest_run_id) == ("L4", "L1", "regressed")
    assert cpu.best_run_id == RunResults.load(fleet_runs.cpu_high_again).run_id  # latest of the best
    assert cpu.known_good is False and "regressed" in cpu.known_good_reason


def test_unusable_inputs_are_named_and_skipped(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{ not json")
    other_schema = derive(fleet_runs.cpu_high, tmp_path / "v9.json", schema_version="9.0", run_id="v9")
    incomplete = derive(fleet_runs.cpu_high, tmp_path / "partial.json", complete=False, finished_at=None,
                        run_id="partial")
    no_stack = derive(fleet_runs.cpu_high, tmp_path / "nostack.json", environment=None, run_id="nostack")
    run_meta = fleet_runs.cpu_high.parent / "run.json"  # a run's other JSON file, not its results
    inputs = [fleet_runs.cpu_high.parent,  # a run folder stands for its results.json
              garbage, other_schema, incomplete, no_stack, run_meta, tmp_path / "missing.json",
              fleet_runs.cpu_high, fleet_runs.dummy_high]
    matrix = merge_results(inputs)
    assert matrix.merged_runs == 2 and len(matrix.rows) == 2
    reasons = {s.path: s.reason for s in matrix.skipped}
    assert set(reasons) == {str(p) for p in inputs[1:8]}
    assert "not a readable JSON file" in reasons[str(garbage)]
    assert "schema version 9.0" in reasons[str(other_schema)]
    assert "incomplete run partial" in reasons[str(incomplete)] and "--resume" in reasons[str(incomplete)]
    assert "captured no environment" in reasons[str(no_stack)]
    assert "schema version" in reasons[str(run_meta)] or "invalid results file" in reasons[str(run_meta)]
    assert "no such results file" in reasons[str(tmp_path / "missing.json")]
    assert reasons[str(fleet_runs.cpu_high)].startswith("duplicate of run ")  # counted once
    assert all("\n" not in r for r in reasons.values())


def test_nothing_usable_gives_an_empty_matrix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    matrix = merge_results([bad])
    assert matrix.rows == [] and matrix.merged_runs == 0
    assert "JSON object" in matrix.skipped[0].reason


def test_device_name_is_part_of_the_key(fleet_runs: FleetRuns, tmp_path: Path) -> None:
    other = derive(fleet_runs.cpu_high, tmp_path / "other.json", run_id="other-device",
                   **{"device.device_name": HOSTILE, "environment.accelerators.0.name": HOSTILE})
    matrix = merge_results([fleet_runs.cpu_high, other])
    assert sorted(tuple(r.key.devices) != (HOSTILE,) for r in matrix.rows) == [False, True]
