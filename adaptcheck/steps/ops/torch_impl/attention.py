"""Torch provider: attention through ``scaled_dot_product_attention``, the path a model takes
without custom kernels (Hugging Face's ``sdpa`` attention).

GQA is done as models do it, by repeating each kv head over its group of query heads
(``repeat_interleave``: query head h reads kv head h // group); sequence lengths become a
boolean mask; a paged cache is first gathered into contiguous per-sequence K/V through the
block tables. The cache write is an ``index_copy_`` into the flattened slots, in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def _expand_kv(x: torch.Tensor, group: int, head_dim: int) -> torch.Tensor:
    """Repeat each kv head ``group`` times along ``head_dim`` (contiguous groups, like HF's repeat_kv)."""
    return x if group == 1 else x.repeat_interleave(group, dim=head_dim)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    qh = q.transpose(0, 1)  # [Hq, T, D]
    kh = _expand_kv(k, group, 1).transpose(0, 1)
    vh = _expand_kv(v, group, 1).transpose(0, 1)
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    return out.transpose(0, 1).contiguous()


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float) -> torch.Tensor:
    max_len = k.shape[1]
    group = q.shape[1] // k.shape[2]
    kh = _expand_kv(k, group, 2).permute(0, 2, 1, 3)  # [B, Hq, S, D]
    vh = _expand_kv(v, group, 2).permute(0, 2, 1, 3)
    visible = torch.arange(max_len, device=k.device)[None, :] < seq_lens[:, None]  # [B, S]
    out = F.scaled_dot_product_attention(q[:, :, None, :], kh, vh, attn_mask=visible[:, None, None, :], scale=scale)
    return out[:, :, 0, :]


def paged_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    batch, max_blocks = block_tables.shape
    _, block_size, num_kv_heads, head_size = key_cache.shape
    # [B, max_blocks, block_size, Hk, D] -> [B, max_blocks * block_size, Hk, D]: token i at i.
    k = key_cache[block_tables].reshape(batch, max_blocks * block_size, num_kv_heads, head_size)
    v = value_cache[block_tables].reshape(batch, max_blocks * block_size, num_kv_heads, head_size)
    return decode_attention(q, k, v, seq_lens, scale)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    real = slot_mapping >= 0  # slot -1 is padding: never written
    slots = slot_mapping[real]
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slots, key[real])
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slots, value[real])
    return key_cache, value_cache


TORCH_OPS: dict[str, Callable[..., Any]] = {
    "prefill_attention": prefill_attention,
    "decode_attention": decode_attention,
    "paged_attention": paged_attention,
    "reshape_and_cache": reshape_and_cache,
}
