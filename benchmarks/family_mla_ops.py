"""Healthy-pass / planted-fail figures of step 3's MLA ops over seeds, per provider and dtype: the
worst normalized error of each seed (over the ladder entry's cases) against the tolerance, for the
healthy implementation and each planted defect (tests/steps/ops/mla_defects.py), for the torch
provider and vLLM's CPU MLA decode kernel (vLLM's mla_prefill is not applicable: no kernel).

Run: OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/family_mla_ops.py [--seeds 5] [--dtypes fp32,bf16]
     [--providers torch,vllm] [--ladder ladders/standard.yaml]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers.base import DictProvider
from adaptcheck.steps.ops.tolerance import load_policy
from tests.steps.ops.mla_defects import decode_defects, prefill_defects

OPS = ("mla_decode", "mla_prefill")


def _ladder_cases(path: Path) -> dict[str, list[Mapping[str, object]]]:
    """The cases of the ladder's ops.<op> entries: the benchmark measures what ships."""
    doc = yaml.safe_load(path.read_text())
    return {c["params"]["op"]: c["params"]["cases"] for c in doc["checks"] if c.get("params", {}).get("op") in OPS}


def _worst(fn: Callable[..., Any], op: str, cases: list[Mapping[str, object]], dtype: str,
           seed: int) -> tuple[float, Status]:
    """Worst normalized error over the cases (∞ when a case raised) and the dtype's status."""
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())
    params = OpCheckParams(op=op, dtypes=[dtype], cases=list(cases), budget_s=600)  # never shrink
    (outcome,) = OpCheck(DictProvider("bench", {op: fn})).run(ctx, params)
    errors = [o.get("normalized") for c in outcome.details["cases"] for o in c.get("outputs", [])]
    finite = [float(e) for e in errors if e is not None]
    raised = any(not c.get("outputs") for c in outcome.details["cases"])
    return (float("inf") if raised or not finite else max(finite)), outcome.status


def _impls(provider: str) -> dict[str, dict[str, Callable[..., Any]]]:
    """op → {variant: fn} for one provider; variant 'healthy' first."""
    if provider == "torch":
        decode, prefill = get_op("mla_decode").native, get_op("mla_prefill").native
        return {"mla_decode": {"healthy": decode, **decode_defects(decode)},
                "mla_prefill": {"healthy": prefill, **prefill_defects(prefill)}}
    from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider

    vllm = VllmProvider()
    ok, why = vllm.available()
    if not ok:
        raise SystemExit(f"vllm provider not available: {why}")
    kernel = vllm.get("mla_decode")
    assert kernel is not None, vllm.lacks_reason("mla_decode")
    print(f"vllm mla_prefill: not applicable: {vllm.lacks_reason('mla_prefill')}")
    return {"mla_decode": {"healthy": kernel, **decode_defects(kernel)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--providers", default="torch,vllm")
    parser.add_argument("--ladder", type=Path, default=Path("ladders/standard.yaml"))
    args = parser.parse_args()
    cases = _ladder_cases(args.ladder)
    policy = load_policy()
    providers = [p for p in args.providers.split(",") if p != "vllm" or importlib.util.find_spec("vllm")]
    for provider in providers:
        for op, variants in _impls(provider).items():
            klass = policy.get(get_op(op).tolerance[0])
            for dtype in args.dtypes.split(","):
                limit = klass.limit_for(dtype).max_normalized
                assert limit is not None
                for variant, fn in variants.items():
                    start = time.perf_counter()
                    runs = [_worst(fn, op, cases[op], dtype, seed) for seed in range(args.seeds)]
                    want = Status.PASS if variant == "healthy" else Status.FAIL
                    hits = sum(status is want for _, status in runs)
                    figures = " ".join(f"{err:.2e}" for err, _ in runs)
                    verdict = "pass" if variant == "healthy" else "caught"
                    print(f"{provider:5} {op:11} {dtype:4} {variant:27} {verdict} {hits}/{args.seeds}  worst normalized"
                          f" per seed {figures}  (tolerance {limit:.1e}; {time.perf_counter() - start:.1f}s)")


if __name__ == "__main__":
    main()
