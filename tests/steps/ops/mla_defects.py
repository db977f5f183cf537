"""Planted MLA defects (shared by tests/steps/ops/test_mla.py and benchmarks/family_mla_ops.py).

Each defect is one realistic mistake, switched on in an otherwise correct implementation: the
torch provider's own functions with a changed argument, or vLLM's adapter handed the changed
argument, so that the very code a check runs is what carries the defect.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from adaptcheck.steps.ops.families import mla as fm

Fn = Callable[..., torch.Tensor]


def _swap_halves(kv_b_proj: torch.Tensor, nope: int) -> torch.Tensor:
    """kv_b_proj with its per-head W_UK and W_UV rows exchanged (P == V, so the shapes still fit)."""
    return torch.cat((kv_b_proj[:, nope:], kv_b_proj[:, :nope]), dim=1)


def _uv_from_uk(kv_b_proj: torch.Tensor, nope: int) -> torch.Tensor:
    """kv_b_proj whose value rows are its key rows: the up-projection applied with W_UK."""
    return torch.cat((kv_b_proj[:, :nope], kv_b_proj[:, :nope]), dim=1)


def decode_defects(impl: Fn) -> dict[str, Fn]:
    """Planted defects around an ``mla_decode`` implementation (torch's or vLLM's)."""

    def halves_swapped(**kw: Any) -> torch.Tensor:
        return impl(**{**kw, "kv_b_proj": _swap_halves(kw["kv_b_proj"], kw["q_nope"].shape[-1])})

    def up_projection_with_w_uk(**kw: Any) -> torch.Tensor:
        return impl(**{**kw, "kv_b_proj": _uv_from_uk(kw["kv_b_proj"], kw["q_nope"].shape[-1])})

    def rope_dropped(**kw: Any) -> torch.Tensor:
        return impl(**{**kw, "q_pe": torch.zeros_like(kw["q_pe"])})

    def scale_of_kv_lora_rank(**kw: Any) -> torch.Tensor:
        return impl(**{**kw, "scale": 1.0 / math.sqrt(kw["kv_c_cache"].shape[-1])})

    def scale_of_nope_dim(**kw: Any) -> torch.Tensor:
        return impl(**{**kw, "scale": 1.0 / math.sqrt(kw["q_nope"].shape[-1])})

    def last_partial_block_ignored(**kw: Any) -> torch.Tensor:
        block = kw["kv_c_cache"].shape[1]
        return impl(**{**kw, "seq_lens": kw["seq_lens"] // block * block})

    return {f.__name__: f for f in (halves_swapped, up_projection_with_w_uk, rope_dropped, scale_of_kv_lora_rank,
                                     scale_of_nope_dim, last_partial_block_ignored)}


def prefill_defects(impl: Fn = fm.mla_prefill) -> dict[str, Fn]:
    """Planted defects around an ``mla_prefill`` implementation."""

    def halves_swapped(**kw: Any) -> torch.Tensor:
        return impl(**{**kw, "kv_b_proj": _swap_halves(kw["kv_b_proj"], kw["q_nope"].shape[-1])})

    def rope_dropped(**kw: Any) -> torch.Tensor:
        return impl(**{**kw, "q_pe": torch.zeros_like(kw["q_pe"])})

    def scale_of_kv_lora_rank(**kw: Any) -> torch.Tensor:
        return impl(**{**kw, "scale": 1.0 / math.sqrt(kw["kv_c"].shape[-1])})

    def scale_of_nope_dim(**kw: Any) -> torch.Tensor:
        return impl(**{**kw, "scale": 1.0 / math.sqrt(kw["q_nope"].shape[-1])})

    def causal_mask_missing(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                            kv_b_proj: torch.Tensor, scale: float) -> torch.Tensor:
        # The native path with SDPA's is_causal off: every query sees the whole sequence.
        tokens, heads, nope = q_nope.shape
        width = kv_b_proj.shape[1]
        kv = torch.nn.functional.linear(kv_c, kv_b_proj.reshape(heads * width, -1)).view(tokens, heads, width)
        k = torch.cat((kv[..., :nope], k_pe[:, None, :].expand(-1, heads, -1)), dim=-1)
        q = torch.cat((q_nope, q_pe), dim=-1)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), kv[..., nope:].transpose(0, 1), scale=scale)
        return out.transpose(0, 1).contiguous()

    return {f.__name__: f for f in (halves_swapped, rope_dropped, scale_of_kv_lora_rank, scale_of_nope_dim,
                                     causal_mask_missing)}
