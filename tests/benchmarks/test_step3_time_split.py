"""Smoke test of benchmarks/step3_time_split.py: it runs a one-op ladder and names what it measured.

Timings are not asserted: they depend on the machine. Only the table's shape is.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import ModuleType

from tests.benchmarks import load_script

LADDER = """\
schema_version: 1
id: bench-one-op
version: "0.1"
model:
  name: "embedded:tiny-llama"
  precision: fp32
checks:
  - id: ops.gemm
    step: 3
    kind: ops.op
    params:
      op: gemm
      dtypes: [fp32]
      budget_s: 2
      cases:
        - {name: tiny, m: 4, n: 5, k: 6}
grade:
  levels:
    - level: L1
      name: device usable
      conditions:
        - id: ops
          description: the op passes
          checks: [ops.gemm]
"""


def _load() -> ModuleType:
    return load_script("step3_time_split")


def test_table_names_the_columns_and_the_op(tmp_path: Path) -> None:
    ladder = tmp_path / "one-op.yaml"
    ladder.write_text(LADDER, encoding="utf-8")
    out = io.StringIO()
    rc = _load().main(["--ladder", str(ladder), "--device", "cpu"], out=out)
    text = out.getvalue()
    assert rc == 0, text
    header = next(line for line in text.splitlines() if line.startswith("op "))
    for column in ("wall", "reference", "device op", "inputs", "compare", "harness"):
        assert column in header
    rows = [line.split()[0] for line in text.splitlines()]
    assert "gemm" in rows and "total" in rows
    assert "%" in text and "total wall time:" in text and "1 pass" in text


def test_ladder_without_op_checks_says_so(tmp_path: Path) -> None:
    ladder = tmp_path / "no-ops.yaml"
    op_check = LADDER[LADDER.index("  - id: ops.gemm"):LADDER.index("grade:")]
    smoke = "  - id: smoke.device_visible\n    step: 2\n    kind: smoke.device_visible\n"
    text = LADDER.replace(op_check, smoke).replace("checks: [ops.gemm]", "checks: [smoke.device_visible]")
    ladder.write_text(text, encoding="utf-8")
    out = io.StringIO()
    assert _load().main(["--ladder", str(ladder), "--device", "cpu"], out=out) == 1
    assert "no step-3" in out.getvalue()
