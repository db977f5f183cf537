"""Step 3's Mamba2 ops over seeds, through the torch provider and through vLLM: the worst error of
each correct implementation (as a fraction of its tolerance, per dtype) and, for every planted
defect of tests/steps/ops/mamba_planted.py wrapped around the same implementation, whether the
check fails and by how much (docs/ops.md, "Mamba2 ops").

Runs the standard ladder's cases (ladders/standard.yaml, the ``family:hybrid`` ``ops.*``
entries). vLLM is skipped, with the reason, where it is not importable.

Exits 1 when a correct seed fails or a planted defect passes.

Run: PYTHONPATH=. python benchmarks/family_mamba_ops.py [--seeds 5] [--providers torch vllm]
"""

from __future__ import annotations

import argparse
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
from tests.steps.ops.mamba_planted import DEFECTS

LADDER = Path(__file__).resolve().parent.parent / "ladders" / "standard.yaml"


def ladder_cases() -> dict[str, list[Mapping[str, object]]]:
    """Op → the cases of its provider-neutral ``ops.<op>`` entry in the standard ladder."""
    checks = yaml.safe_load(LADDER.read_text())["checks"]
    return {c["params"]["op"]: c["params"]["cases"] for c in checks
            if "family:hybrid" in c.get("tags", []) and c["id"] == f"ops.{c['params']['op']}"}


def _implementation(provider: str, op: str) -> Callable[..., Any] | str:
    """The op's correct implementation for ``provider``, or why there is none."""
    if provider == "torch":
        return get_op(op).native
    from adaptcheck.steps.ops.providers.vllm_provider import MAPPINGS, VllmProvider

    vllm = VllmProvider()
    ok, reason = vllm.available()
    if not ok:
        return reason
    if op not in vllm.ops():
        return vllm.lacks_reason(op)
    return MAPPINGS[op].fn


def run(op: str, fn: Callable[..., Any], cases: list[Mapping[str, object]], dtypes: list[str],
        seed: int) -> dict[str, tuple[Status, float]]:
    """dtype → (status, worst ratio of error to tolerance over the cases and outputs)."""
    ctx = CheckContext(backend=CpuBackend(), device_index=0, seed=seed, run_dir=Path("."), model=ModelSpec())
    # A generous budget: the cases run as the ladder writes them, not shrunk for a busy host.
    params = OpCheckParams(op=op, dtypes=dtypes, cases=cases, budget_s=600)
    out: dict[str, tuple[Status, float]] = {}
    for o in OpCheck(DictProvider("under_test", {op: fn})).run(ctx, params):
        ratios = [float(x["ratio"]) for c in o.details.get("cases", []) for x in c["outputs"]
                  if x.get("ratio") is not None]
        out[str(o.subid)] = (o.status, max(ratios, default=float("nan")))
    return out


def _fmt(result: dict[str, tuple[Status, float]]) -> str:
    return "  ".join(f"{d} {s.value} {r:.3g}x" for d, (s, r) in result.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--providers", nargs="+", default=["torch", "vllm"], choices=["torch", "vllm"])
    parser.add_argument("--defect-dtypes", nargs="+", default=["fp32", "bf16"])
    args = parser.parse_args()
    cases = ladder_cases()
    wrong = 0
    for provider in args.providers:
        for op, op_cases in cases.items():
            impl = _implementation(provider, op)
            if isinstance(impl, str):
                print(f"{provider} {op}: not run ({impl})")
                continue
            healthy_pass = caught = planted = 0
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                res = run(op, impl, op_cases, ["fp32", "bf16", "fp16"], seed)
                healthy_pass += all(s is Status.PASS for s, _ in res.values())
                print(f"{provider} {op} seed {seed} correct: {_fmt(res)}  ({time.perf_counter() - t0:.1f}s)")
                for name, plant in DEFECTS[op].items():
                    res = run(op, plant(impl), op_cases, args.defect_dtypes, seed)
                    planted += 1
                    caught += all(s is Status.FAIL for s, _ in res.values())
                    print(f"{provider} {op} seed {seed} {name}: {_fmt(res)}")
            print(f"== {provider} {op}: correct passed {healthy_pass}/{args.seeds} seeds; "
                  f"planted defects failed {caught}/{planted} (defect x seed, every dtype failing)")
            wrong += (args.seeds - healthy_pass) + (planted - caught)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
