"""smoke.matmul: passes on the real CPU, and provably fails for wrong device implementations."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from adaptcheck.steps.smoke.matmul import (
    MIN_K,
    MIN_N,
    MatmulCheck,
    MatmulParams,
    full_fp32_precision,
)
from adaptcheck.steps.smoke.numerics import MATMUL_TOLERANCES
from adaptcheck.steps.smoke.ops import DeviceOps

from .helpers import (
    FAIL,
    PASS,
    SKIP,
    BlockedReverseOps,
    Fp32OnlyBackend,
    LowPrecisionAccumulationOps,
    NanOps,
    PerturbedOps,
    PrecisionSpyOps,
    SlowDtypeOps,
    Tf32Ops,
    UpcastOutputOps,
    by_subid,
    make_ctx,
)

# Small, fixed caps keep these tests fast; the budget is generous so that the caps (not
# machine noise) decide the sizes: n = max_n and K = max_k on any machine.
SMALL = MatmulParams(dtypes=["fp32", "bf16", "fp16"], budget_s=4.0, max_n=128, max_k=4096)


def run(tmp_path: Path, ops: DeviceOps | None = None, params: MatmulParams = SMALL, backend: object = None) -> dict:
    return by_subid(MatmulCheck(ops).run(make_ctx(tmp_path, backend), params))


def test_real_cpu_passes_every_dtype_with_error_beside_tolerance(tmp_path: Path) -> None:
    out = run(tmp_path)
    assert set(out) == {"fp32", "bf16", "fp16"}
    for name, o in out.items():
        assert o.status == PASS, o.message
        tol = MATMUL_TOLERANCES[name].normalized
        assert o.metrics["tolerance_normalized"] == tol
        for case in ("square", "long_k"):
            err = o.metrics[f"{case}.normalized_error"]
            assert 0 <= err <= tol
            assert o.metrics[f"{case}.cosine"] >= 0.9999
        assert o.metrics["square.n"] == 128 and o.metrics["long_k.k"] == 4096
        assert o.details["sizing"]["square"]["limited_by"] == "max_n"
    # fp32 on a correct fp32 path is far inside its limit (TF32 would sit near 1e-4).
    assert out["fp32"].metrics["square.normalized_error"] < 1e-6


def test_undeclared_dtypes_are_not_applicable_skips(tmp_path: Path) -> None:
    out = run(tmp_path, backend=Fp32OnlyBackend())
    assert out["fp32"].status == PASS
    for name in ("bf16", "fp16"):
        assert out[name].status == SKIP and out[name].applicable is False
        assert "does not declare" in out[name].message


def test_fp32_accumulated_in_bf16_fails(tmp_path: Path) -> None:
    out = run(tmp_path, LowPrecisionAccumulationOps(torch.bfloat16))
    assert out["fp32"].status == FAIL
    assert out["fp32"].metrics["square.normalized_error"] > 1e-3  # bf16 accumulation: ~1e-2, limit 1e-5
    assert "normalized error" in out["fp32"].message


def test_bf16_and_fp16_accumulated_in_their_own_precision_fail_through_long_k(tmp_path: Path) -> None:
    bf16 = run(tmp_path, LowPrecisionAccumulationOps(torch.bfloat16))["bf16"]
    fp16 = run(tmp_path, LowPrecisionAccumulationOps(torch.float16))["fp16"]
    for o in (bf16, fp16):
        assert o.status == FAIL, o.message
        assert "long_k" in o.message
        assert o.metrics["long_k.normalized_error"] > o.metrics["tolerance_normalized"]


def test_accumulation_error_grows_with_k(tmp_path: Path) -> None:
    """Why the long-K case exists: a chunked bf16 accumulator passes at K=256 and fails at K=4096."""
    ops = LowPrecisionAccumulationOps(torch.bfloat16, chunk=16)
    short = run(tmp_path, ops, MatmulParams(dtypes=["bf16"], budget_s=4.0, max_n=MIN_N, max_k=MIN_K))["bf16"]
    long = run(tmp_path, ops, MatmulParams(dtypes=["bf16"], budget_s=4.0, max_n=MIN_N, max_k=4096))["bf16"]
    assert short.metrics["long_k.k"] == MIN_K and long.metrics["long_k.k"] == 4096
    assert short.status == PASS, short.message
    assert long.status == FAIL
    assert long.metrics["long_k.normalized_error"] > 2 * short.metrics["long_k.normalized_error"]


def test_tf32_silently_on_fails_fp32_only(tmp_path: Path) -> None:
    out = run(tmp_path, Tf32Ops())
    assert out["fp32"].status == FAIL
    assert 1e-5 < out["fp32"].metrics["square.normalized_error"] < 1e-2
    assert out["bf16"].status == PASS and out["fp16"].status == PASS


@pytest.mark.parametrize("rel", [0.05])
def test_one_perturbed_element_fails_every_dtype(tmp_path: Path, rel: float) -> None:
    out = run(tmp_path, PerturbedOps(rel))
    for name, o in out.items():
        assert o.status == FAIL, name
        worst = o.details["square"]["comparison"]["worst_index"]
        assert worst == [128 // 3, 128 // 2]  # the check points at the element that was moved


def test_small_perturbation_fails_fp32(tmp_path: Path) -> None:
    out = run(tmp_path, PerturbedOps(1e-4), MatmulParams(dtypes=["fp32"], budget_s=4.0, max_n=128, max_k=1024))
    assert out["fp32"].status == FAIL


def test_nan_in_result_fails(tmp_path: Path) -> None:
    out = run(tmp_path, NanOps(), MatmulParams(dtypes=["fp32", "bf16"], budget_s=4.0, max_n=64, max_k=512))
    for o in out.values():
        assert o.status == FAIL and "non-finite" in o.message


def test_wrong_output_dtype_fails(tmp_path: Path) -> None:
    out = run(tmp_path, UpcastOutputOps(), MatmulParams(dtypes=["bf16"], budget_s=4.0, max_n=64, max_k=512))
    assert out["bf16"].status == FAIL and "torch.float32" in out["bf16"].message


def test_differently_ordered_correct_implementation_passes(tmp_path: Path) -> None:
    out = run(tmp_path, BlockedReverseOps())
    for name, o in out.items():
        assert o.status == PASS, (name, o.message)
        # …and it really did compute differently from torch.matmul in fp32:
    assert out["fp32"].metrics["long_k.normalized_error"] > 0


def test_slow_dtype_gets_a_small_n_within_budget(tmp_path: Path) -> None:
    budget = 1.0
    params = MatmulParams(dtypes=["fp32", "fp16"], budget_s=budget, max_n=512, max_k=65536)
    start = time.perf_counter()
    out = run(tmp_path, SlowDtypeOps(torch.float16, gflops=0.02), params)
    took = time.perf_counter() - start
    fast, slow = out["fp32"], out["fp16"]
    assert fast.status == PASS and slow.status == PASS
    # 0.02 GFLOP/s and 0.5 s per case: n ≈ (0.5 × 2e7 / 2)^(1/3) ≈ 170, K ≈ 1200.
    assert slow.metrics["square.n"] <= 192
    assert slow.metrics["square.n"] < fast.metrics["square.n"]
    assert slow.metrics["long_k.k"] <= 2048 < fast.metrics["long_k.k"]
    assert slow.metrics["square.device_s"] <= budget / 2 * 1.5
    assert slow.metrics["long_k.device_s"] <= budget / 2 * 1.5
    assert took < 10 * budget  # probing stays a small share


def test_fp32_runs_at_highest_precision_and_setting_is_restored(tmp_path: Path) -> None:
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        spy = PrecisionSpyOps()
        out = run(tmp_path, spy, MatmulParams(dtypes=["fp32"], budget_s=1.0, max_n=64, max_k=512))
        assert out["fp32"].status == PASS
        assert spy.seen == {"highest"}
        assert "torch.float32_matmul_precision" in out["fp32"].details["precision_switches"]
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(prev)


def test_precision_switches_restored_after_an_exception(tmp_path: Path) -> None:
    from adaptcheck.backends.cpu import CpuBackend

    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with pytest.raises(RuntimeError), full_fp32_precision(CpuBackend()):
            assert torch.get_float32_matmul_precision() == "highest"
            raise RuntimeError("boom")
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(prev)


def test_params_are_strict() -> None:
    with pytest.raises(ValueError):
        MatmulParams.model_validate({"dtypes": ["fp32"], "bogus": 1})
    with pytest.raises(ValueError):
        MatmulParams.model_validate({"dtypes": ["int8"]})
    with pytest.raises(ValueError):
        MatmulParams.model_validate({"dtypes": []})


def test_a_crashing_dtype_errors_alone(tmp_path: Path) -> None:
    class Fp16Crashes(DeviceOps):
        def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            if a.dtype == torch.float16:
                raise RuntimeError("no fp16 kernel for this shape")
            return torch.matmul(a, b)

    out = run(tmp_path, Fp16Crashes(), MatmulParams(dtypes=["fp32", "fp16"], budget_s=1.0, max_n=64, max_k=512))
    assert out["fp32"].status == PASS
    assert out["fp16"].status.value == "error" and "no fp16 kernel" in out["fp16"].message
    assert "Traceback" in out["fp16"].details["traceback"]


def test_sizing_names_what_bounded_it(tmp_path: Path) -> None:
    out = run(tmp_path, SlowDtypeOps(torch.float16, gflops=0.02),
              MatmulParams(dtypes=["fp32", "fp16"], budget_s=1.0, max_n=256, max_k=2048))
    assert out["fp32"].details["sizing"]["square"]["limited_by"] == "max_n"
    assert out["fp16"].details["sizing"]["square"]["limited_by"] == "budget (device)"
