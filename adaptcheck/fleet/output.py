"""Write the fleet matrix in the format its file name asks for: .html, .json or .yaml."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from adaptcheck.base.atomic import write_text_atomic
from adaptcheck.base.errors import UsageError
from adaptcheck.fleet.html import render_fleet
from adaptcheck.fleet.models import FleetMatrix

FORMATS = {".html": "html", ".htm": "html", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def output_format(path: Path) -> str:
    """'html', 'json' or 'yaml' from the suffix; anything else is a usage error (checked before merging)."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(f"-o {path}: unknown output format {path.suffix or '(no suffix)'!r}",
                         hint="name the file .html, .json or .yaml")
    return fmt


def matrix_text(matrix: FleetMatrix, fmt: str) -> str:
    """The matrix as HTML, JSON or YAML text."""
    if fmt == "html":
        return render_fleet(matrix)
    data = json.loads(matrix.model_dump_json())
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def write_matrix(matrix: FleetMatrix, path: Path) -> None:
    """Write ``matrix`` to ``path`` atomically, in the format its suffix names."""
    write_text_atomic(path, matrix_text(matrix, output_format(path)), what="the fleet matrix")
