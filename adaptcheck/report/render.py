"""Render a :class:`ReportView` into one self-contained HTML page.

Autoescaping is on for every template: hostnames, device names, messages and details come
from the machine under test and from third-party plugins, so they are untrusted text.
The page also carries a Content-Security-Policy that forbids every network load and every
script but the one print helper (allowed by its hash), as a second line of defence.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from adaptcheck.report.view import ReportView

# Next to this module, inside the package, so the template ships in the wheel.
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE = "report.html.j2"

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


def render(view: ReportView) -> str:
    """The report page as one HTML string."""
    template = _environment().get_template(TEMPLATE)
    return template.render(
        v=view,
        # Markup: a constant of this module, not data, so it is emitted verbatim.
        print_script=Markup(PRINT_SCRIPT),
        script_csp=script_hash(PRINT_SCRIPT),
    )
