"""View data of the regression comparison — plain data, no HTML — inside the run report (a
``perf.regression`` result's comparison) and as the page of ``adaptcheck compare --html``.

What the page leads with and why: docs/compare.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptcheck.base.errors import InvalidInputError
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.compare import SELF_KIND, Comparison
from adaptcheck.compare.model import PerfFigure, RunRef
from adaptcheck.compare.perf import describe_change, value_text
from adaptcheck.report.fmt import Label, status_key, status_label

PAGE_TEMPLATE = "compare_page.html.j2"
_VERDICTS: dict[str, Label] = {
    "regression": Label(key="fail", label="regression", glyph="✗"),
    "improvement": Label(key="pass", label="improved", glyph="✓"),
    "within_noise": Label(key="na", label="within noise", glyph="○"),
}
_CATEGORY = {"status": "status", "numeric": "numerical", "performance": "performance"}


@dataclass
class CheckRef:
    """A check id and its anchor in the run report ('' on the stand-alone page)."""

    id: str
    anchor: str


@dataclass
class RegressionRow:
    category: str
    check: CheckRef
    figure: str
    before: str
    after: str
    bound: str


@dataclass
class EnvRow:
    what: str
    before: str
    after: str
    change: str


@dataclass
class FigureRow:
    check: CheckRef
    figure: str
    before: str
    after: str
    change: str
    noise: str
    bound: str
    verdict: Label


@dataclass
class NotComparedRow:
    check: CheckRef
    figure: str
    reason: str


@dataclass
class Fact:
    label: str
    value: str


@dataclass
class CauseRow:
    """A check whose status change lost (or gained) a level."""

    level: str
    condition: str
    check: CheckRef
    before: str
    after: str
    message: str


@dataclass
class GradeView:
    line: str
    change: str  # lowered | raised | unchanged
    before: str
    after: str
    causes: list[CauseRow]
    other_reasons: list[str]


@dataclass
class CompareView:
    title: str
    verdict: str
    ok: bool  # comparable and no regression
    comparable: bool
    not_comparable_reason: str
    check: Label | None  # the perf.regression check's status, inside a run report
    grade: GradeView | None  # None inside a run report (its own grade is the report's)
    unverified: list[str]  # 'baseline (edited after the run)' … for each side nothing vouches for
    runs: list[Fact]
    regressions: list[RegressionRow]
    environment: list[EnvRow]
    deployment: list[EnvRow]
    """Each fact of the deployment under test that differs (empty: the same deployment)."""
    deployment_same: str
    """When it is the same: which one both runs certified, on one line; '' otherwise."""
    deployment_sides: list[Fact]
    """When it differs: each run's deployment on one line (the commands as given)."""
    improvements: list[str]
    other_status_changes: list[str]
    added: list[str]
    removed: list[str]
    figures: list[FigureRow]
    not_compared: list[NotComparedRow]
    counts: list[Fact]
    policy: list[Fact]
    adaptcheck_version: str


@dataclass
class ComparePage:
    """What the stand-alone page renders (the section reads ``v.compare`` in both places)."""

    compare: CompareView


def _run_text(r: RunRef) -> str:
    partial = "" if r.complete else ", incomplete"
    mark = "" if r.verified else f" — UNVERIFIED: {r.unverified_reason}"
    return (f"{r.run_id} — {r.device_name} ({r.backend}, {r.device_count} visible), ladder {r.ladder}, "
            f"adaptcheck {r.adaptcheck_version}, started {r.started_at.isoformat(timespec='seconds')}{partial}{mark}")


def _figure_row(f: PerfFigure, ref: CheckRef) -> FigureRow:
    noise = f"{f.spread_before:.1%} / {f.spread_after:.1%}"
    if f.noise_kind == "run_cv":  # a serving figure: run-to-run CV, and the runs behind it
        noise = f"CV {noise} ({f.runs_before} / {f.runs_after} runs)"
    return FigureRow(check=ref, figure=f.figure, before=value_text(f.before, f.unit), after=value_text(f.after, f.unit),
                     change=describe_change(f.change),
                     noise=noise, bound=f"±{f.bound:.1%}", verdict=_VERDICTS[f.verdict])


