"""GEMM family: plain and batched matrix products.

What goes wrong on new hardware: accumulation in low precision (the error grows with K,
so a long-K case with same-sign inputs exposes it), TF32/HF32 silently on for fp32,
unaligned and size-1 shapes taking a broken path.

The torch implementations (``native``) are ``torch.matmul`` and ``torch.bmm``.

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import gemm as ref

Dist = Literal["normal", "positive", "large"]


def sample(shape: tuple[int, ...], dtype: str, gen: torch.Generator, dist: str = "normal") -> torch.Tensor:
    """Values in the target dtype from a seeded generator.

    ``positive`` draws from [0, 1) so that dot products do not cancel and low-precision
    accumulation shows; ``large`` scales normals by 64 (fp16 overflow territory for sums).
    """
    if dist == "positive":
        x = torch.rand(shape, generator=gen, dtype=torch.float32)
    else:
        x = torch.randn(shape, generator=gen, dtype=torch.float32)
        if dist == "large":
            x = x * 64.0
    return x.to(torch_dtype(dtype))


class GemmCase(CaseBase):
    """C[m, n] = A[m, k] @ B[k, n]."""

    m: int = Field(ge=1, description="Rows of A.")
    n: int = Field(ge=1, description="Columns of B.")
    k: int = Field(ge=1, description="Inner dimension (accumulation length).")
    dist: Dist = Field(default="normal", description="Input distribution.")

    def work(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def scaled(self, factor: float) -> GemmCase:
        # Shrink M and N first: K is what the long-K cases are about.
        side = math.sqrt(max(factor, 0.0))
        m, n = max(1, int(self.m * side)), max(1, int(self.n * side))
        rest = factor * (self.m * self.n) / (m * n)
        k = max(1, int(self.k * min(1.0, rest)))
        return self.model_copy(update={"m": m, "n": n, "k": k})


class BmmCase(GemmCase):
    """C[b] = A[b] @ B[b]."""

    batch: int = Field(ge=1, description="Batch size.")

    def work(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


def _gemm_inputs(case: GemmCase, dtype: str, gen: torch.Generator) -> OpInputs:
    return OpInputs({"a": sample((case.m, case.k), dtype, gen, case.dist),
                     "b": sample((case.k, case.n), dtype, gen, case.dist)}, notes={"dist": case.dist})


def _bmm_inputs(case: BmmCase, dtype: str, gen: torch.Generator) -> OpInputs:
    return OpInputs({"a": sample((case.batch, case.m, case.k), dtype, gen, case.dist),
                     "b": sample((case.batch, case.k, case.n), dtype, gen, case.dist)}, notes={"dist": case.dist})


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.bmm(a, b)


OPS = [
    OpDef(
        name="gemm", family="gemm", description="Matrix product C = A @ B.",
        signature="gemm(a: [M, K], b: [K, N]) -> c: [M, N] (same dtype as a)",
        case_model=GemmCase, make_inputs=_gemm_inputs, reference=ref.gemm, native=gemm,
        outputs=("c",), tolerance=("reduction",),
    ),
    OpDef(
        name="bmm", family="gemm", description="Batched matrix product C[b] = A[b] @ B[b].",
        signature="bmm(a: [B, M, K], b: [B, K, N]) -> c: [B, M, N]",
        case_model=BmmCase, make_inputs=_bmm_inputs, reference=ref.bmm, native=bmm,
        outputs=("c",), tolerance=("reduction",),
    ),
]
