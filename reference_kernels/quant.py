"""Quantization references: int8 w8a8 GEMM, int8 quantize, fp8 e4m3 quantize and scaled GEMM.

The fp8 grid is built from the format's definition (sign, 4 exponent bits, 3 mantissa
bits, an exponent bias, subnormals below the smallest normal, a largest finite value) and
values are rounded to it in float64, to nearest with ties to the even mantissa — no
library cast is involved. Integer products are accumulated exactly in int64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference_kernels.gemm import gemm


@dataclass(frozen=True)
class Fp8Format:
    """An 8-bit float with 3 mantissa bits."""

    name: str
    bias: int
    max_finite: float
    mantissa_bits: int = 3

    @property
    def min_normal_exponent(self) -> int:
        # The smallest biased exponent of a normal number is 1.
        return 1 - self.bias

    @property
    def subnormal_step(self) -> float:
        """Spacing of the grid below the smallest normal (and in the first binade)."""
        return 2.0 ** (self.min_normal_exponent - self.mantissa_bits)


E4M3FN = Fp8Format("e4m3fn", bias=7, max_finite=448.0)
"""OCP e4m3: 1.1111.110 = 448 is the largest finite value (1.1111.111 is NaN, no inf)."""
E4M3FNUZ = Fp8Format("e4m3fnuz", bias=8, max_finite=240.0)
"""AMD MI300 e4m3 (fnuz): bias 8, largest finite 1.1111.111 = 240, no negative zero."""
FP8_FORMATS = {f.name: f for f in (E4M3FN, E4M3FNUZ)}


def fp8_format(flavour: str) -> Fp8Format:
    """The e4m3 format of a flavour name ('e4m3fn', 'e4m3fnuz'); e4m3fn for any other."""
    return FP8_FORMATS.get(flavour, E4M3FN)


def grid_step(v: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """Spacing of the fp8 grid at |v|: 2^(e - mantissa_bits) for |v| in [2^e, 2^(e+1))."""
    a = np.abs(np.asarray(v, dtype=np.float64))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    # log2 of a power of two can come out a hair low/high: fix the binade exactly.
    e = np.where(2.0 ** e > a, e - 1, e)
    e = np.where(2.0 ** (e + 1) <= a, e + 1, e)
    e = np.maximum(e, fmt.min_normal_exponent)  # subnormals share the first binade's spacing
    return 2.0 ** (e - fmt.mantissa_bits)


def round_to_fp8(v: np.ndarray, fmt: Fp8Format = E4M3FN) -> np.ndarray:
    """Round already-clamped values (|v| ≤ max_finite) to the grid, ties to even."""
    v = np.asarray(v, dtype=np.float64)
    if np.any(np.abs(v) > fmt.max_finite):
        raise ValueError("round_to_fp8 expects values clamped to the finite range")
    step = grid_step(v, fmt)
    units = v / step  # exact: step is a power of two
    # np.round rounds halves to the even integer; an even unit count is an even mantissa
    # (step is the last mantissa bit), so this is round-to-nearest-even on the grid.
    return np.round(units) * step


def fp8_quantize(x: np.ndarray, scale: np.ndarray, flavour: str = "e4m3fn") -> np.ndarray:
    """q = fp8(clamp(x / scale, -max, max)), returned as float64 values on the grid."""
    fmt = FP8_FORMATS[flavour]
    v = np.asarray(x, dtype=np.float64) / float(np.asarray(scale))
    v = np.clip(v, -fmt.max_finite, fmt.max_finite)
    q = round_to_fp8(v, fmt)
    if fmt is E4M3FNUZ:
        q = q + 0.0  # fnuz has no negative zero: -0.0 + 0.0 is +0.0
    return q


def fp8_scaled_gemm(a: np.ndarray, b: np.ndarray, scale_a: np.ndarray, scale_b: np.ndarray,
                    out_dtype: object = None) -> np.ndarray:
    """out = (a @ b) · scale_a · scale_b with per-tensor scales (a, b: fp8 values as float64)."""
    return gemm(a, b) * float(np.asarray(scale_a)) * float(np.asarray(scale_b))


def int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer product Σ_k a[m, k] · b[k, n] in int64 (no overflow for int8 inputs)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: {a.shape} @ {b.shape}")
    out = np.zeros((m, n), dtype=np.int64)
    block = max(1, 2**22 // max(1, m * n))
    for start in range(0, k, block):
        stop = min(k, start + block)
        out += (a[:, start:stop, None] * b[None, start:stop, :]).sum(axis=1)
    return out


def int8_w8a8_gemm(a: np.ndarray, b: np.ndarray, scale_a: np.ndarray, scale_b: np.ndarray,
                   out_dtype: object = None) -> np.ndarray:
    """out[m, n] = (Σ_k a[m, k] b[k, n]) · scale_a[m] · scale_b[n] (per-token × per-channel)."""
    acc = int_matmul(a, b).astype(np.float64)
    return acc * np.asarray(scale_a, dtype=np.float64).reshape(-1, 1) * np.asarray(scale_b, dtype=np.float64).reshape(1, -1)


def round_half_even(v: np.ndarray) -> np.ndarray:
    """Nearest integer, halves to the even one."""
    return np.round(np.asarray(v, dtype=np.float64))


def scaled_int8_quant(x: np.ndarray, scale: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(q, scale): q = clamp(round_half_even(x / scale), -128, 127).

    ``scale`` None means dynamic per-token quantization: scale[t] = max_h |x[t, h]| / 127,
    returned as [T, 1].
    """
    x = np.asarray(x, dtype=np.float64)
    if scale is None:
        s = np.abs(x).max(axis=1, keepdims=True) / 127.0
    else:
        s = np.asarray(scale, dtype=np.float64)
    q = np.clip(round_half_even(x / s), -128, 127).astype(np.int64)
    return q, s
