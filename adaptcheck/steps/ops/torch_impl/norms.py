"""Torch provider: norms family.

RMSNorm follows the plain-torch path models take (vLLM's ``RMSNorm.forward_native``,
Hugging Face ``LlamaRMSNorm``): upcast to fp32, mean of squares, rsqrt, cast back, then
the weight in the model dtype. LayerNorm is ``torch.nn.functional.layer_norm``, which is
what ``nn.LayerNorm`` calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _rms_normalize_fp32(x32: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x32.pow(2).mean(dim=-1, keepdim=True)
    return x32 * torch.rsqrt(variance + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    normalized = _rms_normalize_fp32(x.to(torch.float32), eps).to(x.dtype)
    return normalized * weight


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    # The sum is formed in fp32 and normalized from there; the stream is stored rounded.
    summed = x.to(torch.float32) + residual.to(torch.float32)
    residual_out = summed.to(x.dtype)
    out = _rms_normalize_fp32(summed, eps).to(x.dtype) * weight
    return out, residual_out


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


TORCH_OPS: dict[str, Callable[..., Any]] = {
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "layer_norm": layer_norm,
}
