"""Norm ops: realistic kernel defects are caught, correct reorderings pass, across seeds."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families import norms as torch_norms
from adaptcheck.steps.ops.families.norms import NormCase, row_kinds
from adaptcheck.steps.ops.providers.base import DictProvider

CASES: list[dict[str, Any]] = [
    {"name": "mixed_rows", "tokens": 10, "hidden": 4096},
    {"name": "long_row", "tokens": 5, "hidden": 8192},
    {"name": "hidden_5120", "tokens": 5, "hidden": 5120},
    {"name": "hidden_1", "tokens": 5, "hidden": 1},
    {"name": "single_token", "tokens": 1, "hidden": 3584, "dist": "normal"},
    {"name": "outlier", "tokens": 3, "hidden": 4096, "dist": "outlier"},
]
LN_CASES: list[dict[str, Any]] = [*CASES, {"name": "near_constant", "tokens": 4, "hidden": 4096, "dist": "near_constant", "eps": 1e-05}]
ALL = ["fp32", "fp16", "bf16"]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run(op: str, fn: Callable[..., Any], dtypes: list[str], seed: int = 0,
         cases: list[dict[str, Any]] = CASES) -> dict[str, Status]:
    params = OpCheckParams(op=op, dtypes=dtypes, cases=cases)
    return {str(o.subid): o.status for o in OpCheck(DictProvider("under_test", {op: fn})).run(_ctx(seed), params)}


def _half(x: torch.Tensor) -> torch.dtype:
    """The low-precision accumulator a cheap kernel would use for this input."""
    return torch.float16 if x.dtype == torch.float16 else torch.bfloat16


# ---- RMSNorm: wrong ---------------------------------------------------------------

def rms_eps_ignored(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True))).to(x.dtype) * weight


def rms_eps_outside_sqrt(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 / (x32.pow(2).mean(-1, keepdim=True).sqrt() + eps)).to(x.dtype) * weight


def rms_half_accumulation(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Squares and per-lane partial sums in fp16 (32 lanes walking the row), then fp32 math."""
    lanes = 32
    pad = (-x.shape[-1]) % lanes
    xs = torch.nn.functional.pad(x.float(), (0, pad)).to(torch.float16).view(x.shape[0], -1, lanes)
    acc = torch.zeros(x.shape[0], lanes, dtype=torch.float16)
    for step in range(xs.shape[1]):
        acc = acc + xs[:, step] * xs[:, step]
    mean_square = acc.float().sum(-1, keepdim=True) / x.shape[-1]
    return (x.float() * torch.rsqrt(mean_square + eps)).to(x.dtype) * weight


