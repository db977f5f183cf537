"""The grade change between two runs, and the status changes that caused it.

What matters first when comparing two runs of a machine is whether its grade moved. Both
results are graded from their own checks and rules before they get here (``adaptcheck
compare`` regrades each file), and their :class:`~adaptcheck.base.schemas.results.GradeResult`
lists, per level and condition, the checks each condition selected. A lowered grade is
explained by the lost levels' unmet conditions: the checks they select that did not block
the grade in the baseline (pass, or n/a: a non-applicable skip blocks nothing) and block it
now. An unmet condition no status change explains (a step not run, a check missing from the
new run) is given with the grade's own reason instead. A raised grade is explained the
other way round.
"""

from __future__ import annotations

from typing import Literal

from adaptcheck.base.schemas.results import CheckResult, ConditionResult, RunResults, Status
from adaptcheck.compare.model import GradeCause, GradeChange

NOT_RUN = "not run"


def _level(n: int) -> str:
    return f"L{n}"


def _conditions(results: RunResults, level: str) -> dict[str, ConditionResult]:
    lv = next((x for x in results.grade.levels if x.level == level), None)
    return {c.id: c for c in lv.conditions} if lv else {}


def _label(check: CheckResult | None) -> str:
    return check.label if check is not None else NOT_RUN


def _clears(check: CheckResult | None) -> bool:
    """Whether the check lets its conditions hold (as :func:`adaptcheck.grade.evaluate_condition` reads it)."""
    return check is not None and (check.status is Status.PASS or check.not_applicable)


def _causes(baseline: RunResults, new: RunResults, levels: list[str], lowered: bool) -> tuple[list[GradeCause], list[str]]:
    """Causes of losing (``lowered``) or gaining ``levels``, and unexplained unmet conditions."""
    old_checks = {c.id: c for c in baseline.checks}
    new_checks = {c.id: c for c in new.checks}
    causes: list[GradeCause] = []
    others: list[str] = []
    for level in levels:
        old_conds, new_conds = _conditions(baseline, level), _conditions(new, level)
        for cid, cond in new_conds.items():
            if cond.holds == (not lowered):
                # lowered: only unmet conditions lost the level; raised: only the met ones gained it
                selected = list(dict.fromkeys([*cond.checks, *(old_conds[cid].checks if cid in old_conds else [])]))
                found = False
                for check_id in selected:
                    old, now = old_checks.get(check_id), new_checks.get(check_id)
                    was_ok, is_ok = _clears(old), _clears(now)
                    if was_ok != is_ok and is_ok == (not lowered):
                        found = True
                        causes.append(GradeCause(level=level, condition=cid, check_id=check_id, before=_label(old),
                                                 after=_label(now), message=now.message if now else ""))
                if lowered and not found:
                    others.append(f"{level} {cid}: {cond.reason or cond.description}")
    return causes, others


def grade_change(baseline: RunResults, new: RunResults) -> GradeChange:
    """How the grade moved from ``baseline`` to ``new`` (both already graded from their checks)."""
    a, b = baseline.grade, new.grade
    na, nb = int(a.level[1:]), int(b.level[1:])
    change: Literal["lowered", "raised", "unchanged"] = "lowered" if nb < na else "raised" if nb > na else "unchanged"
    # The levels lost (or gained) between the two grades, lowest first.
    levels = [_level(n) for n in range(min(na, nb) + 1, max(na, nb) + 1)]
    line = (f"grade {change}: {a.level} ({a.name}) → {b.level} ({b.name})" if levels
            else f"grade unchanged: {b.level} ({b.name})")
    causes, others = _causes(baseline, new, levels, lowered=change == "lowered")
    return GradeChange(before=a.level, before_name=a.name, after=b.level, after_name=b.name, change=change,
                       causes=causes, other_reasons=others, line=line)
