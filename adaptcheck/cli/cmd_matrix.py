"""``adaptcheck matrix``: the fleet compatibility matrix (``merge``) and its known-good export.

Both commands take many results files (or run folders): unusable ones are named on stderr
and skipped — a file edited after its run or without digest too, unless
``--allow-unverified`` (then it is merged, and every row, run and entry built from it says
UNVERIFIED); only "nothing could be merged" is an error (exit 3). ``export-known-good``
exits 1 when no combination reached L4 in its latest run (nothing is written then).
"""

from __future__ import annotations

from pathlib import Path

import typer

from adaptcheck.base.errors import GradeBelowRequired, IntegrityError, InvalidInputError
from adaptcheck.base.trusted import ALLOW_OPTION
from adaptcheck.cli.output import Format, Output
from adaptcheck.fleet import (
    export_known_good,
    merge_results,
    output_format,
    write_matrix,
)
from adaptcheck.fleet.models import (
    KNOWN_GOOD_MIN_LEVEL,
    Combination,
    FleetMatrix,
    SkippedInput,
)
from adaptcheck.fleet.stack import summary

app = typer.Typer(name="matrix", help="Fleet compatibility matrix: merge many runs, export known-good stacks.",
                  no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})

GRADE_STYLE = {"L0": "red", "L1": "yellow", "L2": "yellow", "L3": "cyan", "L4": "cyan", "L5": "green"}
BLOCKER_CHARS = 80
_RESULTS_HELP = "results.json files or run folders (e.g. reports/*/results.json)."
_ALLOW_HELP = ("Merge results files edited after their run or without digest, marked UNVERIFIED. Without it "
               "they are skipped and named, the others merged, and the command exits 5.")


def _warn_skipped(out: Output, skipped: list[SkippedInput]) -> None:
    for s in skipped:
        out.info(f"skipped {s.path}: {s.reason}", style="yellow")


def _warn_unverified(out: Output, matrix: FleetMatrix) -> None:
    for row in matrix.rows:
        for run in row.runs:
            if not run.verified:
                why = "edited after the run" if run.integrity == "edited" else "no digest"
                out.info(f"UNVERIFIED run {run.run_id} ({run.path}): {why}; merged because of {ALLOW_OPTION}",
                         style="bold red")


def _runs(row: Combination) -> str:
    unverified = sum(1 for r in row.runs if not r.verified)
    return f"{len(row.runs)} ({unverified} UNVERIFIED)" if unverified else str(len(row.runs))


def _nothing_merged(inputs: int) -> InvalidInputError:
    return InvalidInputError(f"nothing to merge: none of the {inputs} input(s) is a usable results file",
                             hint="each input is named above with the reason it was skipped")


def _refuse_unverified(skipped: list[SkippedInput]) -> None:
    """Exit 5 once the good inputs are merged, when any input was skipped for its digest: an
    edited file among a fleet's reports must fail the job, not just print a yellow line."""
    refused = [s.path for s in skipped if s.unverified]
    if refused:
        raise IntegrityError(f"{len(refused)} input(s) edited after their run or without digest were not merged: "
                             + ", ".join(refused),
                             hint=f"use the files as their runs wrote them, or pass {ALLOW_OPTION} to merge them "
                                  "marked unverified")


def _table(out: Output, matrix: FleetMatrix) -> None:
    rows = [[r.id, r.latest_grade, r.best_grade, summary(r.key), ", ".join(r.hosts), _runs(r),
             "yes" if r.known_good else "no", _blockers(r.latest_blockers)] for r in matrix.rows]
    out.table("fleet compatibility matrix", ["id", "latest", "best", "combination", "hosts", "runs", "known-good",
                                             "blockers (latest run)"], rows, styles={1: GRADE_STYLE, 2: GRADE_STYLE})


def _blockers(blockers: list[str]) -> str:
    """The first blocker, cut short (the full list is in the HTML/JSON), and how many more."""
    if not blockers:
        return ""
    first = blockers[0] if len(blockers[0]) <= BLOCKER_CHARS else blockers[0][: BLOCKER_CHARS - 1] + "…"
    return first + (f" (+{len(blockers) - 1} more)" if len(blockers) > 1 else "")


@app.command("merge")
def merge(
    results: list[Path] = typer.Argument(..., metavar="RESULTS", help=_RESULTS_HELP),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the matrix here: .html, .json or .yaml."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table (stderr) or json/yaml (the matrix on stdout)."),
    allow_unverified: bool = typer.Option(False, ALLOW_OPTION, help=_ALLOW_HELP),
) -> None:
    """Merge many runs into one row per machine/software combination, with recomputed grades."""
    if output is not None:
        output_format(output)  # a wrong suffix is a usage error before any file is read
    out = Output(fmt)
    matrix = merge_results(results, allow_unverified)
    _warn_skipped(out, matrix.skipped)
    _warn_unverified(out, matrix)
    if not matrix.rows:
        _refuse_unverified(matrix.skipped)
        raise _nothing_merged(matrix.inputs)
    _table(out, matrix)
    if output is not None:
        write_matrix(matrix, output)
        out.info(f"matrix: {output}")
    out.data(matrix.model_dump(mode="json"))
    _refuse_unverified(matrix.skipped)


@app.command("export-known-good")
def export(
    results: list[Path] = typer.Argument(..., metavar="RESULTS", help=_RESULTS_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="Known-good YAML to write (entries with the same id are replaced)."),
    prefix: str = typer.Option("site", "--prefix", help="Prefix of the entry ids, e.g. your site or team name."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table (stderr) or json/yaml (the result on stdout)."),
    allow_unverified: bool = typer.Option(False, ALLOW_OPTION, help=_ALLOW_HELP),
) -> None:
    """Write every combination whose latest run reached L4 or above as a known-good entry (matrices/ schema)."""
    out = Output(fmt)
    done = export_known_good(results, output, prefix=prefix, allow_unverified=allow_unverified)
    _warn_skipped(out, done.skipped)
    if not done.entries and not done.refused:
        _refuse_unverified(done.skipped)
        raise _nothing_merged(len(results))
    for r in done.refused:
        out.info(f"refused {r.row} ({r.summary}): {r.reason}", style="yellow")
    if done.entries:
        out.table("known-good entries written", ["id", "pins"],
                  [[e.id, ", ".join(f"{k} {v}" for k, v in e.versions.items())] for e in done.entries])
        for e in done.entries:
            if "UNVERIFIED" in e.source:
                out.info(f"UNVERIFIED entry {e.id}: {e.source.split('UNVERIFIED', 1)[1].lstrip()}", style="bold red")
        out.info(f"known-good: {output} ({len(done.entries)} written, {done.kept} kept); "
                 "point ADAPTCHECK_KNOWN_GOOD at it so the next runs are checked against it")
    out.data(done.model_dump(mode="json"))
    _refuse_unverified(done.skipped)
    if not done.entries:
        raise GradeBelowRequired(f"no combination reached {KNOWN_GOOD_MIN_LEVEL} in its latest run; nothing written",
                                 hint="each refusal is listed above")
