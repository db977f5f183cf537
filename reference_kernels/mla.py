"""Multi-head latent attention (DeepSeek-V2/V3 MLA) references in float64: prefill and paged decode.

MLA caches one latent vector per token instead of per-head keys and values: ``kv_c`` (the
normalized latent, ``L = kv_lora_rank`` wide) and ``k_pe`` (the rotary part of the key, ``R``
wide, shared by all heads). The up-projection ``kv_b_proj`` turns the latent into each head's
key and value: per head ``n`` its rows ``0..P-1`` are ``W_UK[n]`` (latent → ``k_nope``, ``P``
wide) and rows ``P..P+V-1`` are ``W_UV[n]`` (latent → ``v``, ``V`` wide), which is an
``nn.Linear`` weight of shape ``[N·(P+V), L]`` viewed as ``[N, P+V, L]``. The logit of query ``t``
and key ``s`` in head ``n`` is

    scale · (q_nope[t, n] · k_nope[s, n] + q_pe[t, n] · k_pe[s])

and the output is the softmax-weighted sum of ``v[s, n]``.

:func:`mla_prefill` computes exactly that (keys and values expanded per head: the "compute
friendly" form). :func:`mla_decode` uses the algebraically identical absorbed form,
``q_nope · (W_UK · kv_c) = (W_UKᵀ · q_nope) · kv_c`` and ``Σ p · (W_UV · kv_c) = W_UV · (Σ p · kv_c)``,
because expanding a whole cache per head costs ``S·L·N·(P+V)`` and the absorbed form ``S·L·N``;
in float64 the two agree to ~1e-13 (tests/reference_kernels/test_mla.py checks a decode row
against the prefill's last row), so neither form is favoured by the reference.

The softmax is written out (maximum subtracted) as in :mod:`reference_kernels.attention`, and the
paged cache follows its addressing: token ``i`` of sequence ``b`` is in block
``block_tables[b, i // block_size]`` at offset ``i % block_size``.
"""

from __future__ import annotations

import numpy as np

from reference_kernels.attention import gather_paged, softmax_rows


def split_kv_b_proj(kv_b_proj: np.ndarray, qk_nope_head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``(W_UK [N, P, L], W_UV [N, V, L])`` from ``kv_b_proj [N, P+V, L]``."""
    w = np.asarray(kv_b_proj, dtype=np.float64)
    if not 0 < qk_nope_head_dim < w.shape[1]:
        raise ValueError(f"qk_nope_head_dim {qk_nope_head_dim} outside (0, {w.shape[1]})")
    return w[:, :qk_nope_head_dim], w[:, qk_nope_head_dim:]


def mla_prefill(q_nope: np.ndarray, q_pe: np.ndarray, kv_c: np.ndarray, k_pe: np.ndarray,
                kv_b_proj: np.ndarray, scale: float) -> np.ndarray:
    """Causal MLA over one sequence → ``[T, N, V]``.

    ``q_nope: [T, N, P]``, ``q_pe: [T, N, R]``, ``kv_c: [T, L]``, ``k_pe: [T, R]``,
    ``kv_b_proj: [N, P+V, L]``; query ``i`` attends to keys ``0..i``.
    """
    q_nope, q_pe, kv_c, k_pe = (np.asarray(a, dtype=np.float64) for a in (q_nope, q_pe, kv_c, k_pe))
    tokens, heads, nope = q_nope.shape
    w_uk, w_uv = split_kv_b_proj(kv_b_proj, nope)
    causal = np.arange(tokens)[None, :] <= np.arange(tokens)[:, None]
    out = np.empty((tokens, heads, w_uv.shape[1]))
    rope_logits = np.einsum("tnr,sr->nts", q_pe, k_pe)  # the rope key is shared by every head
    for n in range(heads):
        k_nope = kv_c @ w_uk[n].T  # [T, P]
        v = kv_c @ w_uv[n].T  # [T, V]
        scores = (q_nope[:, n] @ k_nope.T + rope_logits[n]) * scale
        out[:, n] = softmax_rows(np.where(causal, scores, -np.inf)) @ v
    return out


def mla_decode(q_nope: np.ndarray, q_pe: np.ndarray, kv_c_cache: np.ndarray, k_pe_cache: np.ndarray,
               kv_b_proj: np.ndarray, block_tables: np.ndarray, seq_lens: np.ndarray, scale: float) -> np.ndarray:
    """One query per sequence against its first ``seq_lens[b]`` cached latents → ``[B, N, V]``.

    ``q_nope: [B, N, P]``, ``q_pe: [B, N, R]``, ``kv_c_cache: [num_blocks, block_size, L]``,
    ``k_pe_cache: [num_blocks, block_size, R]``, ``kv_b_proj: [N, P+V, L]``; slots after a
    sequence's length are never read.
    """
    q_nope, q_pe = np.asarray(q_nope, dtype=np.float64), np.asarray(q_pe, dtype=np.float64)
    kv_c_cache = np.asarray(kv_c_cache, dtype=np.float64)
    k_pe_cache = np.asarray(k_pe_cache, dtype=np.float64)
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    batch, heads, nope = q_nope.shape
    w_uk, w_uv = split_kv_b_proj(kv_b_proj, nope)
    out = np.empty((batch, heads, w_uv.shape[1]))
    for b in range(batch):
        length = int(seq_lens[b])
        if length < 1:
            raise ValueError(f"seq_lens[{b}] = {length} < 1")
        kv_c = gather_paged(kv_c_cache, block_tables[b], length)  # [S, L]
        k_pe = gather_paged(k_pe_cache, block_tables[b], length)  # [S, R]
        q_latent = np.einsum("np,npl->nl", q_nope[b], w_uk)  # W_UKᵀ · q_nope per head
        scores = (q_latent @ kv_c.T + q_pe[b] @ k_pe.T) * scale  # [N, S]
        latent_out = softmax_rows(scores) @ kv_c  # [N, L]
        out[b] = np.einsum("nl,nvl->nv", latent_out, w_uv)
    return out
