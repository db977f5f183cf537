"""``adaptcheck report``: re-render the HTML report of a results file."""

from __future__ import annotations

from pathlib import Path

import typer

from adaptcheck.cli.output import Output
from adaptcheck.models.results import RunResults
from adaptcheck.report import write_report
from adaptcheck.session import regrade


def report(
    results_path: Path = typer.Argument(..., metavar="RESULTS.json", help="results.json written by 'adaptcheck run'."),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", help="Where to write the HTML report."),
) -> None:
    """Render the self-contained HTML report of a run."""
    results = regrade(RunResults.load(results_path))
    output.parent.mkdir(parents=True, exist_ok=True)
    write_report(results, output, run_dir=results_path.parent)
    Output().info(f"report: {output}")
