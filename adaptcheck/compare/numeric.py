"""Numerical regressions: the correctness metrics of matched checks that got worse beyond their
rule (which metrics, and why each rule: docs/compare.md, "Numerical regressions").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from adaptcheck.base.jsonvalues import as_float
from adaptcheck.base.schemas.results import CheckResult
from adaptcheck.compare.model import (
    Better,
    ComparePolicy,
    NumericChange,
    Regression,
    num,
)

RuleKind = Literal["tolerance", "nats", "count", "fraction"]
Moved = Literal["regression", "improvement"]


@dataclass(frozen=True)
class MetricRule:
    """How one metric is judged."""

    better: Better
    kind: RuleKind


RULES: dict[str, MetricRule] = {
    "ratio_to_tolerance": MetricRule("lower", "tolerance"),
    "max_logprob_abs_diff": MetricRule("lower", "nats"),
    "cases_failed": MetricRule("lower", "count"),
    "sequences_failed": MetricRule("lower", "count"),
    "token_agreement": MetricRule("higher", "fraction"),
}


def _grew(worse: float, better: float, policy: ComparePolicy, floor: float) -> bool:
    """``worse`` exceeds ``better`` by the growth factor and by the absolute floor."""
    return worse > policy.error_growth * better and worse - better > floor


def judge(rule: MetricRule, before: float, after: float, policy: ComparePolicy) -> tuple[Moved | None, str]:
    """(``'regression'`` | ``'improvement'`` | None, the rule in words)."""
    if not (math.isfinite(before) and math.isfinite(after)):
        # A value that became inf/NaN is the worst possible outcome, one that stopped being is the best.
        if math.isfinite(before) != math.isfinite(after):
            moved: Moved = "regression" if math.isfinite(before) else "improvement"
            return moved, "must stay finite"
        return None, "not finite on either side"
    if rule.kind in ("tolerance", "nats"):
        floor = policy.min_error_delta if rule.kind == "tolerance" else policy.min_logprob_delta
        unit = "tolerance" if rule.kind == "tolerance" else "nats"
        text = f"> {policy.error_growth:g}× and > +{floor:g} {unit}"
        if _grew(after, before, policy, floor):
            return "regression", text
        if _grew(before, after, policy, floor):
            return "improvement", text
        return None, text
    if rule.kind == "count":
        if after == before:
            return None, "any increase"
        return ("regression" if after > before else "improvement"), "any increase"
    drop = before - after  # fraction, higher is better
    text = f"drop > {policy.max_agreement_drop:g}"
    if drop > policy.max_agreement_drop:
        return "regression", text
    if -drop > policy.max_agreement_drop:
        return "improvement", text
    return None, text


def compare_numeric(pairs: list[tuple[CheckResult, CheckResult]],
                    policy: ComparePolicy) -> tuple[list[NumericChange], int]:
    """Every judged metric of the matched (baseline, new) checks that moved beyond its rule,
    and how many metrics were judged in all."""
    changes: list[NumericChange] = []
    judged = 0
    for old, new in pairs:
        for name, rule in RULES.items():
            before, after = as_float(old.metrics.get(name)), as_float(new.metrics.get(name))
            if before is None or after is None:
                continue
            judged += 1
            verdict, bound = judge(rule, before, after, policy)
            if verdict is not None:
                changes.append(NumericChange(check_id=new.id, metric=name, better=rule.better, before=before,
                                             after=after, bound=bound, verdict=verdict))
    return changes, judged


def as_regression(c: NumericChange) -> Regression:
    """The regression line of a numeric change."""
    line = f"{c.check_id} {c.metric}: {num(c.before)} → {num(c.after)} (regression: {c.bound})"
    return Regression(category="numeric", check_id=c.check_id, figure=c.metric, before=num(c.before),
                      after=num(c.after), bound=c.bound, line=line)


def improvement_line(c: NumericChange) -> str:
    return f"{c.check_id} {c.metric}: {num(c.before)} → {num(c.after)}"
