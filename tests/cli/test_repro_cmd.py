"""``adaptcheck repro RESULTS CHECK_ID``: the run's script, or one written from results.json.

One real run (step 3 only) with a planted provider: ``silu`` is wrong (its check fails and the
run writes the reproducer), ``gelu`` is torch's own (its check passes and has none until
``adaptcheck repro`` writes it). Scripts run isolated, adaptcheck blocked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptcheck.base.errors import ExitCode
from tests.conftest import ladder_text, run_cli
from tests.repro.standalone import run_standalone

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

REPO = Path(__file__).resolve().parents[2]
CHECKS = [
    {"id": "ops.silu", "step": 3, "kind": "ops.op",
     "params": {"op": "silu", "dtypes": ["fp32"], "cases": [{"name": "rows", "tokens": 4, "width": 32}]}},
    {"id": "ops.gelu", "step": 3, "kind": "ops.op",
     "params": {"op": "gelu", "dtypes": ["fp32"], "cases": [{"name": "rows", "tokens": 4, "width": 32}]}},
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("repro-run")
    ladder = tmp / "ladder.yaml"
    ladder.write_text(ladder_text(CHECKS))
    done = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(tmp / "run"),
                    "--ops", "tests.repro.planted_ops:PLANTED", "--format", "json"], cwd=REPO)
    assert done.returncode == 0, done.stderr
    statuses = {c["id"]: c["status"] for c in json.loads(done.stdout)["checks"]}
    assert statuses == {"ops.silu.fp32": "fail", "ops.gelu.fp32": "pass"}
    (results,) = (tmp / "run").rglob("results.json")
    return results.parent


def test_prints_the_script_the_run_wrote(run_dir: Path) -> None:
    script = run_dir / "repro" / "ops.silu.fp32.py"
    assert script.is_file(), "the failing check must have written its reproducer during the run"
    before = script.stat().st_mtime_ns
    done = run_cli(["repro", str(run_dir), "ops.silu.fp32"], cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(script)
    assert script.stat().st_mtime_ns == before  # printed, not rewritten
    assert run_standalone(script).returncode == 1


def test_writes_a_script_for_a_passing_check_and_it_exits_0(run_dir: Path) -> None:
    script = run_dir / "repro" / "ops.gelu.fp32.py"
    assert not script.exists(), "a passing check writes no reproducer during the run"
    done = run_cli(["repro", str(run_dir / "results.json"), "ops.gelu.fp32"], cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(script)
    ran = run_standalone(script)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "PASS ops.gelu.fp32: 1 case within tolerance" in ran.stdout
    results = json.loads((run_dir / "results.json").read_text())
    (gelu,) = [c for c in results["checks"] if c["id"] == "ops.gelu.fp32"]
    ratio = gelu["details"]["cases"][0]["outputs"][0]["ratio"]
    assert f"ratio={ratio!r}" in ran.stdout  # the check's own figure


def test_unknown_check_is_one_line_with_a_suggestion(run_dir: Path) -> None:
    done = run_cli(["repro", str(run_dir), "ops.gelu.fp3"], cwd=REPO)
    assert done.returncode == ExitCode.USAGE
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "did you mean 'ops.gelu.fp32'" in lines[0]
    assert not (run_dir / "repro" / "ops.gelu.fp3.py").exists()


def test_edited_results_are_refused(run_dir: Path, tmp_path: Path) -> None:
    edited = tmp_path / "results.json"
    data = json.loads((run_dir / "results.json").read_text())
    data["checks"][0]["status"] = "pass"
    edited.write_text(json.dumps(data))
    done = run_cli(["repro", str(edited), "ops.silu.fp32"], cwd=REPO)
    assert done.returncode == ExitCode.INTEGRITY
    assert not (tmp_path / "repro").exists()
