"""The ``version_table`` rule type: a vendor's published pairing table, row by row, with advice
both ways (move the object, or move the subject to a release whose row accepts the object).

Fields and verdicts: matrices/README.md (rules.yaml).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from adaptcheck.base.schemas.matrix_evidence import TableCompared, TableRowFacts
from adaptcheck.compat.rulebase import Evaluation, RuleBase, RuleInputs, Strict
from adaptcheck.compat.stackkeys import change_text, fits, label, stack_value, validate_constraint, validate_key


class TableRow(Strict):
    """One row of a published table."""

    subject: str = Field(description="Constraint on the subject (PEP 440 specifier or 're:…').")
    object: str = Field(description="What the object must satisfy when the subject is in this row.")
    source: str | None = Field(default=None, description="Row-specific source, when not the rule's own.")

    @field_validator("subject", "object")
    @classmethod
    def _constraint(cls, v: str) -> str:
        return validate_constraint(v)


class VersionTableRule(RuleBase):
    type: Literal["version_table"]
    subject: str = Field(description="Constraint key whose version selects the rows (e.g. package.vllm-ascend).")
    object: str = Field(description="Constraint key the selected rows constrain (e.g. runtime.cann).")
    rows: list[TableRow] = Field(min_length=1, description="The table, one row per published pairing.")
    on_mismatch: Literal["incompatible", "warn"] = Field(
        default="incompatible", description="Verdict when the object satisfies none of the subject's rows.")
    on_unknown: Literal["warn", "not_applicable"] = Field(
        default="warn", description="Verdict when the subject is installed but in no row (newer than the table).")
    on_missing_object: Literal["incompatible", "warn"] = Field(
        default="warn", description="Verdict when the subject is in a row but the object was not captured "
                                    "(not installed, or a version file adaptcheck could not read).")

    @field_validator("subject", "object")
    @classmethod
    def _key(cls, v: str) -> str:
        return validate_key(v)

    @model_validator(mode="after")
    def _distinct(self) -> VersionTableRule:
        if self.subject == self.object:
            raise ValueError(f"subject and object are both {self.subject!r}")
        return self


def evaluate_table(rule: VersionTableRule, inp: RuleInputs) -> Evaluation:
    """The verdict of one table against the captured stack (see the module doc)."""
    subject = stack_value(inp.env, rule.subject)
    obj = stack_value(inp.env, rule.object)
    compared = TableCompared(subject=rule.subject, subject_version=subject, object=rule.object, object_version=obj)
    s_name, o_name = label(rule.subject), label(rule.object)
    if subject is None:
        return Evaluation("not_applicable", f"{s_name} not present", compared)
    rows = [r for r in rule.rows if fits(r.subject, subject)]
    if not rows:
        listed = ", ".join(dict.fromkeys(r.subject for r in rule.rows))
        prefix = "warning: " if rule.on_unknown == "warn" else ""
        return Evaluation(rule.on_unknown, f"{prefix}{s_name} {subject} is not in the table ({listed}): its "
                          f"{o_name} pairing is unknown", compared)
    wanted = list(dict.fromkeys(r.object for r in rows))
    compared.wanted = wanted
    compared.rows = [TableRowFacts.model_validate(r.model_dump(exclude_none=True)) for r in rows]
    if obj is None:
        prefix = "warning: " if rule.on_missing_object == "warn" else ""
        return Evaluation(rule.on_missing_object, f"{prefix}{s_name} {subject} needs {o_name} "
                          f"{' or '.join(wanted)}, and {o_name} was not found", compared,
                          [change_text(rule.object, None, wanted[0])])
    if any(fits(w, obj) for w in wanted):
        return Evaluation("ok", f"{s_name} {subject} pairs with {o_name} {obj} ({' or '.join(wanted)})", compared)
    # Both ways out: the object to what this subject wants, or the subject to a row that
    # accepts the object as it is (the nearest release first, as the table lists them).
    advice = [change_text(rule.object, obj, w) for w in wanted]
    others = [r.subject for r in rule.rows if fits(r.object, obj) and not fits(r.subject, subject)]
    advice += [f"or {change_text(rule.subject, subject, s)}" for s in dict.fromkeys(others)]
    prefix = "warning: " if rule.on_mismatch == "warn" else ""
    return Evaluation(rule.on_mismatch, f"{prefix}{s_name} {subject} needs {o_name} {' or '.join(wanted)}, but "
                      f"{obj} is installed", compared, advice)
