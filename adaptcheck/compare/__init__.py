"""Regression comparison of two runs: the 'version upgrade validation' of a machine.

:func:`compare_results` matches the checks of a baseline and a new ``results.json`` by id
and reports status regressions (a pass that no longer passes), numerical regressions
(:mod:`.numeric`), performance regressions beyond the measured run-to-run noise
(:mod:`.perf`), what changed in the stack in between (:mod:`.environment`) and whether the two
runs certified the same deployment under test (:mod:`.deployment`).
``adaptcheck compare`` and the ``perf.regression`` check both call it; docs/compare.md
states every rule.
"""

from __future__ import annotations

from typing import Literal

from adaptcheck.base.integrity import VerifyResult
from adaptcheck.base.schemas.results import CheckResult, RunResults, Status
from adaptcheck.compare import numeric, perf
from adaptcheck.compare.deployment import compare_deployment
from adaptcheck.compare.environment import compare_environment
from adaptcheck.compare.grade import grade_change
from adaptcheck.compare.model import (
    ComparePolicy,
    Comparison,
    Counts,
    DeploymentChange,
    Regression,
    RegressionsFound,
    RunRef,
    StatusChange,
)

__all__ = ["SELF_KIND", "ComparePolicy", "Comparison", "RegressionsFound", "compare_results"]

SELF_KIND = "perf.regression"
"""A run's own regression check says nothing about the other run: never compared."""


def _by_id(results: RunResults, excluded: set[str]) -> dict[str, CheckResult]:
    return {c.id: c for c in results.checks if c.id not in excluded}


def _status_change(old: CheckResult, new: CheckResult) -> StatusChange | None:
    # Compared by label, as the report shows them: a skip that became n/a (or back) changed too.
    if old.label == new.label:
        return None
    verdict: Literal["regression", "improvement", "changed"] = (
        "regression" if old.status is Status.PASS else "improvement" if new.status is Status.PASS else "changed")
    return StatusChange(check_id=new.id, kind=new.kind, before=old.status, after=new.status, before_label=old.label,
                        after_label=new.label, verdict=verdict, message=new.message)


def _status_regression(s: StatusChange) -> Regression:
    why = f": {s.message}" if s.message else ""
    return Regression(category="status", check_id=s.check_id, figure="status", before=s.before_label,
                      after=s.after_label, bound="must stay pass", line=f"{s.text}{why}")


def _comparable(baseline: RunResults, new: RunResults, deployment: DeploymentChange | None) -> tuple[list[str], str]:
    """(what makes the two runs not one machine over time, in the verdict's words; why, in full):
    ([], '') when they are."""
    a, b = baseline.device, new.device
    heads: list[str] = []
    reasons: list[str] = []
    if (a.backend, a.device_name) != (b.backend, b.device_name):
        heads.append("different devices")
        reasons.append(f"different devices: the baseline ran on {a.device_name!r} ({a.backend}), this run on "
                       f"{b.device_name!r} ({b.backend}); the figures are listed, but a difference between two "
                       "devices is not a regression of one")
    if deployment is not None:
        # TP 1 against TP 2, fp8 KV cache against auto, eager against compiled: the figures measure two
        # deployments, and their difference says nothing of the machine getting better or worse.
        heads.append("another deployment")
        reasons.append(f"{deployment.line}: the figures are listed, but a difference between two deployments is "
                       "not a regression of the machine")
    return heads, "; ".join(reasons)


def _verdict(heads: list[str], regressions: list[Regression], counts: Counts) -> str:
    by_cat = {cat: sum(1 for r in regressions if r.category == cat) for cat in ("status", "numeric", "performance")}
    head = f"NOT COMPARABLE ({', '.join(heads)}); " if heads else ""
    if regressions:
        parts = ", ".join(f"{n} {cat}" for cat, n in by_cat.items() if n)
        return f"{head}{len(regressions)} regression(s): {parts}"
    return (f"{head}no regression: {counts.checks_matched} checks matched, {counts.perf_compared} performance "
            f"figures compared ({counts.perf_improvements} improved, {counts.perf_not_compared} not compared), "
            f"{counts.environment_changes} environment change(s)")


def compare_results(baseline: RunResults, new: RunResults, policy: ComparePolicy, *,
                    grade: bool = False, baseline_check: VerifyResult | None = None,
                    new_check: VerifyResult | None = None) -> Comparison:
    """Compare ``new`` against ``baseline`` under ``policy``.

    ``grade``: also say how the grade moved and why (both results must be graded from their
    own checks: ``adaptcheck compare`` regrades each file; a perf.regression check leaves it
    off, its own run is not graded yet). ``baseline_check``/``new_check``: what the files'
    digests said, when the sides were read from files (an unverified side is marked).
    """
    excluded = {c.id for c in [*baseline.checks, *new.checks] if c.kind == SELF_KIND}
    old_checks, new_checks = _by_id(baseline, excluded), _by_id(new, excluded)
    pairs = [(old_checks[cid], new_checks[cid]) for cid in new_checks if cid in old_checks]
    added = [cid for cid in new_checks if cid not in old_checks]
    removed = [cid for cid in old_checks if cid not in new_checks]

    statuses = [s for old, new_c in pairs if (s := _status_change(old, new_c)) is not None]
    numbers, judged = numeric.compare_numeric(pairs, policy)
    figures, not_compared = perf.compare_perf(pairs, policy, [old_checks[c] for c in removed],
                                              [new_checks[c] for c in added])
    env = compare_environment(baseline, new)
    deployment = compare_deployment(baseline, new)

    regressions = ([_status_regression(s) for s in statuses if s.verdict == "regression"]
                   + [numeric.as_regression(n) for n in numbers if n.verdict == "regression"]
                   + [perf.as_regression(f) for f in figures if f.verdict == "regression"])
    improvements = ([s.text for s in statuses if s.verdict == "improvement"]
                    + [numeric.improvement_line(n) for n in numbers if n.verdict == "improvement"]
                    + [perf.improvement_line(f) for f in figures if f.verdict == "improvement"])
    counts = Counts(checks_matched=len(pairs), checks_added=len(added), checks_removed=len(removed),
                    status_changes=len(statuses), numeric_compared=judged, perf_compared=len(figures),
                    perf_not_compared=len(not_compared),
                    perf_improvements=sum(1 for f in figures if f.verdict == "improvement"),
                    environment_changes=len(env), deployment_changes=len(deployment.changes) if deployment else 0,
                    regressions=len(regressions))
    heads, why_not = _comparable(baseline, new, deployment)
    comparison = Comparison(
        policy=policy, baseline=RunRef.of(baseline, baseline_check), new=RunRef.of(new, new_check),
        comparable=not heads, not_comparable_reason=why_not, verdict=_verdict(heads, regressions, counts),
        grade=grade_change(baseline, new) if grade else None,
        regressions=regressions, improvements=improvements, added_checks=added, removed_checks=removed,
        status_changes=statuses, numeric=numbers, perf=figures, not_compared=not_compared, environment=env,
        deployment=deployment, counts=counts)
    unverified = comparison.unverified_sides()
    if unverified:
        # Whoever reads only the verdict line (a CI log, a check message) must see it too.
        comparison.verdict = f"UNVERIFIED {' and '.join(unverified)}: {comparison.verdict}"
    return comparison
