"""Weight-quantized GEMMs (int4 GPTQ/AWQ, block fp8): the torch path and a reformulated correct
kernel pass over seeds; each planted layout or scale defect fails in every dtype."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.frameworks.quant_pack import AWQ_ORDER, expand_blocks
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families import quant_weight as qw
from adaptcheck.steps.ops.providers.base import DictProvider

ALL = ["fp32", "bf16", "fp16"]
GPTQ = [{"name": "gptq_g128_prefill", "m": 64, "n": 128, "k": 512, "format": "gptq", "group_size": 128},
        {"name": "gptq_sym_g32_decode", "m": 1, "n": 96, "k": 256, "format": "gptq", "group_size": 32, "sym": True},
        {"name": "gptq_act_order_g64", "m": 8, "n": 64, "k": 256, "format": "gptq", "group_size": 64,
         "act_order": True},
        {"name": "gptq_per_channel", "m": 4, "n": 64, "k": 256, "format": "gptq", "group_size": -1}]
AWQ = [{"name": "awq_g128_prefill", "m": 64, "n": 128, "k": 512, "format": "awq", "group_size": 128},
       {"name": "awq_g64_decode", "m": 1, "n": 64, "k": 256, "format": "awq", "group_size": 64},
       {"name": "awq_sym_g32", "m": 4, "n": 64, "k": 128, "format": "awq", "group_size": 32, "sym": True}]
BLOCK = [{"name": "w8a8_prefill", "m": 64, "n": 384, "k": 256},
         {"name": "w8a8_decode_partial", "m": 1, "n": 320, "k": 384},
         {"name": "w8a16_prefill", "m": 16, "n": 384, "k": 256, "act": "w8a16"}]


def _ctx(seed: int) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run(op: str, fn: Callable[..., Any], cases: list[dict[str, Any]], dtypes: list[str] = ALL,
         seed: int = 0) -> dict[str, Status]:
    params = OpCheckParams(op=op, dtypes=dtypes, cases=cases, budget_s=120)
    return {str(o.subid): o.status for o in OpCheck(DictProvider("under_test", {op: fn})).run(_ctx(seed), params)}


# ------------------------------------------------------------------------------ int4


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
    wrong = (torch.arange(k) // (group_size // 2)).clamp(max=scales.shape[0] - 1).to(torch.int32)
    return qw.int4_w4a16_gemm(x, qweight, qzeros, scales, wrong, group_size, fmt)


@pytest.mark.parametrize("seed", range(5))
def test_int4_torch_and_factored_pass_across_seeds(seed: int) -> None:
    for fn in (qw.int4_w4a16_gemm, int4_factored):
        assert set(_run("int4_w4a16_gemm", fn, GPTQ + AWQ, seed=seed).values()) == {Status.PASS}, fn.__name__


@pytest.mark.parametrize(("name", "wrong", "cases"), [
    ("gptq zero off by one", int4_zero_off_by_one, GPTQ[:2]),
    ("gptq sym zero off by one", int4_zero_off_by_one, GPTQ[1:2]),
    ("awq zero off by one", int4_zero_off_by_one, AWQ[:1]),
    ("awq order not de-interleaved", int4_awq_order_kept, AWQ[:1]),
    ("awq order not de-interleaved (sym)", int4_awq_order_kept, AWQ[2:]),
    ("act-order g_idx ignored", int4_ignores_g_idx, GPTQ[2:3]),
    ("group 64 for 128 (gptq)", int4_half_group, GPTQ[:1]),
    ("group 64 for 128 (awq)", int4_half_group, AWQ[:1]),
])
def test_int4_defects_are_caught(name: str, wrong: Callable[..., Any], cases: list[dict[str, Any]]) -> None:
    assert _run("int4_w4a16_gemm", wrong, cases) == dict.fromkeys(ALL, Status.FAIL), name


def test_awq_order_and_act_order_inputs() -> None:
    op_case = qw.Int4GemmCase.model_validate(GPTQ[2])
    inputs = qw._int4_inputs(op_case, "fp32", torch.Generator().manual_seed(1))
    g_idx = inputs.kwargs["g_idx"]
    assert isinstance(g_idx, torch.Tensor)
    assert not torch.equal(g_idx.long(), torch.arange(256) // 64)  # a real permutation's groups
    assert torch.bincount(g_idx.long()).tolist() == [64] * 4
    assert AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    with pytest.raises(ValueError, match="GPTQ option"):
        qw.Int4GemmCase.model_validate({**AWQ[0], "act_order": True})


# ------------------------------------------------------------------------------ block fp8


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


@pytest.mark.parametrize("seed", range(5))
def test_block_fp8_torch_and_per_block_pass_across_seeds(seed: int) -> None:
    for fn in (qw.block_fp8_gemm, block_fp8_per_k_block):
        assert set(_run("block_fp8_gemm", fn, BLOCK, seed=seed).values()) == {Status.PASS}, fn.__name__


@pytest.mark.parametrize(("wrong", "cases"), [(block_fp8_scales_transposed, BLOCK[:1]),
                                              (block_fp8_scales_transposed, BLOCK[2:]),
                                              (block_fp8_per_tensor_act_scale, BLOCK[:1]),
                                              (block_fp8_per_tensor_act_scale, BLOCK[1:2])])
def test_block_fp8_defects_are_caught(wrong: Callable[..., Any], cases: list[dict[str, Any]]) -> None:
    assert _run("block_fp8_gemm", wrong, cases) == dict.fromkeys(ALL, Status.FAIL)
