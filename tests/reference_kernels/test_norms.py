"""Norm references against hand-computed rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reference_kernels.norms import fused_add_rms_norm, layer_norm, rms_norm


def test_rms_norm_hand_computed() -> None:
    # mean(x²) = (9 + 16) / 2 = 12.5 → x / √(12.5 + 0.5) = x / √13
    out = rms_norm(np.array([[3.0, 4.0]]), np.array([1.0, 2.0]), 0.5)
    assert np.allclose(out, [[3.0 / math.sqrt(13.0), 8.0 / math.sqrt(13.0)]], rtol=1e-15)


def test_rms_norm_eps_inside_the_root_and_zero_rows() -> None:
    # A row whose mean square equals eps is scaled by 1/√(2 eps), not 1/(√eps + eps).
    eps = 1e-6
    x = np.full((1, 4), math.sqrt(eps))
    assert np.allclose(rms_norm(x, np.ones(4), eps), 1.0 / math.sqrt(2.0), rtol=1e-14)
    assert rms_norm(np.zeros((2, 3)), np.ones(3), eps).tolist() == [[0.0] * 3] * 2


def test_rms_norm_size_one_and_shape_check() -> None:
    assert np.allclose(rms_norm(np.array([[-2.0]]), np.array([3.0]), 0.0), [[-3.0]])
    with pytest.raises(ValueError):
        rms_norm(np.ones((2, 3)), np.ones(2), 1e-6)


def test_fused_add_rms_norm_returns_the_sum_as_residual() -> None:
    x = np.array([[1.0, -2.0]])
    residual = np.array([[2.0, 6.0]])
    out, residual_out = fused_add_rms_norm(x, residual, np.array([1.0, 1.0]), 0.0)
    assert residual_out.tolist() == [[3.0, 4.0]]
    assert np.allclose(out, [[3.0 / math.sqrt(12.5), 4.0 / math.sqrt(12.5)]], rtol=1e-15)
    with pytest.raises(ValueError):
        fused_add_rms_norm(np.ones((1, 2)), np.ones((1, 3)), np.ones(2), 1e-6)


def test_layer_norm_hand_computed() -> None:
    # x = [1, 2, 3, 6]: mean 3, deviations [-2, -1, 0, 3], biased variance 14 / 4 = 3.5
    out = layer_norm(np.array([[1.0, 2.0, 3.0, 6.0]]), np.array([1.0, 1.0, 2.0, 1.0]),
                     np.array([0.0, 0.5, 0.0, -1.0]), 0.5)
    s = math.sqrt(4.0)
    assert np.allclose(out, [[-2.0 / s, -1.0 / s + 0.5, 0.0, 3.0 / s - 1.0]], rtol=1e-15)


def test_layer_norm_keeps_a_tiny_variance_under_a_large_mean() -> None:
    # 1e6 ± 1e-3: one-pass E[x²] − E[x]² would lose the variance entirely even in float64.
    x = np.array([[1e6 - 1e-3, 1e6 + 1e-3]])
    out = layer_norm(x, np.ones(2), np.zeros(2), 0.0)
    assert np.allclose(out, [[-1.0, 1.0]], rtol=1e-6)


def test_layer_norm_constant_row_gives_the_bias() -> None:
    out = layer_norm(np.full((1, 5), 7.0), np.full(5, 3.0), np.arange(5.0), 1e-5)
    assert out.tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0]]
    with pytest.raises(ValueError):
        layer_norm(np.ones((1, 3)), np.ones(3), np.ones(2), 1e-5)
