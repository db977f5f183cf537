"""Check kind ``perf.regression``: this run against the earlier baseline of the same machine that
``adaptcheck run --baseline`` copied into the run folder (verified against its digest when the
check runs; an unverified one is marked in the evidence), compared by
:func:`adaptcheck.compare.compare_results`; its details are the whole
:class:`~adaptcheck.compare.model.Comparison`. Rules, outcomes and the last-check requirement:
docs/compare.md ("Check kind perf.regression").
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from adaptcheck.base.errors import InvalidInputError
from adaptcheck.base.integrity import verify_file
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.compare import ComparePolicy, Comparison, compare_results
from adaptcheck.compare.deployment import ANOTHER_DEPLOYMENT
from adaptcheck.ladder.check import Check, CheckContext, Outcome

SHOWN = 3
"""Regressions named in the message; the details list them all."""
NO_BASELINE = "no baseline: pass --baseline RESULTS.json of an earlier run of this machine"


class RegressionParams(ComparePolicy):
    """``perf.regression``: the comparison policy, plus whether performance must have been compared."""

    require_perf: bool = Field(default=True, description="Skip (never pass) when no performance figure was measured "
                               "in both runs: a comparison without performance figures cannot vouch for performance.")

    def policy(self) -> ComparePolicy:
        return ComparePolicy.model_validate(self.model_dump(exclude={"require_perf"}))


def current_results(run_dir: Path) -> RunResults:
    """This run as results.json would hold it now: the finished checks of the journal, the
    environment lifted out of the capture check, in ladder order."""
    from adaptcheck.ladder.loader import parse_ladder
    from adaptcheck.ladder.runner import JournalWriter
    from adaptcheck.runfolder import (
        JOURNAL,
        LADDER_SNAPSHOT,
        RUN_META,
        RunMeta,
        assemble,
        with_run_model,
    )

    meta = RunMeta.model_validate_json((run_dir / RUN_META).read_text(encoding="utf-8"))
    spec = parse_ladder((run_dir / LADDER_SNAPSHOT).read_text(encoding="utf-8"), str(run_dir / LADDER_SNAPSHOT))
    return assemble(meta, with_run_model(spec, meta), JournalWriter(run_dir / JOURNAL).read(), complete=False)


def verdict(comparison: Comparison, require_perf: bool) -> Outcome:
    """The outcome of a finished comparison (details and metrics attached)."""
    details = comparison.to_data()
    metrics: dict[str, int] = {**comparison.counts.model_dump(), "baseline_verified": int(comparison.baseline.verified)}
    c = comparison
    # Said first, where a reader of the one-line message cannot miss it.
    mark = "" if c.baseline.verified else f"UNVERIFIED baseline ({c.baseline.unverified_reason}): "
    changed = f"; {c.counts.environment_changes} environment change(s)" if c.counts.environment_changes else ""
    if not c.comparable:
        # Never a pass, never a failure: against another device or another deployment (a baseline
        # served at TP 1, this run at TP 2) no figure is a regression of this machine. A skip that
        # applies blocks L5 until a baseline of the same deployment is given.
        why = c.not_comparable_reason
        text = why if why.startswith(ANOTHER_DEPLOYMENT) else f"baseline not comparable: {why}"
        return Outcome.skipped(f"{mark}{text}", details=details, metrics=metrics)
    if c.regressions:
        more = f" (+{len(c.regressions) - SHOWN} more)" if len(c.regressions) > SHOWN else ""
        lines = "; ".join(r.line for r in c.regressions[:SHOWN])
        return Outcome.failed(f"{mark}{len(c.regressions)} regression(s) against run {c.baseline.run_id}: {lines}"
                              f"{more}{changed}", details=details, metrics=metrics)
    if require_perf and not c.counts.perf_compared:
        return Outcome.skipped(f"{mark}no performance figure was measured in both this run and baseline run "
                               f"{c.baseline.run_id} ({c.counts.perf_not_compared} not compared): the comparison "
                               "cannot vouch for performance (run the step-5 checks before this one, or set "
                               "require_perf: false)", details=details, metrics=metrics)
    return Outcome.passed(f"{mark}no regression against run {c.baseline.run_id}: {c.counts.checks_matched} checks matched, "
                          f"{c.counts.perf_compared} performance figures within noise or better "
                          f"({c.counts.perf_improvements} improved){changed}", details=details, metrics=metrics)


class RegressionCheck(Check):
    """This run compared with the baseline given to ``adaptcheck run --baseline``."""

    kind = "perf.regression"
    step = 5
    description = ("No status, numerical or performance regression against an earlier baseline of this machine "
                   "(performance judged against the measured run-to-run noise).")
    params_model = RegressionParams

    def run(self, ctx: CheckContext, params: RegressionParams) -> Outcome:
        from adaptcheck.runfolder import BASELINE

        path = ctx.run_dir / BASELINE
        if not path.is_file():
            return Outcome.skipped(NO_BASELINE)
        try:
            baseline = RunResults.load(path)
        except InvalidInputError as exc:
            return Outcome.errored(f"the baseline copy cannot be read: {exc.one_line()}")
        # Admitted at the start only when intact or with --allow-unverified; said in the evidence.
        check = verify_file(path)
        # The baseline's own result of this check is about its own baseline (and this run has
        # none yet): leave it out rather than list it as removed.
        baseline.checks = [c for c in baseline.checks if c.id != ctx.check_id]
        return verdict(compare_results(baseline, current_results(ctx.run_dir), params.policy(), baseline_check=check),
                       params.require_perf)
