"""Attention references against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from reference_kernels.attention import (
    decode_attention,
    kv_head_for,
    paged_attention,
    prefill_attention,
    reshape_and_cache,
    softmax_rows,
)


def test_softmax_rows_hand_computed_and_overflow_safe() -> None:
    got = softmax_rows(np.array([[0.0, np.log(3.0)], [1000.0, 1000.0], [5.0, -np.inf]]))
    assert np.allclose(got, [[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]])


def test_kv_head_mapping_is_contiguous_groups() -> None:
    assert [kv_head_for(h, 8, 2) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [kv_head_for(h, 4, 4) for h in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        kv_head_for(0, 6, 4)


def test_prefill_causal_with_equal_scores_is_a_running_mean() -> None:
    # Zero queries: every visible key has the same score, so row i averages v[0..i].
    t = 4
    q = np.zeros((t, 1, 2))
    k = np.ones((t, 1, 2))
    v = np.arange(t * 2, dtype=np.float64).reshape(t, 1, 2)
    out = prefill_attention(q, k, v, scale=1.0)
    expected = np.cumsum(v[:, 0], axis=0) / np.arange(1, t + 1)[:, None]
    assert np.allclose(out[:, 0], expected)


def test_prefill_hand_computed_weights_and_scale() -> None:
    # Two tokens, D = 1: row 1 sees scores [q1*k0, q1*k1] * scale.
    q = np.array([[[1.0]], [[2.0]]])
    k = np.array([[[0.0]], [[1.0]]])
    v = np.array([[[10.0]], [[20.0]]])
    out = prefill_attention(q, k, v, scale=0.5)  # row 1 scores [0, 1]
    w1 = np.exp(1.0) / (1.0 + np.exp(1.0))
    assert np.allclose(out[:, 0, 0], [10.0, 10.0 * (1 - w1) + 20.0 * w1])


def test_prefill_gqa_uses_the_group_of_each_query_head() -> None:
    # Hq = 4, Hk = 2: heads 0,1 read kv head 0 (values 1), heads 2,3 read kv head 1 (values 7).
    q = np.zeros((1, 4, 2))
    k = np.zeros((1, 2, 2))
    v = np.stack([np.full((1, 2), 1.0), np.full((1, 2), 7.0)], axis=1)
    out = prefill_attention(q, k, v, scale=1.0)
    assert out[0, :, 0].tolist() == [1.0, 1.0, 7.0, 7.0]


def test_prefill_large_logits_are_a_hard_max() -> None:
    q = np.array([[[100.0]], [[100.0]], [[100.0]]])
    k = np.array([[[1.0]], [[9.0]], [[2.0]]])
    v = np.array([[[1.0]], [[2.0]], [[3.0]]])
    out = prefill_attention(q, k, v, scale=1.0)
    assert np.allclose(out[:, 0, 0], [1.0, 2.0, 2.0])


def test_decode_ignores_keys_past_seq_len() -> None:
    k = np.zeros((2, 3, 1, 1))
    v = np.array([1.0, 3.0, 1e6, 5.0, 7.0, 9.0]).reshape(2, 3, 1, 1)
    k[0, 2] = 1e6  # garbage after seq_lens[0] = 2
    out = decode_attention(np.ones((2, 1, 1)), k, v, np.array([2, 3]), scale=1.0)
    assert np.allclose(out[:, 0, 0], [2.0, 7.0])
    with pytest.raises(ValueError):
        decode_attention(np.ones((2, 1, 1)), k, v, np.array([0, 3]), scale=1.0)


def test_paged_matches_decode_on_the_gathered_sequence() -> None:
    rng = np.random.default_rng(0)
    block_size, num_blocks = 2, 7
    key_cache = rng.standard_normal((num_blocks, block_size, 1, 3)) * 100  # garbage everywhere first
    value_cache = rng.standard_normal((num_blocks, block_size, 1, 3)) * 100
    k = rng.standard_normal((5, 1, 3))
    v = rng.standard_normal((5, 1, 3))
    table = np.array([[6, 2, 4, 0]])  # tokens 0-1 in block 6, 2-3 in block 2, 4 in block 4
    for i in range(5):
        key_cache[table[0, i // 2], i % 2] = k[i]
        value_cache[table[0, i // 2], i % 2] = v[i]
    q = rng.standard_normal((1, 2, 3))
    got = paged_attention(q, key_cache, value_cache, table, np.array([5]), scale=0.4)
    expected = decode_attention(q, k[None], v[None], np.array([5]), scale=0.4)
    assert np.allclose(got, expected)


def test_reshape_and_cache_writes_slots_and_skips_padding() -> None:
    key_cache = np.full((3, 2, 1, 1), -9.0)
    value_cache = np.full((3, 2, 1, 1), -8.0)
    key = np.array([1.0, 2.0, 3.0]).reshape(3, 1, 1)
    value = key * 10
    k_out, v_out = reshape_and_cache(key, value, key_cache, value_cache, np.array([5, -1, 2]))
    assert k_out[:, :, 0, 0].tolist() == [[-9.0, -9.0], [3.0, -9.0], [-9.0, 1.0]]
    assert v_out[:, :, 0, 0].tolist() == [[-8.0, -8.0], [30.0, -8.0], [-8.0, 10.0]]
    assert key_cache[2, 1, 0, 0] == -9.0  # the input is not modified
    with pytest.raises(ValueError):
        reshape_and_cache(key, value, key_cache, value_cache, np.array([6, 0, 0]))


# ---- fp8 KV caches -------------------------------------------------------------------------


def test_quantize_kv_rounds_to_nearest_even_on_each_grid_and_saturates() -> None:
    from reference_kernels.attention import E5M2, kv_cache_format, quantize_kv
    from reference_kernels.quant import E4M3FN, E4M3FNUZ

    assert kv_cache_format("fp8_e5m2") is E5M2 and kv_cache_format("fp8_e4m3") is E4M3FN
    assert kv_cache_format("fp8_e4m3", "e4m3fnuz") is E4M3FNUZ
    # e4m3 around 1: steps of 1/8; 1.0625 is a tie → even (1.0), 1.1875 → 1.25. Scale 0.5 divides.
    assert quantize_kv(np.array([0.53125, 0.59375, 1000.0]), 0.5, E4M3FN).tolist() == [1.0, 1.25, 448.0]
    # e5m2 around 1: steps of 1/4; 1.125 is a tie → 1.0, 1.375 → 1.5; max 57344.
    assert quantize_kv(np.array([1.125, 1.375, -1e6]), 1.0, E5M2).tolist() == [1.0, 1.5, -57344.0]
    with pytest.raises(ValueError, match="fp8_e4m3 or fp8_e5m2"):
        kv_cache_format("auto")


def test_fp8_references_dequantize_and_write_codes() -> None:
    from reference_kernels.attention import paged_attention_fp8, reshape_and_cache_fp8

    q = np.array([[[1.0, 0.0]]])
    codes_k = np.array([[[[2.0, 0.0]], [[0.0, 0.0]]]])  # keys 2·0.5 = 1 and 0
    codes_v = np.array([[[[4.0, 0.0]], [[0.0, 8.0]]]])  # values 1 and 2 (·0.25)
    got = paged_attention_fp8(q, codes_k, codes_v, np.array([[0]]), np.array([2]), 1.0, "fp8_e4m3", 0.5, 0.25)
    w = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()
    assert np.allclose(got[0, 0], [w[0] * 1.0, w[1] * 2.0])
    kc, vc = reshape_and_cache_fp8(np.array([[[0.53125, 1.0]]]), np.array([[[3.0, -3.0]]]), np.zeros((1, 2, 1, 2)),
                                   np.zeros((1, 2, 1, 2)), np.array([1]), "fp8_e5m2", 0.5, 2.0)
    assert kc[0, 1, 0].tolist() == [1.0, 2.0] and vc[0, 1, 0].tolist() == [1.5, -1.5] and not kc[0, 0].any()
