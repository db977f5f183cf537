"""Normalization references: RMSNorm, fused residual-add + RMSNorm, LayerNorm, in float64.

Each is written straight from its defining formula over the last axis (the hidden
dimension); nothing here calls a library norm. Float64 with a two-pass variance keeps the
reference exact enough that near-constant rows (variance ≈ eps) are still judged correctly.
"""

from __future__ import annotations

import numpy as np


def _hidden_mean(values: np.ndarray) -> np.ndarray:
    """Mean over the last axis, kept as a size-1 axis so it broadcasts back over the row."""
    return values.sum(axis=-1, keepdims=True) / values.shape[-1]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """out[t, h] = x[t, h] / sqrt(mean_h(x[t, :]²) + eps) · weight[h].

    ``eps`` sits inside the square root: a row of zeros gives zeros, not 0/0.
    """
    x = np.asarray(x, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight {weight.shape} does not match hidden size {x.shape[-1]}")
    mean_square = _hidden_mean(x * x)
    return x / np.sqrt(mean_square + eps) * weight


def fused_add_rms_norm(x: np.ndarray, residual: np.ndarray, weight: np.ndarray,
                       eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(rms_norm(x + residual), x + residual): the pre-norm residual stream of a decoder layer.

    The second output is the updated residual the next layer adds to; vLLM's kernel writes
    it into ``residual`` in place.
    """
    x = np.asarray(x, dtype=np.float64)
    residual = np.asarray(residual, dtype=np.float64)
    if x.shape != residual.shape:
        raise ValueError(f"x {x.shape} and residual {residual.shape} differ")
    residual_out = x + residual
    return rms_norm(residual_out, weight, eps), residual_out


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """out = (x - mean) / sqrt(var + eps) · weight + bias, with the biased (1/H) variance.

    Two passes (mean first, then the mean of squared deviations) so that a row like
    100 + 1e-3·noise keeps its tiny variance instead of cancelling it away.
    """
    x = np.asarray(x, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    bias = np.asarray(bias, dtype=np.float64)
    if weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(f"weight {weight.shape} / bias {bias.shape} do not match hidden size {x.shape[-1]}")
    centered = x - _hidden_mean(x)
    variance = _hidden_mean(centered * centered)
    return centered / np.sqrt(variance + eps) * weight + bias
