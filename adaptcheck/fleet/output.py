"""Write the fleet matrix in the format its file name asks for: .html, .json or .yaml."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from adaptcheck.errors import UsageError
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


def write_atomic(path: Path, text: str, check: Callable[[Path], object] | None = None) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder.

    ``check`` reads the temporary file first and raises to refuse it: a reader (or a crash)
    never sees half a file, and an invalid one never replaces a good one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are meant to be shared
        if check is not None:
            check(tmp)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_matrix(matrix: FleetMatrix, path: Path) -> None:
    """Write ``matrix`` to ``path`` atomically, in the format its suffix names."""
    write_atomic(path, matrix_text(matrix, output_format(path)))
