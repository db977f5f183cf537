"""Healthy-pass / planted-fail figures of the DeepSeek MoE ops (grouped_topk, fused_moe_shared)
over seeds, for the torch provider and for vLLM's own code (docs/ops.md, the moe family).

Per seed and provider it prints each op's status per dtype and its worst error as a fraction
of the tolerance (ids: mismatching elements), then, per planted defect, on how many seeds it
failed. Exits 1 when a healthy run does not pass on every seed or a defect passes on any.

Run: PYTHONPATH=. python benchmarks/family_moe_ops.py [--seeds 5] [--no-vllm]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the planted defects live under tests/

from adaptcheck.backends.cpu import CpuBackend
from adaptcheck.base.schemas.ladder import ModelSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import CheckContext
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.checks import OpCheck, OpCheckParams
from adaptcheck.steps.ops.providers.base import DictProvider, OpProvider
from tests.steps.ops import planted_moe as pm

CASES: dict[str, list[Mapping[str, object]]] = {
    "grouped_topk": [
        {"name": "deepseek_v3", "tokens": 32, "experts": 256, "topk": 8, "n_group": 8, "topk_group": 4,
         "routed_scaling_factor": 2.5},
        {"name": "deepseek_v2", "tokens": 32, "experts": 160, "topk": 6, "n_group": 8, "topk_group": 3,
         "scoring": "softmax", "correction_bias": False, "renormalize": False, "routed_scaling_factor": 16.0},
    ],
    "fused_moe_shared": [
        {"name": "deepseek_v3_like", "tokens": 16, "hidden": 256, "intermediate": 64, "experts": 16, "topk": 8,
         "routed_scaling_factor": 2.5},
        {"name": "two_shared_hot", "tokens": 16, "hidden": 128, "intermediate": 48, "experts": 8, "topk": 2,
         "n_shared": 2, "same_expert": True},
    ],
}
DTYPES = ["fp32", "bf16", "fp16"]


def _run(provider: OpProvider, op: str, seed: int) -> list[Any]:
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())
    params = OpCheckParams(op=op, provider=provider.name, dtypes=DTYPES, cases=list(CASES[op]), budget_s=120)
    return OpCheck(provider).run(ctx, params)


def _figures(outcomes: list[Any]) -> str:
    """Per dtype: status, then per output its worst error / limit over the cases (exact outputs:
    how many elements differ)."""
    parts = []
    for o in outcomes:
        worst: dict[str, float] = {}
        for case in o.details.get("cases", []):
            for out in case["outputs"]:
                name = out["output"]
                if out["mode"] == "exact":
                    off = round(float(out["mismatch_fraction"] or 0.0) * out["elements"])
                    worst[name] = worst.get(name, 0) + off
                else:
                    worst[name] = max(worst.get(name, 0.0), float(out["ratio"]))
        figures = " ".join(f"{k} {v:.3g}{'' if k.endswith('ids') else '×'}" for k, v in worst.items())
        parts.append(f"{o.subid} {o.status.value} [{figures}]")
    return "; ".join(parts)


def _healthy(providers: dict[str, OpProvider], seeds: int) -> bool:
    ok = True
    for name, provider in providers.items():
        for op in CASES:
            for seed in range(seeds):
                t0 = time.perf_counter()
                outcomes = _run(provider, op, seed)
                passed = all(o.status is Status.PASS for o in outcomes)
                ok &= passed
                print(f"{name:6s} {op:16s} seed {seed}: {_figures(outcomes)}  ({time.perf_counter() - t0:.2f} s)")
    return ok


def _defects(with_vllm: bool) -> dict[str, tuple[str, Callable[..., Any]]]:
    found: dict[str, tuple[str, Callable[..., Any]]] = {}
    for defect in pm.ROUTING_DEFECTS:
        found[f"torch: {defect}"] = ("grouped_topk", pm.torch_router(defect))
        if with_vllm:
            found[f"vllm: {defect}"] = ("grouped_topk", pm.vllm_router(defect))
    for defect in pm.SHARED_DEFECTS:
        found[f"torch: {defect}"] = ("fused_moe_shared", pm.torch_shared(defect))
        if with_vllm:
            found[f"vllm: {defect}"] = ("fused_moe_shared", pm.vllm_shared(defect))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--no-vllm", action="store_true", help="torch provider only")
    args = parser.parse_args(argv)
    providers: dict[str, OpProvider] = {"torch": DictProvider("torch", {op: get_op(op).native for op in CASES})}
    if not args.no_vllm:
        from adaptcheck.steps.ops.providers.vllm_provider import VllmProvider

        vllm = VllmProvider()
        ok, reason = vllm.available()
        if ok:
            providers["vllm"] = vllm
        else:
            print(f"vllm: not available ({reason})")
    print(f"healthy runs, {args.seeds} seeds, dtypes {', '.join(DTYPES)} (figures: worst error / tolerance)")
    healthy_ok = _healthy(providers, args.seeds)
    print("\nplanted defects (failed on N of the seeds; every dtype must fail)")
    defects_ok = True
    for label, (op, fn) in _defects("vllm" in providers).items():
        failed = 0
        for seed in range(args.seeds):
            outcomes = _run(DictProvider("planted", {op: fn}), op, seed)
            failed += all(o.status is Status.FAIL for o in outcomes)
        defects_ok &= failed == args.seeds
        print(f"  {label:45s} failed {failed}/{args.seeds}")
    print(f"\nhealthy: {'all passed' if healthy_ok else 'NOT ALL PASSED'}; "
          f"defects: {'all caught' if defects_ok else 'NOT ALL CAUGHT'}")
    return 0 if healthy_ok and defects_ok else 1


if __name__ == "__main__":
    sys.exit(main())
