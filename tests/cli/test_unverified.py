"""Integrity wherever a results file is trusted (issue 12): ``grade``, ``report``, ``compare``,
``matrix merge``/``export-known-good`` and ``run --baseline`` refuse a file edited after its run
or carrying no digest (exit 5, one line naming the file and the way out) unless
``--allow-unverified``, which lets it through and marks every output built from it.

Files are built with the report tests' factory and sealed by :meth:`RunResults.save`, so each
test states exactly how its input differs from what a run writes.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from adaptcheck.base.schemas.results import RunResults
from adaptcheck.fleet import merge_results
from tests.compare.helpers import BASELINE, RERUN, write_sealed
from tests.conftest import run_cli
from tests.report.factory import make_results

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

VARIANTS = ["edited", "no_digest"]
MARKS = {"edited": "edited after the run", "no_digest": "no digest"}


def _intact(path: Path, **overrides: Any) -> Path:
    """A results file as a run writes it (sealed with its digest)."""
    results = make_results()
    for key, value in overrides.items():
        setattr(results, key, value)
    path.parent.mkdir(parents=True, exist_ok=True)
    results.save(path)
    return path


def _spoil(src: Path, dest: Path, variant: str) -> Path:
    """``src`` hand-edited (a failing check flipped to pass: the forger's edit) or with its
    digest removed (what a schema-1.0 file, or someone covering an edit, looks like)."""
    data = json.loads(src.read_text(encoding="utf-8"))
    if variant == "edited":
        failing = next(c for c in data["checks"] if c["status"] == "fail")
        failing["status"], failing["message"] = "pass", ""
    else:
        del data["digest"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return dest


def _lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def _refused(done: Any, path: Path, variant: str) -> None:
    """Exit 5 with exactly one line: the file, what is wrong with it, and the way out."""
    assert done.returncode == 5, done.stderr
    lines = _lines(done.stderr)
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("adaptcheck: error: ") and str(path) in line, line
    assert ("edited after the run" if variant == "edited" else "carries no digest") in line, line
    assert "--allow-unverified" in line, line
    assert done.stdout == ""


@pytest.mark.parametrize("variant", VARIANTS)
def test_grade_refuses_then_marks_with_allow_unverified(tmp_path: Path, variant: str) -> None:
    intact = _intact(tmp_path / "intact.json")
    spoiled = _spoil(intact, tmp_path / f"{variant}.json", variant)
    # CI gating on L1 must not certify the file: before issue 12 this exited 0 with a note.
    _refused(run_cli(["grade", str(spoiled), "--require", "L1"]), spoiled, variant)

    junit = tmp_path / "junit.xml"
    done = run_cli(["grade", str(spoiled), "--require", "L1", "--format", "json", "--allow-unverified",
                    "--junit", str(junit)])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["verified"], data["integrity"], data["unverified_reason"]) == (False, variant, MARKS[variant])
    assert f"UNVERIFIED ({MARKS[variant]})" in done.stderr
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert props["adaptcheck.verified"] == "false" and props["adaptcheck.unverified"] == MARKS[variant]
    grade_out = next(c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == "grade")
    assert "UNVERIFIED" in (grade_out.findtext("system-out") or "")

    # The intact file: verified, nothing marked.
    done = run_cli(["grade", str(intact), "--require", "L1", "--format", "json", "--junit", str(junit)])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verified"] is True and "UNVERIFIED" not in done.stderr
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert props["adaptcheck.verified"] == "true" and "adaptcheck.unverified" not in props


@pytest.mark.parametrize("variant", VARIANTS)
def test_report_refuses_then_shows_the_banner(tmp_path: Path, variant: str) -> None:
    intact = _intact(tmp_path / "intact.json")
    spoiled = _spoil(intact, tmp_path / f"{variant}.json", variant)
    page = tmp_path / "report.html"
    _refused(run_cli(["report", str(spoiled), "-o", str(page)]), spoiled, variant)
    assert not page.exists()

    done = run_cli(["report", str(spoiled), "-o", str(page), "--allow-unverified"])
    assert done.returncode == 0, done.stderr
    html = page.read_text(encoding="utf-8")
    banner = f"UNVERIFIED: {MARKS[variant]}."
    # Once at the top of the page and once at the digest, where a reader checks it.
    assert html.count(banner) == 2, html[:2000]
    digest_row = html[html.index('id="reproduce"'):]
    assert banner in digest_row

    done = run_cli(["report", str(intact), "-o", str(page)])
    assert done.returncode == 0, done.stderr
    assert "UNVERIFIED" not in page.read_text(encoding="utf-8")


@pytest.mark.parametrize("variant", VARIANTS)
def test_compare_refuses_either_side_then_says_which_is_unverified(tmp_path: Path, variant: str) -> None:
    baseline = write_sealed(BASELINE, tmp_path / "baseline.json")
    rerun = write_sealed(RERUN, tmp_path / "rerun.json")
    spoiled = _spoil(rerun, tmp_path / f"{variant}.json", variant)
    _refused(run_cli(["compare", str(baseline), str(spoiled)]), spoiled, variant)
    _refused(run_cli(["compare", str(spoiled), str(baseline)]), spoiled, variant)

    html = tmp_path / "compare.html"
    done = run_cli(["compare", str(baseline), str(spoiled), "--allow-unverified", "--format", "json",
                    "--html", str(html)])
    assert done.returncode in (0, 1), done.stderr  # the forged pass may change the verdict, not the exit path
    data = json.loads(done.stdout)
    assert data["baseline"]["verified"] is True and data["baseline"]["integrity"] == "intact"
    assert (data["new"]["verified"], data["new"]["integrity"], data["new"]["unverified_reason"]) == (
        False, variant, MARKS[variant])
    assert data["verdict"].startswith(f"UNVERIFIED new ({MARKS[variant]}): ")
    assert f"UNVERIFIED new ({MARKS[variant]})" in done.stderr
    page = html.read_text(encoding="utf-8")
    assert f"UNVERIFIED:</strong> new ({MARKS[variant]})" in page
    assert f"UNVERIFIED: {MARKS[variant]}" in page  # on the new run's line of the runs table


def _merge_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An intact run, a hand-edited copy of it (same run id), and an intact run of another node."""
    intact = _intact(tmp_path / "node-a" / "results.json")
    edited = _spoil(intact, tmp_path / "copy" / "results.json", "edited")
    other = _intact(tmp_path / "node-b" / "results.json", run_id="20261104-093000-node-b")
    return intact, edited, other


def test_merge_skips_edited_files_and_exits_5(tmp_path: Path) -> None:
    intact, edited, other = _merge_inputs(tmp_path)
    out = tmp_path / "matrix.json"
    # Edited copy first: the intact copy is still the one merged, whatever the order.
    done = run_cli(["matrix", "merge", str(edited), str(intact), str(other), "-o", str(out), "--format", "json"])
    assert done.returncode == 5, done.stderr
    assert _lines(done.stderr)[-1].startswith("adaptcheck: error: 1 input(s) edited after their run")
    assert str(edited) in _lines(done.stderr)[-1] and "--allow-unverified" in _lines(done.stderr)[-1]
    matrix = json.loads(out.read_text())  # the good inputs are merged and written all the same
    assert matrix["merged_runs"] == 2
    assert [(s["path"], s["unverified"]) for s in matrix["skipped"]] == [(str(edited), True)]
    assert "edited after the run" in matrix["skipped"][0]["reason"]
    runs = [r for row in matrix["rows"] for r in row["runs"]]
    assert {r["path"] for r in runs} == {str(intact), str(other)} and all(r["verified"] for r in runs)

    # Nothing but the edited file: still exit 5 (not 3): the reason is its integrity.
    done = run_cli(["matrix", "merge", str(edited)])
    assert done.returncode == 5, done.stderr


def test_merge_allow_unverified_prefers_the_intact_duplicate_and_marks_the_rest(tmp_path: Path) -> None:
    intact, edited, other = _merge_inputs(tmp_path)
    # Library: the duplicate run id keeps the intact copy and names the edited one.
    matrix = merge_results([edited, intact, other], allow_unverified=True)
    assert matrix.merged_runs == 2
    [skip] = matrix.skipped
    assert skip.path == str(edited) and not skip.unverified
    assert "edited after the run" in skip.reason and f"the intact copy {intact} was merged instead" in skip.reason
    assert all(r.verified for row in matrix.rows for r in row.runs)

    # An edited file of its own run is merged when allowed, and marked on the run and the row.
    lone = _spoil(other, tmp_path / "lone" / "results.json", "edited")
    data = json.loads(lone.read_text())
    data["run_id"] = "20261105-093000-node-c"
    lone.write_text(json.dumps(data))
    html = tmp_path / "matrix.html"
    done = run_cli(["matrix", "merge", str(intact), str(lone), "--allow-unverified", "-o", str(html),
                    "--format", "json"])
    assert done.returncode == 0, done.stderr
    matrix_data = json.loads(done.stdout)
    [row] = matrix_data["rows"]
    by_id = {r["run_id"]: r for r in row["runs"]}
    assert by_id["20261105-093000-node-c"]["verified"] is False and by_id[RunResults.load(intact).run_id]["verified"]
    assert row["verified"] is False
    assert "UNVERIFIED run 20261105-093000-node-c" in done.stderr
    page = html.read_text(encoding="utf-8")
    assert "UNVERIFIED run(s) merged" in page and "UNVERIFIED: file edited after the run" in page


def test_export_known_good_refuses_edited_inputs(tmp_path: Path) -> None:
    intact = _intact(tmp_path / "a" / "results.json")
    edited = _spoil(intact, tmp_path / "b" / "results.json", "edited")
    done = run_cli(["matrix", "export-known-good", str(edited), "-o", str(tmp_path / "kg.yaml")])
    assert done.returncode == 5, done.stderr
    assert not (tmp_path / "kg.yaml").exists()


@pytest.mark.parametrize("variant", VARIANTS)
def test_run_baseline_refused_before_anything_runs(tmp_path: Path, variant: str) -> None:
    spoiled = _spoil(write_sealed(RERUN, tmp_path / "rerun.json"), tmp_path / f"{variant}.json", variant)
    out = tmp_path / "run"
    done = run_cli(["run", "--ladder", "quick", "--device", "cpu", "--steps", "1", "--out", str(out),
                    "--baseline", str(spoiled)])
    _refused(done, spoiled, variant)
    assert "--baseline" in done.stderr
    assert not out.exists()


@pytest.mark.slow
def test_run_baseline_allowed_unverified_is_marked_in_the_evidence(tmp_path: Path, write_ladder: Any) -> None:
    ladder = write_ladder([
        {"id": "matrix.capture", "step": 1, "kind": "matrix.capture"},
        {"id": "smoke.device_visible", "step": 2, "kind": "smoke.device_visible"},
        {"id": "perf.regression", "step": 5, "kind": "perf.regression", "params": {"require_perf": False}},
    ])
    first = tmp_path / "first"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(first), "--quiet"])
    assert done.returncode == 0, done.stderr
    undigested = _spoil(first / "results.json", tmp_path / "undigested.json", "no_digest")
    second = tmp_path / "second"
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(second), "--format", "json",
                    "--baseline", str(undigested), "--allow-unverified"])
    assert done.returncode == 0, done.stderr
    reg = next(c for c in json.loads(done.stdout)["checks"] if c["id"] == "perf.regression")
    assert reg["message"].startswith("UNVERIFIED baseline (no digest): "), reg["message"]
    assert reg["details"]["baseline"]["verified"] is False and reg["metrics"]["baseline_verified"] == 0


def test_load_verified_is_the_one_rule(tmp_path: Path) -> None:
    """The library function every command uses: intact passes, the rest raise unless allowed."""
    from adaptcheck.base.errors import IntegrityError, InvalidInputError
    from adaptcheck.base.trusted import load_verified

    intact = _intact(tmp_path / "intact.json")
    results, verdict = load_verified(intact, allow_unverified=False)
    assert verdict.intact and results.run_id == make_results().run_id
    for variant in VARIANTS:
        spoiled = _spoil(intact, tmp_path / f"{variant}.json", variant)
        with pytest.raises(IntegrityError):
            load_verified(spoiled, allow_unverified=False)
        _, verdict = load_verified(spoiled, allow_unverified=True)
        assert verdict.unverified_reason == MARKS[variant]
    with pytest.raises(InvalidInputError):  # unreadable stays exit 3, allowed or not
        load_verified(tmp_path / "missing.json", allow_unverified=True)

