"""Run one case of an operator on the device and judge each output against the float64
reference, shrinking cases to the check's time budget (seeding, shrinking and fp32 precision:
docs/ops.md, "How an op is checked").
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import JsonValue
from pydantic_core import to_jsonable_python

from adaptcheck.base.dtypes import is_fnuz, torch_dtype
from adaptcheck.base.errors import exception_line
from adaptcheck.base.schemas.ops_evidence import (
    CaseEvidence,
    CaseSeconds,
    OutputEvidence,
    ScaledCase,
    ToleranceLimits,
    WorstElement,
)
from adaptcheck.steps.ops.judge import OutputComparison, compare
from adaptcheck.steps.ops.opdef import CaseBase, OpDef
from adaptcheck.steps.ops.tolerance import TolerancePolicy
from adaptcheck.steps.smoke.matmul import full_fp32_precision

if TYPE_CHECKING:
    from collections.abc import Callable

    from adaptcheck.ladder.check import CheckContext


@dataclass
class CaseResult:
    """One case in one dtype."""

    case: str
    dtype: str
    passed: bool
    outputs: list[OutputComparison] = field(default_factory=list)
    error: str = ""
    scaled: ScaledCase = field(default_factory=ScaledCase)
    """The shrink that made the case fit the budget (empty when it ran as written)."""
    notes: dict[str, JsonValue] = field(default_factory=dict)
    seed: int = 0
    """Seed of the CPU generator the inputs came from (a reproducer rebuilds them from it)."""
    params: dict[str, JsonValue] = field(default_factory=dict)
    """The case's fields as run (after any shrink): with the seed, all a reproducer needs."""
    op_s: float = 0.0
    reference_s: float = 0.0
    inputs_s: float = 0.0
    compare_s: float = 0.0

    @property
    def ratio(self) -> float:
        if self.error:
            return math.inf
        return max((o.ratio for o in self.outputs), default=math.inf)

    def evidence(self) -> CaseEvidence:
        """The case as ``details.cases`` records it."""
        return CaseEvidence(
            case=self.case, dtype=self.dtype, passed=self.passed, error=self.error, ratio=_figure(self.ratio),
            outputs=[output_evidence(o) for o in self.outputs], scaled=self.scaled, notes=self.notes,
            seed=self.seed, params=self.params,
            seconds=CaseSeconds(op=self.op_s, reference=self.reference_s, inputs=self.inputs_s,
                                compare=self.compare_s),
        )


def _figure(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)  # JSON has no inf/nan


def output_evidence(o: OutputComparison) -> OutputEvidence:
    """One output's comparison as ``details.cases[].outputs`` records it (every field, None included)."""
    worst = WorstElement() if o.worst is None else WorstElement(
        index=o.worst.index, got=o.worst.got, expected=o.worst.expected, abs_error=o.worst.abs_error)
    return OutputEvidence(
        output=o.output, mode=o.mode, passed=o.passed, ratio=_figure(o.ratio),
        limits=ToleranceLimits.model_validate(o.limits), max_abs=_figure(o.max_abs), max_rel=_figure(o.max_rel),
        mismatch_fraction=_figure(o.mismatch_fraction), cosine=o.cosine,
        normalized=None if o.normalized is None else _figure(o.normalized), max_ulp=o.max_ulp,
        nonfinite_got=o.nonfinite_got, nonfinite_ref=o.nonfinite_ref, elements=o.elements, worst=worst,
        reason=o.reason)


