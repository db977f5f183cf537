"""Activation ops and softmax: realistic kernel defects are caught, correct rewrites pass."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families import activations as torch_act
from adaptcheck.steps.ops.families.activations import ActCase, SoftmaxCase
from adaptcheck.steps.ops.providers.base import DictProvider

pytestmark = pytest.mark.slow  # real processes or servers: outside the fast lane (-m "not slow")

ACT_CASES: list[dict[str, Any]] = [
    {"name": "mixed_rows", "tokens": 8, "width": 4096},
    {"name": "large", "tokens": 2, "width": 1000, "dist": "large"},
    {"name": "overflow", "tokens": 2, "width": 1000, "dist": "overflow"},
    {"name": "denormal", "tokens": 2, "width": 1000, "dist": "denormal"},
    {"name": "odd_single", "tokens": 1, "width": 11, "dist": "normal"},
]
SOFTMAX_CASES: list[dict[str, Any]] = [
    {"name": "qwen_vocab", "tokens": 2, "vocab": 151936},
    {"name": "wide_logits", "tokens": 2, "vocab": 151936, "dist": "wide"},
    {"name": "large_offset", "tokens": 4, "vocab": 32000, "dist": "large_offset"},
    {"name": "dominant", "tokens": 2, "vocab": 151936, "dist": "dominant"},
    {"name": "ties", "tokens": 2, "vocab": 16384, "dist": "flat"},
    {"name": "single_row_odd", "tokens": 1, "vocab": 7},
]
ALL = ["fp32", "fp16", "bf16"]
CORRECT_DTYPES = ["fp32", "bf16", "fp16"]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run(op: str, fn: Callable[..., Any], dtypes: list[str], seed: int = 0,
         cases: list[dict[str, Any]] | None = None) -> dict[str, Status]:
    if cases is None:
        cases = SOFTMAX_CASES if op == "softmax" else ACT_CASES
    params = OpCheckParams(op=op, dtypes=dtypes, cases=cases)
    return {str(o.subid): o.status for o in OpCheck(DictProvider("under_test", {op: fn})).run(_ctx(seed), params)}


# ---- SiLU ----------------------------------------------------------------------------

def silu_naive_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """σ(x) written e^x / (1 + e^x) in the input dtype: inf / inf = NaN once e^x overflows."""
    e = torch.exp(x)
    return x * (e / (1 + e))


def silu_bf16_math(x: torch.Tensor) -> torch.Tensor:
    """Computes in bf16 whatever the input (a kernel with one low-precision code path)."""
    return torch.nn.functional.silu(x.to(torch.bfloat16)).to(x.dtype)


def silu_reciprocal_form(x: torch.Tensor) -> torch.Tensor:
    """Correct, written differently: x / (1 + e^−x) in fp32 (e^−x = inf gives −0, as it should)."""
    x32 = x.float()
    return (x32 / (1.0 + torch.exp(-x32))).to(x.dtype)


# ---- GELU ----------------------------------------------------------------------------

def gelu_tanh_instead_of_erf(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def gelu_quick(x: torch.Tensor) -> torch.Tensor:
    """The sigmoid approximation x · σ(1.702 x) ("quick GELU") where the erf form is required."""
    x32 = x.float()
    return (x32 * torch.sigmoid(1.702 * x32)).to(x.dtype)


def gelu_erf_formula(x: torch.Tensor) -> torch.Tensor:
    """Correct, written out: ½ x (1 + erf(x / √2)) in fp32."""
    x32 = x.float()
    return (0.5 * x32 * (1.0 + torch.erf(x32 / math.sqrt(2.0)))).to(x.dtype)


def gelu_erf_instead_of_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="none")


def gelu_tanh_without_cubic(x: torch.Tensor) -> torch.Tensor:
    """Drops the 0.044715 x³ term."""
    x32 = x.float()
    return (0.5 * x32 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * x32))).to(x.dtype)


def gelu_tanh_sigmoid_identity(x: torch.Tensor) -> torch.Tensor:
    """Correct, written differently: ½(1 + tanh u) = σ(2u), so x · σ(2u) in fp32."""
    x32 = x.float()
    u = math.sqrt(2.0 / math.pi) * (x32 + 0.044715 * x32 * x32 * x32)
    return (x32 * torch.sigmoid(2.0 * u)).to(x.dtype)


# ---- SiLU and mul -----------------------------------------------------------------------

def silu_and_mul_halves_swapped(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., d:]) * x[..., :d]


def silu_and_mul_product_first(x: torch.Tensor) -> torch.Tensor:
    """gate · up first, then · σ(gate), in the input dtype: a negative gate's huge gate · up
    overflows fp16 to ∓inf before σ(gate) ≈ 0 can cancel it (inf · 0 = NaN)."""
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    return gate * up * torch.sigmoid(gate)


def silu_and_mul_fp32(x: torch.Tensor) -> torch.Tensor:
    """Correct, fused style: everything in fp32, one rounding at the end."""
    d = x.shape[-1] // 2
    x32 = x.float()
    return (torch.nn.functional.silu(x32[..., :d]) * x32[..., d:]).to(x.dtype)


# ---- softmax ----------------------------------------------------------------------------

def softmax_no_max_subtraction(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x.float())
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def softmax_wrong_dim(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=0)


def softmax_bf16_sum(x: torch.Tensor) -> torch.Tensor:
    """Exponentials in fp32 but the denominator summed by 32 lanes in bf16."""
    x32 = x.float()
    e = torch.exp(x32 - x32.max(-1, keepdim=True).values)
    pad = (-e.shape[-1]) % 32
    lanes = torch.nn.functional.pad(e, (0, pad)).view(e.shape[0], -1, 32)
    acc = torch.zeros(e.shape[0], 32, dtype=torch.bfloat16)
    for step in range(lanes.shape[1]):
        acc = acc + lanes[:, step].to(torch.bfloat16)
    return (e / acc.float().sum(-1, keepdim=True)).to(x.dtype)


def softmax_truncated_sum(x: torch.Tensor) -> torch.Tensor:
    """The denominator only covers the first 65536 entries (a 16-bit loop bound)."""
    x32 = x.float()
    e = torch.exp(x32 - x32.max(-1, keepdim=True).values)
    return (e / e[:, :65536].sum(-1, keepdim=True)).to(x.dtype)


def softmax_log_sum_exp(x: torch.Tensor) -> torch.Tensor:
    """Correct, written differently: exp((x − m) − log Σ e^(x − m)) in fp32 (log-softmax, then exp).

    (Not exp(x − logsumexp(x)): rounding logsumexp to fp32 at |x| ≈ 1e4 costs ≈ 1e4 · 2⁻²⁴
    = 6e-4 of every probability, 36× the fp32 limit on the large-offset case.)
    """
    x32 = x.float()
    shifted = x32 - x32.max(-1, keepdim=True).values
    return torch.exp(shifted - torch.log(torch.exp(shifted).sum(-1, keepdim=True))).to(x.dtype)


def softmax_exp_minus_logsumexp(x: torch.Tensor) -> torch.Tensor:
    """exp(x − logsumexp(x)) in fp32: fine for small logits, 6e-4 off at |x| ≈ 1e4."""
    x32 = x.float()
    return torch.exp(x32 - torch.logsumexp(x32, dim=-1, keepdim=True)).to(x.dtype)


def softmax_online(x: torch.Tensor) -> torch.Tensor:
    """Correct, flash style: one pass over 4096-wide chunks keeping a running max and a
    running sum rescaled whenever the max grows."""
    x32 = x.float()
    run_max = torch.full((x.shape[0], 1), -math.inf)
    run_sum = torch.zeros(x.shape[0], 1)
    for start in range(0, x.shape[-1], 4096):
        chunk = x32[:, start:start + 4096]
        new_max = torch.maximum(run_max, chunk.max(-1, keepdim=True).values)
        run_sum = run_sum * torch.exp(run_max - new_max) + torch.exp(chunk - new_max).sum(-1, keepdim=True)
        run_max = new_max
    return (torch.exp(x32 - run_max) / run_sum).to(x.dtype)


# ---- tests ------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_torch_and_rewritten_correct_activations_pass_across_seeds(seed: int) -> None:
    passing = {d: Status.PASS for d in CORRECT_DTYPES}
    for op, alternative in [("silu", silu_reciprocal_form), ("gelu", gelu_erf_formula),
                            ("gelu_tanh", gelu_tanh_sigmoid_identity), ("silu_and_mul", silu_and_mul_fp32)]:
        assert _run(op, get_op(op).native, CORRECT_DTYPES, seed) == passing, op
        assert _run(op, alternative, CORRECT_DTYPES, seed) == passing, alternative.__name__


@pytest.mark.parametrize("seed", range(5))
def test_torch_softmax_passes_across_seeds(seed: int) -> None:
    assert _run("softmax", torch_act.softmax, CORRECT_DTYPES, seed) == {d: Status.PASS for d in CORRECT_DTYPES}


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("alternative", [softmax_log_sum_exp, softmax_online])
def test_rewritten_correct_softmax_passes(seed: int, alternative: Callable[..., torch.Tensor]) -> None:
    assert _run("softmax", alternative, CORRECT_DTYPES, seed) == {d: Status.PASS for d in CORRECT_DTYPES}


@pytest.mark.parametrize(("op", "wrong", "caught"), [
    ("silu", silu_naive_sigmoid, ALL),
    ("silu", silu_bf16_math, ["fp32", "fp16"]),
    ("gelu", gelu_quick, ALL),
    ("gelu", gelu_tanh_instead_of_erf, ["fp32"]),
    ("gelu_tanh", gelu_erf_instead_of_tanh, ["fp32"]),
    ("gelu_tanh", gelu_tanh_without_cubic, ALL),
    ("silu_and_mul", silu_and_mul_halves_swapped, ALL),
    ("silu_and_mul", silu_and_mul_product_first, ["fp16"]),
    ("softmax", softmax_no_max_subtraction, ALL),
    ("softmax", softmax_wrong_dim, ALL),
    ("softmax", softmax_bf16_sum, ALL),
    ("softmax", softmax_truncated_sum, ALL),
])
def test_activation_defects_are_caught(op: str, wrong: Callable[..., torch.Tensor], caught: list[str]) -> None:
    assert _run(op, wrong, caught) == {d: Status.FAIL for d in caught}


def test_erf_and_tanh_gelu_are_within_half_precision_tolerance_of_each_other() -> None:
    # Documented limit of the element-wise class: the two GELUs differ by ≤ 4.7e-4, under
    # the fp16/bf16 atol of 1e-3, so only fp32 tells them apart.
    assert _run("gelu", gelu_tanh_instead_of_erf, ["fp16", "bf16"]) == {"fp16": Status.PASS, "bf16": Status.PASS}


def test_softmax_via_rounded_logsumexp_is_too_coarse_for_fp32_at_large_offsets() -> None:
    assert _run("softmax", softmax_exp_minus_logsumexp, ["fp32"], cases=[SOFTMAX_CASES[2]]) == {"fp32": Status.FAIL}
    assert _run("softmax", softmax_exp_minus_logsumexp, ALL, cases=[SOFTMAX_CASES[0]]) == {
        d: Status.PASS for d in ALL}


def test_softmax_without_max_subtraction_turns_large_offsets_into_nan() -> None:
    params = OpCheckParams(op="softmax", dtypes=["fp16"], cases=[SOFTMAX_CASES[2]])
    (outcome,) = OpCheck(DictProvider("x", {"softmax": softmax_no_max_subtraction})).run(_ctx(), params)
    assert outcome.status is Status.FAIL
    assert outcome.details["cases"][0]["outputs"][0]["nonfinite_got"] > 0


def test_scaling_keeps_the_vocabulary_and_the_row_kinds() -> None:
    soft = SoftmaxCase(name="s", tokens=64, vocab=151936).scaled(0.01)
    assert soft.vocab == 151936 and soft.tokens == 1
    act = ActCase(name="a", tokens=1000, width=14336).scaled(0.0001)
    assert act.width == 14336 and act.tokens == 4
