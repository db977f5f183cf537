"""``adaptcheck matrix``: the fleet compatibility matrix (``merge``) and its known-good export.

Both commands take many results files (or run folders): unusable ones are named on stderr
and skipped; only "nothing could be merged" is an error (exit 3). ``export-known-good``
exits 1 when no combination reached L4 in its latest run (nothing is written then).
"""

from __future__ import annotations

from pathlib import Path

import typer

from adaptcheck.cli.output import Format, Output
from adaptcheck.errors import GradeBelowRequired, InvalidInputError
from adaptcheck.fleet import (
    export_known_good,
    merge_results,
    output_format,
    write_matrix,
)
from adaptcheck.fleet.models import KNOWN_GOOD_MIN_LEVEL, FleetMatrix, SkippedInput
from adaptcheck.fleet.stack import summary

app = typer.Typer(name="matrix", help="Fleet compatibility matrix: merge many runs, export known-good stacks.",
                  no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})

GRADE_STYLE = {"L0": "red", "L1": "yellow", "L2": "yellow", "L3": "cyan", "L4": "cyan", "L5": "green"}
BLOCKER_CHARS = 80
_RESULTS_HELP = "results.json files or run folders (e.g. reports/*/results.json)."


def _warn_skipped(out: Output, skipped: list[SkippedInput]) -> None:
    for s in skipped:
        out.info(f"skipped {s.path}: {s.reason}", style="yellow")


def _nothing_merged(inputs: int) -> InvalidInputError:
    return InvalidInputError(f"nothing to merge: none of the {inputs} input(s) is a usable results file",
                             hint="each input is named above with the reason it was skipped")


def _table(out: Output, matrix: FleetMatrix) -> None:
    rows = [[r.id, r.latest_grade, r.best_grade, summary(r.key), ", ".join(r.hosts), len(r.runs),
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
) -> None:
    """Merge many runs into one row per machine/software combination, with recomputed grades."""
    if output is not None:
        output_format(output)  # a wrong suffix is a usage error before any file is read
    out = Output(fmt)
    matrix = merge_results(results)
    _warn_skipped(out, matrix.skipped)
    if not matrix.rows:
        raise _nothing_merged(matrix.inputs)
    _table(out, matrix)
    if output is not None:
        write_matrix(matrix, output)
        out.info(f"matrix: {output}")
    out.data(matrix.model_dump(mode="json"))


@app.command("export-known-good")
def export(
    results: list[Path] = typer.Argument(..., metavar="RESULTS", help=_RESULTS_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="Known-good YAML to write (entries with the same id are replaced)."),
    prefix: str = typer.Option("site", "--prefix", help="Prefix of the entry ids, e.g. your site or team name."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table (stderr) or json/yaml (the result on stdout)."),
) -> None:
    """Write every combination whose latest run reached L4 or above as a known-good entry (matrices/ schema)."""
    out = Output(fmt)
    done = export_known_good(results, output, prefix=prefix)
    _warn_skipped(out, done.skipped)
    if not done.entries and not done.refused:
        raise _nothing_merged(len(results))
    for r in done.refused:
        out.info(f"refused {r.row} ({r.summary}): {r.reason}", style="yellow")
    if done.entries:
        out.table("known-good entries written", ["id", "pins"],
                  [[e.id, ", ".join(f"{k} {v}" for k, v in e.versions.items())] for e in done.entries])
        out.info(f"known-good: {output} ({len(done.entries)} written, {done.kept} kept); "
                 "point ADAPTCHECK_KNOWN_GOOD at it so the next runs are checked against it")
    out.data(done.model_dump(mode="json"))
    if not done.entries:
        raise GradeBelowRequired(f"no combination reached {KNOWN_GOOD_MIN_LEVEL} in its latest run; nothing written",
                                 hint="each refusal is listed above")
