"""Activation references against known values and limits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reference_kernels.activations import (
    gelu,
    gelu_tanh,
    sigmoid,
    silu,
    silu_and_mul,
    softmax,
)


def test_sigmoid_and_silu_known_values_and_extremes() -> None:
    assert sigmoid(np.array([0.0]))[0] == 0.5
    assert math.isclose(silu(np.array([1.0]))[0], 1.0 / (1.0 + math.exp(-1.0)), rel_tol=1e-15)
    assert math.isclose(silu(np.array([-2.0]))[0], -2.0 / (1.0 + math.exp(2.0)), rel_tol=1e-15)
    # No overflow warning or NaN at the extremes: silu(−1000) is −0, silu(1000) is 1000.
    with np.errstate(over="raise", invalid="raise"):
        far = silu(np.array([-1000.0, 1000.0, -80.0]))
    assert far[0] == 0.0 and far[1] == 1000.0
    assert math.isclose(far[2], -80.0 * math.exp(-80.0), rel_tol=1e-14)


def test_gelu_known_values() -> None:
    # x · Φ(x) with Φ(1) = 0.8413447460685429, Φ(−1) = 0.15865525393145707
    out = gelu(np.array([0.0, 1.0, -1.0]))
    assert out[0] == 0.0
    assert math.isclose(out[1], 0.8413447460685429, rel_tol=1e-15)
    assert math.isclose(out[2], -0.15865525393145707, rel_tol=1e-14)


def test_gelu_keeps_relative_accuracy_in_the_far_negative_tail() -> None:
    # Φ(−10) = 7.61985302416047e-24: 1 + erf(−10/√2) would have cancelled to 0.
    assert math.isclose(gelu(np.array([-10.0]))[0], -10.0 * 7.61985302416047e-24, rel_tol=1e-12)


def test_gelu_tanh_known_value_and_difference_from_erf() -> None:
    u = math.sqrt(2.0 / math.pi) * (1.0 + 0.044715)
    assert math.isclose(gelu_tanh(np.array([1.0]))[0], 0.5 * (1.0 + math.tanh(u)), rel_tol=1e-15)
    x = np.linspace(-6.0, 6.0, 12001)
    gap = np.abs(gelu(x) - gelu_tanh(x)).max()
    assert 4.0e-4 < gap < 5.0e-4  # the approximation's known worst error, near x = −2.7


def test_silu_and_mul_uses_the_first_half_as_gate() -> None:
    x = np.array([[1.0, -2.0, 3.0, 5.0]])
    expected = [silu(np.array([1.0]))[0] * 3.0, silu(np.array([-2.0]))[0] * 5.0]
    assert np.allclose(silu_and_mul(x), [expected], rtol=1e-15)
    with pytest.raises(ValueError):
        silu_and_mul(np.ones((1, 3)))


def test_softmax_known_values_large_logits_and_ties() -> None:
    out = softmax(np.array([[0.0, math.log(3.0)]]))
    assert np.allclose(out, [[0.25, 0.75]], rtol=1e-15)
    # Offsets do not change the result and do not overflow (e^10000 would in float64).
    assert np.allclose(softmax(np.array([[1e4, 1e4 + math.log(3.0)]])), [[0.25, 0.75]], rtol=1e-12)
    flat = softmax(np.zeros((2, 151936)))
    assert np.allclose(flat, 1.0 / 151936, rtol=1e-12)
    assert np.allclose(flat.sum(axis=-1), 1.0, rtol=1e-12)
