"""Weight-quantized references against hand-made words and scales."""

from __future__ import annotations

import numpy as np

from reference_kernels.quant_weight import block_fp8_gemm, dequantize_int4, int4_w4a16_gemm, unpack_cols, unpack_rows

WORD = 0x87654321 - 2**32  # nibbles 0..7 hold 1..8 (int32: the top nibble sets the sign bit)


def test_unpacking_known_words() -> None:
    assert unpack_cols(np.array([[WORD]]), awq=False).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    # AWQ: nibble i holds column [0, 2, 4, 6, 1, 3, 5, 7][i].
    assert unpack_cols(np.array([[WORD]]), awq=True).tolist() == [[1, 5, 2, 6, 3, 7, 4, 8]]
    assert unpack_rows(np.array([[WORD]])).ravel().tolist() == [1, 2, 3, 4, 5, 6, 7, 8]


def test_gptq_v1_zero_is_stored_plus_one_and_g_idx_picks_the_group() -> None:
    qweight = np.full((1, 8), WORD)  # K = 8 rows: codes 1..8 down every column
    qzeros = np.array([[0x00000000], [0x11111111]])  # stored 0 → zero 1; stored 1 → zero 2
    scales = np.array([[1.0] * 8, [10.0] * 8])
    g_idx = np.array([1, 0, 0, 0, 0, 0, 0, 1])
    w = dequantize_int4(qweight, qzeros, scales, g_idx, 4, "gptq")
    assert w[:, 0].tolist() == [(1 - 2) * 10.0, 1, 2, 3, 4, 5, 6, (8 - 2) * 10.0]
    contiguous = dequantize_int4(qweight, qzeros, scales, None, 4, "gptq")
    assert contiguous[:, 0].tolist() == [0, 1, 2, 3, 30, 40, 50, 60]
    sym = dequantize_int4(qweight, None, scales[:1], None, -1, "gptq")  # no zeros: bias 8
    assert sym[:, 0].tolist() == [-7, -6, -5, -4, -3, -2, -1, 0]
    x = np.ones((1, 8))
    assert int4_w4a16_gemm(x, qweight, None, scales[:1], None, -1, "gptq")[0, 0] == -28.0


def test_block_fp8_scales_are_indexed_n_block_then_k_block() -> None:
    a = np.ones((1, 4))
    b = np.ones((2, 4))  # N = 2, K = 4; blocks of 1 × 2
    b_scale = np.array([[1.0, 2.0], [3.0, 4.0]])  # [n_block, k_block]
    out = block_fp8_gemm(a, None, b, b_scale, 1, 2)
    assert out.tolist() == [[1 + 1 + 2 + 2, 3 + 3 + 4 + 4]]
    a_scale = np.array([[10.0, 100.0]])  # one per 1 × 2 activation group
    assert block_fp8_gemm(a, a_scale, b, b_scale, 1, 2).tolist() == [[20 + 400, 60 + 800]]
