"""Healthy-pass / planted-fail figures of step 3's weight-quantized GEMMs (int4_w4a16_gemm for
GPTQ and AWQ, block_fp8_gemm) over seeds, on the standard ladder's own cases: the torch path
and a reformulated correct kernel must pass every seed; each planted defect (a zero point off
by one, AWQ's order not undone, act-order's g_idx ignored, the group size halved, block scales
indexed transposed, one activation scale per tensor) must fail every seed, in every dtype.

Prints one row per (variant, ladder check, seed): the status per dtype and the worst ratio to
the tolerance (≤ 1 passes); exits 1 when any healthy run fails or any planted run passes.

Run: PYTHONPATH=. python benchmarks/family_quant_ops.py [--seeds 5] [--checks ops.block_fp8_gemm]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers.base import DictProvider
from tests.steps.ops import planted_quant_weight as pq

LADDER = Path(__file__).resolve().parents[1] / "ladders" / "standard.yaml"
CHECKS = ("ops.int4_w4a16_gemm.gptq", "ops.int4_w4a16_gemm.gptq_act_order", "ops.int4_w4a16_gemm.awq",
          "ops.block_fp8_gemm")

# Which ladder checks each planted defect is run against: those whose cases contain what it breaks.
TARGETS: dict[str, tuple[str, ...]] = {
    "int4_zero_off_by_one": CHECKS[:3],
    "int4_awq_order_kept": ("ops.int4_w4a16_gemm.awq",),
    "int4_ignores_g_idx": ("ops.int4_w4a16_gemm.gptq_act_order",),
    "int4_half_group": CHECKS[:3],
    "block_fp8_scales_transposed": ("ops.block_fp8_gemm",),
    "block_fp8_per_tensor_act_scale": ("ops.block_fp8_gemm",),
}


def ladder_params(check_id: str) -> dict[str, Any]:
    checks = yaml.safe_load(LADDER.read_text(encoding="utf-8"))["checks"]
    params: dict[str, Any] = next(c["params"] for c in checks if c["id"] == check_id)
    return params


def run(fn: Callable[..., Any], check_id: str, seed: int, only_cases: list[str] | None = None) -> tuple[dict[str, str], float]:
    """Statuses per dtype and the worst ratio to tolerance of ``fn`` on a ladder check's cases."""
    params = dict(ladder_params(check_id))
    if only_cases is not None:
        params["cases"] = [c for c in params["cases"] if c["name"] in only_cases]
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())
    outcomes = OpCheck(DictProvider("bench", {params["op"]: fn})).run(ctx, OpCheckParams.model_validate(params))
    statuses = {str(o.subid): o.status.value for o in outcomes}
    ratios = [float(o.metrics.get("ratio_to_tolerance", float("inf"))) for o in outcomes if o.metrics]
    return statuses, max(ratios, default=float("nan"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--checks", nargs="*", default=list(CHECKS))
    args = ap.parse_args(argv)
    bad = 0
    print(f"{'variant':34} {'check':38} seed  statuses (fp32 bf16 fp16)   worst ratio")
    for op, fns in pq.HEALTHY.items():
        for fn in fns:
            for check_id in args.checks:
                if ladder_params(check_id)["op"] != op:
                    continue
                for seed in range(args.seeds):
                    statuses, ratio = run(fn, check_id, seed)
                    ok = set(statuses.values()) == {Status.PASS.value}
                    bad += not ok
                    print(f"{'healthy ' + fn.__name__:34} {check_id:38} {seed:4}  {' '.join(statuses.values()):24}"
                          f" {ratio:10.3g}{'' if ok else '  <-- healthy run not passing'}")
    for fns in pq.PLANTED.values():
        for fn in fns:
            for check_id in TARGETS[fn.__name__]:
                if check_id not in args.checks:
                    continue
                for seed in range(args.seeds):
                    statuses, ratio = run(fn, check_id, seed)
                    ok = set(statuses.values()) == {Status.FAIL.value}
                    bad += not ok
                    print(f"{'planted ' + fn.__name__:34} {check_id:38} {seed:4}  {' '.join(statuses.values()):24}"
                          f" {ratio:10.3g}{'' if ok else '  <-- defect not caught'}")
    print(f"\n{bad} unexpected result(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
