"""Weight-quantized GEMM variants shared by tests/steps/ops/test_quant_weight.py and
benchmarks/family_quant_ops.py: correct reformulations (as fused kernels compute) and the
planted defects issue 30 names (a zero point off by one, AWQ's order not undone, act-order's
g_idx ignored, the group size halved, block scales indexed transposed, one activation scale
per tensor)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from adaptcheck.frameworks.quant_pack import expand_blocks
from adaptcheck.steps.ops.families import quant_weight as qw


def int4_factored(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor,
                  g_idx: torch.Tensor | None, group_size: int, fmt: str) -> torch.Tensor:
    """Correct, as fused kernels factor it: per group, s ⊙ (x·q) − s·z ⊙ Σx, summed over groups."""
    w = qw.int4_dequantize(qweight, qzeros, torch.ones_like(scales), g_idx, group_size, fmt)  # code − zero
    k = w.shape[0]
    g = qw_group(k, group_size, g_idx)
    out = torch.zeros(x.shape[0], w.shape[1])
    for grp in reversed(range(scales.shape[0])):
        rows = g == grp
        out += (x[:, rows].float() @ w[rows]) * scales[grp].float()
    return out.to(x.dtype)


def qw_group(k: int, group_size: int, g_idx: torch.Tensor | None) -> torch.Tensor:
    if g_idx is not None:
        return g_idx.long()
    return torch.arange(k) // (k if group_size == -1 else group_size)


def int4_zero_off_by_one(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor,
                         g_idx: torch.Tensor | None, group_size: int, fmt: str) -> torch.Tensor:
    """Reads GPTQ's stored zero as the zero (no +1 of the v1 format); AWQ's zero taken +1."""
    w = qw.int4_dequantize(qweight, qzeros, scales, g_idx, group_size, fmt).double()
    g = qw_group(w.shape[0], group_size, g_idx)
    return (x.double() @ (w + scales.double()[g] * (1 if fmt == "gptq" else -1))).to(x.dtype)


def int4_awq_order_kept(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor,
                        g_idx: torch.Tensor | None, group_size: int, fmt: str) -> torch.Tensor:
    """Unpacks AWQ words in plain nibble order (the interleave [0,2,4,6,1,3,5,7] not undone)."""
    def plain(words: torch.Tensor) -> torch.Tensor:
        nib = qw._nibbles(words)
        return nib.reshape(words.shape[0], -1)

    codes = plain(qweight)
    zeros = plain(qzeros) if qzeros is not None else torch.full_like(codes[: scales.shape[0]], 8)
    g = qw_group(codes.shape[0], group_size, g_idx)
    return (x.float() @ ((codes - zeros[g]).float() * scales.float()[g])).to(x.dtype)


def int4_ignores_g_idx(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor,
                       g_idx: torch.Tensor | None, group_size: int, fmt: str) -> torch.Tensor:
    """Groups taken as k // group_size whatever g_idx says (act-order lost)."""
    return qw.int4_w4a16_gemm(x, qweight, qzeros, scales, None, group_size, fmt)


def int4_half_group(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor,
                    g_idx: torch.Tensor | None, group_size: int, fmt: str) -> torch.Tensor:
    """Scales applied per group_size/2 rows (per 64 when the checkpoint says 128), clamped to the last group."""
    k = qweight.shape[0] * (8 if fmt == "gptq" else 1)
    half = (k if group_size == -1 else group_size) // 2
    wrong = (torch.arange(k) // half).clamp(max=scales.shape[0] - 1).to(torch.int32)
    return qw.int4_w4a16_gemm(x, qweight, qzeros, scales, wrong, group_size, fmt)


def block_fp8_per_k_block(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor, b_scale: torch.Tensor,
                          block_n: int, block_k: int, out_dtype: torch.dtype) -> torch.Tensor:
    """Correct, as DeepSeek's kernel: fp32 partial products per K block, scaled, then summed."""
    n, k = b.shape
    out = torch.zeros(a.shape[0], n)
    for kb in reversed(range(b_scale.shape[1])):
        cols = slice(kb * block_k, min(k, (kb + 1) * block_k))
        part = a[:, cols].float() @ b[:, cols].float().t()
        sb = b_scale[:, kb].float().repeat_interleave(block_n)[:n]
        sa = a_scale[:, kb:kb + 1].float() if a_scale is not None else 1.0
        out += part * sb * sa
    return out.to(out_dtype)


def block_fp8_scales_transposed(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor,
                                b_scale: torch.Tensor, block_n: int, block_k: int,
                                out_dtype: torch.dtype) -> torch.Tensor:
    """Reads the [N/bn, K/bk] block scales as if stored [K/bk, N/bn] (indexed [k_block, n_block])."""
    nb, kb = b_scale.shape
    as_kn = b_scale.reshape(kb, nb)  # the same memory, the other layout
    n, k = b.shape
    full = as_kn[torch.arange(k)[None, :] // block_k, torch.arange(n)[:, None] // block_n]
    af = a.float() * (expand_blocks(a_scale.float(), a.shape[0], k, 1, block_k) if a_scale is not None else 1.0)
    return (af @ (b.float() * full).t()).to(out_dtype)


def block_fp8_per_tensor_act_scale(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor,
                                   b_scale: torch.Tensor, block_n: int, block_k: int,
                                   out_dtype: torch.dtype) -> torch.Tensor:
    """One activation scale (the largest group's) for the whole tensor."""
    one = None if a_scale is None else torch.full_like(a_scale, float(a_scale.max()))
    return qw.block_fp8_gemm(a, one, b, b_scale, block_n, block_k, out_dtype)


HEALTHY: dict[str, list[Callable[..., Any]]] = {
    "int4_w4a16_gemm": [qw.int4_w4a16_gemm, int4_factored],
    "block_fp8_gemm": [qw.block_fp8_gemm, block_fp8_per_k_block],
}
"""Op → correct implementations: the torch provider's and a reformulation."""

PLANTED: dict[str, list[Callable[..., Any]]] = {
    "int4_w4a16_gemm": [int4_zero_off_by_one, int4_awq_order_kept, int4_ignores_g_idx, int4_half_group],
    "block_fp8_gemm": [block_fp8_scales_transposed, block_fp8_per_tensor_act_scale],
}
"""Op → planted defects."""
