"""Fused mixture-of-experts reference: softmax router → top-k → (renormalize) → SwiGLU experts.

Everything is float64 and written from the formula: a row softmax with the maximum
subtracted, a stable descending sort for the top-k, SiLU as v / (1 + e^-v), and the
expert matrix products through the blocked GEMM reference (no BLAS).
"""

from __future__ import annotations

import numpy as np

from reference_kernels.gemm import gemm


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis: e^(l - max) / Σ e^(l - max)."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def silu(v: np.ndarray) -> np.ndarray:
    """SiLU(v) = v · sigmoid(v) = v / (1 + e^-v)."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore"):  # e^-v = inf for very negative v gives the right limit 0
        return v / (1.0 + np.exp(-v))


def route(router_logits: np.ndarray, topk: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids [T, topk], weights [T, topk]) for every token.

    The top-k is a stable descending sort of the probabilities: among exactly equal
    probabilities the lower expert id comes first (the op's inputs keep ties away from the
    k-th/k+1-th boundary, so which of two tied *selected* experts is listed first does not
    change the output).
    """
    probs = softmax_rows(router_logits)
    t, e = probs.shape
    if not 1 <= topk <= e:
        raise ValueError(f"topk {topk} outside 1..{e}")
    ids = np.empty((t, topk), dtype=np.int64)
    weights = np.empty((t, topk), dtype=np.float64)
    for tok in range(t):
        order = np.argsort(-probs[tok], kind="stable")[:topk]
        ids[tok] = order
        weights[tok] = probs[tok, order]
        if renormalize:
            weights[tok] = weights[tok] / weights[tok].sum()
    return ids, weights


def expert_mlp(x: np.ndarray, w13: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """One expert on rows x [n, H]: w2 · (silu(gate) * up) with [gate; up] = w13 · x."""
    inter = w13.shape[0] // 2
    h = gemm(x, w13.T)  # [n, 2I]
    gate, up = h[:, :inter], h[:, inter:]
    return gemm(silu(gate) * up, w2.T)  # [n, H]


def fused_moe(x: np.ndarray, router_logits: np.ndarray, w13: np.ndarray, w2: np.ndarray,
              topk: int, renormalize: bool) -> np.ndarray:
    """out[t] = Σ_j weight[t, j] · expert_{ids[t, j]}(x[t]).

    x [T, H], router_logits [T, E], w13 [E, 2I, H] (first I rows gate, next I rows up),
    w2 [E, H, I]. Experts are visited one by one with the tokens routed to them.
    """
    x = np.asarray(x, dtype=np.float64)
    w13 = np.asarray(w13, dtype=np.float64)
    w2 = np.asarray(w2, dtype=np.float64)
    t, hidden = x.shape
    n_exp, two_i, h2 = w13.shape
    if h2 != hidden or two_i % 2 or w2.shape != (n_exp, hidden, two_i // 2):
        raise ValueError(f"shapes do not fit: x {x.shape}, w13 {w13.shape}, w2 {w2.shape}")
    ids, weights = route(router_logits, int(topk), bool(renormalize))
    out = np.zeros((t, hidden), dtype=np.float64)
    for e in range(n_exp):
        tok, slot = np.nonzero(ids == e)
        if tok.size == 0:
            continue
        y = expert_mlp(x[tok], w13[e], w2[e])
        # A token selects an expert at most once, so rows of `tok` are distinct: plain += is safe.
        out[tok] += weights[tok, slot][:, None] * y
    return out
