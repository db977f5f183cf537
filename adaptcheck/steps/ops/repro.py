"""Step 3's side of the reproducers: from an op check, live (:func:`write_check_repro`, for an
outcome that failed or errored) or as results.json recorded it (:func:`write_recorded_repro`,
for ``adaptcheck repro``), to an :class:`~adaptcheck.repro.ops.OpsReproSpec` holding the very
objects the check used, so the script is the check's code (docs/ops.md, "Reproducers").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptcheck import __version__
from adaptcheck.base.errors import InvalidInputError
from adaptcheck.base.schemas.ops_evidence import CaseEvidence, OpEvidence
from adaptcheck.repro.files import repro_relpath
from adaptcheck.repro.ops import OpsReproCase, OpsReproSpec, OutputTolerance, write_ops_repro
from adaptcheck.steps.ops.harness import CaseResult, to_numpy
from adaptcheck.steps.ops.judge import compare
from adaptcheck.steps.ops.opdef import OpDef
from adaptcheck.steps.ops.tolerance import load_policy
from adaptcheck.steps.smoke.matmul import full_fp32_precision

if TYPE_CHECKING:
    from collections.abc import Callable

_FP8_MODULE = "adaptcheck.steps.ops.families.quant"


def _fp8_override(flavour: str | None) -> dict[tuple[str, str], str]:
    """The fp8 ops read the backend's flavour from a context variable the check sets; the
    script has no check around it, so it gets the flavour as a constant."""
    if flavour is None:
        body = "    raise RuntimeError('this backend declares no fp8 format: fp8 ops do not apply')\n"
    else:
        body = f"    return {flavour!r}\n"
    return {(_FP8_MODULE, "current_fp8_flavour"): f"def current_fp8_flavour():\n{body}"}


def tolerances(op: OpDef, dtype: str) -> list[tuple[str, OutputTolerance]]:
    """(output, tolerance class as the script needs it) for each output of ``op``."""
    policy = load_policy()
    out: list[tuple[str, OutputTolerance]] = []
    for name, klass_name in zip(op.outputs, op.tolerance, strict=False):
        klass = policy.get(klass_name)
        out.append((name, {"class": klass_name, "mode": klass.mode,
                           "limits": klass.limit_for(dtype).model_dump(exclude_none=True),
                           "max_code_distance": klass.max_code_distance}))
    return out


def case_namespace(op: OpDef, params: Mapping[str, object]) -> dict[str, object]:
    """What the generator reads of a case: its fields plus its computed properties
    (``rotary``, ``qk_gain`` …), as plain values — the script hands the generator a plain
    namespace instead of the pydantic case model."""
    case = op.case_model.model_validate(params)
    out: dict[str, object] = case.model_dump()
    for name in dir(type(case)):
        if name.startswith(("_", "model_")):
            continue
        if isinstance(getattr(type(case), name, None), (property, functools.cached_property)):
            out[name] = getattr(case, name)
    return out


def _observed(case: CaseEvidence) -> str:
    if case.error:
        return f"raised {case.error}"
    parts = [f"{o.output}: ratio {o.ratio} max_abs {o.max_abs}"
             + (f" normalized {o.normalized}" if o.normalized is not None else "")
             for o in case.outputs]
    return "; ".join(parts)


def build_spec(*, check_id: str, op: OpDef, fn: Callable[..., Any], provider: str, provider_description: str,
               dtype: str, device: str, device_type: str, torch_module: str, extension_module: str | None,
               fp8_flavour: str | None, cases: list[OpsReproCase]) -> OpsReproSpec:
    """The spec for ``cases`` of ``op`` in ``dtype``."""
    return OpsReproSpec(
        check_id=check_id, op=op.name, dtype=dtype, device=device, provider=provider,
        provider_description=provider_description, make_inputs=op.make_inputs, reference=op.reference,
        op_fn=fn, to_numpy=to_numpy, compare=compare, precision=full_fp32_precision,
        outputs=tolerances(op, dtype), in_place=op.in_place, cases=cases, device_type=device_type,
        torch_module=torch_module, extension_module=extension_module, overrides=_fp8_override(fp8_flavour),
        version=__version__)


def write_check_repro(ctx: Any, op: OpDef, fn: Callable[..., Any], provider: Any, dtype: str,
                      results: list[CaseResult], check_id: str) -> str:
    """Write the script for the cases of ``results`` that did not pass; the relative path."""
    bad = [r for r in results if not r.passed] or results
    backend = ctx.backend
    cases = [OpsReproCase(r.case, case_namespace(op, r.params), r.seed, _observed(r.evidence())) for r in bad]
    spec = build_spec(check_id=check_id, op=op, fn=fn, provider=provider.name,
                      provider_description=getattr(provider, "description", ""), dtype=dtype,
                      device=str(ctx.device), device_type=backend.device_type, torch_module=backend.torch_module,
                      extension_module=backend.extension_module, fp8_flavour=backend.fp8_flavour, cases=cases)
    write_ops_repro(Path(ctx.run_dir), spec)
    return repro_relpath(check_id)


def write_recorded_repro(run_dir: Path, check_id: str, details: Mapping[str, object], device: str,
                         backend_name: str) -> Path:
    """Write the script for a step-3 check from what results.json recorded of it (its ``details``,
    read as :class:`OpEvidence`; details that do not fit raise :class:`EvidenceError`).

    Every case of the check is included (failing ones first): for a passing check the script
    shows the margin. Cases recorded before reproducers existed carry no seed/parameters:
    that is an :class:`InvalidInputError` naming what is missing.
    """
    from adaptcheck.backends.registry import get_backend
    from adaptcheck.steps.ops.catalog import get_op
    from adaptcheck.steps.ops.providers.registry import load_provider

    evidence = OpEvidence.parse(details, where=f"{check_id}: details")
    op = get_op(evidence.op or "")
    dtype = evidence.dtype or ""
    recorded = list(evidence.cases)
    missing = [c.case or "?" for c in recorded if c.seed is None or c.params is None]
    if not recorded or missing:
        raise InvalidInputError(f"{check_id}: results.json does not record the seed and parameters of case(s)"
                                f" {', '.join(missing) or '(none recorded)'}",
                                hint="run the check again with this adaptcheck; it records them")
    provider = load_provider(evidence.provider or "torch")
    ok, why = provider.available()
    fn = provider.get(op.name) if ok else None
    if fn is None:
        raise InvalidInputError(f"{check_id}: provider {provider.name!r} cannot give {op.name!r} here"
                                f" ({why or provider.lacks_reason(op.name)})",
                                hint="install the provider the check ran with")
    backend = get_backend(backend_name)
    recorded.sort(key=lambda c: c.passed)
    cases = [OpsReproCase(c.case, case_namespace(op, c.params or {}), c.seed or 0, _observed(c)) for c in recorded]
    # A flavour recorded as null means the backend declared none; one not recorded (older files) is the backend's.
    fp8 = evidence.fp8_flavour if "fp8_flavour" in evidence.model_fields_set else backend.fp8_flavour
    spec = build_spec(check_id=check_id, op=op, fn=fn, provider=provider.name,
                      provider_description=(provider.description if evidence.provider_description is None
                                            else evidence.provider_description),
                      dtype=dtype, device=device, device_type=backend.device_type,
                      torch_module=backend.torch_module, extension_module=backend.extension_module,
                      fp8_flavour=fp8, cases=cases)
    return write_ops_repro(run_dir, spec)
