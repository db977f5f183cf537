"""Torch provider: MoE family, the expert-by-expert loop a model without a fused kernel runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk: int, renormalize: bool) -> torch.Tensor:
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        h = x[tok] @ w13[e].t()  # matmuls in the model dtype, as a model runs them
        act = F.silu(h[:, :inter]) * h[:, inter:]
        y = act @ w2[e].t()
        # Weighted sum across experts in fp32: several experts add into one row.
        out.index_add_(0, tok, y.float() * weights[tok, slot].unsqueeze(1))
    return out.to(x.dtype)


TORCH_OPS: dict[str, Callable[..., Any]] = {"fused_moe": fused_moe}
