"""RoPE reference against hand-computed rotations and RoPE's analytic properties."""

from __future__ import annotations

import numpy as np
import pytest

from reference_kernels.rope import cos_sin_cache_float64, rope, rotate_heads


def _cache(rows: list[tuple[list[float], list[float]]]) -> np.ndarray:
    """A cache from explicit (cos, sin) rows."""
    return np.array([c + s for c, s in rows], dtype=np.float64)


def test_quarter_turn_neox_and_gptj_pair_different_elements() -> None:
    # head_size 4, rotary_dim 4: two frequencies; position 1 rotates both pairs by 90°.
    cache = _cache([([1.0, 1.0], [0.0, 0.0]), ([0.0, 0.0], [1.0, 1.0])])
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    pos = np.array([1])
    # neox pairs (x0, x2) and (x1, x3): (a, b) -> (-b, a)
    assert rotate_heads(pos, x, cache, 4, True).tolist() == [[-3.0, -4.0, 1.0, 2.0]]
    # GPT-J pairs (x0, x1) and (x2, x3)
    assert rotate_heads(pos, x, cache, 4, False).tolist() == [[-2.0, 1.0, -4.0, 3.0]]


def test_position_zero_is_identity_and_positions_pick_rows() -> None:
    cache = cos_sin_cache_float64(8, 4)
    x = np.arange(8, dtype=np.float64).reshape(1, 8)  # two heads of 4
    assert np.array_equal(rotate_heads(np.array([0]), x, cache, 4, True), x)
    # Two tokens with different positions get the rotations of their own rows.
    xs = np.vstack([x, x])
    out = rotate_heads(np.array([3, 5]), xs, cache, 4, False)
    assert np.allclose(out[0], rotate_heads(np.array([3]), x, cache, 4, False)[0])
    assert np.allclose(out[1], rotate_heads(np.array([5]), x, cache, 4, False)[0])
    assert not np.allclose(out[0], out[1])


def test_hand_computed_angle() -> None:
    theta = 0.3
    cache = _cache([([np.cos(theta)], [np.sin(theta)])])
    got = rotate_heads(np.array([0]), np.array([[2.0, 5.0]]), cache, 2, True)
    assert np.allclose(got, [[2 * np.cos(theta) - 5 * np.sin(theta), 5 * np.cos(theta) + 2 * np.sin(theta)]])


def test_partial_rotary_leaves_the_tail_unchanged() -> None:
    cache = cos_sin_cache_float64(64, 4)  # rotary_dim 4 of head_size 8
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16))
    out = rotate_heads(np.array([7, 20, 63]), x, cache, 8, True)
    heads_in, heads_out = x.reshape(3, 2, 8), out.reshape(3, 2, 8)
    assert np.array_equal(heads_out[..., 4:], heads_in[..., 4:])
    assert not np.allclose(heads_out[..., :4], heads_in[..., :4])


@pytest.mark.parametrize("is_neox", [True, False])
def test_norm_preserved_and_scores_depend_only_on_relative_position(is_neox: bool) -> None:
    cache = cos_sin_cache_float64(200, 16)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 16))
    k = rng.standard_normal((1, 16))
    rq = rotate_heads(np.array([150]), q, cache, 16, is_neox)
    assert np.isclose(np.linalg.norm(rq), np.linalg.norm(q))

    def score(m: int, n: int) -> float:
        return float(rotate_heads(np.array([m]), q, cache, 16, is_neox)[0]
                     @ rotate_heads(np.array([n]), k, cache, 16, is_neox)[0])

    assert np.isclose(score(120, 100), score(20, 0))
    assert np.isclose(score(199, 190), score(9, 0))


def test_rope_rotates_query_and_key_with_different_head_counts() -> None:
    cache = cos_sin_cache_float64(10, 4)
    q = np.ones((2, 4 * 4))
    k = np.ones((2, 4 * 2))
    qo, ko = rope(np.array([1, 2]), q, k, cache, 4, True)
    assert qo.shape == (2, 16) and ko.shape == (2, 8)
    assert np.allclose(qo.reshape(2, 4, 4)[:, 0], ko.reshape(2, 2, 4)[:, 1])


def test_bad_arguments_raise() -> None:
    cache = cos_sin_cache_float64(4, 4)
    with pytest.raises(ValueError):
        rotate_heads(np.array([4]), np.ones((1, 4)), cache, 4, True)  # position past the cache
    with pytest.raises(ValueError):
        rotate_heads(np.array([0]), np.ones((1, 6)), cache, 4, True)  # width not a multiple
    with pytest.raises(ValueError):
        rotate_heads(np.array([0]), np.ones((1, 2)), cache, 2, True)  # rotary_dim > head_size
