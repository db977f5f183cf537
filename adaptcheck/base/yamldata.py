"""Strict, bounded YAML data files (ladders, matrices): safe loading, duplicate keys refused and
``file:line`` in every error (docs/ladders.md, "YAML data files").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from adaptcheck.base.errors import InvalidInputError, exception_line
from adaptcheck.base.paths import data_dir

M = TypeVar("M", bound=BaseModel)

MAX_YAML_CHARS = 4 * 1024 * 1024
"""Largest YAML text accepted (characters)."""
MAX_YAML_DEPTH = 64
"""Deepest nesting of mappings/sequences accepted."""
MAX_INT_DIGITS = 1000
"""Longest integer accepted (digits)."""


class _LimitError(yaml.MarkedYAMLError):
    """A limit of this module was hit; carries the mark of the offending node."""


class BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases, nesting beyond :data:`MAX_YAML_DEPTH` and over-long
    integers, each as a marked error (so the message names the line)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise _LimitError(None, None, f"alias *{event.anchor} refused: adaptcheck data files may not use "
                              "anchors and aliases (write the values out)", event.start_mark)  # type: ignore[arg-type]
        # The composer recurses once per level; count before recursing, so a file nested
        # 100,000 deep is refused at level 65 instead of exhausting the stack.
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _LimitError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            # Python's own limit (4,300 digits) would raise a bare ValueError naming no line.
            raise _LimitError(None, None, f"an integer has {digits} digits, more than the {MAX_INT_DIGITS} "
                              "adaptcheck reads", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:
            # e.g. a timestamp that matches the pattern but is no date (2024-13-45)
            raise _ValueError(None, None, f"cannot read this value: {exception_line(exc, with_type=False)}", node.start_mark) from None


class _ValueError(yaml.MarkedYAMLError):
    """A scalar the constructor could not turn into a value (bad date, …); carries its mark."""


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


def load_bounded(text: str, name: str | None = None) -> tuple[Any, yaml.Node | None]:
    """Compose ``text`` (one document) with :class:`BoundedLoader` and construct its data.

    ``name`` (the file name) is written into every node's marks: a tree merged from several
    files (a ladder that extends another) still knows which file each node came from.
    Returns ``(data, root node)``; raises ``yaml.YAMLError`` (marked where possible)."""
    loader = BoundedLoader(text)
    if name is not None:
        loader.name = name  # the Reader stamps this on every mark it makes from here on
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return data, root


def construct(root: yaml.Node) -> Any:
    """The data of a node tree composed earlier (or merged from several files), built with
    :class:`BoundedLoader`'s constructors and so under the same limits."""
    loader = BoundedLoader("")
    try:
        return loader.construct_document(root)
    finally:
        loader.dispose()


def read_text(path: Path, error: type[InvalidInputError], what: str = "file") -> str:
    """The text of a YAML data file, refusing (as ``error``) a missing, unreadable or too large one."""
    too_large = f"{path}: {what} larger than {MAX_YAML_CHARS // (1024 * 1024)} Mi characters"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_CHARS * 4 + 1)  # at most 4 bytes a character in UTF-8
        if len(raw) > MAX_YAML_CHARS * 4:
            raise error(too_large)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise error(f"{path}: cannot read: no such {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if len(text) > MAX_YAML_CHARS:
        raise error(too_large)
    return text


def parse_yaml(text: str, filename: str, error: type[InvalidInputError]) -> tuple[dict[str, object], yaml.Node]:
    """Parse a YAML mapping; malformed text, a limit hit or duplicate keys raise ``error`` naming the line.

    The mapping is the document as read (to be validated into a model by the caller)."""
    if len(text) > MAX_YAML_CHARS:
        raise error(f"{filename}: larger than {MAX_YAML_CHARS // (1024 * 1024)} Mi characters",
                    hint="adaptcheck data files are a few kB; check that this is the right file")
    try:
        data, root = load_bounded(text, filename)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        kind = "YAML refused" if isinstance(exc, _LimitError) else "malformed YAML"
        raise error(f"{filename}{line}: {kind}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise error(f"{filename}: malformed YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    except RecursionError:
        # Not reachable with the depth limit; kept so a smaller stack can never crash the CLI.
        raise error(f"{filename}: YAML refused: nested too deeply") from None
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
    # A model-level validator may say where below it the problem is (ctx "at"), e.g. the
    # second of two checks with one id.
    at = (err.get("ctx") or {}).get("at", ())
    loc = [*prefix, *err["loc"], *at]
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("type")
    where = ".".join(map(str, loc)) or "(top)"
    return f"{location(root, loc, filename)}: {where}: {msg}"


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


def mark_of(root: yaml.Node, loc: list[Any] | tuple[Any, ...]) -> yaml.Mark:
    """Mark (file name and line) of the deepest node reachable along ``loc``.

    Pydantic inserts the discriminator value into the location of a tagged-union member
    (``rules.0.requirement.target``); such a part matches no node and is skipped.
    """
    node = root
    mark = root.start_mark
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if pair is not None:
                # the key's line: for 'key:' followed by a block, that is where the reader looks
                mark, node = pair[0].start_mark, pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            mark = node.start_mark
    return mark


def line_of(root: yaml.Node, loc: list[Any] | tuple[Any, ...]) -> int:
    """Line (1-based) of the deepest node reachable along ``loc``."""
    return mark_of(root, loc).line + 1


def location(root: yaml.Node, loc: list[Any] | tuple[Any, ...], filename: str) -> str:
    """``file:line`` of the deepest node reachable along ``loc``. The file is the one the node
    was read from (:func:`parse_yaml` names every mark): in a ladder merged from a parent and
    a child, a value the child set points into the child. ``filename`` stands in for a node
    read without a name (marks of an unnamed stream say ``<unicode string>``)."""
    mark = mark_of(root, loc)
    name = mark.name if mark.name and not mark.name.startswith("<") else filename
    return f"{name}:{mark.line + 1}"


# --- the shipped data files of matrices/ -----------------------------------------------------------

class MatrixError(InvalidInputError):
    """A compatibility-matrix data file is malformed; the message names the file and line."""


def matrices_file(name: str) -> Path:
    """A shipped file of ``matrices/`` (works for a checkout and for an installed wheel)."""
    return data_dir("matrices") / name


def load_model(path: Path, model: type[M], error: type[InvalidInputError] = MatrixError) -> M:
    """Read ``path`` (size-bounded) and validate it as ``model``; every problem is one ``error`` line."""
    return parse_model(read_text(path, error), str(path), model, error)
