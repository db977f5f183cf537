"""``adaptcheck compare``: a new run against a baseline — grade change first, then regressions,
improvements, stack changes.

Both files are read through :func:`adaptcheck.base.trusted.load_verified` (an edited or undigested
file is refused unless ``--allow-unverified``, and then marked) and regraded from their own
checks, so the grade change printed first is the one ``adaptcheck grade`` would give each.
"""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import ValidationError

from adaptcheck.base.errors import UsageError
from adaptcheck.base.trusted import ALLOW_HELP, ALLOW_OPTION, load_verified
from adaptcheck.cli.output import Format, Output
from adaptcheck.compare import (
    ComparePolicy,
    Comparison,
    RegressionsFound,
    compare_results,
)
from adaptcheck.compare.model import RunRef
from adaptcheck.runfolder import regrade

SHOWN_IMPROVEMENTS = 10


def _policy(**given: float | None) -> ComparePolicy:
    try:
        return ComparePolicy(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        option = "--" + str(first["loc"][0]).replace("_", "-")
        raise UsageError(f"{option}: {first['msg']}", hint="see 'adaptcheck compare --help'") from None


def _print_grade(out: Output, c: Comparison) -> None:
    """What matters first: did the grade move, and which checks moved it."""
    g = c.grade
    if g is None:
        return
    out.info(g.line, style={"lowered": "bold red", "raised": "bold green"}.get(g.change, "bold"))
    if g.causes:
        out.info("  caused by:" if g.change == "lowered" else "  gained by:")
        for cause in g.causes:
            out.info("  - " + " ".join(cause.text.split()))
    for reason in g.other_reasons:
        out.info("  - " + " ".join(reason.split()))


def _side(name: str, ref: RunRef) -> str:
    mark = "" if ref.verified else f"  [UNVERIFIED: {ref.unverified_reason}]"
    return f"{name} {ref.run_id} ({ref.device_name}, {ref.ladder}){mark}"


def _print(out: Output, c: Comparison) -> None:
    _print_grade(out, c)
    for side in c.unverified_sides():
        out.info(f"UNVERIFIED {side}: used with {ALLOW_OPTION}; nothing vouches for its content", style="bold red")
    out.info(_side("baseline:", c.baseline))
    out.info(_side("new:     ", c.new))
    if not c.comparable:
        out.info(f"WARNING: not comparable: {c.not_comparable_reason}", style="bold red")
    if c.regressions:
        out.table("Regressions", ["kind", "check", "figure", "baseline", "new", "bound"],
                  [[r.category, r.check_id, r.figure, r.before, r.after, r.bound] for r in c.regressions])
    changed = [s for s in c.status_changes if s.verdict == "changed"]
    if changed:
        out.table("Other status changes", ["check", "baseline", "new", "message"],
                  [[s.check_id, s.before_label or s.before.value, s.after_label or s.after.value,
                    " ".join(s.message.split())] for s in changed])
    if c.environment:
        out.table("Environment changes", ["what", "baseline", "new"],
                  [[e.what, e.before or "absent", e.after or "absent"] for e in c.environment])
    if c.improvements:
        more = len(c.improvements) - SHOWN_IMPROVEMENTS
        out.table("Improvements" + (f" (first {SHOWN_IMPROVEMENTS} of {len(c.improvements)})" if more > 0 else ""),
                  ["improvement"], [[line] for line in c.improvements[:SHOWN_IMPROVEMENTS]])
    n = c.counts
    out.info(f"{n.checks_matched} checks matched ({n.checks_added} only in the new run, {n.checks_removed} only in "
             f"the baseline); {n.numeric_compared} numerical metrics judged; {n.perf_compared} performance figures "
             f"compared, {n.perf_not_compared} not compared (see --format json)")
    out.info(c.verdict, style="red" if c.regressions else "yellow" if not c.comparable else "green")


def compare(
    baseline: Path = typer.Argument(..., metavar="BASELINE.json", help="results.json of the earlier run."),
    new: Path = typer.Argument(..., metavar="NEW.json", help="results.json of the run to judge."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table (human, stderr) or json/yaml (the comparison on stdout)."),
    html: Path | None = typer.Option(None, "--html", help="Also write the comparison as a self-contained HTML page."),
    noise_multiplier: float | None = typer.Option(None, "--noise-multiplier", help="A performance figure regresses when worse by more than this × the larger measured run-to-run spread (default 3)."),
    min_tolerance: float | None = typer.Option(None, "--min-tolerance", help="Floor of that bound, as a fraction, for spreads measured as ~0 (default 0.02)."),
    error_growth: float | None = typer.Option(None, "--error-growth", help="An error metric regresses only when it grew by more than this factor (default 2) ..."),
    min_error_delta: float | None = typer.Option(None, "--min-error-delta", help="... and ratio_to_tolerance by more than this many tolerances (default 0.1)."),
    min_logprob_delta: float | None = typer.Option(None, "--min-logprob-delta", help="... and max_logprob_abs_diff by more than this many nats (default 0.1)."),
    max_agreement_drop: float | None = typer.Option(None, "--max-agreement-drop", help="Largest drop of token_agreement that is not a regression (default 0.05)."),
    allow_unverified: bool = typer.Option(False, ALLOW_OPTION, help=ALLOW_HELP),
) -> None:
    """Compare NEW.json against BASELINE.json: the grade change and the checks that caused it first;
    then checks matched by id; status, numerical and performance regressions (performance judged
    against the run-to-run spread both runs measured); environment changes.
    Exit codes: 0 no regression, 1 regressions found or grade lowered, 2 bad option, 3 unreadable
    file, 5 a file edited after its run or without digest (see --allow-unverified)."""
    policy = _policy(noise_multiplier=noise_multiplier, min_tolerance=min_tolerance, error_growth=error_growth,
                     min_error_delta=min_error_delta, min_logprob_delta=min_logprob_delta,
                     max_agreement_drop=max_agreement_drop)
    out = Output(fmt)
    old_results, old_check = load_verified(baseline, allow_unverified)
    new_results, new_check = load_verified(new, allow_unverified)
    comparison = compare_results(regrade(old_results), regrade(new_results), policy, grade=True,
                                 baseline_check=old_check, new_check=new_check)
    _print(out, comparison)
    if html is not None:
        from adaptcheck.report.render import write_compare_report

        write_compare_report(comparison, html)
        out.info(f"report: {html}")
    out.data(comparison.to_data())
    lowered = comparison.grade is not None and comparison.grade.change == "lowered"
    if comparison.regressions or lowered:
        g = comparison.grade
        head = f"grade lowered {g.before} → {g.after}; " if g is not None and lowered else ""
        raise RegressionsFound(f"{head}{len(comparison.regressions)} regression(s) of run {comparison.new.run_id} "
                               f"against baseline {comparison.baseline.run_id}")
