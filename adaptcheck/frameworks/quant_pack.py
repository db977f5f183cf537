"""Packing and quantizing Linear weights into the published checkpoint layouts: GPTQ and AWQ
int4 words, per-channel int8, DeepSeek-style 128×128 block fp8. Torch only; used by the
checkpoint writer (quant_writer.py) and by step 3's weight-quantized op inputs.

Each quantizer returns the codes, the stored tensors and the exact dequantized weight in
float64, so a float64 reference of the quantized model needs no unpacking of its own. The
layouts and the GPTQ v1 zero convention are described in reference_kernels/quant_weight.py,
whose independent NumPy unpacker is what the tests hold these packers to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Nibble i of an AWQ word holds column AWQ_ORDER[i] of its eight (AutoAWQ's GEMM packing)."""

_SHIFTS = torch.arange(8, dtype=torch.int64) * 4


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """uint32 bit patterns held in int64 → int32 with the same bits (two's complement)."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """Codes [K, N] (0..15) → GPTQ words [K/8, N]: rows 8i..8i+7 in nibbles 0..7 of word i."""
    k, n = codes.shape
    if k % 8:
        raise ValueError(f"K={k} is not a multiple of 8")
    c = codes.to(torch.int64).reshape(k // 8, 8, n)
    return _to_int32((c << _SHIFTS[None, :, None]).sum(dim=1))


def pack_cols(codes: torch.Tensor, awq: bool = False) -> torch.Tensor:
    """Codes [R, N] → words [R, N/8] packed along N; nibble i holds column i (or AWQ_ORDER[i])."""
    r, n = codes.shape
    if n % 8:
        raise ValueError(f"N={n} is not a multiple of 8")
    c = codes.to(torch.int64).reshape(r, n // 8, 8)
    if awq:
        c = c[:, :, list(AWQ_ORDER)]  # nibble i ← column AWQ_ORDER[i]
    return _to_int32((c << _SHIFTS).sum(dim=2))


@dataclass
class Int4Weight:
    """One Linear layer quantized to 4 bits, in both checkpoint layouts' raw parts."""

    codes: torch.Tensor
    """[K, N] int64 codes 0..15 (K = in_features)."""
    zeros: torch.Tensor
    """[G, N] int64 zero points as applied (8 everywhere when symmetric)."""
    scales: torch.Tensor
    """[G, N] scales, in the dtype they are stored in."""
    g_idx: torch.Tensor
    """[K] int32 group of each input row (a permutation's groups under act-order)."""
    group_size: int
    """Rows per group; -1 (one group over K) as configs spell per-channel."""
    sym: bool
    dequantized: torch.Tensor
    """[K, N] float64: (code - zero[g]) · scale[g], exact."""

    def gptq(self) -> dict[str, torch.Tensor]:
        """GPTQ v1 tensors: qweight [K/8, N], qzeros [G, N/8] holding zero - 1, scales, g_idx."""
        return {"qweight": pack_rows(self.codes), "qzeros": pack_cols(self.zeros - 1), "scales": self.scales,
                "g_idx": self.g_idx}

    def awq(self) -> dict[str, torch.Tensor]:
        """AWQ tensors: qweight [K, N/8] and qzeros [G, N/8] in AWQ's interleaved order, scales.

        Symmetric: no qzeros (zero 8, vLLM's uint4b8). Published AWQ checkpoints all carry
        zero points (``zero_point: true``); the writer refuses sym for AWQ.
        """
        out = {"qweight": pack_cols(self.codes, awq=True), "scales": self.scales}
        if not self.sym:
            out["qzeros"] = pack_cols(self.zeros, awq=True)
        return out


def act_order_g_idx(k: int, group_size: int, perm: torch.Tensor) -> torch.Tensor:
    """GPTQ act-order: rows are quantized in ``perm``'s order, group j takes perm[j·g:(j+1)·g]."""
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group_size).to(torch.int32)
    return g_idx


def exact16(scales: torch.Tensor) -> torch.Tensor:
    """Scales rounded to bf16's 8 significant bits inside fp16's normal range, as float16:
    exactly representable in bf16, fp16 and fp32 alike (so a checkpoint means the same weight
    whichever of them it is served in)."""
    s = scales.to(torch.float64).clamp(min=2.0**-14, max=6.0e4)
    return s.to(torch.bfloat16).to(torch.float16)


