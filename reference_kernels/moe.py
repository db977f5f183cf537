"""Mixture-of-experts references: the softmax top-k router, DeepSeek's group-limited top-k router
(sigmoid or softmax scores, optional correction bias) and the SwiGLU experts, routed and shared.

Everything is float64 and written from the formula: a row softmax with the maximum
subtracted, a stable descending sort for the top-k, SiLU as v / (1 + e^-v), and the
expert matrix products through the blocked GEMM reference (no BLAS).
"""

from __future__ import annotations

import numpy as np

from reference_kernels.activations import sigmoid
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


def routing_scores(router_logits: np.ndarray, scoring_func: str) -> np.ndarray:
    """Per-expert scores: a row softmax or an element-wise sigmoid of the logits."""
    if scoring_func == "softmax":
        return softmax_rows(router_logits)
    if scoring_func == "sigmoid":
        return sigmoid(router_logits)
    raise ValueError(f"unknown scoring function {scoring_func!r}")


def grouped_route(router_logits: np.ndarray, e_score_correction_bias: np.ndarray | None, topk: int,
                  num_expert_group: int, topk_group: int, scoring_func: str, renormalize: bool,
                  routed_scaling_factor: float) -> tuple[np.ndarray, np.ndarray]:
    """Group-limited top-k routing (DeepSeek-V2/V3): (ids [T, topk], weights [T, topk]).

    Experts form ``num_expert_group`` equal groups of consecutive ids. Choice score = score +
    bias where a correction bias is given (V3 "noaux_tc"), else the score itself (V2). A
    group's score is the sum of its two best choice scores with a bias, its best choice score
    without one. The ``topk_group`` best groups are kept; the ``topk`` best choice scores
    among their experts are selected. Weights are the selected experts' *uncorrected* scores,
    divided by their sum if ``renormalize``, times ``routed_scaling_factor``. Rows are in
    ascending expert id (the op's inputs keep a clear gap at both cuts, so the selected set
    is unique and no order within it carries meaning).
    """
    scores = routing_scores(router_logits, scoring_func)
    t, e = scores.shape
    if e % num_expert_group or not 1 <= topk_group <= num_expert_group:
        raise ValueError(f"{e} experts cannot form {num_expert_group} groups keeping {topk_group}")
    choice = scores if e_score_correction_bias is None else scores + np.asarray(e_score_correction_bias,
                                                                                 dtype=np.float64)[None, :]
    grouped = np.sort(choice.reshape(t, num_expert_group, -1), axis=-1)[:, :, ::-1]
    group_score = grouped[:, :, :2].sum(axis=-1) if e_score_correction_bias is not None else grouped[:, :, 0]
    ids = np.empty((t, topk), dtype=np.int64)
    weights = np.empty((t, topk), dtype=np.float64)
    per_group = e // num_expert_group
    for tok in range(t):
        kept = np.argsort(-group_score[tok], kind="stable")[:topk_group]
        allowed = np.concatenate([np.arange(g * per_group, (g + 1) * per_group) for g in kept])
        chosen = np.sort(allowed[np.argsort(-choice[tok, allowed], kind="stable")[:topk]])
        ids[tok] = chosen
        w = scores[tok, chosen]
        if renormalize:
            w = w / w.sum()
        weights[tok] = w * float(routed_scaling_factor)
    return ids, weights


def grouped_topk(router_logits: np.ndarray, e_score_correction_bias: np.ndarray | None, topk: int,
                 num_expert_group: int, topk_group: int, scoring_func: str, renormalize: bool,
                 routed_scaling_factor: float) -> tuple[np.ndarray, np.ndarray]:
    """The op's outputs in its order: (topk_weights [T, k], topk_ids [T, k]), ids ascending."""
    ids, weights = grouped_route(router_logits, e_score_correction_bias, topk, num_expert_group, topk_group,
                                 scoring_func, renormalize, routed_scaling_factor)
    return weights, ids


def fused_moe_shared(x: np.ndarray, topk_weights: np.ndarray, topk_ids: np.ndarray, w13: np.ndarray,
                     w2: np.ndarray, shared_w13: np.ndarray, shared_w2: np.ndarray) -> np.ndarray:
    """out[t] = Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t]) + shared(x[t]).

    Routing is given (weights already carry any routed scaling factor); the shared expert is
    one SwiGLU MLP (shared_w13 [2·Is, H]: first Is rows gate, next Is up; shared_w2 [H, Is])
    applied to every token with weight 1.
    """
    x = np.asarray(x, dtype=np.float64)
    w13 = np.asarray(w13, dtype=np.float64)
    w2 = np.asarray(w2, dtype=np.float64)
    ids = np.asarray(topk_ids, dtype=np.int64)
    weights = np.asarray(topk_weights, dtype=np.float64)
    out = expert_mlp(x, np.asarray(shared_w13, dtype=np.float64), np.asarray(shared_w2, dtype=np.float64))
    for e in range(w13.shape[0]):
        tok, slot = np.nonzero(ids == e)
        if tok.size:
            # Ids are distinct within a row, so the rows of `tok` are distinct: plain += is safe.
            out[tok] += weights[tok, slot][:, None] * expert_mlp(x[tok], w13[e], w2[e])
    return out
