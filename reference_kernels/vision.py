"""Vision-language encoder references (Qwen2-VL style), in float64.

* ``encoder_attention``: bidirectional softmax attention inside each image of a packed
  sequence. ``cu_seqlens = [0, n_0, n_0 + n_1, …]`` delimits the images; a token attends to
  every token of its own image (no causal mask) and to nothing outside it.
* ``patch_embed``: a Conv3d whose stride equals its kernel, applied to one patch per row, is a
  plain linear map: ``out[n, e] = Σ_{c,t,i,j} x[n, c, t, i, j] · w[e, c, t, i, j] + b[e]``,
  where each row of ``pixel_values`` is a patch flattened in (channel, frame, row, column) order.
* ``mrope``: multimodal RoPE. Every rotary frequency ``i`` belongs to one position axis
  (temporal, height or width) and takes its angle from that axis' position: chunked sections
  (Qwen2-VL: the first ``s_t`` frequencies temporal, the next ``s_h`` height, the last ``s_w``
  width) or interleaved (Qwen3-VL: frequency ``i`` is height when ``i % 3 == 1`` and
  ``i < 3 s_h``, width when ``i % 3 == 2`` and ``i < 3 s_w``, temporal otherwise). The
  rotation itself is neox style (pairs ``(x[i], x[i + rotary_dim/2])``).
* ``vision_rope_2d``: the ViT's 2-D RoPE: the first quarter of the frequencies of a head
  rotate by the patch's row, the second quarter by its column (neox pairs over the whole head).

Angles come from the ``cos_sin_cache`` the op receives (cos half then sin half per row), so the
references check the kernels, not how the cache was built.
"""

from __future__ import annotations

import itertools

import numpy as np


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def encoder_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens: np.ndarray,
                      scale: float) -> np.ndarray:
    """``[T, Hq, D]``: per image ``softmax(scale · q kᵀ) v`` over that image's tokens only.

    GQA: query head ``h`` reads kv head ``h // (Hq / Hk)``.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    t, hq = q.shape[:2]
    hk = k.shape[1]
    if hq % hk:
        raise ValueError(f"query heads {hq} not a multiple of kv heads {hk}")
    if cu[0] != 0 or cu[-1] != t or np.any(np.diff(cu) < 0):
        raise ValueError(f"cu_seqlens must rise from 0 to {t}, got {cu.tolist()}")
    kv_head = np.arange(hq) // (hq // hk)
    out = np.zeros_like(q)
    for start, end in itertools.pairwise(cu.tolist()):
        if end == start:
            continue
        qs = q[start:end].transpose(1, 0, 2)                 # [Hq, n, D]
        ks = k[start:end][:, kv_head].transpose(1, 0, 2)     # [Hq, n, D]
        vs = v[start:end][:, kv_head].transpose(1, 0, 2)
        probs = _softmax_rows(scale * qs @ ks.transpose(0, 2, 1))
        out[start:end] = (probs @ vs).transpose(1, 0, 2)
    return out


def patch_embed(pixel_values: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``[N, E]``: each flattened patch times the flattened kernel, plus the bias."""
    x = np.asarray(pixel_values, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    e = w.shape[0]
    if x.shape[1] != w[0].size:
        raise ValueError(f"patch rows of {x.shape[1]} values, kernel of {w[0].size}")
    out = x @ w.reshape(e, -1).T
    if bias is not None:
        out = out + np.asarray(bias, dtype=np.float64)[None, :]
    return out


def mrope_axes(half: int, mrope_section: np.ndarray | list[int], interleaved: bool) -> np.ndarray:
    """``[rotary_dim/2]`` int: the position axis (0 temporal, 1 height, 2 width) of each frequency."""
    s_t, s_h, s_w = (int(s) for s in mrope_section)
    if s_t + s_h + s_w != half:
        raise ValueError(f"mrope_section {[s_t, s_h, s_w]} does not add up to rotary_dim/2 = {half}")
    if not interleaved:
        return np.repeat(np.arange(3), [s_t, s_h, s_w])
    i = np.arange(half)
    axes = np.zeros(half, dtype=np.int64)
    axes[(i % 3 == 1) & (i < 3 * s_h)] = 1
    axes[(i % 3 == 2) & (i < 3 * s_w)] = 2
    return axes


def _rotate_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_size: int) -> np.ndarray:
    """``x: [T, H*head_size]`` with per-token ``cos, sin: [T, rotary_dim/2]``; the tail passes."""
    tokens, width = x.shape
    heads = x.reshape(tokens, width // head_size, head_size)
    half = cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]
    a, b = heads[..., :half], heads[..., half:2 * half]
    out = heads.copy()
    out[..., :half] = a * c - b * s
    out[..., half:2 * half] = b * c + a * s
    return out.reshape(tokens, width)


def mrope(positions: np.ndarray, query: np.ndarray, key: np.ndarray, cos_sin_cache: np.ndarray, head_size: int,
          mrope_section: np.ndarray, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """(query_out, key_out): frequency ``i`` rotated by ``positions[axis(i)]`` (see :func:`mrope_axes`)."""
    pos = np.asarray(positions, dtype=np.int64)
    cache = np.asarray(cos_sin_cache, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[0] != 3:
        raise ValueError(f"positions must be [3, T], got {pos.shape}")
    if pos.min() < 0 or pos.max() >= cache.shape[0]:
        raise ValueError(f"positions must lie in [0, {cache.shape[0]})")
    half = cache.shape[1] // 2
    axes = mrope_axes(half, mrope_section, interleaved)
    freq = np.arange(half)
    rows = pos[axes]                                         # [half, T]: each frequency's position
    cos = cache[rows, freq[:, None]].T                       # [T, half]
    sin = cache[rows, half + freq[:, None]].T
    q = np.asarray(query, dtype=np.float64)
    k = np.asarray(key, dtype=np.float64)
    return _rotate_neox(q, cos, sin, head_size), _rotate_neox(k, cos, sin, head_size)


def vision_rope_2d(q: np.ndarray, k: np.ndarray, pos_ids: np.ndarray,
                   cos_sin_cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q_out, k_out) ``[N, H, D]``: frequencies ``[0, D/4)`` by the row, ``[D/4, D/2)`` by the column."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    pos = np.asarray(pos_ids, dtype=np.int64)
    cache = np.asarray(cos_sin_cache, dtype=np.float64)
    n, h, d = q.shape
    quarter = cache.shape[1] // 2
    if 4 * quarter != d:
        raise ValueError(f"cache of {cache.shape[1]} columns does not fit head size {d} (needs D/2)")
    cos = np.concatenate([cache[pos[:, 0], :quarter], cache[pos[:, 1], :quarter]], axis=1)
    sin = np.concatenate([cache[pos[:, 0], quarter:], cache[pos[:, 1], quarter:]], axis=1)
    return (_rotate_neox(q.reshape(n, h * d), cos, sin, d).reshape(n, h, d),
            _rotate_neox(k.reshape(n, h * d), cos, sin, d).reshape(n, h, d))
