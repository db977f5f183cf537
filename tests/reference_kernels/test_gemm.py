"""GEMM references against hand-computed products."""

from __future__ import annotations

import numpy as np
import pytest

from reference_kernels.gemm import bmm, gemm


def test_gemm_hand_computed() -> None:
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = np.array([[7.0, 8.0], [9.0, 10.0], [11.0, 12.0]])
    assert gemm(a, b).tolist() == [[58.0, 64.0], [139.0, 154.0]]


def test_gemm_long_k_is_exact_in_float64_for_integers() -> None:
    k = 100_000
    a = np.ones((1, k))
    b = np.arange(k, dtype=np.float64).reshape(k, 1)
    assert gemm(a, b)[0, 0] == k * (k - 1) / 2


def test_bmm_and_shape_errors() -> None:
    a = np.stack([np.eye(2), 2 * np.eye(2)])
    b = np.stack([np.full((2, 2), 3.0), np.full((2, 2), 1.0)])
    assert bmm(a, b).tolist() == [[[3.0, 3.0], [3.0, 3.0]], [[2.0, 2.0], [2.0, 2.0]]]
    with pytest.raises(ValueError):
        gemm(np.ones((2, 3)), np.ones((2, 3)))
