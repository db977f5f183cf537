"""Torch provider: sampling family (greedy argmax; vLLM-style sort-based top-k/top-p mask)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits, dim=-1).to(torch.int64)


def top_k_top_p_mask(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Sort ascending, mask below the k-th largest, then mask the low end whose cumulative
    probability stays ≤ 1 - p (the top token always survives); scatter back."""
    vals, idx = logits.sort(dim=-1, descending=False)
    v = logits.shape[-1]
    kth = vals.gather(1, (v - k.to(torch.long)).unsqueeze(1))
    vals = vals.masked_fill(vals < kth, float("-inf"))
    # Probabilities in fp32 whatever the logits dtype, as a sampler does.
    cum = torch.softmax(vals.float(), dim=-1).cumsum(dim=-1)
    drop = cum <= (1.0 - p.float()).unsqueeze(1)
    drop[:, -1] = False
    vals = vals.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, idx, vals)


TORCH_OPS: dict[str, Callable[..., Any]] = {"greedy_sample": greedy_sample, "top_k_top_p_mask": top_k_top_p_mask}
