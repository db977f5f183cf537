"""Activations family: SiLU, GELU (erf), GELU (tanh), SiLU-and-mul (SwiGLU), softmax.

Element-wise activations (``elementwise`` class) and what their inputs expose (``dist``):

* ``large``: |x| up to 80: a sigmoid written e^x / (1 + e^x), or e^(−x) formed in fp16,
  overflows to inf/inf = NaN (fp16 overflows from e^11.1, fp32 from e^88.7);
* ``overflow``: for silu_and_mul, fp16 gate/up pairs whose true product is at most 0.9 ·
  65504 but whose gate · up overflows when a negative gate is multiplied in before its
  sigmoid (silu(−30) · 3000 ≈ 0, −30 · 3000 = −inf in fp16); for single-input ops,
  values up to ±60000;
* ``denormal``: subnormal inputs of the dtype (fp32/bf16 ~1e-40, fp16 ~1e-6) catch a
  path that produces NaN/inf on them. A device that flushes them to zero stays within the
  element-wise atol (1e-5 / 1e-3) by policy; that is a limit of the class, not a pass of
  a flush check;
* ``normal``: N(0, 3²), where the erf and tanh GELUs differ most (≈4.7e-4 near x = −2.7:
  47× the fp32 tolerance, but only ~0.47× the fp16/bf16 ones, so only fp32 can tell them
  apart by policy).

Softmax is judged with the ``reduction`` class (max|Δ| / max p plus cosine), not
element-wise: over a 151,936-token vocabulary a flat row's probabilities are ~6.6e-6,
below the element-wise atol of every dtype (fp32 1e-5, fp16/bf16 1e-3), so an all-zeros
or 2×-too-small row would pass element-wise. Every softmax case holds rows of one kind so
the largest probability of the case is a fair scale for all its rows. Its inputs expose:
a missing max-subtraction (``large_offset``: logits at ±1e4, e^x overflows or underflows
in every dtype), a low-precision or truncated sum over a large vocabulary (``normal`` and
``wide`` at V = 151,936), a dominant logit (``dominant``, also at index V − 1), exact ties
(``flat``). Keep ``flat`` to V ≤ 16384 for fp16: at larger V every probability 1/V is an
fp16 subnormal that no fp16 output can hold to 2e-3 of itself (at V = 151,936 the
rounding alone is ≈1.9× the fp16 limit).

The torch implementations (``native``) are the public torch ops a model calls:
``F.silu``, ``F.gelu`` (erf / ``approximate='tanh'``), SwiGLU as vLLM's
``SiluAndMul.forward_native`` writes it, and ``torch.softmax`` in the input dtype (so a
device's half-precision softmax kernel is what gets checked).

Adding an op to a family: docs/adding-an-op.md.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from adaptcheck.base.dtypes import torch_dtype
from adaptcheck.steps.ops.opdef import CaseBase, OpDef, OpInputs
from reference_kernels import activations as ref

ActDist = Literal["mixed", "normal", "large", "denormal", "overflow"]
SoftmaxDist = Literal["normal", "wide", "large_offset", "dominant", "flat"]

MIXED_CYCLE: tuple[ActDist, ...] = ("normal", "large", "denormal", "overflow")
"""Row kinds of ``dist: mixed`` for activations, row t taking MIXED_CYCLE[t % 4]."""

FP16_MAX = 65504.0
LARGE_OFFSET = 1.0e4
"""Softmax ``large_offset`` logits sit at ±1e4: e^x is inf (or 0) in fp16, bf16 and fp32."""
WIDE_STD = 2.0
"""Std of ``wide`` logits (and of the noise on ``large_offset`` rows)."""
DOMINANT_GAP = 25.0
"""The dominant logit's lead: it takes ≈ 1 − V·e^−25 of the mass."""


class ActCase(CaseBase):
    """x: [tokens, width] (silu_and_mul: [tokens, 2 · width], output [tokens, width])."""

    tokens: int = Field(ge=1, description="Rows (T).")
    width: int = Field(ge=1, description="Elements per row of the output (D).")
    dist: ActDist = Field(default="mixed", description="Input values; 'mixed' cycles through the kinds by row.")

    def work(self) -> float:
        return 40.0 * self.tokens * self.width

    def scaled(self, factor: float) -> ActCase:
        keep = min(self.tokens, len(MIXED_CYCLE))
        return self.model_copy(update={"tokens": max(keep, int(self.tokens * factor))})


