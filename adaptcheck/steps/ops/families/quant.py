"""Quantization family: int8 w8a8 GEMM, int8 quantize, fp8 e4m3 quantize and scaled GEMM.

What goes wrong: int8 products accumulated in int16 (overflow) or fp16, per-token and
per-channel scales swapped or collapsed to one per-tensor scale; fp8 casts without the
clamp (|x| ≥ 465 becomes NaN on a non-saturating cast), multiplying by the scale instead
of dividing, rounding toward zero instead of to nearest-even, subnormals flushed; a scaled
fp8 GEMM dropping one of its scales.

fp8 format. The flavour (OCP ``e4m3fn``, max 448, or MI300 ``e4m3fnuz``, max 240) is the
backend's (``Backend.fp8_flavour``). Input generators, references and the torch provider
read it from :func:`current_fp8_flavour`, a context variable the check sets around each
case (``fp8_flavour_scope``); outside any scope it is ``e4m3fn``. A backend without fp8
(flavour None) makes :func:`current_fp8_flavour` raise :class:`Fp8Unavailable`.

fp8_quantize is compared **exactly** (not ±1 ULP): ±1 would accept round-toward-zero,
which is never more than one step off. That is sound because the inputs make the answer
unique: with a power-of-two scale x / scale is exact in any precision, so exact ties are
checked for ties-to-even; with any other scale the elements whose x / scale lies within
1/16 of a grid step of a rounding tie are left out of the comparison (``compare_mask``),
a margin far wider than an fp32 or even bf16 division error.

The torch implementations (``native``). int8 GEMM: ``torch._int_mm`` (int32
accumulation) where the device and shapes allow it, else an fp32 matmul of the int8 codes
(exact while partial sums stay below 2^24, and well within tolerance beyond). fp8 GEMM:
``torch._scaled_mm`` where the device has it (CUDA/ROCm with fp8 tensor cores and K, N
multiples of 16), else the codes dequantized to fp32 and multiplied; :func:`fp8_gemm_path`
says which one a call takes. fp8 casts use the backend's flavour (:func:`current_fp8_flavour`).

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from adaptcheck.base.dtypes import is_fnuz, torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import quant as ref

FP8_OPS = ("fp8_quantize", "fp8_scaled_gemm")
"""Ops that need the backend to have an fp8 format (not applicable where fp8_flavour is None)."""

_FP8_FLAVOUR: ContextVar[str | None] = ContextVar("adaptcheck_fp8_flavour", default="e4m3fn")


class Fp8Unavailable(RuntimeError):
    """The backend declares no fp8 format: the fp8 ops do not apply."""


@contextmanager
def fp8_flavour_scope(flavour: str | None) -> Iterator[None]:
    """Run the enclosed case with the backend's fp8 flavour (None: no fp8 on this backend)."""
    token = _FP8_FLAVOUR.set(flavour)
    try:
        yield
    finally:
        _FP8_FLAVOUR.reset(token)


def current_fp8_flavour() -> str:
    """The fp8 e4m3 flavour in effect ('e4m3fn' or 'e4m3fnuz')."""
    flavour = _FP8_FLAVOUR.get()
    if flavour is None:
        raise Fp8Unavailable("this backend declares no fp8 format (fp8_flavour is None): fp8 ops do not apply")
    if flavour not in ref.FP8_FORMATS:
        raise Fp8Unavailable(f"unknown fp8 flavour {flavour!r}; known: {', '.join(ref.FP8_FORMATS)}")
    return flavour


def _backend_fp8_scope(backend: Any) -> AbstractContextManager[None]:
    """OpDef.device_scope of the fp8 ops: the backend's flavour for the whole case."""
    return fp8_flavour_scope(backend.fp8_flavour)


def fp8_torch_dtype() -> torch.dtype:
    """The torch fp8 e4m3 dtype of the flavour in effect."""
    return torch_dtype("fp8_e4m3", fnuz=is_fnuz(current_fp8_flavour()))


