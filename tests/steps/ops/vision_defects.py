"""Planted defects of the vision family's ops, shared by tests/steps/ops/test_vision.py and
benchmarks/family_vision_ops.py: each is the correct path with one realistic mistake switched on,
as a torch variant of the family's ``native`` function or as a wrapper around vLLM's own layer
(the ``vllm_`` ones; vLLM is imported only when they run).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from adaptcheck.steps.ops.families import vision
from adaptcheck.steps.ops.families.vision import rotate_neox_


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float, *,
               causal: bool, per_image: bool) -> torch.Tensor:
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    segment = torch.repeat_interleave(torch.arange(lens.shape[0]), lens)
    t = q.shape[0]
    mask = segment[:, None] == segment[None, :] if per_image else torch.ones(t, t, dtype=torch.bool)
    if causal:
        mask = mask & torch.ones(t, t, dtype=torch.bool).tril()
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1),
                                         attn_mask=mask, scale=scale)
    return out.transpose(0, 1).contiguous()


def attention_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """The decoder's causal mask kept in the ViT (within each image)."""
    return _attention(q, k, v, cu_seqlens, scale, causal=True, per_image=True)


def attention_across_images(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """cu_seqlens ignored: the packed images attend to each other."""
    return _attention(q, k, v, cu_seqlens, scale, causal=False, per_image=False)


def attention_per_image_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                             scale: float) -> torch.Tensor:
    """Correct, written differently: one softmax(q kᵀ) v per image in float32, as an eager loop."""
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    bounds = cu_seqlens.tolist()
    for s, e in itertools.pairwise(bounds):
        qs = q[s:e].float().transpose(0, 1)
        ks = k[s:e].float().repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[s:e].float().repeat_interleave(group, dim=1).transpose(0, 1)
        out[s:e] = (torch.softmax(scale * qs @ ks.transpose(1, 2), dim=-1) @ vs).transpose(0, 1).to(q.dtype)
    return out


def patch_frame_major(pixel_values: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Patch rows read as (frame, channel, row, column): C and T transposed."""
    e, c, t, p, _ = weight.shape
    n = pixel_values.shape[0]
    x = pixel_values.reshape(n, t, c, p, p).transpose(1, 2)
    return F.conv3d(x, weight, bias, stride=(t, p, p)).view(n, e)


def patch_as_linear(pixel_values: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Correct, written differently: the stride = kernel Conv3d as one matmul (what vLLM runs)."""
    out = pixel_values @ weight.reshape(weight.shape[0], -1).t()
    return out + bias if bias is not None else out


def _mrope_with_axes(name: str,
                     axes_of: Callable[[int, list[int], bool, torch.device], torch.Tensor]) -> Callable[..., Any]:
    def fn(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
           head_size: int, mrope_section: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
        half = cos_sin_cache.shape[1] // 2
        axes = axes_of(half, [int(s) for s in mrope_section.tolist()], interleaved, positions.device)
        rows = positions.index_select(0, axes)
        cols = torch.arange(half)[:, None]
        cos, sin = cos_sin_cache[rows, cols].t().float(), cos_sin_cache[rows, cols + half].t().float()
        return rotate_neox_(query, cos, sin, head_size), rotate_neox_(key, cos, sin, head_size)
    fn.__name__ = name
    return fn


mrope_hw_swapped = _mrope_with_axes("mrope_hw_swapped",
                                    lambda h, s, i, d: torch.tensor([0, 2, 1])[vision.mrope_axes(h, s, i, d)])
"""The height section reads the width positions and the reverse."""

mrope_temporal_only = _mrope_with_axes("mrope_temporal_only", lambda h, s, i, d: torch.zeros(h, dtype=torch.int64))
"""Plain 1-D RoPE: the temporal row for every frequency (exact on text tokens only)."""

mrope_chunked_always = _mrope_with_axes("mrope_chunked_always",
                                        lambda h, s, i, d: vision.mrope_axes(h, s, False, d))
"""The interleaved flag ignored: Qwen3-VL's interleaved sections laid out as Qwen2-VL's chunks."""


def vision_rope_hw_swapped(q: torch.Tensor, k: torch.Tensor, pos_ids: torch.Tensor,
                           cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows and columns swapped (pos_ids read as (column, row))."""
    return vision.vision_rope_2d(q, k, pos_ids.flip(1), cos_sin_cache)


# ---- the same mistakes around vLLM's layers (the vllm provider's adapters with one input changed)


def vllm_attention_across_images(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                                 scale: float) -> torch.Tensor:
    """vLLM's MMEncoderAttention handed one segment over all images."""
    from adaptcheck.steps.ops.providers import vllm_vision

    whole = torch.tensor([0, q.shape[0]], dtype=cu_seqlens.dtype)
    return vllm_vision.encoder_attention(q, k, v, whole, scale)


def vllm_mrope_text_positions(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                              cos_sin_cache: torch.Tensor, head_size: int, mrope_section: torch.Tensor,
                              interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's MRotaryEmbedding given 1-D (temporal) positions: it then runs plain RoPE."""
    from adaptcheck.steps.ops.providers import vllm_vision

    return vllm_vision.mrope(positions[0].contiguous(), query, key, cos_sin_cache, head_size, mrope_section,
                             interleaved)


def vllm_mrope_hw_swapped(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                          cos_sin_cache: torch.Tensor, head_size: int, mrope_section: torch.Tensor,
                          interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's MRotaryEmbedding with the height and width position rows swapped."""
    from adaptcheck.steps.ops.providers import vllm_vision

    return vllm_vision.mrope(positions[[0, 2, 1]].contiguous(), query, key, cos_sin_cache, head_size,
                             mrope_section, interleaved)


def vllm_patch_frame_major(pixel_values: torch.Tensor, weight: torch.Tensor,
                           bias: torch.Tensor | None) -> torch.Tensor:
    """vLLM's Conv3dLayer fed rows flattened (frame, channel, …) instead of (channel, frame, …)."""
    from adaptcheck.steps.ops.providers import vllm_vision

    c, t, p = weight.shape[1:4]
    n = pixel_values.shape[0]
    reordered = pixel_values.reshape(n, c, t, p * p).transpose(1, 2).reshape(n, -1)
    return vllm_vision.patch_embed(reordered, weight, bias)
