"""Smoke test of benchmarks/harness_vs_torch_benchmark.py: it runs, prints both figures and the
difference, and turns a difference over the tolerance into exit code 1.

Timings are not asserted (they depend on the machine and its load): the verdict is forced
both ways with tolerances no measurement can miss (∞) or meet (-1).
"""

from __future__ import annotations

import io
from types import ModuleType

from tests.benchmarks import load_script

ARGS = ["--device", "cpu", "--shapes", "16x32x32:fp32", "--rounds", "1", "--budget", "0.01"]


def _load() -> ModuleType:
    return load_script("harness_vs_torch_benchmark")


def test_prints_both_figures_and_the_verdict() -> None:
    out = io.StringIO()
    rc = _load().main([*ARGS, "--tolerance", "inf"], out=out)
    text = out.getvalue()
    assert rc == 0, text
    assert "adaptcheck" in text and "torch.utils.benchmark" in text and "synchronize + perf_counter" in text
    row = next(line for line in text.splitlines() if line.startswith("16x32x32 fp32"))
    assert row.count("ms") >= 2 and "%" in row
    assert text.rstrip().splitlines()[-1].startswith("OK:")


def test_a_difference_over_the_tolerance_exits_1() -> None:
    out = io.StringIO()
    assert _load().main([*ARGS, "--tolerance", "-1"], out=out) == 1
    assert "FAIL:" in out.getvalue()


def test_shape_parsing() -> None:
    assert _load().parse_shapes("1x2x3:bf16, 4x5x6") == [(1, 2, 3, "bf16"), (4, 5, 6, "bf16")]
