"""Weight-quantized GEMMs as checkpoints store them: int4 weight-only (GPTQ, AWQ) and
DeepSeek-V3-style block fp8 (W8A8 with per-token-group activation scales, or W8A16).

What goes wrong: a zero point off by one (GPTQ v1 stores zero - 1; AWQ stores it as is),
AWQ's interleaved nibble order [0, 2, 4, 6, 1, 3, 5, 7] not undone, act-order's ``g_idx``
ignored (groups taken as k // group_size), scales applied per the wrong group size, fp8
block scales indexed [k_block, n_block] instead of [n_block, k_block], one activation scale
used for a whole tensor instead of one per 1×128 group.

The inputs make each of those visible: codes, zeros and scales are drawn independently
(scales over a 4× spread per group and per block), act-order cases use a random permutation,
block counts along N and K differ. The layouts and the GPTQ v1 zero convention are in
reference_kernels/quant_weight.py; the tensors are packed by adaptcheck/frameworks/quant_pack.py
(the checkpoint writer's packers), which the reference unpacks independently.

The torch implementations (``native``) are the path a model without kernels takes: unpack
and dequantize the whole weight (in float32), cast it to the activation dtype and multiply.

Tolerances: int4 GEMM ``reduction`` (its output is a GEMM in the activation dtype over
exactly representable dequantized weights: the reduction class's figures apply as they are).
Block fp8 ``fp8_gemm``: W8A8 is an fp8 GEMM like fp8_scaled_gemm (its fp32 output is only as
exact as the fp8 MMA accumulator, measured on an H200: matrices/tolerances.yaml); W8A16
kernels dequantize the fp8 weight into the 16-bit activation dtype (Marlin-fp8, vLLM's AMX
kernel), so an fp32 output is not held to 1e-5 either. The defects this op is for are
errors of order 1 (a wrong scale on whole blocks): 500× the fp8_gemm limits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.frameworks.quant_pack import AWQ_ORDER, Int4Weight, act_order_g_idx, expand_blocks
from adaptcheck.steps.ops.families.quant import fp8_flavour_scope, fp8_torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import quant_weight as ref


@contextmanager
def _backend_fp8(backend: Any) -> Iterator[None]:
    """OpDef.device_scope of block_fp8_gemm: the backend's fp8 flavour for the whole case."""
    with fp8_flavour_scope(backend.fp8_flavour):
        yield


