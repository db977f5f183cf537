"""MLA references: the absorbed decode agrees with the expanded prefill, and hand-computed cases."""

from __future__ import annotations

import numpy as np

from reference_kernels.mla import mla_decode, mla_prefill, split_kv_b_proj

N, L, P, R, V = 3, 8, 4, 2, 5


def _weights(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((N, P + V, L))


def test_decode_of_the_last_token_equals_the_prefills_last_row() -> None:
    # The absorbed form (decode) and the expanded form (prefill) are the same function: the
    # last query of a causal prefill sees every key, as a decode step over the whole cache does.
    rng = np.random.default_rng(0)
    t, bs = 7, 3
    q_nope, q_pe = rng.standard_normal((t, N, P)), rng.standard_normal((t, N, R))
    kv_c, k_pe, w = rng.standard_normal((t, L)), rng.standard_normal((t, R)), _weights(rng)
    prefill = mla_prefill(q_nope, q_pe, kv_c, k_pe, w, scale=0.3)
    blocks = np.array([2, 0, 4])  # shuffled blocks of a 5-block cache
    kv_cache, pe_cache = np.full((5, bs, L), 1e3), np.full((5, bs, R), 1e3)  # unread slots: huge
    tok = np.arange(t)
    kv_cache[blocks[tok // bs], tok % bs], pe_cache[blocks[tok // bs], tok % bs] = kv_c, k_pe
    decode = mla_decode(q_nope[-1:], q_pe[-1:], kv_cache, pe_cache, w, blocks[None], np.array([t]), scale=0.3)
    assert np.allclose(decode[0], prefill[-1], rtol=1e-12, atol=1e-12)


def test_one_key_returns_its_value_and_the_first_query_sees_only_the_first_key() -> None:
    rng = np.random.default_rng(1)
    q_nope, q_pe = rng.standard_normal((2, N, P)), rng.standard_normal((2, N, R))
    kv_c, k_pe, w = rng.standard_normal((2, L)), rng.standard_normal((2, R)), _weights(rng)
    _, w_uv = split_kv_b_proj(w, P)
    out = mla_prefill(q_nope, q_pe, kv_c, k_pe, w, scale=1.0)
    assert np.allclose(out[0], w_uv @ kv_c[0])  # [N, V]: v of token 0 in every head


def test_rope_term_and_scale_enter_the_logits() -> None:
    # Two keys whose no-rope parts score equally: the rope term alone decides the weights,
    # softmax(scale · [a, b]) with a, b the q_pe · k_pe products.
    q_nope, q_pe = np.zeros((1, 1, P)), np.ones((1, 1, R))
    kv_c = np.eye(2, L)
    k_pe = np.array([[1.0, 0.0], [0.0, 0.0]])
    w = np.zeros((1, P + V, L))
    w[0, P:, :2] = np.eye(V, 2)  # v = the first two latent coordinates
    out = mla_prefill(np.repeat(q_nope, 2, 0), np.repeat(q_pe, 2, 0), kv_c, k_pe, w, scale=2.0)
    p0 = np.exp(2.0) / (np.exp(2.0) + 1.0)
    assert np.allclose(out[1, 0, :2], [p0, 1 - p0])
