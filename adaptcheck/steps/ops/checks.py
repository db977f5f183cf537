"""The ``ops.op`` check kind: one operator, one provider, one outcome per dtype from its cases,
recorded as :class:`~adaptcheck.base.schemas.ops_evidence.OpEvidence` (outcomes, skips and
errors: docs/ops.md, "How an op is checked").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from adaptcheck.base.schemas.ops_evidence import OpEvidence, OpMetrics, ToleranceSpec
from adaptcheck.base.schemas.results import Status
from adaptcheck.ladder.check import Check, CheckContext, Outcome
from adaptcheck.steps.ops.catalog import get_op
from adaptcheck.steps.ops.harness import CaseResult, fit_case, measure_speed, run_case
from adaptcheck.steps.ops.opdef import CaseBase, OpDef
from adaptcheck.steps.ops.providers.base import OpProvider
from adaptcheck.steps.ops.providers.registry import load_provider
from adaptcheck.steps.ops.repro import write_check_repro
from adaptcheck.steps.ops.tolerance import TolerancePolicy, load_policy


class OpCheckParams(BaseModel):
    """Params of ``ops.op``."""

    model_config = ConfigDict(extra="forbid")

    op: str = Field(description="Operator name (``adaptcheck ops`` lists them).")
    provider: str = Field(default="torch", description="Provider name or 'module:object'; --ops overrides it.")
    dtypes: list[str] = Field(min_length=1, description="Dtypes to check.")
    # Ladder YAML as read: each case is validated into the op's own case model below.
    cases: list[Mapping[str, object]] = Field(min_length=1, description="Cases; fields depend on the op.")
    budget_s: float = Field(default=20.0, gt=0, description="Time budget; cases are shrunk to fit it.")

    @model_validator(mode="after")
    def _known(self) -> OpCheckParams:
        op = get_op(self.op)  # UnknownNameError carries the suggestion; pydantic reports it
        bad = [d for d in self.dtypes if d not in op.dtypes]
        if bad:
            raise ValueError(f"op {self.op!r} is not defined for {bad}; it takes {list(op.dtypes)}")
        names: set[str] = set()
        for case in self.cases:
            try:
                parsed = op.case_model.model_validate(case)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(f"case {case.get('name', '?')!r}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
            if parsed.name in names:
                raise ValueError(f"duplicate case name {parsed.name!r}")
            names.add(parsed.name)
        return self

    def parsed_cases(self) -> list[CaseBase]:
        op = get_op(self.op)
        return [op.case_model.model_validate(c) for c in self.cases]


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def summarize(op: OpDef, provider: OpProvider, dtype: str, results: list[CaseResult],
              fp8_flavour: str | None) -> tuple[Outcome, OpEvidence]:
    """One outcome for one dtype from its case results, and its evidence (stored as the
    outcome's details; a caller that adds to it stores it again)."""
    outputs = [o for r in results for o in r.outputs]
    worst = max(results, key=lambda r: r.ratio)
    compared = [o.ratio for r in results if not r.error for o in r.outputs]
    metrics = OpMetrics(
        cases=len(results),
        cases_failed=sum(1 for r in results if not r.passed),
        ratio_to_tolerance=_finite(worst.ratio),
        # Worst ratio over the cases that produced outputs (a raising case makes the one above ∞).
        measured_ratio=_finite(max(compared)) if compared else None,
        max_abs_error=max((o.max_abs for o in outputs), default=0.0),
        max_rel_error=max((o.max_rel for o in outputs), default=0.0),
        mismatch_fraction=max((o.mismatch_fraction for o in outputs), default=0.0),
        op_s=sum(r.op_s for r in results),
        reference_s=sum(r.reference_s for r in results),
        inputs_s=sum(r.inputs_s for r in results),
        compare_s=sum(r.compare_s for r in results),
    )
    cosines = [o.cosine for o in outputs if o.cosine is not None]
    if cosines:
        metrics.min_cosine = min(cosines)
    ulps = [o.max_ulp for o in outputs if o.max_ulp is not None]
    if ulps:
        metrics.max_ulp = max(ulps)
    policy = load_policy()
    evidence = OpEvidence(
        op=op.name, provider=provider.name, dtype=dtype, signature=op.signature,
        tolerance={out: _tolerance_spec(policy, k, dtype) for out, k in zip(op.outputs, op.tolerance, strict=False)},
        cases=[r.evidence() for r in results],
        worst_case=worst.case,
        provider_description=provider.description,
        fp8_flavour=fp8_flavour,  # what a reproducer written later needs
    )
    errors = [r for r in results if r.error]
    failed = [r for r in results if not r.passed and not r.error]
    if failed:
        w = max(failed, key=lambda r: r.ratio)
        reason = next((o.reason for o in w.outputs if not o.passed), "")
        outcome = Outcome.failed(f"{len(failed)}/{len(results)} cases out of tolerance; worst '{w.case}'"
                                 f" ({_ratio_text(w.ratio)} of tolerance): {reason}", subid=dtype)
    elif errors:
        outcome = Outcome.errored(f"case '{errors[0].case}' raised {errors[0].error}", subid=dtype)
    else:
        outcome = Outcome.passed(f"{len(results)} case{'s' if len(results) != 1 else ''} within tolerance (worst"
                                 f" '{worst.case}' at {_ratio_text(worst.ratio)} of tolerance)", subid=dtype)
    outcome.metrics, outcome.details = metrics.dump(), evidence.dump()
    return outcome, evidence


def _tolerance_spec(policy: TolerancePolicy, klass_name: str, dtype: str) -> ToleranceSpec:
    klass = policy.get(klass_name)
    spec = ToleranceSpec.model_validate({"class": klass_name, "mode": klass.mode,
                                         **klass.limit_for(dtype).model_dump(exclude_none=True)})
    if klass.max_code_distance is not None:
        spec.max_code_distance = klass.max_code_distance
    return spec


def _attach_repro(ctx: CheckContext, op: OpDef, fn: Callable[..., Any], provider: OpProvider, dtype: str,
                  results: list[CaseResult], evidence: OpEvidence) -> None:
    """Write repro/<check id>.py for a failing dtype; a script that cannot be written is noted,
    never a change of the verdict. Outside a run (no check id: a test calling run() directly)
    there is no run folder to write into."""
    if not ctx.check_id:
        return
    check_id = f"{ctx.check_id}.{dtype}"
    try:
        evidence.repro = write_check_repro(ctx, op, fn, provider, dtype, results, check_id)
    except Exception as exc:  # noqa: BLE001 - the op's verdict stands whatever the writer meets
        evidence.repro_error = f"{type(exc).__name__}: {exc}"[:300]


def _ratio_text(ratio: float) -> str:
    return "∞" if not math.isfinite(ratio) else f"{ratio:.3g}×"


class OpCheck(Check):
    """One operator against the float64 reference."""

    kind = "ops.op"
    step = 3
    description = "An LLM operator on the device vs a CPU float64 reference kernel, per dtype and case."
    params_model = OpCheckParams

    def __init__(self, provider: OpProvider | None = None) -> None:
        self._provider = provider  # tests hand in a deliberately wrong provider here

    def _resolve_provider(self, ctx: CheckContext, params: OpCheckParams) -> OpProvider:
        if self._provider is not None:
            return self._provider
        return load_provider(ctx.op_provider or params.provider)

    def run(self, ctx: CheckContext, params: OpCheckParams) -> list[Outcome]:
        op = get_op(params.op)
        provider = self._resolve_provider(ctx, params)

        def not_applicable(reason: str, dtype: str) -> Outcome:
            return Outcome.skipped(reason, applicable=False, subid=dtype,
                                   details=OpEvidence(op=op.name, provider=provider.name, dtype=dtype).dump())

        ok, why = provider.available()
        if not ok:
            return [not_applicable(f"provider {provider.name!r} not available: {why}", d) for d in params.dtypes]
        missing = [d for d in op.requires if d not in ctx.backend.dtypes]
        if missing:
            return [not_applicable(f"{ctx.backend.display_name} does not claim {', '.join(missing)}, which {op.name}"
                                   " needs", d) for d in params.dtypes]
        fn = provider.get(op.name)
        if fn is None:
            return [not_applicable(provider.lacks_reason(op.name), d) for d in params.dtypes]
        policy = load_policy()
        runnable = [d for d in params.dtypes if d in ctx.backend.dtypes]
        speed = measure_speed(ctx, runnable) if runnable else None
        cases = params.parsed_cases()
        per_case = params.budget_s / max(1, len(cases) * len(runnable))
        outcomes: list[Outcome] = []
        total_cases, done_cases = len(cases) * len(runnable), 0
        for dtype in params.dtypes:
            if dtype not in ctx.backend.dtypes:
                outcomes.append(not_applicable(f"{ctx.backend.display_name} does not claim {dtype}", dtype))
                continue
            lacks = provider.lacks_dtype(op.name, dtype)
            if lacks:
                outcomes.append(not_applicable(lacks, dtype))
                continue
            results = []
            for case in cases:
                assert speed is not None
                # Shown live for long op checks (fused MoE at model shapes takes minutes on a CPU).
                ctx.progress(done_cases, total_cases, "cases", note=f"{dtype} {case.name}")
                fitted, scaled = fit_case(case, dtype, speed, per_case)
                res = run_case(ctx, op, fn, fitted, dtype, policy)
                res.scaled = scaled
                results.append(res)
                done_cases += 1
            outcome, evidence = summarize(op, provider, dtype, results, ctx.backend.fp8_flavour)
            hint = provider.failure_hint(op.name, dtype) if outcome.status is Status.FAIL else None
            if hint:
                outcome.message += f"; likely cause: {hint}"
                evidence.likely_cause = hint
            if outcome.status in (Status.FAIL, Status.ERROR):
                _attach_repro(ctx, op, fn, provider, dtype, results, evidence)
            outcome.details = evidence.dump()
            outcomes.append(outcome)
        return outcomes
