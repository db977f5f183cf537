"""Render a :class:`ReportView` into two self-contained HTML pages: the report and its details.

Autoescaping is on for every template: hostnames, device names, messages and details come
from the machine under test and from third-party plugins, so they are untrusted text.
The page also carries a Content-Security-Policy that forbids every network load and every
script but the one print helper (allowed by its hash), as a second line of defence.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from adaptcheck.base.atomic import write_text_atomic
from adaptcheck.compare import Comparison
from adaptcheck.report.comparison import PAGE_TEMPLATE, ComparePage, build_compare_view
from adaptcheck.report.view import ReportView

# Next to this module, inside the package, so the template ships in the wheel.
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE = "report.html.j2"
DETAILS_TEMPLATE = "report_details.html.j2"
MAIN_FILE = "report.html"
DETAILS_FILE = "report-details.html"
"""The details page beside report.html (per-op cases, every check's evidence): the main page
stays short enough to read and to share."""
DETAILS_PAGE_ANCHORS = ("checks", "ops-details", "perf-details", "numerics-details")
"""Section ids of the details page (besides the view's ``detail_anchors``)."""

# Browsers do not print the body of a closed <details>, whatever the CSS says; this opens
# them all before printing. The report is fully readable without it.
PRINT_SCRIPT = (
    "window.addEventListener('beforeprint',function(){"
    "document.querySelectorAll('details').forEach(function(d){d.open=true;});});"
)


def script_hash(script: str) -> str:
    """The CSP source expression ('sha256-…') that allows exactly this inline script."""
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "sha256-" + base64.b64encode(digest).decode("ascii")


@lru_cache(maxsize=1)
def _environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(str(TEMPLATE_DIR)),
        # Every template and string template is escaped, whatever its extension.
        autoescape=True,
        undefined=StrictUndefined,  # a typo in the template fails the tests instead of rendering blank
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_template(name: str, **context: Any) -> str:
    """Another page of this folder (e.g. the comparison page), with the same autoescaping environment."""
    return _environment().get_template(name).render(**context)


def details_path(report: Path) -> Path:
    """Where the details page of the report at ``report`` goes: ``report-details.html`` beside
    ``report.html``; beside ``-o out.html``, ``out-details.html``."""
    return report.with_name(f"{report.stem}-details{report.suffix or '.html'}")


def linker(view: ReportView, page: str, main_file: str, details_file: str) -> Callable[[str], str]:
    """``link(anchor)`` for the templates: a fragment on the same page, or the other page's
    file name and fragment (the two pages lie in one folder)."""
    on_details = set(view.detail_anchors) | set(DETAILS_PAGE_ANCHORS)

    def link(anchor: str) -> str:
        here = (anchor in on_details) == (page == "details")
        return f"#{anchor}" if here else f"{quote(details_file if page == 'main' else main_file)}#{anchor}"

    return link


def render(view: ReportView, page: str = "main", main_file: str = MAIN_FILE, details_file: str = DETAILS_FILE) -> str:
    """One page of the report as an HTML string: ``main`` (grade, blockers, step summaries,
    charts) or ``details`` (every op case, every check's evidence)."""
    template = _environment().get_template(TEMPLATE if page == "main" else DETAILS_TEMPLATE)
    return template.render(
        v=view,
        link=linker(view, page, main_file, details_file),
        # Markup: a constant of this module, not data, so it is emitted verbatim.
        print_script=Markup(PRINT_SCRIPT),
        script_csp=script_hash(PRINT_SCRIPT),
    )


def write_compare_report(comparison: Comparison, path: Path) -> None:
    """The comparison as a self-contained HTML page (UTF-8, written atomically)."""
    write_text_atomic(path, render_template(PAGE_TEMPLATE, v=ComparePage(compare=build_compare_view(comparison))),
                      what="the comparison page")
