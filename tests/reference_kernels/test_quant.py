"""Quantization references against the fp8 format definition and hand-computed products."""

from __future__ import annotations

import numpy as np
import pytest

from reference_kernels.quant import (
    E4M3FN,
    E4M3FNUZ,
    fp8_quantize,
    fp8_scaled_gemm,
    grid_step,
    int8_w8a8_gemm,
    round_to_fp8,
    scaled_int8_quant,
)


def test_e4m3fn_grid_landmarks() -> None:
    # Largest finite 448 = 1.75 · 2^8, smallest normal 2^-6, smallest subnormal 2^-9.
    assert round_to_fp8(np.array([448.0, 2.0**-6, 2.0**-9]), E4M3FN).tolist() == [448.0, 2.0**-6, 2.0**-9]
    assert grid_step(np.array([1.0, 1.99, 256.0, 0.001]), E4M3FN).tolist() == [0.125, 0.125, 32.0, 2.0**-9]
    # 1.0625 is halfway between 1.0 (even mantissa 000) and 1.125 (odd 001): ties to even → 1.0.
    # 1.1875 is halfway between 1.125 (odd) and 1.25 (even 010) → 1.25.
    assert round_to_fp8(np.array([1.0625, 1.1875, -1.1875]), E4M3FN).tolist() == [1.0, 1.25, -1.25]
    # Subnormal ties: 2^-10 is halfway between 0 and 2^-9 → 0; 3·2^-10 → 2^-8 (even).
    assert round_to_fp8(np.array([2.0**-10, 3 * 2.0**-10]), E4M3FN).tolist() == [0.0, 2.0**-8]
    # Rounding up across a binade: 15.5 (halfway between 15 and 16) → 16.
    assert round_to_fp8(np.array([15.5, 15.4]), E4M3FN).tolist() == [16.0, 15.0]


def test_e4m3fnuz_grid_landmarks() -> None:
    assert round_to_fp8(np.array([240.0, 2.0**-7, 2.0**-10]), E4M3FNUZ).tolist() == [240.0, 2.0**-7, 2.0**-10]
    assert fp8_quantize(np.array([-1e-9]), np.array(1.0), "e4m3fnuz").tolist() == [0.0]
    assert np.signbit(fp8_quantize(np.array([-1e-9]), np.array(1.0), "e4m3fnuz")).tolist() == [False]


def test_fp8_quantize_clamps_and_scales() -> None:
    got = fp8_quantize(np.array([465.0, -1e6, 448.0, 0.0, 3.0]), np.array(1.0))
    assert got.tolist() == [448.0, -448.0, 448.0, 0.0, 3.0]
    assert fp8_quantize(np.array([6.0]), np.array(2.0)).tolist() == [3.0]  # divides by the scale
    assert fp8_quantize(np.array([1000.0]), np.array(1.0), "e4m3fnuz").tolist() == [240.0]
    with pytest.raises(ValueError):
        round_to_fp8(np.array([500.0]))


def test_fp8_scaled_gemm_hand_computed() -> None:
    a = np.array([[1.0, 2.0]])
    b = np.array([[3.0], [4.0]])
    assert fp8_scaled_gemm(a, b, np.array(0.5), np.array(0.25)).tolist() == [[11 * 0.125]]


def test_int8_gemm_exact_and_scaled_per_token_per_channel() -> None:
    k = 8192
    a = np.full((2, k), 127)
    b = np.full((k, 3), 127)
    sa = np.array([[1.0], [2.0]])
    sb = np.array([[1.0, 0.5, 0.25]])
    out = int8_w8a8_gemm(a, b, sa, sb)
    base = 127 * 127 * k  # 132 million: beyond int16 and fp16, exact in int64
    assert out.tolist() == [[base, base * 0.5, base * 0.25], [2 * base, base, base * 0.5]]


def test_scaled_int8_quant_static_and_dynamic() -> None:
    q, s = scaled_int8_quant(np.array([[0.5, 1.5, -2.5, 1000.0, -1000.0]]), np.array(1.0))
    assert q.tolist() == [[0, 2, -2, 127, -128]] and float(s) == 1.0
    q, s = scaled_int8_quant(np.array([[1.0, -2.54], [1.0, 0.25]]), None)
    assert s[:, 0].tolist() == pytest.approx([2.54 / 127, 1.0 / 127])
    assert q.tolist() == [[50, -127], [127, 32]]  # 0.25 · 127 = 31.75
