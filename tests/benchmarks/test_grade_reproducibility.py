"""Smoke test of benchmarks/grade_reproducibility.py in its tiny mode (two step-1 runs), and of
its verdict on results files: different grades, a missing results.json, or a quick run over the
time budget make it exit 1.

The real measurement (10 full quick runs, then standard runs with vLLM) is run by hand on a
quiet machine; its table is quoted in the closing note of issue 14.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks import load_script

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grade_reproducibility.py"


def _results(path: Path, level: str, blockers: list[str], checks: list[tuple[str, str, str]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    data = {"grade": {"level": level, "blockers": blockers},
            "checks": [{"id": i, "status": s, "message": m} for i, s, m in checks]}
    (path / "results.json").write_text(json.dumps(data), encoding="utf-8")
    return path / "results.json"


def test_two_tiny_runs_same_grade(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "2", "--steps", "1", "--device", "cpu",
                           "--keep", str(tmp_path)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "quick: 2 runs, grades L0 x2 — the same grade every time" in out
    assert "quick ladder wall time: median" in out and "budget 240 s)" in out
    assert (tmp_path / "quick-1" / "results.json").is_file() and (tmp_path / "quick-2" / "results.json").is_file()
    seeds = [json.loads((tmp_path / f"quick-{s}" / "results.json").read_text())["seed"] for s in (1, 2)]
    assert seeds == [1, 2]  # one seed per run, from --seed-start


def test_verdict_on_differing_grades_missing_results_and_budget(tmp_path: Path) -> None:
    m = load_script("grade_reproducibility")
    blocker = "L5 soak: the soak passes — perf.soak fail"
    a = m.read_run("quick", 1, 150.0, 0, _results(tmp_path / "a", "L4", [blocker], []))
    b = m.read_run("quick", 2, 140.0, 0, _results(tmp_path / "b", "L3", ["L4 serving: x — y"],
                                                   [("perf.serving.concurrent_short", "fail", "level 1:  spread\n63%")]))
    assert a.blockers == ["L5 soak"] and b.not_passing == ["perf.serving.concurrent_short=fail: level 1: spread 63%"]
    out = io.StringIO()
    assert m.report([a, b], 180.0, out) == 1
    text = out.getvalue()
    assert "grades L3 x1, L4 x1 — GRADES DIFFER" in text and "run 2: perf.serving.concurrent_short=fail" in text

    same = [a, m.read_run("quick", 2, 160.0, 0, _results(tmp_path / "c", "L4", [blocker], []))]
    assert m.report(same, 180.0, io.StringIO()) == 0
    slow = io.StringIO()
    assert m.report(same, 155.0, slow) == 1 and "worst 160 s (budget 155 s: OVER)" in slow.getvalue()
    assert m.report(same, 0, io.StringIO()) == 0  # no limit

    missing = m.read_run("standard", 1, 5.0, 70, tmp_path / "nothing" / "results.json")
    assert missing.grade is None
    text = io.StringIO()
    assert m.report([missing], 180.0, text) == 1  # a run without results is never "the same grade"
    assert "SOME RUNS WROTE NO RESULTS" in text.getvalue()