def build_compare_view(comparison: Comparison, anchors: dict[str, str] | None = None,
                       check: Label | None = None) -> CompareView:
    """The section's data. ``anchors``: check id → anchor in the run report, when inside one."""
    import adaptcheck

    c = comparison

    def ref(cid: str) -> CheckRef:
        return CheckRef(id=cid, anchor=(anchors or {}).get(cid, ""))

    n = c.counts
    counts = [Fact("checks matched", str(n.checks_matched)),
              Fact("checks only in the new run / only in the baseline", f"{n.checks_added} / {n.checks_removed}"),
              Fact("status changes", str(n.status_changes)),
              Fact("numerical metrics judged", str(n.numeric_compared)),
              Fact("performance figures compared", f"{n.perf_compared} ({n.perf_improvements} improved)"),
              Fact("performance figures not compared", str(n.perf_not_compared)),
              Fact("environment changes", str(n.environment_changes)),
              Fact("deployment changes", str(n.deployment_changes))]
    p = c.policy
    policy = [Fact("performance bound", f"{p.noise_multiplier:g} × the larger measured spread, at least "
                   f"{p.min_tolerance:.1%}"),
              Fact("ratio_to_tolerance", f"regression when > {p.error_growth:g}× the baseline and "
                   f"> +{p.min_error_delta:g} tolerance"),
              Fact("max_logprob_abs_diff", f"regression when > {p.error_growth:g}× the baseline and "
                   f"> +{p.min_logprob_delta:g} nats"),
              Fact("token_agreement", f"regression when it drops by > {p.max_agreement_drop:g}"),
              Fact("cases_failed, sequences_failed", "regression on any increase")]
    grade = None
    if c.grade is not None:
        g = c.grade
        grade = GradeView(line=g.line, change=g.change, before=g.before, after=g.after,
                          causes=[CauseRow(level=x.level, condition=x.condition, check=ref(x.check_id),
                                           before=x.before, after=x.after, message=x.message) for x in g.causes],
                          other_reasons=list(g.other_reasons))
    lowered = grade is not None and grade.change == "lowered"
    deployment = c.deployment.changes if c.deployment is not None else []
    # A comparison older than 1.1 names no deployment: nothing to say then rather than a guess.
    same = "" if c.deployment is not None else c.new.deployment or ""
    return CompareView(
        title=f"adaptcheck comparison — {c.new.device_name}",
        verdict=c.verdict, ok=c.comparable and not c.regressions and not lowered, comparable=c.comparable,
        not_comparable_reason=c.not_comparable_reason, check=check, grade=grade, unverified=c.unverified_sides(),
        runs=[Fact("baseline", _run_text(c.baseline)), Fact("new", _run_text(c.new))],
        regressions=[RegressionRow(category=_CATEGORY[r.category], check=ref(r.check_id), figure=r.figure,
                                   before=r.before, after=r.after, bound=r.bound) for r in c.regressions],
        environment=[EnvRow(what=e.what, before=e.before if e.before is not None else "absent",
                            after=e.after if e.after is not None else "absent", change=e.change)
                     for e in c.environment],
        deployment=[EnvRow(what=e.what, before=e.before if e.before is not None else "absent",
                           after=e.after if e.after is not None else "absent", change=e.change) for e in deployment],
        deployment_same=same,
        deployment_sides=[Fact("baseline", c.deployment.before), Fact("new", c.deployment.after)] if c.deployment else [],
        improvements=list(c.improvements),
        other_status_changes=[s.text for s in c.status_changes if s.verdict == "changed"],
        added=list(c.added_checks), removed=list(c.removed_checks),
        figures=[_figure_row(f, ref(f.check_id)) for f in c.perf],
        not_compared=[NotComparedRow(check=ref(x.check_id), figure=x.figure, reason=x.reason) for x in c.not_compared],
        counts=counts, policy=policy, adaptcheck_version=adaptcheck.__version__,
    )


def build_compare(results: RunResults, anchors: dict[str, str]) -> CompareView | None:
    """The section of a run report: from the first ``perf.regression`` result carrying a
    comparison (None when there is none: no baseline was given, or the check did not run)."""
    for c in results.checks:
        if c.kind != SELF_KIND or "counts" not in c.details:
            continue
        try:
            comparison = Comparison.from_data(c.details, c.id)
        except InvalidInputError:
            continue  # hand-edited or older details: the check's own entry still shows them raw
        return build_compare_view(comparison, anchors, check=status_label(status_key(c)))
    return None