class SoftmaxCase(CaseBase):
    """x: [tokens, vocab] logits; softmax over the vocabulary."""

    tokens: int = Field(ge=1, description="Rows (T).")
    vocab: int = Field(ge=1, description="Length of the softmax (V), e.g. 151936 for Qwen.")
    dist: SoftmaxDist = Field(default="normal", description="Logit distribution (one kind per case).")

    def work(self) -> float:
        return 30.0 * self.tokens * self.vocab

    def scaled(self, factor: float) -> SoftmaxCase:
        # The vocabulary size is the point of the case; only rows are dropped.
        return self.model_copy(update={"tokens": max(1, int(self.tokens * factor))})


def _uniform(n: int, low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=gen, dtype=torch.float64)


def _signs(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=gen).to(torch.float64) * 2 - 1


def _denormals(n: int, dtype: str, gen: torch.Generator) -> torch.Tensor:
    # Log-uniform over the subnormal range of the dtype (fp32 and bf16 share an exponent range).
    lo, hi = (-7.2, -4.3) if dtype == "fp16" else (-44.5, -38.2)
    return _signs(n, gen) * 10.0 ** _uniform(n, lo, hi, gen)


def _single_row(kind: ActDist, width: int, dtype: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return 3.0 * torch.randn(width, generator=gen, dtype=torch.float64)
    if kind == "large":
        return _uniform(width, -80.0, 80.0, gen)
    if kind == "denormal":
        return _denormals(width, dtype, gen)
    return _uniform(width, -60000.0, 60000.0, gen)  # overflow: fp16's top range


def _gate_up_row(kind: ActDist, width: int, dtype: str, gen: torch.Generator) -> torch.Tensor:
    """[gate | up] for one row of silu_and_mul."""
    tdt = torch_dtype(dtype)
    if kind != "overflow":
        return torch.cat([_single_row(kind, width, dtype, gen), _single_row(kind, width, dtype, gen)])
    positive = torch.rand(width, generator=gen) < 0.5
    gate = torch.where(positive, _uniform(width, 0.0, 250.0, gen), _uniform(width, -250.0, -30.0, gen))
    gate = gate.to(tdt).to(torch.float64)
    silu_gate = torch.from_numpy(ref.silu(gate.numpy())).abs()
    target = _signs(width, gen) * _uniform(width, 0.5, 0.9, gen) * FP16_MAX
    # Positive gates: |silu(g) · up| = target ≤ 0.9 · 65504. Negative gates ≤ −30 with
    # |up| ≥ 3000: |g · up| ≥ 90000 overflows fp16 while silu(g) · up ≈ 0. Gates in
    # (−30, 0) are left out on purpose: there silu(g) is an fp16 subnormal whose rounding,
    # times |up| in the thousands, exceeds the fp16 atol even for a correct kernel.
    up = torch.where(positive, target / silu_gate.clamp(min=1.0), _signs(width, gen) * _uniform(width, 3000.0, 60000.0, gen))
    return torch.cat([gate, up.clamp(-60000.0, 60000.0)])


def _kinds(case: ActCase) -> list[ActDist]:
    if case.dist == "mixed":
        return [MIXED_CYCLE[t % len(MIXED_CYCLE)] for t in range(case.tokens)]
    return [case.dist] * case.tokens


def _unary_inputs(case: ActCase, dtype: str, gen: torch.Generator) -> OpInputs:
    kinds = _kinds(case)
    x = torch.stack([_single_row(k, case.width, dtype, gen) for k in kinds])
    return OpInputs({"x": x.to(torch_dtype(dtype))},
                    notes={"dist": case.dist, "row_kinds": {k: kinds.count(k) for k in dict.fromkeys(kinds)}})


def _silu_and_mul_inputs(case: ActCase, dtype: str, gen: torch.Generator) -> OpInputs:
    kinds = _kinds(case)
    x = torch.stack([_gate_up_row(k, case.width, dtype, gen) for k in kinds])
    return OpInputs({"x": x.to(torch_dtype(dtype))},
                    notes={"dist": case.dist, "row_kinds": {k: kinds.count(k) for k in dict.fromkeys(kinds)}})


def _softmax_inputs(case: SoftmaxCase, dtype: str, gen: torch.Generator) -> OpInputs:
    t, v = case.tokens, case.vocab
    noise = torch.randn(t, v, generator=gen, dtype=torch.float64)
    notes: dict[str, object] = {"dist": case.dist}
    if case.dist == "normal":
        x = noise
    elif case.dist == "wide":
        # LM-head-like spread: the top tokens hold much of the mass. (Std 2, not more: at
        # std 3-4 over 151,936 tokens torch's own fp32 CPU softmax drops tail terms below one
        # ulp of its running sum and lands at 0.7-2.4× the fp32 reduction limit.)
        x = WIDE_STD * noise
    elif case.dist == "large_offset":
        # Rows alternate +1e4 / −1e4: without the max-subtraction e^x is inf (or 0 → 0/0).
        offsets = torch.tensor([LARGE_OFFSET if i % 2 == 0 else -LARGE_OFFSET for i in range(t)],
                               dtype=torch.float64)
        x = offsets[:, None] + WIDE_STD * noise
        notes["offset"] = LARGE_OFFSET
    elif case.dist == "dominant":
        x = noise
        where = torch.randint(0, v, (t,), generator=gen)
        where[0] = v - 1  # the last vocabulary slot, where an index-width bug would show
        x[torch.arange(t), where] += DOMINANT_GAP
        notes["dominant_index"] = [int(i) for i in where[:8]]
    else:  # flat: exact ties, every probability 1/V
        x = torch.zeros(t, v, dtype=torch.float64)
    return OpInputs({"x": x.to(torch_dtype(dtype))}, notes=notes)


_ELEMENTWISE = ("elementwise",)


# --- native: the torch provider's implementation (device-generic torch, the path a model takes
# without custom kernels); each OpDef below names its function, and the provider reads them there.


def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="none")


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


