"""``adaptcheck report``: re-render the HTML report of a results file.

The file is read through :func:`adaptcheck.base.trusted.load_verified`: a file edited after its
run or without digest is refused (exit 5) unless ``--allow-unverified``, and a report
rendered from one anyway carries an UNVERIFIED banner at the top and at its digest.
"""

from __future__ import annotations

from pathlib import Path

import typer

from adaptcheck.base.trusted import ALLOW_HELP, ALLOW_OPTION, load_verified
from adaptcheck.cli.output import Output
from adaptcheck.report import write_report
from adaptcheck.runfolder import regrade


def report(
    results_path: Path = typer.Argument(..., metavar="RESULTS.json", help="results.json written by 'adaptcheck run'."),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", help="Where to write the HTML report."),
    allow_unverified: bool = typer.Option(False, ALLOW_OPTION, help=ALLOW_HELP),
) -> None:
    """Render the self-contained HTML report of a run.

    Exit 3 when the file is not a readable results.json, 5 when it was edited after its run
    or carries no digest (unless --allow-unverified: the report is then marked UNVERIFIED).
    """
    stored, check = load_verified(results_path, allow_unverified)
    out = Output()
    if check.unverified_reason:
        out.info(f"UNVERIFIED ({check.unverified_reason}): {check.message}; the report is marked so",
                 style="bold red")
    results = regrade(stored)
    details = write_report(results, output, run_dir=results_path.parent, unverified=check.unverified_reason)
    out.info(f"report:  {output}")
    out.info(f"details: {details}")
