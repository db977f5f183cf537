"""``adaptcheck compare``: a new run against a baseline — regressions, improvements, stack changes."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from adaptcheck.cli.output import Format, Output
from adaptcheck.compare import (
    ComparePolicy,
    Comparison,
    RegressionsFound,
    compare_results,
)
from adaptcheck.errors import UsageError
from adaptcheck.models.results import RunResults

SHOWN_IMPROVEMENTS = 10


def _policy(**given: float | None) -> ComparePolicy:
    try:
        return ComparePolicy(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        option = "--" + str(first["loc"][0]).replace("_", "-")
        raise UsageError(f"{option}: {first['msg']}", hint="see 'adaptcheck compare --help'") from None


def _print(out: Output, c: Comparison) -> None:
    out.info(f"baseline: {c.baseline.run_id} ({c.baseline.device_name}, {c.baseline.ladder})")
    out.info(f"new:      {c.new.run_id} ({c.new.device_name}, {c.new.ladder})")
    if not c.comparable:
        out.info(f"WARNING: not comparable: {c.not_comparable_reason}", style="bold red")
    if c.regressions:
        out.table("Regressions", ["kind", "check", "figure", "baseline", "new", "bound"],
                  [[r.category, r.check_id, r.figure, r.before, r.after, r.bound] for r in c.regressions])
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
    html: Optional[Path] = typer.Option(None, "--html", help="Also write the comparison as a self-contained HTML page."),
    noise_multiplier: Optional[float] = typer.Option(None, "--noise-multiplier", help="A performance figure regresses when worse by more than this × the larger measured run-to-run spread (default 3)."),
    min_tolerance: Optional[float] = typer.Option(None, "--min-tolerance", help="Floor of that bound, as a fraction, for spreads measured as ~0 (default 0.02)."),
    error_growth: Optional[float] = typer.Option(None, "--error-growth", help="An error metric regresses only when it grew by more than this factor (default 2) ..."),
    min_error_delta: Optional[float] = typer.Option(None, "--min-error-delta", help="... and ratio_to_tolerance by more than this many tolerances (default 0.1)."),
    min_logprob_delta: Optional[float] = typer.Option(None, "--min-logprob-delta", help="... and max_logprob_abs_diff by more than this many nats (default 0.1)."),
    max_agreement_drop: Optional[float] = typer.Option(None, "--max-agreement-drop", help="Largest drop of token_agreement that is not a regression (default 0.05)."),
) -> None:
    """Compare NEW.json against BASELINE.json: checks matched by id; status, numerical and performance
    regressions (performance judged against the run-to-run spread both runs measured); environment changes.
    Exit codes: 0 no regression, 1 regressions found, 2 bad option, 3 unreadable file."""
    policy = _policy(noise_multiplier=noise_multiplier, min_tolerance=min_tolerance, error_growth=error_growth,
                     min_error_delta=min_error_delta, min_logprob_delta=min_logprob_delta,
                     max_agreement_drop=max_agreement_drop)
    out = Output(fmt)
    comparison = compare_results(RunResults.load(baseline), RunResults.load(new), policy)
    _print(out, comparison)
    if html is not None:
        from adaptcheck.report.compare import write_compare_report

        write_compare_report(comparison, html)
        out.info(f"report: {html}")
    out.data(comparison.to_data())
    if comparison.regressions:
        raise RegressionsFound(f"{len(comparison.regressions)} regression(s) of run {comparison.new.run_id} against "
                               f"baseline {comparison.baseline.run_id}")
