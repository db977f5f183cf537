"""Sampling references against hand-computed masks and indices."""

from __future__ import annotations

import math

import numpy as np

from reference_kernels.sampling import greedy_sample, top_k_top_p_mask

INF = math.inf


def test_greedy_first_maximum_and_large_index() -> None:
    z = np.array([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 2.0, 4.0]])
    assert greedy_sample(z).tolist() == [1, 0]
    big = np.zeros((1, 151936))
    big[0, 151935] = 1.0
    assert greedy_sample(big).tolist() == [151935]


def test_top_k_only() -> None:
    z = np.array([[1.0, 4.0, 2.0, 3.0]])
    out = top_k_top_p_mask(z, np.array([2]), np.array([1.0]))
    assert out.tolist() == [[-INF, 4.0, -INF, 3.0]]
    assert top_k_top_p_mask(z, np.array([4]), np.array([1.0])).tolist() == z.tolist()
    assert top_k_top_p_mask(z, np.array([1]), np.array([1.0])).tolist() == [[-INF, 4.0, -INF, -INF]]


def test_top_p_smallest_prefix_reaching_p() -> None:
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    z = np.log(probs)[None, :]
    # Masses 0.5, 0.8, 0.95, 1.0: p = 0.7 keeps two, p = 0.5 keeps exactly one (reaches p).
    out = top_k_top_p_mask(z, np.array([4]), np.array([0.7]))
    assert np.isfinite(out[0]).tolist() == [True, True, False, False]
    out = top_k_top_p_mask(z, np.array([4]), np.array([0.5]))
    assert np.isfinite(out[0]).tolist() == [True, False, False, False]
    assert np.isfinite(top_k_top_p_mask(z, np.array([4]), np.array([1e-9]))[0]).sum() == 1


def test_top_p_renormalizes_over_top_k() -> None:
    # After top-3 the probabilities are 0.5/0.95, 0.3/0.95, 0.15/0.95 = .526, .316, .158:
    # p = 0.8 needs all three (0.842 after two is ≥ 0.8 → two kept). Hand: two kept.
    z = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    out = top_k_top_p_mask(z, np.array([3]), np.array([0.8]))
    assert np.isfinite(out[0]).tolist() == [True, True, False, False]
    # Without renormalizing, 0.5 + 0.3 = 0.8 would be borderline; p = 0.85 shows the difference:
    # renormalized masses .526, .842, 1.0 → three kept (0.842 < 0.85).
    out = top_k_top_p_mask(z, np.array([3]), np.array([0.85]))
    assert np.isfinite(out[0]).tolist() == [True, True, True, False]
