"""Typed evidence of the step-3 ``ops.op`` check kind: one operator, one provider, one dtype.

The records mirror what the harness measures (per case, per output, the worst element) and
the tolerance the policy applied; what each figure means is in docs/ops.md. Everything an op
defines for itself (its case parameters, its input notes) is kept as plain JSON values, so a
new op never needs a change here (docs/adding-an-op.md).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, JsonValue

from adaptcheck.base.jsonvalues import as_float
from adaptcheck.base.schemas.evidence import Evidence

Figure = float | str
"""A measured number as stored: a float, or 'inf' / '-inf' / 'nan' (JSON has no non-finite numbers)."""

def _numbers(record: Evidence, leave_out: frozenset[str] = frozenset()) -> dict[str, float]:
    """The numeric fields of ``record`` that are set, by stored name and in stored order (extras a
    newer writer added included)."""
    out: dict[str, float] = {}
    for key, value in record.model_dump(exclude_unset=True, by_alias=True).items():
        number = as_float(value)
        if key not in leave_out and number is not None:
            out[key] = number
    return out


class ToleranceLimits(Evidence):
    """Limits one output was judged by in one dtype (only those its mode uses are present)."""

    rtol: float | None = Field(default=None, description="allclose: relative tolerance.")
    atol: float | None = Field(default=None, description="allclose: absolute tolerance.")
    max_normalized: float | None = Field(default=None, description="normalized: max|Δ|/max|ref| limit.")
    min_cosine: float | None = Field(default=None, description="normalized: minimum cosine similarity.")
    max_code_distance: int | None = Field(default=None, description="codes: allowed distance in codes (ULPs of "
                                          "the output dtype, or integer steps).")

    def named(self) -> dict[str, float]:
        """The limits that are set, by name."""
        return _numbers(self)


class ToleranceSpec(Evidence):
    """The tolerance class of one output as the check applied it in its dtype (``details.tolerance``):
    its name and mode, then the limits of :class:`ToleranceLimits` that the mode uses."""

    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True, validate_by_alias=True)

    klass: str = Field(default="", alias="class", description="Class name in matrices/tolerances.yaml.")
    mode: str = Field(default="", description="allclose, normalized, exact or codes.")
    rtol: float | None = Field(default=None, description="allclose: relative tolerance.")
    atol: float | None = Field(default=None, description="allclose: absolute tolerance.")
    max_normalized: float | None = Field(default=None, description="normalized: max|Δ|/max|ref| limit.")
    min_cosine: float | None = Field(default=None, description="normalized: minimum cosine similarity.")
    max_code_distance: int | None = Field(default=None, description="codes: allowed code distance.")

    def named(self) -> dict[str, float]:
        """The limits that are set (class and mode left out), by name."""
        return _numbers(self, frozenset({"class", "mode"}))


class WorstElement(Evidence):
    """The element furthest off (a non-finite surprise first); empty when nothing was compared."""

    index: list[int] | None = Field(default=None, description="Index of the element in the output tensor.")
    got: Figure | None = Field(default=None, description="What the device produced there.")
    expected: Figure | None = Field(default=None, description="What the float64 reference gives there.")
    abs_error: Figure | None = Field(default=None, description="|got - expected| ('inf' when not finite).")


class OutputEvidence(Evidence):
    """One output of one case in one dtype, against its float64 reference."""

    output: str = Field(default="", description="Output name, as in the op's signature.")
    mode: str = Field(default="", description="Comparison mode of its tolerance class.")
    passed: bool = Field(default=False, description="Within tolerance.")
    ratio: Figure | None = Field(default=None, description="Measured error / limit: <= 1 passes, 'inf' for an "
                                 "exact mismatch or a non-finite surprise.")
    limits: ToleranceLimits = Field(default_factory=ToleranceLimits, description="The limits applied.")
    max_abs: Figure | None = Field(default=None, description="Largest absolute error over finite elements.")
    max_rel: Figure | None = Field(default=None, description="Largest relative error (guarded denominator).")
    mismatch_fraction: Figure | None = Field(default=None, description="Fraction of elements out of tolerance.")
    cosine: float | None = Field(default=None, description="Cosine similarity (normalized mode), else None.")
    normalized: Figure | None = Field(default=None, description="max|Δ|/max|ref| (normalized mode), else None.")
    max_ulp: int | None = Field(default=None, description="Largest ULP distance in the output dtype (allclose "
                                "mode on floats), else None.")
    nonfinite_got: int = Field(default=0, description="Non-finite elements the device produced.")
    nonfinite_ref: int = Field(default=0, description="Non-finite elements of the reference.")
    elements: int = Field(default=0, description="Elements compared.")
    worst: WorstElement = Field(default_factory=WorstElement, description="The worst element.")
    reason: str = Field(default="", description="Why it failed, one line ('' when it passed).")

    @property
    def ratio_value(self) -> float | None:
        """``ratio`` as a number (inf/nan included); None when absent."""
        return as_float(self.ratio)


class ScaledCase(Evidence):
    """How a case was shrunk to fit the check's time budget; empty when it ran as written."""

    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True, validate_by_alias=True)

    before: dict[str, JsonValue] | None = Field(default=None, alias="from", description="The case's fields as written.")
    after: dict[str, JsonValue] | None = Field(default=None, alias="to", description="The case's fields as run.")
    why: str = Field(default="", description="The estimate that made it shrink.")

    @property
    def recorded(self) -> bool:
        """True when the case was shrunk (the record is not empty)."""
        return bool(self.model_fields_set or self.model_extra)

    def changes(self) -> list[tuple[str, JsonValue, JsonValue]]:
        """(field, before, after) of each field the shrink changed, ``name`` left out; a field
        one side lacks counts as None there (the fields are the op's own)."""
        before, after = self.before or {}, self.after or {}
        keys = [k for k in before if k != "name" and before[k] != after.get(k)]
        keys += [k for k in after if k not in before and k != "name"]
        return [(k, before.get(k), after.get(k)) for k in keys]


