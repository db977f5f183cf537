"""Smoke test of benchmarks/family_quant_ops.py on its smallest check and one seed: the healthy
kernels pass, the planted block-scale defects fail, and the table says so."""

from __future__ import annotations

import pytest

from tests.benchmarks import load_script


def test_one_seed_of_the_block_fp8_check(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("family_quant_ops")
    assert bench.main(["--seeds", "1", "--checks", "ops.block_fp8_gemm"]) == 0
    out = capsys.readouterr().out
    assert "healthy block_fp8_gemm" in out and "planted block_fp8_scales_transposed" in out
    assert "fail fail fail" in out and out.rstrip().endswith("0 unexpected result(s)")
