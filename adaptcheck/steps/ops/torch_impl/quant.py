"""Torch provider: quantization family.

int8 GEMM: ``torch._int_mm`` (int32 accumulation) where the device and shapes allow it,
else an fp32 matmul of the int8 codes (exact while partial sums stay below 2^24, and
well within tolerance beyond). fp8 GEMM: ``torch._scaled_mm`` where the device has it
(CUDA/ROCm with fp8 tensor cores and K, N multiples of 16), else the codes dequantized to
fp32 and multiplied; :func:`fp8_gemm_path` says which one a call takes. fp8 casts use the
backend's flavour (see :func:`adaptcheck.steps.ops.families.quant.current_fp8_flavour`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from adaptcheck.steps.ops.families.quant import fp8_torch_dtype


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


TORCH_OPS: dict[str, Callable[..., Any]] = {
    "int8_w8a8_gemm": int8_w8a8_gemm, "scaled_int8_quant": scaled_int8_quant,
    "fp8_quantize": fp8_quantize, "fp8_scaled_gemm": fp8_scaled_gemm,
}
