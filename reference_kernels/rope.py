"""Rotary position embedding (RoPE) reference, in float64.

For a token at position ``p`` and a rotary pair ``(x_a, x_b)`` with frequency index ``i``,
RoPE rotates the pair by the angle ``p · θ_i``::

    x_a' = x_a · cos(p θ_i) − x_b · sin(p θ_i)
    x_b' = x_b · cos(p θ_i) + x_a · sin(p θ_i)

The angles come from the cache the op receives (``cos_sin_cache[p] = [cos(p θ_0..), sin(p θ_0..)]``,
first half cos, second half sin, as vLLM lays it out), so the reference checks the rotation
and the gather, not how the cache was built. Which elements form a pair is the style:

* neox: ``(x[i], x[i + rotary_dim/2])`` — the two halves of the rotary part;
* GPT-J: ``(x[2i], x[2i + 1])`` — interleaved neighbours.

Only the first ``rotary_dim`` elements of each head rotate (partial rotary); the rest pass
through unchanged.
"""

from __future__ import annotations

import numpy as np


def rotate_heads(positions: np.ndarray, x: np.ndarray, cos_sin_cache: np.ndarray, head_size: int,
                 is_neox: bool) -> np.ndarray:
    """RoPE of one tensor ``x: [T, H * head_size]`` (or ``[T, H, head_size]``) → same shape, float64."""
    x = np.asarray(x, dtype=np.float64)
    shape = x.shape
    x = x.reshape(shape[0], -1)
    cache = np.asarray(cos_sin_cache, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.int64)
    tokens, width = x.shape
    if width % head_size:
        raise ValueError(f"row width {width} is not a multiple of head_size {head_size}")
    rotary_dim = cache.shape[1]
    if rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and at most head_size {head_size}")
    if positions.shape != (tokens,):
        raise ValueError(f"positions has shape {positions.shape}, expected ({tokens},)")
    if tokens and (positions.min() < 0 or positions.max() >= cache.shape[0]):
        raise ValueError(f"positions must lie in [0, {cache.shape[0]})")
    half = rotary_dim // 2

    heads = x.reshape(tokens, width // head_size, head_size)
    # One angle per (token, frequency); broadcast over heads.
    cos = cache[positions, :half][:, None, :]
    sin = cache[positions, half:][:, None, :]
    if is_neox:
        a_idx = np.arange(half)
        b_idx = a_idx + half
    else:
        a_idx = np.arange(0, rotary_dim, 2)
        b_idx = a_idx + 1
    x_a = heads[:, :, a_idx]
    x_b = heads[:, :, b_idx]
    out = heads.copy()  # the pass-through tail of a partial rotary stays as it was
    out[:, :, a_idx] = x_a * cos - x_b * sin
    out[:, :, b_idx] = x_b * cos + x_a * sin
    return out.reshape(shape)


def rope(positions: np.ndarray, query: np.ndarray, key: np.ndarray, cos_sin_cache: np.ndarray,
         head_size: int, is_neox: bool) -> tuple[np.ndarray, np.ndarray]:
    """(query_out, key_out): both tensors rotated with the same positions and cache."""
    return (rotate_heads(positions, query, cos_sin_cache, head_size, is_neox),
            rotate_heads(positions, key, cos_sin_cache, head_size, is_neox))


def cos_sin_cache_float64(max_position: int, rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    """The exact cache ``[max_position, rotary_dim]``: θ_i = base^(−2i / rotary_dim).

    Used by the unit tests (and to measure how far a float32-built cache is from exact);
    the op's inputs carry their own cache.
    """
    inv_freq = base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    angles = np.arange(max_position, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1)
