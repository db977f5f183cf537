"""Strict YAML data files: ``safe_load`` plus ``file:line`` in every error.

Ladders and the compatibility matrices are data that users edit by hand, so a problem must
point at the line. The text is read with ``yaml.safe_load``; the composed node tree is kept
only to map a validation error's location to a line and to reject duplicate keys (which
``safe_load`` would silently resolve to the last one, hiding a typo).
"""

from __future__ import annotations

from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from adaptcheck.errors import InvalidInputError

M = TypeVar("M", bound=BaseModel)


def parse_yaml(text: str, filename: str, error: type[InvalidInputError]) -> tuple[dict[str, Any], yaml.Node]:
    """Parse a YAML mapping; malformed text or duplicate keys raise ``error`` naming the line."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise error(f"{filename}{line}: malformed YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise error(f"{filename}: malformed YAML: {exc}") from None
    if root is None or not isinstance(data, dict):
        raise error(f"{filename}:1: expected a YAML mapping at the top level")
    _reject_duplicate_keys(root, filename, error)
    return data, root


def parse_model(text: str, filename: str, model: type[M], error: type[InvalidInputError] = InvalidInputError) -> M:
    """Validate YAML ``text`` as ``model``. Errors name ``filename:line`` and the key path."""
    data, root = parse_yaml(text, filename, error)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(describe(exc, root, filename)) from None


def describe(exc: ValidationError, root: yaml.Node, filename: str, prefix: tuple[Any, ...] = ()) -> str:
    """The most telling validation error, one line. A misspelt key is reported before the
    'missing' error it causes; a wrong ``type`` tag points at the ``type`` key itself.
    ``prefix`` is the location of the validated value inside the file."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    loc = [*prefix, *err["loc"]]
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("type")
    where = ".".join(map(str, loc)) or "(top)"
    return f"{filename}:{line_of(root, loc)}: {where}: {msg}"


def _reject_duplicate_keys(node: yaml.Node, filename: str, error: type[InvalidInputError]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key, value in node.value:
            if key.value in seen:
                raise error(f"{filename}:{key.start_mark.line + 1}: duplicate key {key.value!r}")
            seen.add(key.value)
            _reject_duplicate_keys(value, filename, error)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _reject_duplicate_keys(item, filename, error)


def line_of(root: yaml.Node, loc: list[Any]) -> int:
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
