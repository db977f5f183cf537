"""GEMM references: plain and batched matrix products, accumulated in float64."""

from __future__ import annotations

import numpy as np


def gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C[m, n] = Σ_k A[m, k] · B[k, n], in float64.

    Written as a broadcast multiply-and-sum over K blocks rather than a BLAS call, so the
    reference does not share a library (or its accumulation tricks) with the op under test.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: {a.shape} @ {b.shape}")
    out = np.zeros((m, n), dtype=np.float64)
    block = max(1, 2**22 // max(1, m * n))  # bound the temporary to ~32 MiB
    for start in range(0, k, block):
        stop = min(k, start + block)
        out += (a[:, start:stop, None] * b[None, start:stop, :]).sum(axis=1)
    return out


def bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C[i] = A[i] @ B[i] for every batch index i."""
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"batch sizes differ: {a.shape[0]} vs {b.shape[0]}")
    return np.stack([gemm(a[i], b[i]) for i in range(a.shape[0])])