def rms_input_dtype_accumulation(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """One running sum of squares per row kept in the input dtype (a thread-per-row kernel)."""
    acc = torch.zeros(x.shape[0], dtype=x.dtype)
    for h in range(x.shape[-1]):
        acc = acc + x[:, h] * x[:, h]
    mean_square = acc.float()[:, None] / x.shape[-1]
    return (x.float() * torch.rsqrt(mean_square + eps)).to(x.dtype) * weight


def rms_weight_not_applied(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


# ---- RMSNorm: correct, computed differently ------------------------------------------

def rms_via_vector_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """‖x‖₂/√H instead of a mean of squares, rows summed back to front in 96-wide blocks,
    weight applied in fp32 with one final rounding."""
    x32 = x.float()
    h = x.shape[-1]
    sum_sq = torch.zeros(x.shape[0], 1)
    for start in reversed(range(0, h, 96)):
        sum_sq += torch.linalg.vector_norm(x32[:, start:start + 96], dim=-1, keepdim=True) ** 2
    return (x32 / torch.sqrt(sum_sq / h + eps) * weight.float()).to(x.dtype)


# ---- fused add + RMSNorm ------------------------------------------------------------

def fused_stale_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalizes the sum but hands back the residual it was given (no write-back)."""
    out, _ = torch_norms.fused_add_rms_norm(x.clone(), residual.clone(), weight, eps)
    return out, residual


def fused_residual_is_output(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Writes the normalized output into the residual too (aliased buffers)."""
    out, _ = torch_norms.fused_add_rms_norm(x, residual, weight, eps)
    return out, out


def fused_norms_x_only(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Adds the residual but normalizes the layer output alone."""
    return torch_norms.rms_norm(x, weight, eps), (x.float() + residual.float()).to(x.dtype)


def fused_cuda_kernel_order(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Correct, the order vLLM's CUDA kernel uses: write the rounded sum into ``residual`` in
    place, then normalize what was stored (not the fp32 sum), into ``x`` in place."""
    residual.copy_(x.float() + residual.float())
    r32 = residual.float()
    inv = torch.rsqrt(r32.pow(2).sum(-1, keepdim=True) / x.shape[-1] + eps)
    x.copy_((r32 * inv).to(x.dtype) * weight)
    return x, residual


# ---- LayerNorm ------------------------------------------------------------------------

def ln_eps_ignored(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    centered = x32 - x32.mean(-1, keepdim=True)
    out = centered / centered.pow(2).mean(-1, keepdim=True).sqrt()
    return (out * weight.float() + bias.float()).to(x.dtype)


def ln_one_pass_variance(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """var = E[x²] − E[x]² in fp32: cancels when the mean is large next to the spread."""
    x32 = x.float()
    mean = x32.mean(-1, keepdim=True)
    var = (x32 * x32).mean(-1, keepdim=True) - mean * mean
    out = (x32 - mean) * torch.rsqrt(var.clamp(min=0) + eps)
    return (out * weight.float() + bias.float()).to(x.dtype)


def ln_unbiased_variance(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """torch.var's default (1/(H−1)) instead of LayerNorm's 1/H."""
    x32 = x.float()
    with warnings.catch_warnings():  # torch warns that H = 1 leaves no degree of freedom: that is the bug
        warnings.simplefilter("ignore", UserWarning)
        variance = x32.var(-1, keepdim=True)
    out = (x32 - x32.mean(-1, keepdim=True)) * torch.rsqrt(variance + eps)
    return (out * weight.float() + bias.float()).to(x.dtype)


def ln_bias_not_applied(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, None, eps)


def ln_welford_blocks(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """Correct, computed differently: per-block mean and M2 in fp32, merged with Chan's
    parallel-variance update (what a tiled GPU kernel does)."""
    x32 = x.float()
    count = torch.zeros(x.shape[0], 1)
    mean = torch.zeros(x.shape[0], 1)
    m2 = torch.zeros(x.shape[0], 1)
    for start in range(0, x.shape[-1], 160):
        block = x32[:, start:start + 160]
        n_b = float(block.shape[-1])
        mean_b = block.mean(-1, keepdim=True)
        m2_b = (block - mean_b).pow(2).sum(-1, keepdim=True)
        delta = mean_b - mean
        total = count + n_b
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + delta.pow(2) * count * n_b / total
        count = total
    out = (x32 - mean) * torch.rsqrt(m2 / count + eps)
    return (out * weight.float() + bias.float()).to(x.dtype)


# ---- tests ------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_torch_norms_pass_across_seeds(seed: int) -> None:
    passing = {d: Status.PASS for d in ALL}
    assert _run("rms_norm", torch_norms.rms_norm, ALL, seed) == passing
    assert _run("fused_add_rms_norm", torch_norms.fused_add_rms_norm, ALL, seed) == passing
    assert _run("layer_norm", torch_norms.layer_norm, ALL, seed, LN_CASES) == passing


@pytest.mark.parametrize("seed", range(2))
def test_reordered_correct_norms_pass(seed: int) -> None:
    passing = {d: Status.PASS for d in ALL}
    assert _run("rms_norm", rms_via_vector_norm, ALL, seed) == passing
    assert _run("fused_add_rms_norm", fused_cuda_kernel_order, ALL, seed) == passing
    assert _run("layer_norm", ln_welford_blocks, ALL, seed, LN_CASES) == passing


@pytest.mark.parametrize("wrong", [rms_eps_ignored, rms_eps_outside_sqrt, rms_half_accumulation,
                                   rms_weight_not_applied])
def test_rms_norm_defects_are_caught_in_every_dtype(wrong: Callable[..., torch.Tensor]) -> None:
    assert _run("rms_norm", wrong, ALL) == {d: Status.FAIL for d in ALL}


def test_rms_norm_input_dtype_accumulation_is_caught_without_overflow() -> None:
    # Only normal rows, so nothing overflows: the precision lost over 8192 additions alone fails.
    cases = [{"name": "long_row", "tokens": 4, "hidden": 8192, "dist": "normal"}]
    assert _run("rms_norm", rms_input_dtype_accumulation, ["fp16", "bf16"], cases=cases) == {
        "fp16": Status.FAIL, "bf16": Status.FAIL}


def test_rms_norm_zero_rows_give_nan_without_eps() -> None:
    params = OpCheckParams(op="rms_norm", dtypes=["bf16"], cases=[{"name": "zeros", "tokens": 2, "hidden": 64,
                                                                    "dist": "zeros"}])
    (outcome,) = OpCheck(DictProvider("x", {"rms_norm": rms_eps_ignored})).run(_ctx(), params)
    assert outcome.status is Status.FAIL
    assert outcome.details["cases"][0]["outputs"][0]["nonfinite_got"] == 128


@pytest.mark.parametrize("wrong", [fused_stale_residual, fused_residual_is_output, fused_norms_x_only])
def test_fused_add_rms_norm_defects_are_caught(wrong: Callable[..., Any]) -> None:
    assert _run("fused_add_rms_norm", wrong, ALL) == {d: Status.FAIL for d in ALL}


def test_fused_add_rms_norm_inputs_are_cloned_for_in_place_kernels() -> None:
    # fused_cuda_kernel_order writes into x and residual; the reference must still see the
    # originals (it passes only if the harness cloned them).
    assert _run("fused_add_rms_norm", fused_cuda_kernel_order, ["fp32"]) == {"fp32": Status.PASS}


@pytest.mark.parametrize("wrong", [ln_eps_ignored, ln_bias_not_applied])
def test_layer_norm_defects_are_caught_in_every_dtype(wrong: Callable[..., torch.Tensor]) -> None:
    assert _run("layer_norm", wrong, ALL, cases=LN_CASES) == {d: Status.FAIL for d in ALL}


def test_layer_norm_one_pass_variance_is_caught_in_fp32() -> None:
    # Half-precision inputs cannot carry a spread that small under that mean, so only fp32 shows it.
    cases = [{"name": "near_constant", "tokens": 4, "hidden": 4096, "dist": "near_constant", "eps": 1e-5}]
    assert _run("layer_norm", ln_one_pass_variance, ["fp32"], cases=cases) == {"fp32": Status.FAIL}


def test_layer_norm_unbiased_variance_is_caught() -> None:
    # 1/(H−1) is 1.2e-4 off at H = 4096 (fp32 sees it) and 0/0 at H = 1 (every dtype does).
    assert _run("layer_norm", ln_unbiased_variance, ["fp32"], cases=[LN_CASES[0]]) == {"fp32": Status.FAIL}
    assert _run("layer_norm", ln_unbiased_variance, ALL, cases=[LN_CASES[3]]) == {d: Status.FAIL for d in ALL}


def test_mixed_rows_cycle_through_every_kind_and_scaling_keeps_them() -> None:
    case = NormCase(name="c", tokens=100, hidden=8192)
    assert set(row_kinds(case)) == {"normal", "tiny", "zeros", "near_constant", "large"}
    small = case.scaled(0.001)
    assert small.hidden == 8192 and set(row_kinds(small)) == set(row_kinds(case))
