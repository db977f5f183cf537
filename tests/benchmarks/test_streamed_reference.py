"""Smoke test of benchmarks/streamed_reference.py: a real run on the embedded tiny model (both
sides in their own processes, ~10 s) prints the figures and exits 0 (the streamed numbers equal
the in-memory ones); the difference it holds to 1e-9 sees a changed figure or top-K token.

Timings are not asserted. The full measurement on SmolLM2-135M (`python
benchmarks/streamed_reference.py`) is run by hand; its figures are in docs/reference-at-scale.md.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.benchmarks import load_script


def test_a_run_on_the_tiny_model_prints_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    rc = load_script("streamed_reference").main(["--model", "embedded:tiny-llama", "--budget", "12M", "--tokens", "3",
                                                 "--seq-len", "24"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "in memory  in_memory  fp64" in text and "streamed   streamed   fp64" in text
    assert "per layer load:" in text and "max relative difference 0 " in text and "greedy tokens identical" in text


def _side(logprobs: list[float], top: list[list[tuple[int, float]]]) -> dict[str, Any]:
    return {"token_logprobs": logprobs, "top": top}


def test_the_difference_sees_a_figure_and_a_token() -> None:
    bench = load_script("streamed_reference")
    a = _side([-1.0, -2.0], [[(1, -1.0), (2, -3.0)]])
    assert bench.max_rel_diff(a, a) == 0.0
    assert bench.max_rel_diff(a, _side([-1.0, -2.000002], [[(1, -1.0), (2, -3.0)]])) == pytest.approx(1e-6)
    assert math.isinf(bench.max_rel_diff(a, _side([-1.0, -2.0], [[(1, -1.0), (3, -3.0)]])))
