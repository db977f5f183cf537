"""Sampling references: greedy argmax and the top-k / top-p (nucleus) logit mask.

Written with sorts, comparisons and a max-subtracted softmax in float64.
"""

from __future__ import annotations

import numpy as np


def greedy_sample(logits: np.ndarray) -> np.ndarray:
    """ids[b] = the first index holding the largest logit of row b (int64)."""
    z = np.asarray(logits, dtype=np.float64)
    ids = np.empty(z.shape[0], dtype=np.int64)
    for b in range(z.shape[0]):
        ids[b] = int(np.flatnonzero(z[b] == z[b].max())[0])
    return ids


def top_k_top_p_mask(logits: np.ndarray, k: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Logits outside the top-k, then outside the nucleus, set to -inf; the rest unchanged.

    Per row: keep the logits ≥ the k-th largest; take the softmax over the kept ones and
    keep the smallest prefix of them (sorted descending) whose mass reaches p. p ≥ 1 keeps
    every top-k logit: every probability is positive, so only the whole set has mass 1
    (summing in floating point must not decide that). Ties straddling a cut keep all tied
    values; the op's inputs avoid them.
    """
    z = np.asarray(logits, dtype=np.float64)
    out = np.full_like(z, -np.inf)
    for b in range(z.shape[0]):
        row = z[b]
        kb = int(k[b])
        if not 1 <= kb <= row.size:
            raise ValueError(f"row {b}: k={kb} outside 1..{row.size}")
        order = np.argsort(-row, kind="stable")
        kth = row[order[kb - 1]]
        kept = np.flatnonzero(row >= kth)
        if float(p[b]) < 1.0:
            vals = row[kept]
            e = np.exp(vals - vals.max())
            probs = e / e.sum()
            desc = np.argsort(-vals, kind="stable")
            mass = np.cumsum(probs[desc])
            n = int(np.searchsorted(mass, float(p[b]), side="left")) + 1  # first prefix with mass ≥ p
            n = min(n, kept.size)
            kept = kept[desc[:n]]
        out[b, kept] = row[kept]
    return out
