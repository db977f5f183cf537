"""Smoke test of benchmarks/family_quant_ops.py on one small block-fp8 case and one seed (the
ladder's cases are the benchmark's own business): the healthy kernels pass, the planted
block-scale defects fail, and the table says so."""

from __future__ import annotations

from typing import Any

import pytest

from tests.benchmarks import load_script

TINY: dict[str, Any] = {"op": "block_fp8_gemm", "dtypes": ["fp32", "bf16", "fp16"],
                        "cases": [{"name": "tiny", "m": 4, "n": 384, "k": 256}]}


def test_one_seed_of_a_small_block_fp8_check(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load_script("family_quant_ops")
    monkeypatch.setattr(bench, "ladder_params", lambda check_id: TINY)
    assert bench.main(["--seeds", "1", "--checks", "ops.block_fp8_gemm"]) == 0
    out = capsys.readouterr().out
    assert "healthy block_fp8_gemm" in out and "planted block_fp8_scales_transposed" in out
    assert "fail fail fail" in out and out.rstrip().endswith("0 unexpected result(s)")