class CaseSeconds(Evidence):
    """Where one case's time went, in seconds."""

    op: float | None = Field(default=None, description="The device op (synchronized).")
    reference: float | None = Field(default=None, description="The float64 reference kernel.")
    inputs: float | None = Field(default=None, description="Generating the inputs.")
    compare: float | None = Field(default=None, description="Comparing outputs with the reference.")

    def total(self) -> float | None:
        """Sum of the recorded times (extras included); None when nothing was recorded."""
        values = self.model_dump(exclude_unset=True).values()
        if not values:
            return None
        return sum((f for f in (as_float(v) for v in values) if f is not None), 0.0)


class CaseEvidence(Evidence):
    """One case in one dtype."""

    case: str = Field(default="", description="Case name from the ladder.")
    dtype: str | None = Field(default=None, description="Dtype it ran in.")
    passed: bool = Field(default=False, description="Every output within tolerance and nothing raised.")
    error: str = Field(default="", description="What the provider raised ('' when it did not).")
    ratio: Figure | None = Field(default=None, description="Worst output ratio; 'inf' when the case raised.")
    outputs: list[OutputEvidence] = Field(default_factory=list, description="Per-output comparisons.")
    scaled: ScaledCase = Field(default_factory=ScaledCase, description="The shrink, when the case was shrunk.")
    notes: dict[str, JsonValue] = Field(default_factory=dict, description="What is special about the inputs "
                                        "(the op's own facts: their keys depend on the op).")
    seed: int | None = Field(default=None, description="Seed of the CPU generator the inputs came from "
                             "(absent before reproducers existed).")
    params: dict[str, JsonValue] | None = Field(default=None, description="The case's fields as run (after any "
                                                "shrink); with the seed, all a reproducer needs.")
    seconds: CaseSeconds | None = Field(default=None, description="Where the case's time went.")

    @property
    def ratio_value(self) -> float | None:
        """``ratio`` as a number (inf/nan included); None when absent."""
        return as_float(self.ratio)


class OpEvidence(Evidence):
    """``ops.op``: one operator of one provider in one dtype (a not-applicable skip has the first three only)."""

    op: str | None = Field(default=None, description="Catalog op name.")
    provider: str | None = Field(default=None, description="Provider that ran it ('torch', 'vllm', 'module:object').")
    dtype: str | None = Field(default=None, description="The dtype of this outcome.")
    signature: str | None = Field(default=None, description="The provider signature of the op.")
    tolerance: dict[str, ToleranceSpec] = Field(default_factory=dict, description="Output name → the tolerance "
                                                "class applied in this dtype.")
    cases: list[CaseEvidence] = Field(default_factory=list, description="Every case, in ladder order.")
    worst_case: str | None = Field(default=None, description="Name of the case with the largest ratio.")
    provider_description: str | None = Field(default=None, description="What the provider runs, in words.")
    fp8_flavour: str | None = Field(default=None, description="The backend's fp8 format (a reproducer needs it); "
                                    "None when it declares none.")
    likely_cause: str | None = Field(default=None, description="A known cause the provider names for a failure.")
    repro: str | None = Field(default=None, description="Run-folder path of the reproducer written for a failure.")
    repro_error: str | None = Field(default=None, description="Why the reproducer could not be written.")


class OpMetrics(Evidence):
    """The ``metrics`` of an ``ops.op`` outcome (sums and worst values over its cases)."""

    cases: int | None = Field(default=None, description="Cases run.")
    cases_failed: int | None = Field(default=None, description="Cases out of tolerance or raising.")
    ratio_to_tolerance: Figure | None = Field(default=None, description="Worst case ratio ('inf' when one raised).")
    measured_ratio: Figure | None = Field(default=None, description="Worst ratio over cases that produced outputs.")
    max_abs_error: float | None = Field(default=None, description="Largest absolute error over outputs.")
    max_rel_error: float | None = Field(default=None, description="Largest relative error over outputs.")
    mismatch_fraction: float | None = Field(default=None, description="Largest mismatch fraction over outputs.")
    op_s: float | None = Field(default=None, description="Seconds in the device op.")
    reference_s: float | None = Field(default=None, description="Seconds in the reference kernels.")
    inputs_s: float | None = Field(default=None, description="Seconds generating inputs.")
    compare_s: float | None = Field(default=None, description="Seconds comparing.")
    min_cosine: float | None = Field(default=None, description="Smallest cosine over outputs that have one.")
    max_ulp: int | None = Field(default=None, description="Largest ULP distance over outputs that have one.")


class ServedImplementations(Evidence):
    """What each vLLM layer type ran (``teacher_forced.implementations`` of a step-4 check)."""

    implementations: dict[str, JsonValue] = Field(default_factory=dict, description="Layer class → how vLLM "
                                                  "ran it, in its own words (forward_native, _C::rms_norm …).")


class ServedOpsRef(Evidence):
    """The one part of a step-4 check's details the step-3 section reads: the served implementations."""

    teacher_forced: ServedImplementations | None = Field(default=None, description="The teacher-forced record "
                                                         "(only its implementations are read here).")
