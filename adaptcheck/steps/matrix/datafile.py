"""Load a ``matrices/*.yaml`` file into a strict pydantic model, with ``file:line`` errors.

The text is read with ``yaml.safe_load``; the composed node tree is used only to point a
validation error at its line and to reject duplicate keys (which ``safe_load`` would
silently resolve to the last one, hiding a typo in a compatibility table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from adaptcheck.errors import InvalidInputError
from adaptcheck.paths import data_dir

M = TypeVar("M", bound=BaseModel)


class MatrixError(InvalidInputError):
    """A compatibility-matrix data file is malformed; the message names the file and line."""


def matrices_file(name: str) -> Path:
    """A shipped file of ``matrices/`` (works for a checkout and for an installed wheel)."""
    return data_dir("matrices") / name


def load_model(path: Path, model: type[M]) -> M:
    """Read ``path`` and validate it as ``model``; every problem is one ``MatrixError`` line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixError(f"{path}: cannot read: {exc}") from None
    return parse_model(text, str(path), model)


def parse_model(text: str, filename: str, model: type[M]) -> M:
    """Validate YAML ``text`` as ``model``. Errors name ``filename:line`` and the key path."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise MatrixError(f"{filename}{line}: malformed YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise MatrixError(f"{filename}: malformed YAML: {exc}") from None
    if root is None or not isinstance(data, dict):
        raise MatrixError(f"{filename}:1: expected a YAML mapping at the top level")
    _reject_duplicate_keys(root, filename)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise MatrixError(_describe(exc, root, filename)) from None


def _describe(exc: ValidationError, root: yaml.Node, filename: str) -> str:
    """The most telling error, one line. A misspelt key is reported before the 'missing'
    error it causes; a wrong ``type`` tag points at the ``type`` key itself."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    loc = list(err["loc"])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("type")
    where = ".".join(map(str, loc)) or "(top)"
    return f"{filename}:{_line_of(root, loc)}: {where}: {msg}"


def _reject_duplicate_keys(node: yaml.Node, filename: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key, value in node.value:
            if key.value in seen:
                raise MatrixError(f"{filename}:{key.start_mark.line + 1}: duplicate key {key.value!r}")
            seen.add(key.value)
            _reject_duplicate_keys(value, filename)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _reject_duplicate_keys(item, filename)


def _line_of(root: yaml.Node, loc: list[Any]) -> int:
    """Line (1-based) of the deepest node reachable along ``loc``.

    Pydantic inserts the discriminator value into the location of a tagged-union member
    (``rules.0.requirement.target``); such a part matches no node and is skipped.
    """
    node = root
    line = root.start_mark.line
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if pair is not None:
                # the key's line: for 'key:' followed by a block, that is where the reader looks
                line, node = pair[0].start_mark.line, pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
    return line + 1