def quantize_int4(weight: torch.Tensor, group_size: int, sym: bool, perm: torch.Tensor | None = None) -> Int4Weight:
    """Round-to-nearest min/max int4 quantization of a Linear weight [N, K] (out, in).

    ``perm`` (act-order) says in which order the input rows form groups; None: contiguous.
    Scales are stored float16 (as GPTQ and AWQ checkpoints hold them), rounded by :func:`exact16`
    before the codes are computed, so the codes are the nearest ones for the scale stored.
    """
    w = weight.detach().to(torch.float64).t().contiguous()  # [K, N]
    k, n = w.shape
    size = k if group_size == -1 else group_size
    if k % size:
        raise ValueError(f"group size {group_size} does not divide K={k}")
    g_idx = (torch.arange(k) // size).to(torch.int32) if perm is None else act_order_g_idx(k, size, perm)
    groups = k // size
    gi = g_idx.long()
    lo = torch.full((groups, n), float("inf"), dtype=torch.float64).scatter_reduce(0, gi[:, None].expand(k, n), w,
                                                                                 "amin")
    hi = torch.full((groups, n), -float("inf"), dtype=torch.float64).scatter_reduce(0, gi[:, None].expand(k, n), w,
                                                                                   "amax")
    if sym:
        scales = (torch.maximum(lo.abs(), hi.abs()) / 7.5).clamp(min=1e-8)  # codes -8..7 around 8
        zeros = torch.full((groups, n), 8, dtype=torch.int64)
    else:
        lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
        scales = ((hi - lo) / 15).clamp(min=1e-8)
        # Zero in 1..15 so that GPTQ v1's stored zero - 1 never goes negative.
        zeros = torch.round(-lo / scales).clamp(1, 15).to(torch.int64)
    scales = exact16(scales)
    s64 = scales.to(torch.float64)
    codes = torch.round(w / s64[gi] + zeros[gi]).clamp(0, 15).to(torch.int64)
    deq = (codes - zeros[gi]).to(torch.float64) * s64[gi]
    return Int4Weight(codes, zeros, scales, g_idx, group_size, sym, deq)


@dataclass
class Int8Weight:
    """Per-output-channel symmetric int8 (compressed-tensors W8A8 'channel' strategy)."""

    weight: torch.Tensor
    """[N, K] int8."""
    weight_scale: torch.Tensor
    """[N, 1] bfloat16 (values exact in fp16 and fp32 too)."""
    dequantized: torch.Tensor
    """[N, K] float64."""


def quantize_int8_channel(weight: torch.Tensor) -> Int8Weight:
    """Scale = row amax / 127, rounded by :func:`exact16` and stored bf16 (llm-compressor stores
    scales in the model dtype); codes the nearest for that scale."""
    w = weight.detach().to(torch.float64)
    scale = exact16(w.abs().amax(dim=1, keepdim=True) / 127).to(torch.bfloat16)
    q = torch.round(w / scale.double()).clamp(-127, 127).to(torch.int8)
    return Int8Weight(q, scale, q.double() * scale.double())


@dataclass
class BlockFp8Weight:
    """DeepSeek-V3 block fp8: weight [N, K] fp8 e4m3, weight_scale_inv [ceil(N/bn), ceil(K/bk)]."""

    weight: torch.Tensor
    weight_scale_inv: torch.Tensor
    dequantized: torch.Tensor
    """[N, K] float64: weight · weight_scale_inv[n // bn, k // bk] (exact: 4 × 24 significant bits)."""


def expand_blocks(scale: torch.Tensor, rows: int, cols: int, block_r: int, block_c: int) -> torch.Tensor:
    """Block scales → one per element: scale[r // block_r, c // block_c]."""
    return scale[torch.arange(rows)[:, None] // block_r, torch.arange(cols)[None, :] // block_c]


def quantize_block_fp8(weight: torch.Tensor, block: tuple[int, int] = (128, 128),
                       fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> BlockFp8Weight:
    """Quantize [N, K] with one scale per block_n × block_k tile (scale = tile amax / fp8 max)."""
    w = weight.detach().to(torch.float64)
    n, k = w.shape
    bn, bk = block
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.zeros(rows * bn, cols * bk, dtype=torch.float64)
    padded[:n, :k] = w.abs()
    amax = padded.reshape(rows, bn, cols, bk).amax(dim=(1, 3))
    fmax = torch.finfo(fp8_dtype).max
    scale = (amax / fmax).clamp(min=1e-12).to(torch.float32)
    full = expand_blocks(scale.double(), n, k, bn, bk)
    q = (w / full).clamp(-fmax, fmax).to(torch.float32).to(fp8_dtype)
    return BlockFp8Weight(q, scale, q.to(torch.float64) * full)