# ---------------------------------------------------------------------------------- int8 GEMM


class Int8GemmCase(CaseBase):
    """out[M, N] = (a[M, K] @ b[K, N] in int32) · scale_a[M] · scale_b[N]."""

    m: int = Field(ge=1, description="Rows (tokens).")
    n: int = Field(ge=1, description="Columns (output channels).")
    k: int = Field(ge=1, le=131072, description="Inner dimension (127²·K must fit int32).")
    dist: Literal["uniform", "saturated"] = Field(
        default="uniform", description="uniform codes in [-127, 127] | saturated: codes near +127 so that"
        " partial sums leave int16 and fp16 range at once.")

    def work(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def scaled(self, factor: float) -> Int8GemmCase:
        side = math.sqrt(max(factor, 0.0))
        m, n = max(1, int(self.m * side)), max(1, int(self.n * side))
        rest = factor * (self.m * self.n) / (m * n)
        return self.model_copy(update={"m": m, "n": n, "k": max(1, int(self.k * min(1.0, rest)))})


def _int8_codes(shape: tuple[int, int], dist: str, gen: torch.Generator) -> torch.Tensor:
    if dist == "saturated":
        return (127 - torch.randint(0, 8, shape, generator=gen)).to(torch.int8)
    return torch.randint(-127, 128, shape, generator=gen).to(torch.int8)


def _int8_gemm_inputs(case: Int8GemmCase, dtype: str, gen: torch.Generator) -> OpInputs:
    a = _int8_codes((case.m, case.k), case.dist, gen)
    b = _int8_codes((case.k, case.n), case.dist, gen)
    # Scales differ per token and per channel (a 4× spread, 2.5e-3..1e-2) so that a swapped
    # or per-tensor scale is visible.
    scale_a = (torch.rand(case.m, 1, generator=gen) * 3 + 1) * 2.5e-3
    scale_b = (torch.rand(1, case.n, generator=gen) * 3 + 1) * 2.5e-3
    if dtype == "fp16":
        # Keep |out| within fp16 range whatever K: 127²·K·sa·sb ≤ ~3e4.
        limit = 3e4 / (127.0 * 127.0 * case.k)
        shrink = min(1.0, math.sqrt(limit) / 1e-2)
        scale_a, scale_b = scale_a * shrink, scale_b * shrink
    return OpInputs({"a": a, "b": b, "scale_a": scale_a.float(), "scale_b": scale_b.float(),
                     "out_dtype": torch_dtype(dtype)}, notes={"dist": case.dist})


# ------------------------------------------------------------------------------ int8 quantize


class Int8QuantCase(CaseBase):
    """q = clamp(round(x / scale), -128, 127); dynamic: scale = max|x[t]| / 127 per token."""

    tokens: int = Field(ge=1, description="Rows T.")
    hidden: int = Field(ge=1, description="Columns H.")
    dynamic: bool = Field(default=False, description="Per-token scales computed by the op (scale=None).")
    dist: Literal["normal", "saturate", "ties"] = Field(
        default="normal", description="normal | saturate (|x/scale| up to 400: clamped) | ties (exact .5 codes,"
        " static power-of-two scale)")

    def work(self) -> float:
        return 20.0 * self.tokens * self.hidden

    def scaled(self, factor: float) -> Int8QuantCase:
        return self.model_copy(update={"tokens": max(1, int(self.tokens * min(1.0, factor)))})


def _int8_quant_inputs(case: Int8QuantCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    t, h = case.tokens, case.hidden
    if case.dist == "ties":
        codes = torch.randint(-130, 130, (t, h), generator=gen).float() + 0.5
        x = (codes * 0.0625).to(tdt)  # power-of-two scale: x / scale = code exactly
        scale: torch.Tensor | None = torch.tensor(0.0625)
    else:
        x = torch.randn(t, h, generator=gen)
        x[:, 0] = x[:, 0].abs() + 0.5  # no all-zero row: a dynamic scale of 0 is undefined
        if case.dist == "saturate":
            x = x * 100.0
        x = x.to(tdt)
        scale = torch.tensor(0.03125 * 1.37)  # not a power of two: rounding happens
    if case.dynamic:
        scale = None
    notes = {"dist": case.dist, "dynamic": case.dynamic}
    return OpInputs({"x": x, "scale": None if scale is None else scale.float()}, notes=notes)


# ------------------------------------------------------------------------------ fp8 quantize


class Fp8QuantCase(CaseBase):
    """q = fp8(clamp(x / scale, -max, max))."""

    tokens: int = Field(ge=1, description="Rows T.")
    hidden: int = Field(ge=1, description="Columns H.")
    dist: Literal["normal", "adversarial", "ties"] = Field(
        default="normal", description="normal (scale not a power of two; near-ties not compared) | adversarial"
        " (beyond ±max incl. ≥465, exactly ±max, subnormals, ±0) | ties (exact rounding ties)")

    def work(self) -> float:
        return 20.0 * self.tokens * self.hidden

    def scaled(self, factor: float) -> Fp8QuantCase:
        return self.model_copy(update={"tokens": max(1, int(self.tokens * min(1.0, factor)))})


def _grid_values(fmt: ref.Fp8Format) -> np.ndarray:
    """Every non-negative finite value of the format, from its definition."""
    step = fmt.subnormal_step
    vals = [i * step for i in range(2**fmt.mantissa_bits)]  # zero and subnormals
    e = fmt.min_normal_exponent
    while True:
        for mant in range(2**fmt.mantissa_bits):
            v = (1 + mant / 2**fmt.mantissa_bits) * 2.0**e
            if v > fmt.max_finite:
                return np.array(vals)
            vals.append(v)
        e += 1


def _near_tie(v: np.ndarray, fmt: ref.Fp8Format, margin: float = 1 / 16) -> np.ndarray:
    """Elements within ``margin`` grid steps of a rounding tie (inside the finite range)."""
    inside = np.abs(v) <= fmt.max_finite
    vc = np.clip(v, -fmt.max_finite, fmt.max_finite)
    units = vc / ref.grid_step(vc, fmt)
    frac = np.abs(units - np.floor(units) - 0.5)
    return inside & (frac < margin)


def _fp8_quant_inputs(case: Fp8QuantCase, dtype: str, gen: torch.Generator) -> OpInputs:
    tdt = torch_dtype(dtype)
    fmt = ref.FP8_FORMATS[current_fp8_flavour()]
    t, h = case.tokens, case.hidden
    n = t * h
    grid = torch.from_numpy(_grid_values(fmt))
    if case.dist == "normal":
        scale = 0.0173  # not a power of two: x / scale rounds in the device's precision
        v = torch.randn(n, generator=gen, dtype=torch.float64) * fmt.max_finite / 3
    else:
        scale = 0.125
        pick = torch.randint(0, grid.numel(), (n,), generator=gen)
        if case.dist == "ties":
            # Midpoints between neighbouring grid values: every element is an exact tie.
            pick = pick.clamp(max=grid.numel() - 2)
            v = (grid[pick] + grid[pick + 1]) / 2
        else:
            v = grid[pick].clone()
            kind = torch.randint(0, 10, (n,), generator=gen)
            big = fmt.max_finite * (1.04 + torch.rand(n, generator=gen, dtype=torch.float64) * 20)
            v = torch.where(kind < 2, big, v)                                  # beyond max, ≥ 465 for e4m3fn
            v = torch.where(kind == 2, torch.full_like(v, fmt.max_finite), v)  # exactly at ±max
            tiny = torch.rand(n, generator=gen, dtype=torch.float64) * 2.0 ** fmt.min_normal_exponent
            v = torch.where(kind == 3, tiny, v)                                # subnormal range, off-grid
            v = torch.where(kind == 4, torch.zeros_like(v), v)                 # zero (and -0 below)
        sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
        v = v * sign
    x = (v * scale).reshape(t, h).to(tdt)
    notes: dict[str, object] = {"dist": case.dist, "flavour": fmt.name, "scale": scale,
                                "beyond_max": int((x.double().abs() / scale > fmt.max_finite).sum())}
    mask = None
    if case.dist != "ties":
        near = _near_tie(x.double().numpy() / np.float64(np.float32(scale)), fmt)
        if scale != 2.0 ** round(math.log2(scale)):
            mask = torch.from_numpy(~near)
            notes["not_compared_near_ties"] = int(near.sum())
        else:
            notes["exact_ties_compared"] = int(near.sum())
    return OpInputs({"x": x, "scale": torch.tensor(scale, dtype=torch.float32)}, notes=notes, compare_mask=mask)


def _fp8_quant_reference(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return ref.fp8_quantize(x, scale, current_fp8_flavour())


# --------------------------------------------------------------------------- fp8 scaled GEMM


class Fp8GemmCase(CaseBase):
    """out[M, N] = (a @ b in fp32) · scale_a · scale_b, a and b fp8 e4m3."""

    m: int = Field(ge=1, description="Rows.")
    n: int = Field(ge=1, description="Columns.")
    k: int = Field(ge=1, description="Inner dimension.")
    dist: Literal["normal", "positive"] = Field(default="normal", description="normal | positive (no cancellation).")

    def work(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def scaled(self, factor: float) -> Fp8GemmCase:
        side = math.sqrt(max(factor, 0.0))
        m, n = max(1, int(self.m * side)), max(1, int(self.n * side))
        rest = factor * (self.m * self.n) / (m * n)
        return self.model_copy(update={"m": m, "n": n, "k": max(1, int(self.k * min(1.0, rest)))})


def _fp8_gemm_inputs(case: Fp8GemmCase, dtype: str, gen: torch.Generator) -> OpInputs:
    fdt = fp8_torch_dtype()
    fmax = torch.finfo(fdt).max

    def values(shape: tuple[int, int]) -> torch.Tensor:
        v = torch.rand(shape, generator=gen) if case.dist == "positive" else torch.randn(shape, generator=gen)
        return (v * fmax / 4).clamp(-fmax, fmax).to(fdt)  # use the whole fp8 range

    a, b = values((case.m, case.k)), values((case.k, case.n))
    # Scales well away from 1 so that dropping either one is visible; sized so |out| ≲ 1e3.
    scale_a = torch.tensor(0.37 / fmax, dtype=torch.float32)
    scale_b = torch.tensor(4.1 / (fmax * math.sqrt(case.k)) if case.dist == "normal" else 4.1 / (fmax * case.k),
                           dtype=torch.float32)
    return OpInputs({"a": a, "b": b, "scale_a": scale_a, "scale_b": scale_b, "out_dtype": torch_dtype(dtype)},
                    notes={"dist": case.dist, "flavour": current_fp8_flavour()})


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def int8_w8a8_gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   out_dtype: torch.dtype) -> torch.Tensor:
    try:
        acc = torch._int_mm(a, b).float()
    except (RuntimeError, NotImplementedError):  # shape/device restrictions of _int_mm
        acc = a.float() @ b.float()
    return (acc * scale_a.float() * scale_b.float()).to(out_dtype)


def scaled_int8_quant(x: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    if scale is None:
        scale = xf.abs().amax(dim=1, keepdim=True) / 127.0
    q = torch.round(xf / scale.float()).clamp(-128, 127).to(torch.int8)
    return q, scale


def fp8_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    fdt = fp8_torch_dtype()
    fmax = torch.finfo(fdt).max
    return (x.float() / scale.float()).clamp(-fmax, fmax).to(fdt)


def fp8_gemm_path(a: torch.Tensor, b: torch.Tensor) -> str:
    """'scaled_mm' where torch._scaled_mm can run these operands, else 'dequantize'."""
    if a.device.type != "cuda" or a.shape[1] % 16 or b.shape[1] % 16:
        return "dequantize"
    major, minor = torch.cuda.get_device_capability(a.device)
    if torch.version.hip is None and (major, minor) < (8, 9):  # fp8 tensor cores: Ada/Hopper and later
        return "dequantize"
    return "scaled_mm"


def fp8_scaled_gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                    out_dtype: torch.dtype) -> torch.Tensor:
    if fp8_gemm_path(a, b) == "scaled_mm":
        # cuBLASLt wants the second operand column-major.
        return torch._scaled_mm(a, b.t().contiguous().t(), scale_a=scale_a.float(), scale_b=scale_b.float(),
                                out_dtype=out_dtype)
    return ((a.float() @ b.float()) * scale_a.float() * scale_b.float()).to(out_dtype)


OPS = [
    OpDef(
        name="int8_w8a8_gemm", family="quant",
        description="int8 × int8 GEMM accumulated in int32, per-token × per-channel scales.",
        signature=("int8_w8a8_gemm(a: [M, K] int8, b: [K, N] int8, scale_a: [M, 1] float32, scale_b: [1, N]"
                   " float32, out_dtype: torch.dtype) -> out: [M, N] out_dtype (the check's dtype)"),
        case_model=Int8GemmCase, make_inputs=_int8_gemm_inputs, reference=ref.int8_w8a8_gemm, native=int8_w8a8_gemm,
        outputs=("out",), tolerance=("reduction",), requires=("int8",),
    ),
    OpDef(
        name="scaled_int8_quant", family="quant",
        description="Symmetric int8 quantization, static per-tensor or dynamic per-token scale.",
        signature=("scaled_int8_quant(x: [T, H], scale: [] float32 | None) -> (q: [T, H] int8, scale: [] or"
                   " [T, 1] float32); q = clamp(round_half_even(x / scale), -128, 127); scale None: max|x[t]|/127"),
        case_model=Int8QuantCase, make_inputs=_int8_quant_inputs, reference=ref.scaled_int8_quant, native=scaled_int8_quant,
        outputs=("q", "scale"), tolerance=("codes", "elementwise"), requires=("int8",),
    ),
    OpDef(
        name="fp8_quantize", family="quant",
        description="Static per-tensor fp8 e4m3 quantization: clamp to ±max, then cast (ties to even).",
        signature=("fp8_quantize(x: [T, H], scale: [] float32) -> q: [T, H] float8 e4m3 (backend flavour:"
                   " e4m3fn max 448, e4m3fnuz max 240); q = cast(clamp(x / scale, -max, max))"),
        case_model=Fp8QuantCase, make_inputs=_fp8_quant_inputs, reference=_fp8_quant_reference, native=fp8_quantize,
        outputs=("q",), tolerance=("exact",), requires=("fp8_e4m3",), device_scope=_backend_fp8_scope,
    ),
    OpDef(
        name="fp8_scaled_gemm", family="quant",
        description="fp8 e4m3 GEMM with per-tensor scales, summed by the device's fp8 MMA (an accumulator of about 14 bits, as Hopper's, passes at fp32 output).",
        signature=("fp8_scaled_gemm(a: [M, K] float8, b: [K, N] float8, scale_a: [] float32, scale_b: [] float32,"
                   " out_dtype: torch.dtype) -> out: [M, N] out_dtype (the check's dtype)"),
        case_model=Fp8GemmCase, make_inputs=_fp8_gemm_inputs, reference=ref.fp8_scaled_gemm, native=fp8_scaled_gemm,
        # fp8_gemm, not reduction: the fp32 output is only as exact as the fp8 MMA accumulator
        # (matrices/tolerances.yaml says why, with the H200 measurements).
        outputs=("out",), tolerance=("fp8_gemm",), requires=("fp8_e4m3",), device_scope=_backend_fp8_scope,
    ),
]