OPS = [
    OpDef(
        name="silu", family="activations", description="SiLU / swish: x · sigmoid(x).",
        signature="silu(x: [T, D]) -> out: [T, D] (x's dtype)",
        case_model=ActCase, make_inputs=_unary_inputs, reference=ref.silu, native=silu,
        outputs=("out",), tolerance=_ELEMENTWISE,
    ),
    OpDef(
        name="gelu", family="activations", description="GELU, exact erf form: x · Φ(x).",
        signature="gelu(x: [T, D]) -> out: [T, D] (erf form, not the tanh approximation)",
        case_model=ActCase, make_inputs=_unary_inputs, reference=ref.gelu, native=gelu,
        outputs=("out",), tolerance=_ELEMENTWISE,
    ),
    OpDef(
        name="gelu_tanh", family="activations",
        description="GELU, tanh approximation: ½x(1 + tanh(√(2/π)(x + 0.044715x³))).",
        signature="gelu_tanh(x: [T, D]) -> out: [T, D]",
        case_model=ActCase, make_inputs=_unary_inputs, reference=ref.gelu_tanh, native=gelu_tanh,
        outputs=("out",), tolerance=_ELEMENTWISE,
    ),
    OpDef(
        name="silu_and_mul", family="activations",
        description="SwiGLU gate: silu(x[:, :D]) · x[:, D:] (first half is the gate).",
        signature="silu_and_mul(x: [T, 2D]) -> out: [T, D]",
        case_model=ActCase, make_inputs=_silu_and_mul_inputs, reference=ref.silu_and_mul, native=silu_and_mul,
        outputs=("out",), tolerance=_ELEMENTWISE,
    ),
    OpDef(
        name="softmax", family="activations", description="Softmax over the last dimension.",
        signature="softmax(x: [T, V]) -> out: [T, V] probabilities (x's dtype or fp32)",
        case_model=SoftmaxCase, make_inputs=_softmax_inputs, reference=ref.softmax, native=softmax,
        outputs=("out",), tolerance=("reduction",),
    ),
]
