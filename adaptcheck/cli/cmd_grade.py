"""``adaptcheck grade``: recompute the grade of a results file; exit 1 below ``--require``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from adaptcheck.cli.output import Format, Output
from adaptcheck.cli.render import print_grade
from adaptcheck.errors import GradeBelowRequired, UsageError
from adaptcheck.models.ladder import LEVELS
from adaptcheck.models.results import RunResults
from adaptcheck.session import regrade
from adaptcheck.steps.grade import level_at_least


def check_level(level: str) -> str:
    """Validate an L1-L5 level argument."""
    if level not in LEVELS:
        raise UsageError(f"--require {level!r} is not a level", hint="use one of " + ", ".join(LEVELS))
    return level


def grade(
    results_path: Path = typer.Argument(..., metavar="RESULTS.json", help="results.json written by 'adaptcheck run'."),
    require: Optional[str] = typer.Option(None, "--require", "-r", help="Exit 1 unless the grade is at least this level (L1-L5)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table, json or yaml."),
) -> None:
    """Print the grade and its blockers. Exit codes: 0 meets --require, 1 below it, 3 unreadable file."""
    if require is not None:
        check_level(require)
    out = Output(fmt)
    stored = RunResults.load(results_path)
    results = regrade(stored)
    if results.grade.level != stored.grade.level:
        out.info(f"note: the file says {stored.grade.level}, but its checks and rules give {results.grade.level};"
                 " using the recomputed grade", style="yellow")
    print_grade(out, results)
    meets = require is None or level_at_least(results.grade.level, require)
    out.data({"grade": results.grade.level, "name": results.grade.name, "required": require, "meets": meets,
              "blockers": results.grade.blockers, "steps_not_run": results.grade.steps_not_run})
    if not meets:
        raise GradeBelowRequired(f"grade {results.grade.level} is below the required {require}")
