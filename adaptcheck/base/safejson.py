"""Bounded reading of the JSON files a user hands to adaptcheck.

``results.json`` (``grade``, ``report``, ``compare``, ``verify``, ``matrix merge``,
``run --baseline``) and saved comparisons come from other machines and other people, so
they are read with limits that keep a hostile or broken file a one-line error (exit 3)
instead of a crash or a stall:

* size: at most :data:`MAX_JSON_BYTES` (64 MiB; a real results.json is well under 5 MiB);
* nesting: at most :data:`MAX_JSON_DEPTH` (64) levels of objects and arrays, checked by a
  cheap pre-scan *before* :func:`json.loads` (whose C parser would otherwise raise
  ``RecursionError`` — or, in a thread with a small stack, crash — at about 100,000 levels);
* integers: at most :data:`MAX_INT_DIGITS` (1,000) digits (Python itself refuses 4,300 with
  a bare ``ValueError`` that names no file).

Every problem is an :class:`~adaptcheck.base.errors.InvalidInputError` naming the file, and the
line where one is known.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

from adaptcheck.base.errors import InvalidInputError

MAX_JSON_BYTES = 64 * 1024 * 1024
"""Largest JSON file read (bytes)."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of objects/arrays accepted (a results.json nests about 10 levels)."""
MAX_INT_DIGITS = 1000
"""Longest integer literal accepted (digits)."""

# A JSON string (escapes included), or one bracket. Strings are matched so that brackets
# inside them are not counted.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonLimitError(InvalidInputError):
    """A JSON file is larger, deeper or holds longer numbers than adaptcheck reads."""


class JsonFormatError(InvalidInputError):
    """A file is not valid JSON; the message names the line and column."""


class _IntTooLong(ValueError):
    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        self.digits = digits


def _line_at(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def nesting_depth(text: str) -> int:
    """Deepest bracket nesting of JSON ``text``, ignoring brackets inside strings.

    Runs at C speed (regular expressions, ``accumulate``), about 10 ms per MiB, so it can
    run on every file before the recursive parser sees it.
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    return max(0, max(accumulate(map(_DEPTH_STEP.__getitem__, brackets))))


def _deep_line(text: str, limit: int) -> int:
    """Line where nesting first exceeds ``limit`` (only called once it is known to)."""
    depth = 0
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in "[{":
            depth += 1
            if depth > limit:
                return _line_at(text, m.start())
        elif tok in "]}":
            depth -= 1
    return 1


def _bounded_int(max_digits: int) -> Callable[[str], int]:
    def parse(literal: str) -> int:
        digits = len(literal.lstrip("-"))
        if digits > max_digits:
            raise _IntTooLong(digits)
        return int(literal)

    return parse


def loads(text: str, source: str, *, max_depth: int = MAX_JSON_DEPTH, max_int_digits: int = MAX_INT_DIGITS,
          object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
          parse_constant: Callable[[str], Any] | None = None) -> Any:
    """:func:`json.loads` with the limits above; ``source`` names the text in errors.

    Raises :class:`JsonLimitError` or :class:`JsonFormatError`; an exception raised by a
    hook (``object_pairs_hook``, ``parse_constant``) propagates unchanged, so a caller can
    tell its own findings apart.
    """
    if nesting_depth(text) > max_depth:
        raise JsonLimitError(f"{source}:{_deep_line(text, max_depth)}: nested deeper than {max_depth} levels",
                             hint="adaptcheck never writes such a file; use the file as its run wrote it")
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook, parse_constant=parse_constant,
                          parse_int=_bounded_int(max_int_digits))
    except _IntTooLong as exc:
        m = re.search(rf"-?\d{{{max_int_digits + 1},}}", text)
        line = f":{_line_at(text, m.start())}" if m else ""
        raise JsonLimitError(f"{source}{line}: an integer has {exc.digits} digits, more than the {max_int_digits} "
                             "adaptcheck reads", hint="use the file as its run wrote it") from None
    except json.JSONDecodeError as exc:
        raise JsonFormatError(f"{source}: not a readable JSON file: {exc.msg} "
                              f"(line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        # Not reachable with the depth pre-scan; kept so a smaller stack can never crash the CLI.
        raise JsonLimitError(f"{source}: nested too deeply to read") from None


def read_text(path: Path, *, max_bytes: int = MAX_JSON_BYTES, what: str = "file") -> str:
    """The UTF-8 text of ``path``, refusing files over ``max_bytes`` before reading them.

    Raises :class:`JsonLimitError` for a file too large; ``OSError`` and
    ``UnicodeDecodeError`` propagate so callers keep their own wording for a missing file.
    """
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)  # never more than the limit, whatever stat() claims
    if len(data) > max_bytes:
        raise JsonLimitError(f"{path}: {what} larger than {max_bytes // (1024 * 1024)} MiB",
                             hint="adaptcheck never writes such a file; check that this is the right file")
    return data.decode("utf-8")


def load_file(path: Path, *, what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES,
              missing_hint: str | None = None) -> Any:
    """Read and parse a JSON file with every limit; any problem is one InvalidInputError line."""
    try:
        text = read_text(path, max_bytes=max_bytes, what=what)
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such {what}", hint=missing_hint) from None
    except IsADirectoryError:
        raise InvalidInputError(f"{path}: is a folder, not a {what}", hint=missing_hint) from None
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise JsonFormatError(f"{path}: not a readable JSON file: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return loads(text, str(path))


__all__ = ["MAX_INT_DIGITS", "MAX_JSON_BYTES", "MAX_JSON_DEPTH", "JsonFormatError", "JsonLimitError",
           "load_file", "loads", "nesting_depth", "read_text"]