def _shrink(m: int, n: int, k: int, factor: float, step: int) -> tuple[int, int, int]:
    """Smaller M, N, K for a slow device, N and K kept multiples of ``step``."""
    side = math.sqrt(max(factor, 0.0))
    m2 = max(1, int(m * side))
    n2 = max(step, int(n * side) // step * step)
    rest = factor * (m * n) / (m2 * n2)
    k2 = max(step, int(k * min(1.0, rest)) // step * step)
    return m2, n2, k2


# ------------------------------------------------------------------------------ int4 W4A16


class Int4GemmCase(CaseBase):
    """out[M, N] = x[M, K] @ W[K, N], W = (code - zero[g(k)]) · scale[g(k)] from a GPTQ or AWQ layout."""

    m: int = Field(ge=1, description="Tokens (1: decode, 64: prefill).")
    n: int = Field(ge=32, multiple_of=32, description="Output channels.")
    k: int = Field(ge=32, multiple_of=32, description="Input channels.")
    format: Literal["gptq", "awq"] = Field(description="Checkpoint layout: gptq (qweight packed along K, v1 zeros)"
                                           " | awq (packed along N, interleaved nibble order).")
    group_size: int = Field(default=128, description="K rows per scale group: 32, 64, 128 … or -1 (per channel).")
    sym: bool = Field(default=False, description="Symmetric: zero 8 (GPTQ stores 7s in qzeros; AWQ has no qzeros).")
    act_order: bool = Field(default=False, description="GPTQ desc_act: groups follow a random permutation (g_idx).")

    @model_validator(mode="after")
    def _valid(self) -> Int4GemmCase:
        if self.group_size != -1 and (self.group_size < 8 or self.k % self.group_size):
            raise ValueError(f"group_size {self.group_size} must be -1 or divide K={self.k}")
        if self.act_order and self.format != "gptq":
            raise ValueError("act_order (desc_act) is a GPTQ option")
        return self

    def work(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def scaled(self, factor: float) -> Int4GemmCase:
        step = 32 if self.group_size == -1 else max(32, self.group_size)
        m, n, k = _shrink(self.m, self.n, self.k, factor, step)
        return self.model_copy(update={"m": m, "n": n, "k": max(k, step)})


def _int4_inputs(case: Int4GemmCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    k, n = case.k, case.n
    size = k if case.group_size == -1 else case.group_size
    groups = k // size
    codes = torch.randint(0, 16, (k, n), generator=gen)
    zeros = (torch.full((groups, n), 8) if case.sym else torch.randint(1, 16, (groups, n), generator=gen))
    # A 4× spread between groups and channels: a scale from the wrong group is 1.6× off on average.
    scales = ((torch.rand(groups, n, generator=gen) * 3 + 1) * (0.5 / (15 * math.sqrt(k)))).to(tdt)
    if case.act_order:
        g_idx = act_order_g_idx(k, size, torch.randperm(k, generator=gen))
    else:
        g_idx = (torch.arange(k) // size).to(torch.int32)
    g = g_idx.long()
    w = Int4Weight(codes, zeros, scales, g_idx, case.group_size, case.sym,
                   (codes - zeros[g]).double() * scales.double()[g])
    tensors = w.gptq() if case.format == "gptq" else w.awq()
    x = torch.randn(case.m, k, generator=gen).to(tdt)
    kwargs: dict[str, Any] = {"x": x, "qweight": tensors["qweight"], "qzeros": tensors.get("qzeros"),
                              "scales": tensors["scales"], "g_idx": tensors.get("g_idx"),
                              "group_size": case.group_size, "fmt": case.format}
    notes = {"format": case.format, "groups": groups, "sym": case.sym, "act_order": case.act_order}
    return OpInputs(kwargs, notes=notes)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """[R, W] int32 → [R, W, 8] nibbles (nibble j: bits 4j..4j+3)."""
    shifts = torch.arange(8, device=words.device, dtype=torch.int32) * 4
    return (words.unsqueeze(-1) >> shifts) & 0xF  # arithmetic shift: the mask drops the sign bits


def int4_dequantize(qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor,
                    g_idx: torch.Tensor | None, group_size: int, fmt: str) -> torch.Tensor:
    """The [K, N] float32 weight of a GPTQ or AWQ layer (the torch fallback's dequantization)."""
    if fmt == "gptq":
        nib = _nibbles(qweight)  # [K/8, N, 8]
        codes = nib.permute(0, 2, 1).reshape(-1, qweight.shape[1])
    else:
        inverse = [AWQ_ORDER.index(c) for c in range(8)]  # column c sits in nibble AWQ_ORDER.index(c)
        codes = _nibbles(qweight)[:, :, inverse].reshape(qweight.shape[0], -1)
    k = codes.shape[0]
    if qzeros is None:
        zeros = torch.full_like(scales, 8, dtype=torch.int32)
    else:
        z = _nibbles(qzeros)
        if fmt == "awq":
            z = z[:, :, [AWQ_ORDER.index(c) for c in range(8)]]
        zeros = z.reshape(qzeros.shape[0], -1) + (1 if fmt == "gptq" else 0)
    if g_idx is None:
        size = k if group_size == -1 else group_size
        g = torch.arange(k, device=codes.device) // size
    else:
        g = g_idx.long()
    return (codes - zeros[g]).float() * scales.float()[g]


def int4_w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor,
                    g_idx: torch.Tensor | None, group_size: int, fmt: str) -> torch.Tensor:
    return x @ int4_dequantize(qweight, qzeros, scales, g_idx, group_size, fmt).to(x.dtype)


# ------------------------------------------------------------------------------ block fp8


class BlockFp8Case(CaseBase):
    """out = (a · a_scale[m, k // bk]) @ (b · b_scale[n // bn, k // bk])ᵀ, b fp8 e4m3 [N, K]."""

    m: int = Field(ge=1, description="Tokens.")
    n: int = Field(ge=1, description="Output channels (need not fill the last block).")
    k: int = Field(ge=1, description="Input channels (need not fill the last block).")
    act: Literal["w8a8", "w8a16"] = Field(
        default="w8a8", description="w8a8: fp8 activations with one scale per token and 1×block_k group |"
        " w8a16: activations in the checked dtype, no activation scale.")
    block_n: int = Field(default=128, ge=1, description="Weight block rows (DeepSeek-V3: 128).")
    block_k: int = Field(default=128, ge=1, description="Weight block columns and activation group (128).")

    def work(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def scaled(self, factor: float) -> BlockFp8Case:
        m, n, k = _shrink(self.m, self.n, self.k, factor, 1)
        return self.model_copy(update={"m": m, "n": n, "k": k})


def _block_fp8_inputs(case: BlockFp8Case, dtype: str, gen: torch.Generator) -> OpInputs:
    fdt = fp8_torch_dtype()
    fmax = torch.finfo(fdt).max
    kb, nb = -(-case.k // case.block_k), -(-case.n // case.block_n)

    def codes(shape: tuple[int, int]) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * fmax / 4).clamp(-fmax, fmax).to(fdt)

    def spread(shape: tuple[int, int]) -> torch.Tensor:
        return torch.rand(shape, generator=gen, dtype=torch.float64) * 3 + 1

    b = codes((case.n, case.k))
    # Dequantized weights ~ 1/sqrt(K) with a 4× spread between blocks.
    b_scale = (spread((nb, kb)) * 4 / (fmax * math.sqrt(case.k))).float()
    if case.act == "w8a8":
        a = codes((case.m, case.k))
        a_scale: torch.Tensor | None = (spread((case.m, kb)) * 2 / fmax).float()
    else:
        a, a_scale = torch.randn(case.m, case.k, generator=gen).to(torch_dtype(dtype)), None
    kwargs: dict[str, Any] = {"a": a, "a_scale": a_scale, "b": b, "b_scale": b_scale, "block_n": case.block_n,
                              "block_k": case.block_k, "out_dtype": torch_dtype(dtype)}
    return OpInputs(kwargs, notes={"act": case.act, "blocks": [nb, kb], "flavour": str(fdt).rsplit(".", 1)[-1]})


def block_fp8_gemm(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor, b_scale: torch.Tensor,
                   block_n: int, block_k: int, out_dtype: torch.dtype) -> torch.Tensor:
    n, k = b.shape
    w = b.float() * expand_blocks(b_scale.float(), n, k, block_n, block_k)
    af = a.float()
    if a_scale is not None:
        af = af * expand_blocks(a_scale.float(), a.shape[0], k, 1, block_k)
    return (af @ w.t()).to(out_dtype)


OPS = [
    OpDef(
        name="int4_w4a16_gemm", family="quant_weight",
        description="int4 weight-only GEMM from a GPTQ (v1 zeros, act-order g_idx) or AWQ (interleaved) checkpoint layout.",
        signature=("int4_w4a16_gemm(x: [M, K], qweight: int32 [K/8, N] (gptq) | [K, N/8] (awq), qzeros: int32"
                   " [G, N/8] | None, scales: [G, N] (x's dtype), g_idx: int32 [K] | None, group_size: int (-1:"
                   " per channel), fmt: 'gptq' | 'awq') -> out: [M, N] (x's dtype)"),
        case_model=Int4GemmCase, make_inputs=_int4_inputs, reference=ref.int4_w4a16_gemm, native=int4_w4a16_gemm,
        outputs=("out",), tolerance=("reduction",),
    ),
    OpDef(
        name="block_fp8_gemm", family="quant_weight",
        description="DeepSeek-V3 block fp8 GEMM: 128×128 weight block scales; fp8 activations with 1×128 group scales (W8A8) or 16-bit activations (W8A16).",
        signature=("block_fp8_gemm(a: [M, K] float8 (w8a8) | checked dtype (w8a16), a_scale: [M, ceil(K/block_k)]"
                   " float32 | None, b: [N, K] float8, b_scale: [ceil(N/block_n), ceil(K/block_k)] float32,"
                   " block_n: int, block_k: int, out_dtype: torch.dtype) -> out: [M, N] out_dtype"),
        case_model=BlockFp8Case, make_inputs=_block_fp8_inputs, reference=ref.block_fp8_gemm, native=block_fp8_gemm,
        outputs=("out",), tolerance=("fp8_gemm",), requires=("fp8_e4m3",), device_scope=_backend_fp8,
    ),
]
