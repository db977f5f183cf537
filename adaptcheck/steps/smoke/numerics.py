"""Comparisons the smoke checks judge by: bit-exact equality (copies) and normalized error
against float64 (matmuls), with the per-dtype matmul limits.

Why these two verdicts and where the limits come from: docs/smoke.md (Comparisons).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adaptcheck.base.schemas.smoke_evidence import BitDiffEvidence, ComparisonFacts, MatmulToleranceFacts

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class MatmulTolerance:
    """Limits for a matmul against a float64 reference of the same (upcast) inputs."""

    normalized: float
    """Max allowed max|Δ| / max|ref|."""
    cosine: float = 0.9999
    """Min cosine similarity between result and reference."""
    note: str = ""

    def evidence(self) -> MatmulToleranceFacts:
        return MatmulToleranceFacts(normalized=self.normalized, cosine=self.cosine, note=self.note)


_MATMUL_NOTES = {
    # fp32 only holds with TF32/HF32 off: TF32 rounds inputs to 10 mantissa bits (~1e-4 error).
    "fp32": "fp32 accumulate, TF32/HF32 off",
    # Output rounding alone is ≤ 2^-9 ≈ 2e-3 of an element; 1.6e-2 is the field's bf16 rtol.
    "bf16": "fp32 accumulate, bf16 output",
    # Output rounding alone is ≤ 2^-11 ≈ 4.9e-4; fp16 accumulation over long K exceeds 2e-3.
    "fp16": "fp32 accumulate, fp16 output",
}


def _matmul_tolerances() -> dict[str, MatmulTolerance]:
    """The limits of the step-3 ``reduction`` class (matrices/tolerances.yaml), so a matmul is
    judged by the same numbers in step 2 and step 3 and they are kept in one place."""
    from adaptcheck.steps.ops.tolerance import load_policy

    reduction = load_policy().get("reduction")
    out: dict[str, MatmulTolerance] = {}
    for name, note in _MATMUL_NOTES.items():
        limit = reduction.limit_for(name)
        assert limit.max_normalized is not None and limit.min_cosine is not None  # validated by the policy
        out[name] = MatmulTolerance(limit.max_normalized, limit.min_cosine, note)
    return out


MATMUL_TOLERANCES: dict[str, MatmulTolerance] = _matmul_tolerances()
"""Per-dtype matmul limits: the ``reduction`` class of matrices/tolerances.yaml (docs/ops.md)."""


@dataclass(frozen=True)
class Comparison:
    """Result vs float64 reference."""

    normalized_error: float
    max_abs_error: float
    max_abs_ref: float
    cosine: float
    nonfinite: int
    worst_index: tuple[int, ...]
    worst_got: float
    worst_ref: float

    def within(self, tol: MatmulTolerance) -> bool:
        """True only when every element is finite and both limits hold. Written so that a
        NaN metric compares False and therefore fails."""
        return self.nonfinite == 0 and self.normalized_error <= tol.normalized and self.cosine >= tol.cosine

    def evidence(self) -> ComparisonFacts:
        return ComparisonFacts(
            normalized_error=self.normalized_error, max_abs_error=self.max_abs_error, max_abs_ref=self.max_abs_ref,
            cosine=self.cosine, nonfinite=self.nonfinite, worst_index=list(self.worst_index),
            worst_got=self.worst_got, worst_ref=self.worst_ref)


def compare_to_reference(got: torch.Tensor, ref: torch.Tensor) -> Comparison:
    """Compare a host tensor with its float64 reference (same shape)."""
    import torch

    if tuple(got.shape) != tuple(ref.shape):
        raise ValueError(f"shape {tuple(got.shape)} differs from reference {tuple(ref.shape)}")
    g = got.to(torch.float64)
    r = ref.to(torch.float64)
    finite = torch.isfinite(g)
    nonfinite = int((~finite).sum().item())
    diff = (g - r).abs()
    # A NaN anywhere must make the worst element the NaN one, so rank non-finite first.
    rank = torch.where(finite, diff, torch.full_like(diff, math.inf))
    flat = int(torch.argmax(rank).item())
    idx = _unravel(flat, tuple(g.shape))
    max_abs_ref = float(r.abs().max().item()) if r.numel() else 0.0
    max_abs_err = float(diff.max().item()) if nonfinite == 0 else math.nan
    denom = max_abs_ref if max_abs_ref > 0 else 1.0
    norms = float(torch.linalg.vector_norm(g).item()) * float(torch.linalg.vector_norm(r).item())
    if nonfinite:
        cosine = math.nan
    elif norms == 0.0:
        cosine = 1.0 if float(g.abs().max().item() if g.numel() else 0.0) == max_abs_ref else 0.0
    else:
        cosine = float((g * r).sum().item()) / norms
    return Comparison(
        normalized_error=max_abs_err / denom,
        max_abs_error=max_abs_err,
        max_abs_ref=max_abs_ref,
        cosine=cosine,
        nonfinite=nonfinite,
        worst_index=idx,
        worst_got=float(g[idx].item()),
        worst_ref=float(r[idx].item()),
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Multi-index of a flat (row-major) index. Plain Python: torch.unravel_index pulls in sympy."""
    out: list[int] = []
    for dim in reversed(shape):
        flat, rem = divmod(flat, dim)
        out.append(rem)
    return tuple(reversed(out))


