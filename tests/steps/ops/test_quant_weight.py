"""Weight-quantized GEMMs (int4 GPTQ/AWQ, block fp8): the torch path and a reformulated correct
kernel pass over seeds; each planted layout or scale defect fails in every dtype."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.frameworks.quant_pack import AWQ_ORDER
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.families import quant_weight as qw
from adaptcheck.steps.ops.providers.base import DictProvider
from tests.steps.ops.planted_quant_weight import (
    block_fp8_per_k_block,
    block_fp8_per_tensor_act_scale,
    block_fp8_scales_transposed,
    int4_awq_order_kept,
    int4_factored,
    int4_half_group,
    int4_ignores_g_idx,
    int4_zero_off_by_one,
)

ALL = ["fp32", "bf16", "fp16"]
GPTQ = [{"name": "gptq_g128_prefill", "m": 32, "n": 64, "k": 256, "format": "gptq", "group_size": 128},
        {"name": "gptq_sym_g32_decode", "m": 1, "n": 64, "k": 128, "format": "gptq", "group_size": 32, "sym": True},
        {"name": "gptq_act_order_g64", "m": 4, "n": 64, "k": 256, "format": "gptq", "group_size": 64,
         "act_order": True},
        {"name": "gptq_per_channel", "m": 4, "n": 32, "k": 128, "format": "gptq", "group_size": -1}]
AWQ = [{"name": "awq_g128_prefill", "m": 32, "n": 64, "k": 256, "format": "awq", "group_size": 128},
       {"name": "awq_g64_decode", "m": 1, "n": 64, "k": 128, "format": "awq", "group_size": 64},
       {"name": "awq_sym_g32", "m": 4, "n": 32, "k": 64, "format": "awq", "group_size": 32, "sym": True}]
BLOCK = [{"name": "w8a8_prefill", "m": 16, "n": 384, "k": 256},
         {"name": "w8a8_decode_partial", "m": 1, "n": 320, "k": 384},
         {"name": "w8a16_prefill", "m": 8, "n": 384, "k": 256, "act": "w8a16"}]


def _ctx(seed: int) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run(op: str, fn: Callable[..., Any], cases: list[dict[str, Any]], dtypes: list[str] = ALL,
         seed: int = 0) -> dict[str, Status]:
    params = OpCheckParams.model_validate({"op": op, "dtypes": dtypes, "cases": cases, "budget_s": 120})
    return {str(o.subid): o.status for o in OpCheck(DictProvider("under_test", {op: fn})).run(_ctx(seed), params)}


# ------------------------------------------------------------------------------ int4


@pytest.mark.parametrize("seed", range(5))
def test_int4_torch_passes_across_seeds(seed: int) -> None:
    # More seeds and the ladder's own cases: benchmarks/family_quant_ops.py.
    assert set(_run("int4_w4a16_gemm", qw.int4_w4a16_gemm, GPTQ + AWQ, seed=seed).values()) == {Status.PASS}


def test_int4_factored_kernel_passes() -> None:
    assert set(_run("int4_w4a16_gemm", int4_factored, GPTQ + AWQ).values()) == {Status.PASS}


@pytest.mark.parametrize(("name", "wrong", "cases"), [
    ("gptq zero off by one", int4_zero_off_by_one, GPTQ[:2]),
    ("gptq sym zero off by one", int4_zero_off_by_one, GPTQ[1:2]),
    ("awq zero off by one", int4_zero_off_by_one, AWQ[:1]),
    ("awq order not de-interleaved", int4_awq_order_kept, AWQ[:1]),
    ("awq order not de-interleaved (sym)", int4_awq_order_kept, AWQ[2:]),
    ("act-order g_idx ignored", int4_ignores_g_idx, GPTQ[2:3]),
    ("group 64 for 128 (gptq)", int4_half_group, GPTQ[:1]),
    ("group 64 for 128 (awq)", int4_half_group, AWQ[:1]),
])
def test_int4_defects_are_caught(name: str, wrong: Callable[..., Any], cases: list[dict[str, Any]]) -> None:
    assert _run("int4_w4a16_gemm", wrong, cases) == dict.fromkeys(ALL, Status.FAIL), name


def test_awq_order_and_act_order_inputs() -> None:
    op_case = qw.Int4GemmCase.model_validate(GPTQ[2])
    inputs = qw._int4_inputs(op_case, "fp32", torch.Generator().manual_seed(1))
    g_idx = inputs.kwargs["g_idx"]
    assert isinstance(g_idx, torch.Tensor)
    assert not torch.equal(g_idx.long(), torch.arange(256) // 64)  # a real permutation's groups
    assert torch.bincount(g_idx.long()).tolist() == [64] * 4  # K=256, groups of 64
    assert AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    with pytest.raises(ValueError, match="GPTQ option"):
        qw.Int4GemmCase.model_validate({**AWQ[0], "act_order": True})


# ------------------------------------------------------------------------------ block fp8


@pytest.mark.parametrize("seed", range(5))
def test_block_fp8_torch_passes_across_seeds(seed: int) -> None:
    assert set(_run("block_fp8_gemm", qw.block_fp8_gemm, BLOCK, seed=seed).values()) == {Status.PASS}


def test_block_fp8_per_k_block_kernel_passes() -> None:
    assert set(_run("block_fp8_gemm", block_fp8_per_k_block, BLOCK).values()) == {Status.PASS}


@pytest.mark.parametrize(("wrong", "cases"), [(block_fp8_scales_transposed, BLOCK[:1]),
                                              (block_fp8_scales_transposed, BLOCK[2:]),
                                              (block_fp8_per_tensor_act_scale, BLOCK[:1]),
                                              (block_fp8_per_tensor_act_scale, BLOCK[1:2])])
def test_block_fp8_defects_are_caught(wrong: Callable[..., Any], cases: list[dict[str, Any]]) -> None:
    assert _run("block_fp8_gemm", wrong, cases) == dict.fromkeys(ALL, Status.FAIL)
