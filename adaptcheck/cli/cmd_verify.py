"""``adaptcheck verify``: say whether a results.json was edited after the run.

Exit 0 when its content matches the digest it carries, 5 when it was edited or carries no
digest (nothing proves it intact), 3 when it is not a readable JSON file.
"""

from __future__ import annotations

from pathlib import Path

import typer

from adaptcheck.base.errors import IntegrityError, InvalidInputError
from adaptcheck.base.integrity import Integrity, verify_file
from adaptcheck.cli.output import Format, Output

_HINTS = {
    Integrity.EDITED: "the digest no longer vouches for this file; use the run folder's original or run again",
    Integrity.NO_DIGEST: "only files written by adaptcheck with results schema 1.1 or later carry one",
}


def verify(
    results_path: Path = typer.Argument(..., metavar="RESULTS.json", help="results.json written by 'adaptcheck run'."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table (one line on stderr), json or yaml (verdict on stdout)."),
) -> None:
    """Check that a results.json is unchanged since adaptcheck wrote it (its SHA-256 digest).

    The digest catches accidental and casual edits; it is not a signature.

    Exit codes:
      0  intact: the content matches the digest the file carries
      3  the file is missing or not readable JSON
      5  edited after the run, or the file carries no digest to check
    """
    out = Output(fmt)
    result = verify_file(results_path)
    if result.status is Integrity.UNREADABLE:
        raise InvalidInputError(result.message, hint="pass the results.json of a run")
    # The verdict is data whatever it is, so a pipeline can read it before the exit code.
    out.data(result.model_dump(mode="json"))
    if not result.intact:
        raise IntegrityError(result.message, hint=_HINTS.get(result.status))
    out.info(result.message, style="green")
