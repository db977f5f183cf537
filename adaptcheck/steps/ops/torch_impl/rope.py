"""Torch provider: RoPE, written the way a model's native path does it (vLLM ``forward_native``).

cos/sin are gathered from the float32 cache by position, the rotary part of each head is
rotated in float32 and written back into query and key in place (vLLM's kernels rotate in
place too); the tail of a partial rotary is never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox: bool) -> torch.Tensor:
    """Rotate ``x: [T, H*D]`` in place with ``cos, sin: [T, rotary_dim/2]`` (float32)."""
    tokens = x.shape[0]
    heads = x.view(tokens, -1, head_size)
    rotary_dim = 2 * cos.shape[-1]
    rot = heads[..., :rotary_dim].float()
    c, s = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    heads[..., :rotary_dim] = out.to(x.dtype)
    return x


def rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
         head_size: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache.index_select(0, positions).float().chunk(2, dim=-1)
    return _rotate_(query, cos, sin, head_size, is_neox), _rotate_(key, cos, sin, head_size, is_neox)


TORCH_OPS: dict[str, Callable[..., Any]] = {"rope": rope}
