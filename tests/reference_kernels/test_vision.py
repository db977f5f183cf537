"""Vision references against known values and against the plain RoPE / attention references."""

from __future__ import annotations

import numpy as np

from reference_kernels import rope as rope_ref
from reference_kernels import vision as ref


def test_encoder_attention_stays_inside_each_image() -> None:
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(5, 2, 4)), np.zeros((5, 2, 4))
    v = rng.normal(size=(5, 2, 4))
    out = ref.encoder_attention(q, k, v, np.array([0, 1, 5]), 0.5)
    # Equal keys: each token averages its own image's values; a one-token image returns its value.
    assert np.allclose(out[0], v[0])
    assert np.allclose(out[1:], v[1:].mean(axis=0, keepdims=True))


def test_encoder_attention_gqa_reads_kv_head_h_over_group() -> None:
    v = np.stack([np.full((3, 4), 1.0), np.full((3, 4), 2.0)], axis=1)  # kv head 0 → 1, head 1 → 2
    out = ref.encoder_attention(np.zeros((3, 4, 4)), np.zeros((3, 2, 4)), v, np.array([0, 3]), 1.0)
    assert out[0, :, 0].tolist() == [1.0, 1.0, 2.0, 2.0]


def test_patch_embed_is_the_flattened_kernel_dot_the_patch() -> None:
    w = np.zeros((2, 3, 2, 2, 2))
    w[0, 1, 0, 1, 0] = 1.0  # channel 1, frame 0, row 1, column 0
    w[1, 2, 1, 0, 1] = 3.0  # channel 2, frame 1, row 0, column 1
    x = np.arange(24.0)[None, :]  # (c, t, i, j) flattened: index c*8 + t*4 + i*2 + j
    assert ref.patch_embed(x, w, np.array([0.5, 0.0])).tolist() == [[10.5, 3.0 * 21]]


def test_mrope_with_equal_rows_is_plain_rope() -> None:
    rng = np.random.default_rng(1)
    cache = rope_ref.cos_sin_cache_float64(64, 32)
    pos = rng.integers(0, 64, size=7)
    q, k = rng.normal(size=(7, 2 * 32)), rng.normal(size=(7, 32))
    got = ref.mrope(np.stack([pos] * 3), q, k, cache, 32, np.array([4, 6, 6]), False)
    want = rope_ref.rope(pos, q, k, cache, 32, True)
    assert all(np.allclose(g, w) for g, w in zip(got, want, strict=True))


def test_mrope_axes_chunked_and_interleaved() -> None:
    assert ref.mrope_axes(6, [2, 2, 2], False).tolist() == [0, 0, 1, 1, 2, 2]
    inter = ref.mrope_axes(64, [24, 20, 20], True)
    assert inter[:6].tolist() == [0, 1, 2, 0, 1, 2] and inter[60:].tolist() == [0, 0, 0, 0]
    assert np.bincount(inter).tolist() == [24, 20, 20]


def test_vision_rope_at_the_origin_is_the_identity_and_rows_rotate_the_first_quarter() -> None:
    cache = rope_ref.cos_sin_cache_float64(8, 8)  # head 16: 4 frequencies per axis
    x = np.random.default_rng(2).normal(size=(2, 1, 16))
    q, _ = ref.vision_rope_2d(x, x, np.array([[0, 0], [3, 0]]), cache)
    assert np.allclose(q[0], x[0])
    # Row 3, column 0: frequencies 4..7 (the column's) do not move: x[8+4 : 16] and x[4:8] stay.
    assert np.allclose(q[1, 0, 4:8], x[1, 0, 4:8]) and np.allclose(q[1, 0, 12:], x[1, 0, 12:])
    assert not np.allclose(q[1, 0, :4], x[1, 0, :4])
