"""GEMM ops: realistic kernel defects are caught, correct reorderings pass, across seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers.base import DictProvider

CASES = [{"name": "square", "m": 32, "n": 32, "k": 64},
         {"name": "long_k", "m": 8, "n": 8, "k": 8192, "dist": "positive"},
         {"name": "unaligned", "m": 3, "n": 33, "k": 97}]


def _ctx(seed: int = 0) -> CheckContext:
    return CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())


def _run(fn, dtypes: list[str], seed: int = 0, op: str = "gemm", cases=CASES) -> dict[str, Status]:
    params = OpCheckParams(op=op, dtypes=dtypes, cases=cases)
    return {o.subid: o.status for o in OpCheck(DictProvider("under_test", {op: fn})).run(_ctx(seed), params)}


def low_precision_accumulation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Accumulates partial sums in the input dtype (bf16 for fp32 inputs): error grows with K."""
    acc_dtype = torch.bfloat16 if a.dtype == torch.float32 else a.dtype
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=acc_dtype)
    for i in range(0, a.shape[1], 32):
        acc = acc + (a[:, i:i + 32].float() @ b[i:i + 32].float()).to(acc_dtype)
    return acc.to(a.dtype)


def tf32_like(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 inputs silently rounded to 10 mantissa bits (TF32) before the product."""
    def round10(t: torch.Tensor) -> torch.Tensor:
        bits = t.float().view(torch.int32)
        return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return (round10(a) @ round10(b)).to(a.dtype)


def reversed_blocks(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Correct, but sums K in blocks of 96 from the last block to the first, in fp32."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    k = a.shape[1]
    for start in reversed(range(0, k, 96)):
        acc += a[:, start:start + 96].float() @ b[start:start + 96].float()
    return acc.to(a.dtype)


@pytest.mark.parametrize("seed", range(5))
def test_torch_and_reordered_correct_gemm_pass_across_seeds(seed: int) -> None:
    from adaptcheck.steps.ops.families.gemm import gemm

    assert set(_run(gemm, ["fp32", "bf16"], seed).values()) == {Status.PASS}
    assert set(_run(reversed_blocks, ["fp32", "bf16"], seed).values()) == {Status.PASS}


def test_low_precision_accumulation_is_caught() -> None:
    got = _run(low_precision_accumulation, ["fp32", "bf16", "fp16"])
    assert got == {"fp32": Status.FAIL, "bf16": Status.FAIL, "fp16": Status.FAIL}


def test_tf32_is_caught_for_fp32() -> None:
    assert _run(tf32_like, ["fp32"]) == {"fp32": Status.FAIL}


def test_one_wrong_element_is_caught_and_located() -> None:
    def off_by_a_bit(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = a @ b
        out[2, 5] += out.abs().max() * 0.05
        return out

    params = OpCheckParams(op="gemm", dtypes=["bf16"], cases=[CASES[0]])
    (outcome,) = OpCheck(DictProvider("x", {"gemm": off_by_a_bit})).run(_ctx(), params)
    assert outcome.status is Status.FAIL
    worst = outcome.details["cases"][0]["outputs"][0]["worst"]
    assert worst["index"] == [2, 5]


def test_kernel_that_raises_is_an_error_and_missing_op_is_not_applicable() -> None:
    def boom(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no kernel image for this device")

    assert _run(boom, ["fp32"]) == {"fp32": Status.ERROR}
    params = OpCheckParams(op="gemm", dtypes=["fp32"], cases=[CASES[0]])
    (outcome,) = OpCheck(DictProvider("empty", {})).run(_ctx(), params)
    assert outcome.status is Status.SKIP and outcome.applicable is False
    assert "does not implement 'gemm'" in outcome.message


def test_bmm_wrong_batch_order_is_caught() -> None:
    from adaptcheck.steps.ops.families.gemm import bmm

    cases = [{"name": "small", "batch": 3, "m": 8, "n": 8, "k": 16}]
    assert _run(bmm, ["fp32"], op="bmm", cases=cases) == {"fp32": Status.PASS}
    assert _run(lambda a, b: torch.bmm(a, b.flip(0)), ["fp32"], op="bmm", cases=cases) == {"fp32": Status.FAIL}
