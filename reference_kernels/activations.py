"""Activation references: SiLU, GELU (erf and tanh forms), SiLU-and-mul (SwiGLU), softmax.

All in float64 from the defining formulas. Where the textbook form loses accuracy in
float64 itself, an algebraically identical form is used and the reason is given: the
reference must stay far more accurate than the tolerance it is judged with.
"""

from __future__ import annotations

import math

import numpy as np

_erfc = np.frompyfunc(math.erfc, 1, 1)
"""The complementary error function from the C library, element by element (no SciPy)."""


def sigmoid(x: np.ndarray) -> np.ndarray:
    """σ(x) = 1 / (1 + e^(-x)).

    For x < 0 the same value is written e^x / (1 + e^x), so e^(-x) is never formed for
    very negative x (it would overflow to inf even in float64 below about -709).
    """
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    e = np.exp(x[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x · σ(x)."""
    x = np.asarray(x, dtype=np.float64)
    return x * sigmoid(x)


def gelu(x: np.ndarray) -> np.ndarray:
    """gelu(x) = x · Φ(x), Φ the standard normal CDF = ½ · erfc(-x / √2).

    erfc rather than 1 + erf(x/√2): for x ≪ 0 the latter cancels to zero long before Φ does.
    """
    x = np.asarray(x, dtype=np.float64)
    phi = 0.5 * np.asarray(_erfc(-x / math.sqrt(2.0)), dtype=np.float64)
    return x * phi


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation: ½ · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))).

    Written as printed (GPT-2, PyTorch ``approximate='tanh'``). For x ≪ 0 the bracket
    cancels, but the absolute error stays ≈ |x| · 1e-16, far below every tolerance.
    """
    x = np.asarray(x, dtype=np.float64)
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
    return 0.5 * x * (1.0 + np.tanh(inner))


def silu_and_mul(x: np.ndarray) -> np.ndarray:
    """SwiGLU gate: x = [gate | up] along the last axis; out = silu(gate) · up.

    The first half is the gate (vLLM's ``silu_and_mul`` convention, the merged
    gate_up_proj output of Llama/Qwen MLPs).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] % 2:
        raise ValueError(f"last dimension {x.shape[-1]} is not even")
    d = x.shape[-1] // 2
    return silu(x[..., :d]) * x[..., d:]


def softmax(x: np.ndarray) -> np.ndarray:
    """softmax over the last axis: e^(x_i) / Σ_j e^(x_j).

    The row maximum is subtracted first (the quotient does not change) so float64 does
    not overflow for logits beyond ~709; the row sum is NumPy's pairwise float64 sum.
    """
    x = np.asarray(x, dtype=np.float64)
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
