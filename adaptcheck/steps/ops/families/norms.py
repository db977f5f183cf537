"""Norms family: RMSNorm, fused residual-add + RMSNorm, LayerNorm.

What goes wrong on new hardware, and the rows that expose it (``dist``; ``mixed`` cycles
row by row through normal, tiny, zeros, near_constant and large):

* eps ignored or placed outside the square root: ``tiny`` rows (mean square ≈ eps) and,
  for LayerNorm, ``near_constant`` rows (variance ≈ eps) move by tens of percent; ``zeros``
  rows turn into 0/0 = NaN;
* the sum of squares accumulated (or the squares formed) in fp16/bf16: ``large`` rows
  (std 32: Σx² over more than ~64 elements passes 65504) and ``outlier`` rows (one
  channel at ±300, whose square alone overflows fp16) overflow; long rows (H = 8192) lose
  precision;
* one-pass variance E[x²] − E[x]² in fp32: ``near_constant`` rows (noise ≈ √eps under a
  mean 16-128× larger) cancel catastrophically;
* non-power-of-two hidden sizes (5120, 3584, 1) and a single token taking another path.

Row magnitudes are chosen so every row normalizes to O(|weight|): the ``reduction`` class
scales errors by the largest reference value of the whole case, and one row far above the
others would hide the rest. ``outlier`` rows (which normalize to ≈ √H) therefore have
their own ``dist`` and are not part of ``mixed``.

The torch implementations (``native``): RMSNorm follows the plain-torch path models take
(vLLM's ``RMSNorm.forward_native``, Hugging Face ``LlamaRMSNorm``): upcast to fp32, mean of
squares, rsqrt, cast back, then the weight in the model dtype. LayerNorm is
``torch.nn.functional.layer_norm``, which is what ``nn.LayerNorm`` calls.

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import norms as ref

RowKind = Literal["normal", "tiny", "zeros", "near_constant", "large", "outlier"]
Dist = Literal["mixed", "normal", "tiny", "zeros", "near_constant", "large", "outlier"]

MIXED_CYCLE: tuple[RowKind, ...] = ("normal", "tiny", "zeros", "near_constant", "large")
"""Row kinds of ``dist: mixed``, row t taking MIXED_CYCLE[t % 5]."""

LARGE_STD = 32.0
"""Std of ``large`` rows: Σx² passes fp16's 65504 from H ≈ 64 on, and even 32 per-lane fp16
partial sums overflow from H ≈ 2048 on; every single square still fits fp16."""

OUTLIER = 300.0
"""Magnitude of the one outlier channel: 300² = 90000 overflows fp16 by itself."""


class NormCase(CaseBase):
    """One norm call over ``tokens`` rows of ``hidden`` elements."""

    tokens: int = Field(ge=1, description="Rows (T).")
    hidden: int = Field(ge=1, description="Hidden size (H), the reduced dimension.")
    eps: float = Field(default=1e-6, gt=0, description="Epsilon added to the mean square / variance.")
    dist: Dist = Field(default="mixed", description="Row contents; 'mixed' cycles through the adversarial kinds.")

    def work(self) -> float:
        return 8.0 * self.tokens * self.hidden

    def scaled(self, factor: float) -> NormCase:
        # H is what the case is about (accumulation length, odd sizes): drop rows only, but
        # keep one full cycle of the mixed row kinds.
        keep = min(self.tokens, len(MIXED_CYCLE))
        return self.model_copy(update={"tokens": max(keep, int(self.tokens * factor))})


def row_kinds(case: NormCase) -> list[RowKind]:
    """The kind of every row of the case."""
    if case.dist == "mixed":
        return [MIXED_CYCLE[t % len(MIXED_CYCLE)] for t in range(case.tokens)]
    return [case.dist] * case.tokens


def _signs(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=gen).to(torch.float64) * 2 - 1


def make_rows(kinds: list[RowKind], hidden: int, eps: float, gen: torch.Generator) -> torch.Tensor:
    """Float64 rows of the given kinds (rounded to the target dtype by the caller)."""
    rows = torch.empty(len(kinds), hidden, dtype=torch.float64)
    noise_std = math.sqrt(eps)
    for t, kind in enumerate(kinds):
        normal = torch.randn(hidden, generator=gen, dtype=torch.float64)
        if kind == "normal":
            rows[t] = normal
        elif kind == "tiny":
            # mean square ≈ eps: whether eps is added, and where, changes the output by ~30 %
            rows[t] = normal * noise_std
        elif kind == "zeros":
            rows[t] = 0.0
        elif kind == "near_constant":
            # variance ≈ eps under a mean 16-128× the noise: a one-pass E[x²] − E[x]² loses
            # the variance, while a correct fp32 kernel (error ≈ |c|/√eps · 2⁻²⁴) stays well
            # inside the fp32 limit. A larger |c|/√eps would fail every fp32 kernel, not just
            # the wrong ones.
            lead = 2.0 ** (4.0 + 3.0 * float(torch.rand(1, generator=gen, dtype=torch.float64)))
            rows[t] = float(_signs(1, gen)[0]) * lead * noise_std + normal * noise_std
        elif kind == "large":
            rows[t] = normal * LARGE_STD
        else:  # outlier: one channel far above the rest (LLM "massive activations")
            rows[t] = normal
            where = int(torch.randint(0, hidden, (1,), generator=gen))
            rows[t, where] = float(_signs(1, gen)[0]) * OUTLIER
    return rows


def _weight(hidden: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    # Spread around 1 like trained norm weights, but far enough from 1 that a kernel that
    # forgets the weight is off by tens of percent.
    return (1.0 + 0.5 * torch.randn(hidden, generator=gen, dtype=torch.float64)).to(dtype)


def _notes(case: NormCase, kinds: list[RowKind]) -> dict[str, object]:
    return {"dist": case.dist, "eps": case.eps,
            "row_kinds": {k: kinds.count(k) for k in dict.fromkeys(kinds)}}


def _rms_inputs(case: NormCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    kinds = row_kinds(case)
    x = make_rows(kinds, case.hidden, case.eps, gen).to(tdt)
    return OpInputs({"x": x, "weight": _weight(case.hidden, tdt, gen), "eps": case.eps}, notes=_notes(case, kinds))


def _fused_inputs(case: NormCase, dtype: str, gen: torch.Generator) -> OpInputs:
    """x (the layer output) and residual (the stream) whose *sum* has the row kind.

    zeros rows are an exact cancellation x = −residual; near_constant rows put the
    constant in the residual and the √eps noise in x; tiny and large rows split the
    variance between the two.
    """
    tdt = torch_dtype(dtype)
    kinds = row_kinds(case)
    x = torch.empty(case.tokens, case.hidden, dtype=torch.float64)
    residual = torch.empty_like(x)
    for t, kind in enumerate(kinds):
        if kind == "zeros":
            residual[t] = torch.randn(case.hidden, generator=gen, dtype=torch.float64)
            x[t] = -residual[t]
        elif kind == "near_constant":
            (row,) = make_rows(["near_constant"], case.hidden, case.eps, gen)
            residual[t] = row.mean()
            x[t] = row - row.mean()
        elif kind == "outlier":  # the outlier lives in the residual stream
            residual[t] = make_rows(["outlier"], case.hidden, case.eps, gen)[0]
            x[t] = torch.randn(case.hidden, generator=gen, dtype=torch.float64)
        else:
            pair = make_rows([kind, kind], case.hidden, case.eps, gen) / math.sqrt(2.0)
            x[t], residual[t] = pair[0], pair[1]
    return OpInputs({"x": x.to(tdt), "residual": residual.to(tdt), "weight": _weight(case.hidden, tdt, gen),
                     "eps": case.eps}, notes=_notes(case, kinds))


def _layer_inputs(case: NormCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    kinds = row_kinds(case)
    rows = make_rows(kinds, case.hidden, case.eps, gen)
    notes = _notes(case, kinds)
    if case.hidden == 1:
        # A one-element row is constant: the exact output is the bias, and a correct kernel
        # that forms x·rstd − mean·rstd (torch's CPU half-precision path does) is off by its
        # rounding times |x|/√eps (1000 for |x| = 1, eps = 1e-6), up to 24× the fp16 limit.
        # Rows are drawn at the √eps scale there, where that amplification is ≈ 1 and a
        # kernel that drops eps still divides 0 by 0.
        spread = 0.5 + 1.5 * torch.rand(rows.shape, generator=gen, dtype=torch.float64)
        rows = torch.sign(rows) * math.sqrt(case.eps) * spread
        notes["rows_scaled_to_sqrt_eps"] = True
    x = rows.to(tdt)
    bias = (0.5 * torch.randn(case.hidden, generator=gen, dtype=torch.float64)).to(tdt)
    return OpInputs({"x": x, "weight": _weight(case.hidden, tdt, gen), "bias": bias, "eps": case.eps}, notes=notes)


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


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


OPS = [
    OpDef(
        name="rms_norm", family="norms",
        description="RMSNorm: x / sqrt(mean(x²) + eps) · weight over the hidden dimension.",
        signature="rms_norm(x: [T, H], weight: [H], eps: float) -> out: [T, H] (x's dtype)",
        case_model=NormCase, make_inputs=_rms_inputs, reference=ref.rms_norm, native=rms_norm,
        outputs=("out",), tolerance=("reduction",),
    ),
    OpDef(
        name="fused_add_rms_norm", family="norms",
        description="Residual add then RMSNorm: residual_out = x + residual, out = rms_norm(residual_out).",
        signature=("fused_add_rms_norm(x: [T, H], residual: [T, H], weight: [H], eps: float)"
                   " -> (out: [T, H], residual_out: [T, H]); may write into x and residual"),
        case_model=NormCase, make_inputs=_fused_inputs, reference=ref.fused_add_rms_norm, native=fused_add_rms_norm,
        # residual_out is one rounded addition per element, so it is held element-wise
        # (a normalized error would let a wrong residual in small rows through).
        outputs=("out", "residual_out"), tolerance=("reduction", "elementwise"), in_place=True,
    ),
    OpDef(
        name="layer_norm", family="norms",
        description="LayerNorm: (x − mean) / sqrt(var + eps) · weight + bias, biased variance.",
        signature="layer_norm(x: [T, H], weight: [H], bias: [H], eps: float) -> out: [T, H] (x's dtype)",
        case_model=NormCase, make_inputs=_layer_inputs, reference=ref.layer_norm, native=layer_norm,
        outputs=("out",), tolerance=("reduction",),
    ),
]