_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def int_view(t: torch.Tensor) -> torch.Tensor:
    """The same bytes seen as an integer tensor of the same element size (bit-exact compare)."""
    import torch

    return t.view(getattr(torch, _INT_VIEW[t.element_size()]))


@dataclass(frozen=True)
class BitDiff:
    """Bit-level difference between what was sent and what came back."""

    elements: int
    mismatched: int
    first_index: int | None = None
    expected_bits: str = ""
    got_bits: str = ""
    problem: str = ""
    """Non-empty when the tensors are not even comparable (shape or dtype changed)."""

    @property
    def exact(self) -> bool:
        return not self.problem and self.mismatched == 0

    def evidence(self) -> BitDiffEvidence:
        out = BitDiffEvidence(elements=self.elements, mismatched=self.mismatched)
        if self.first_index is not None:
            out.first_index, out.expected_bits, out.got_bits = self.first_index, self.expected_bits, self.got_bits
        if self.problem:
            out.problem = self.problem
        return out


def bit_diff(expected: torch.Tensor, got: torch.Tensor) -> BitDiff:
    """Compare two host tensors element by element on their raw bits."""
    if got.dtype != expected.dtype or tuple(got.shape) != tuple(expected.shape):
        return BitDiff(expected.numel(), expected.numel(),
                       problem=f"came back as {got.dtype} {tuple(got.shape)}, sent {expected.dtype} {tuple(expected.shape)}")
    e = int_view(expected.contiguous()).reshape(-1)
    g = int_view(got.contiguous()).reshape(-1)
    ne = e != g
    mismatched = int(ne.sum().item())
    if mismatched == 0:
        return BitDiff(e.numel(), 0)
    first = int(ne.nonzero()[0].item())
    width = 2 * expected.element_size()
    mask = (1 << (8 * expected.element_size())) - 1
    return BitDiff(e.numel(), mismatched, first,
                   f"0x{int(e[first].item()) & mask:0{width}x}", f"0x{int(g[first].item()) & mask:0{width}x}")


SPECIAL_BITS: dict[str, tuple[int, ...]] = {
    # zero, -0.0, +inf, -inf, quiet NaN, signalling NaN, negative NaN with payload,
    # smallest denormal (±), largest denormal, smallest normal, largest finite.
    "fp32": (0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC00001,
             0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF),
}
"""Raw bit patterns a copy must preserve. 1- and 2-byte dtypes get *every* pattern instead
(see :func:`pattern_tensor`), so they need no list."""


def pattern_tensor(dtype_name: str, dtype: torch.dtype, nbytes: int, generator: torch.Generator) -> torch.Tensor:
    """A host tensor of ``dtype`` holding every special bit pattern followed by random bits.

    For 1- and 2-byte dtypes (int8, fp16, bf16, fp8) the prefix is all 2^8 / 2^16 bit patterns
    (every NaN, denormal, ±0, ±inf); for wider ones the :data:`SPECIAL_BITS` list. Random
    bits fill the rest up to ``nbytes``, so the bulk of the copy is incompressible and
    position-dependent.
    """
    import torch

    size = torch.empty((), dtype=dtype).element_size()
    int_dtype = getattr(torch, _INT_VIEW[size])
    if size <= 2:
        prefix = torch.arange(-(1 << (8 * size - 1)), 1 << (8 * size - 1), dtype=torch.int64).to(int_dtype)
    else:
        vals = [v - (1 << 32) if v >= (1 << 31) else v for v in SPECIAL_BITS.get(dtype_name, ())]
        prefix = torch.tensor(vals, dtype=torch.int64).to(int_dtype)
    rest = max(0, nbytes // size - prefix.numel())
    rand = torch.randint(0, 256, (rest * size,), dtype=torch.uint8, generator=generator).view(int_dtype)
    return torch.cat([prefix, rand]).view(dtype)
