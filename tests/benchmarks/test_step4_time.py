"""Smoke test of benchmarks/step4_time.py without running step 4 (minutes per side): the
baseline export is importable and really imported by the child, an unknown revision is a
usage error, and the table reads step-4 seconds from results files and computes the growth.

The whole measurement (`python benchmarks/step4_time.py`) is run by hand; its figure is the
one issue 13's "Done means" quotes.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step4_time.py"


def _load() -> ModuleType:
    return load_script("step4_time")


def _results(path: Path, durations: dict[str, float], *, generation: float | None = None) -> Path:
    checks = [{"step": 3, "id": "ops.gemm.bf16", "status": "pass", "duration_s": 99.0, "metrics": {}}]
    for i, (cid, s) in enumerate(durations.items()):
        metrics = {"model_generation_s": generation} if generation is not None and i == 0 else {}
        checks.append({"step": 4, "id": cid, "status": "pass" if i else "fail", "duration_s": s, "metrics": metrics})
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps({"checks": checks}), encoding="utf-8")
    return path / "results.json"


def test_table_medians_total_and_growth(tmp_path: Path) -> None:
    m = _load()
    base = m.Side(name="base", tree=tmp_path)
    cur = m.Side(name="current", tree=tmp_path)
    for i, (a, b) in enumerate([(10.0, 2.0), (12.0, 2.0), (11.0, 2.0)]):
        base.runs.append(m.read_run(_results(tmp_path / f"b{i}", {"fw.load": a, "fw.ref": b}), 20.0, 0))
    cur.runs.append(m.read_run(_results(tmp_path / "c", {"fw.load": 11.0, "fw.ref": 4.5, "fw.new": 1.0},
                                        generation=3.0), 25.0, 1))
    assert base.median("fw.load") == 11.0 and base.median(m.TOTAL) == 13.0  # step 3's 99 s is not step 4
    out = io.StringIO()
    total = m.print_table(base, cur, out)
    assert total == pytest.approx(100.0 * (16.5 - 13.0) / 13.0)
    text = out.getvalue()
    assert "fw.ref" in text and "+125.0%" in text  # 2.0 → 4.5
    assert "fw.new" in text and "—" in text  # only in the current run: no growth figure
    assert "model generated in 3.0 s" in text and "exited 1" in text and "not passing: fw.load=fail" in text


def test_unknown_revision_is_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--baseline-rev", "no-such-rev-0000", "--keep", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "unknown revision 'no-such-rev-0000'" in proc.stderr


def test_exported_tree_is_what_the_child_imports(tmp_path: Path) -> None:
    m = _load()
    head = subprocess.run(["git", "-C", str(m.REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    sha = m.export_revision("HEAD", tmp_path / "tree")
    assert sha == head.stdout.strip() and (tmp_path / "tree" / "adaptcheck" / "__init__.py").is_file()
    m.check_imports_from(tmp_path / "tree")  # raises when the editable install would win
    with pytest.raises(m.UsageProblem, match="does not import from"):
        m.check_imports_from(tmp_path / "empty")