def to_numpy(value: Any) -> Any:
    """A reference argument: tensors become float64 (floats) or int64 (integers) NumPy arrays."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.is_floating_point():
            return t.to(torch.float64).numpy()
        if t.dtype == torch.bool:
            return t.numpy()
        return t.to(torch.int64).numpy()
    return value


def seed_for(ctx: CheckContext, op: str, case: str, dtype: str) -> int:
    return ctx.seed_for(f"ops:{op}:{case}:{dtype}")


def _synchronize(ctx: CheckContext) -> None:
    ctx.backend.synchronize(ctx.device_index)


def run_case(ctx: CheckContext, op: OpDef, fn: Callable[..., Any], case: CaseBase, dtype: str,
             policy: TolerancePolicy) -> CaseResult:
    """Run and judge one case. Exceptions in the provider become an error result."""
    scope = op.device_scope(ctx.backend) if op.device_scope is not None else nullcontext()
    with scope:
        return _run_case(ctx, op, fn, case, dtype, policy)


def _run_case(ctx: CheckContext, op: OpDef, fn: Callable[..., Any], case: CaseBase, dtype: str,
              policy: TolerancePolicy) -> CaseResult:
    result = CaseResult(case=case.name, dtype=dtype, passed=False, seed=seed_for(ctx, op.name, case.name, dtype),
                        params=case.model_dump(mode="json"))
    t0 = time.perf_counter()
    gen = torch.Generator(device="cpu")
    gen.manual_seed(result.seed)
    inputs = op.make_inputs(case, dtype, gen)
    # The op's own facts as the JSON they are stored as (str for anything else, as the worker's wire does).
    result.notes = to_jsonable_python(inputs.notes, fallback=str)
    ref_args = {k: to_numpy(v) for k, v in inputs.kwargs.items()}
    dev_args = {k: (v.clone() if op.in_place else v).to(ctx.device) if isinstance(v, torch.Tensor) else v
                for k, v in inputs.kwargs.items()}
    result.inputs_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    try:
        with full_fp32_precision(ctx.backend):
            got = fn(**dev_args)
            _synchronize(ctx)
    except Exception as exc:  # noqa: BLE001 - a kernel that raises is this case's result
        result.error = f"{exception_line(exc)}"[:500]
        result.op_s = time.perf_counter() - t0
        return result
    result.op_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    expected = op.reference(**ref_args)
    result.reference_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    got_t = got if isinstance(got, tuple) else (got,)
    exp_t = expected if isinstance(expected, tuple) else (expected,)
    if len(got_t) != len(op.outputs):
        result.error = f"provider returned {len(got_t)} outputs, the op has {len(op.outputs)} ({', '.join(op.outputs)})"
        return result
    mask = inputs.compare_mask.numpy() if inputs.compare_mask is not None else None
    for i, (name, klass_name) in enumerate(zip(op.outputs, op.tolerance, strict=False)):
        if not isinstance(got_t[i], torch.Tensor):
            result.error = f"output {name!r} is a {type(got_t[i]).__name__}, not a tensor"
            return result
        result.outputs.append(compare(name, got_t[i], np.asarray(exp_t[i]), dtype, policy.get(klass_name),
                                      mask if i == 0 else None))
    result.compare_s = time.perf_counter() - t0
    result.passed = all(o.passed for o in result.outputs)
    return result


@dataclass
class SpeedModel:
    """Measured rates used to shrink cases that would not fit the budget."""

    device_flops: dict[str, float]
    reference_flops: float


def measure_speed(ctx: CheckContext, dtypes: list[str]) -> SpeedModel:
    """Quick GEMM probes on the device per dtype and of the NumPy float64 reference."""
    from reference_kernels.gemm import gemm as ref_gemm

    rates: dict[str, float] = {}
    for dtype in dtypes:
        try:
            tdt = torch_dtype(dtype, fnuz=is_fnuz(ctx.backend.fp8_flavour))
            if not tdt.is_floating_point or tdt.itemsize < 2:
                continue
            n = 64
            a = torch.ones(n, n, dtype=tdt, device=ctx.device)
            torch.matmul(a, a)
            _synchronize(ctx)
            t0 = time.perf_counter()
            torch.matmul(a, a)
            _synchronize(ctx)
            rates[dtype] = 2 * n**3 / max(time.perf_counter() - t0, 1e-7)
        except Exception:  # noqa: BLE001 - a dtype that cannot matmul is judged by its own cases
            continue
    n = 48
    x = np.ones((n, n))
    t0 = time.perf_counter()
    ref_gemm(x, x)
    return SpeedModel(rates, 2 * n**3 / max(time.perf_counter() - t0, 1e-7))


def fit_case(case: CaseBase, dtype: str, speed: SpeedModel, budget_s: float) -> tuple[CaseBase, ScaledCase]:
    """Shrink ``case`` until its estimated device + reference time fits ``budget_s`` (the shrink
    is empty when it fits as written)."""
    work = case.work()
    device_rate = speed.device_flops.get(dtype) or min(speed.device_flops.values(), default=1e9)
    estimate = work / device_rate + work / speed.reference_flops
    if estimate <= budget_s:
        return case, ScaledCase()
    smaller = case.scaled(budget_s / estimate)
    if smaller.model_dump() == case.model_dump():
        return case, ScaledCase()
    return smaller, ScaledCase.model_validate({"from": case.model_dump(mode="json"), "to": smaller.model_dump(mode="json"),
                                               "why": f"estimated {estimate:.1f}s > budget {budget_s:.1f}s on this device"})
