"""The self-contained HTML report: build plain view data first, render it second.

``write_report`` is the entry point the run session and ``adaptcheck report`` call;
:mod:`adaptcheck.report.view` builds the data and :mod:`adaptcheck.report.render` lays it out.
"""

from __future__ import annotations

import os
from pathlib import Path

from adaptcheck.atomic import write_text_atomic
from adaptcheck.models.results import RunResults
from adaptcheck.report.render import render
from adaptcheck.report.view import build_view

__all__ = ["write_report"]


def write_report(results: RunResults, path: Path, run_dir: Path | None = None) -> None:
    """Render the report of ``results`` into ``path`` (UTF-8, atomically).

    ``run_dir``: the run folder holding the files the report links to (step 5's per-request
    records), when the report is written somewhere else; links are made relative to it.

    The page is written to a temporary file in the same folder and moved over ``path``,
    so a reader (or a crash) never sees half a report and an older report stays intact
    until the new one is complete.
    """
    path = Path(path)
    base = ""
    if run_dir is not None and Path(run_dir).resolve() != path.parent.resolve():
        base = Path(os.path.relpath(Path(run_dir).resolve(), path.parent.resolve())).as_posix()
    write_text_atomic(path, render(build_view(results, records_base=base)))
