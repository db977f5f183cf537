"""Smoke test of benchmarks/ladder_time.py on fabricated run folders (a real ladder takes minutes):
per-step and per-check seconds come from checks.jsonl, the notes say what a check's time bought,
two folders compare side by side, --max-total-s sets the exit status, a folder that is not a
run is a usage error.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.benchmarks import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ladder_time.py"


def _folder(path: Path, checks: list[dict[str, Any]], wall_s: float | None = None) -> Path:
    path.mkdir(parents=True)
    lines = [json.dumps({"spec_id": c.pop("spec_id", c["id"]), "results": [c]}) for c in checks]
    (path / "checks.jsonl").write_text("\n".join(lines) + "\n{torn", encoding="utf-8")  # a killed run's last line
    if wall_s is not None:
        (path / "results.json").write_text(json.dumps({
            "started_at": "2026-12-03T10:00:00Z", "finished_at": f"2026-12-03T10:0{int(wall_s // 60)}:{int(wall_s % 60):02d}Z",
            "grade": {"level": "L4"}, "model": {"name": "/tmp/models/smollm2"}}), encoding="utf-8")
    return path


def _checks(serving_s: float) -> list[dict[str, Any]]:
    return [
        {"id": "smoke.matmul", "step": 2, "kind": "smoke.matmul", "status": "pass", "duration_s": 1.5},
        {"id": "framework.vllm.load", "step": 4, "kind": "framework.load", "status": "pass", "duration_s": 40.0,
         "details": {"framework": {"name": "vllm", "loaded_by": "framework.vllm.load", "load_s": 38.2}}},
        {"id": "perf.serving.single_long", "step": 5, "kind": "perf.serving", "status": "pass",
         "duration_s": serving_s, "details": {"levels": [
             {"level": 1, "runs": [{"duration_s": 4.0}, {"duration_s": 5.0}, {"duration_s": 6.0}],
              "stability": {"runs": 3, "stop": "budget", "disturbed_runs": 1}}]}},
        {"id": "ops.gemm.fp32", "spec_id": "ops.gemm", "step": 3, "kind": "ops.op", "status": "pass", "duration_s": 2.0},
    ]


def test_one_run_per_step_top_checks_and_notes(tmp_path: Path) -> None:
    m = load_script("ladder_time")
    run = m.read_run(_folder(tmp_path / "a", _checks(30.0), wall_s=90.0))
    assert [c.id for c in run.checks] == ["smoke.matmul", "framework.vllm.load", "perf.serving.single_long", "ops.gemm"]
    assert run.checks_s == 73.5 and run.wall_s == 90.0 and run.grade == "L4"
    out = io.StringIO()
    m.print_single(run, 2, out)
    text = out.getvalue()
    assert "wall 90.0 s" in text and "outside the checks 16.5 s" in text
    assert "loaded vllm here in 38.2 s" in text
    assert "L1: 3 runs +1 disturbed (budget), 5.0 s measured/run" in text
    assert "smoke.matmul" not in text.split("top 2 checks")[1]  # only the two largest are listed


def test_two_runs_compare_and_the_exit_status(tmp_path: Path) -> None:
    before = _folder(tmp_path / "before", _checks(30.0), wall_s=90.0)
    after = _folder(tmp_path / "after", _checks(12.0), wall_s=70.0)
    m = load_script("ladder_time")
    out = io.StringIO()
    m.print_compare([m.read_run(before), m.read_run(after)], 10, out)
    text = out.getvalue()
    assert "-20.0" in text and "-18.0" in text  # wall and the serving check, last minus first
    proc = subprocess.run([sys.executable, str(SCRIPT), "--from", str(before), "--from", str(after),
                           "--max-total-s", "80"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "OVER: before took 90 s > 80 s" in proc.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--from", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and "no checks.jsonl" in bad.stderr
