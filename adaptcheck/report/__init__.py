"""The self-contained HTML report: build plain view data first, render it second.

``write_report`` is the entry point the run session and ``adaptcheck report`` call;
:mod:`adaptcheck.report.view` builds the data and :mod:`adaptcheck.report.render` lays it out.
"""

from __future__ import annotations

import os
from pathlib import Path

from adaptcheck.base.atomic import write_text_atomic
from adaptcheck.base.schemas.results import RunResults
from adaptcheck.report.render import details_path, render
from adaptcheck.report.view import build_view

__all__ = ["details_path", "write_report"]


def write_report(results: RunResults, path: Path, run_dir: Path | None = None, unverified: str = "") -> Path:
    """Render the report of ``results`` into ``path`` (UTF-8, atomically), and its details page
    (every op case, every check's evidence) beside it, named by :func:`details_path`; returns
    the details page's path.

    ``run_dir``: the run folder holding the files the report links to (step 5's per-request
    records), when the report is written somewhere else; links are made relative to it.
    ``unverified``: why nothing vouches for the results file ('edited after the run', 'no
    digest') when ``adaptcheck report --allow-unverified`` renders it anyway (a banner says so).

    The page is written to a temporary file in the same folder and moved over ``path``,
    so a reader (or a crash) never sees half a report and an older report stays intact
    until the new one is complete.
    """
    path = Path(path)
    base = ""
    if run_dir is not None and Path(run_dir).resolve() != path.parent.resolve():
        base = Path(os.path.relpath(Path(run_dir).resolve(), path.parent.resolve())).as_posix()
    view = build_view(results, records_base=base, unverified=unverified)
    details = details_path(path)
    # Details first: the main page never links to a page that is not there yet.
    write_text_atomic(details, render(view, "details", main_file=path.name, details_file=details.name),
                      what="the report's details page")
    write_text_atomic(path, render(view, "main", main_file=path.name, details_file=details.name), what="the report")
    return details
