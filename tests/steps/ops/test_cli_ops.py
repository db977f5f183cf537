"""Step 3 end to end: ``--ops module:object`` puts a vendor's kernels under test; L2 demands the model dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

REPO = Path(__file__).resolve().parents[3]

GEMM_LADDER = """
schema_version: 1
id: ops-test
version: "0"
model: {precision: bf16}
checks:
  - id: smoke.first
    step: 2
    kind: dummy.pass
  - id: ops.gemm
    step: 3
    kind: ops.op
    params:
      op: gemm
      dtypes: [fp32, bf16]
      cases:
        - {name: long_k, m: 8, n: 8, k: 4096, dist: positive}
grade:
  levels:
    - level: L1
      name: device usable
      conditions:
        - {id: smoke, description: smoke passes, steps: [2]}
    - level: L2
      name: model runs
      conditions:
        - {id: model_ops, description: ops at the model dtype, checks: ["ops.*.{precision}"]}
"""


def test_ops_override_runs_a_vendor_provider_and_the_grade_demands_the_model_dtype(tmp_path: Path) -> None:
    ladder = tmp_path / "l.yaml"
    ladder.write_text(GEMM_LADDER)
    good = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(tmp_path / "good"),
                    "--format", "json"], cwd=REPO)
    assert good.returncode == 0, good.stderr
    data = json.loads(good.stdout)
    assert {c["id"]: c["status"] for c in data["checks"] if c["step"] == 3} == {"ops.gemm.fp32": "pass",
                                                                                "ops.gemm.bf16": "pass"}
    assert data["grade"]["level"] == "L2"

    bad = run_cli(["run", "--ladder", str(ladder), "--device", "cpu", "--out", str(tmp_path / "bad"),
                   "--ops", "tests.steps.ops.wrong_provider:BROKEN_OPS", "--format", "json"], cwd=REPO)
    assert bad.returncode == 0, bad.stderr
    data = json.loads(bad.stdout)
    statuses = {c["id"]: c["status"] for c in data["checks"] if c["step"] == 3}
    assert statuses["ops.gemm.bf16"] == "fail"
    assert data["checks"][-1]["details"]["provider"] == "tests.steps.ops.wrong_provider:BROKEN_OPS"
    assert data["grade"]["level"] == "L1"
    assert any("ops.gemm.bf16 fail" in b for b in data["grade"]["blockers"])


def test_ops_override_that_cannot_load_is_a_one_line_usage_error(tmp_path: Path) -> None:
    done = run_cli(["run", "--ladder", "quick", "--device", "cpu", "--ops", "no_such_module:thing",
                    "--out", str(tmp_path / "x")], cwd=REPO)
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot load it" in lines[0]
