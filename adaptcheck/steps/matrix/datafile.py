"""Load a ``matrices/*.yaml`` file into a strict pydantic model, with ``file:line`` errors.

Parsing and line-accurate errors come from :mod:`adaptcheck.yamldata`, shared with ladders.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from adaptcheck import yamldata
from adaptcheck.errors import InvalidInputError
from adaptcheck.paths import data_dir

M = TypeVar("M", bound=BaseModel)


class MatrixError(InvalidInputError):
    """A compatibility-matrix data file is malformed; the message names the file and line."""


def matrices_file(name: str) -> Path:
    """A shipped file of ``matrices/`` (works for a checkout and for an installed wheel)."""
    return data_dir("matrices") / name


def load_model(path: Path, model: type[M], error: type[MatrixError] = MatrixError) -> M:
    """Read ``path`` and validate it as ``model``; every problem is one ``error`` line."""
    text = yamldata.read_text(path, error)  # size-bounded; a problem is one ``error`` line
    return parse_model(text, str(path), model, error)


def parse_model(text: str, filename: str, model: type[M], error: type[MatrixError] = MatrixError) -> M:
    """Validate YAML ``text`` as ``model``. Errors name ``filename:line`` and the key path."""
    return yamldata.parse_model(text, filename, model, error)
