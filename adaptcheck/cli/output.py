r"""The one output object every command writes through.

Humans read stderr (rich tables, progress, the grade); machines read stdout, which carries
only the ``--format json|yaml`` document. Every string leaving the process goes through the
secret scrubber first, so a token in the environment cannot leak through a message.

Every string shown on the terminal also goes through :func:`terminal_safe`: a results file,
a plugin or a device can carry text with escape sequences (``EPYC\x1b]0;…\x07\x1b[2J``
retitles the window and clears the screen) or carriage returns that overwrite what the user
reads. Each C0 control except newline and tab, DEL, each C1 control and the Unicode bidi
overrides is replaced by its escaped text (``\x1b``, ``\x07``, ``\u202e``): the sequence is
inert, and the reader still sees that the text held one. Nothing is dropped silently. The
stdout document needs no such pass: JSON escapes every control (``\u001b``) and YAML's
safe dumper double-quotes and escapes them (``\e``).
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from adaptcheck.base.redact import scrub_text
from adaptcheck.base.terminal import error_line, shown


class Format(str, Enum):
    """Output formats of the commands that print data."""

    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


STATUS_STYLE = {"pass": "green", "fail": "red", "error": "bold red", "skip": "yellow", "n/a": "dim"}

class Output:
    """Human output on stderr, data on stdout."""

    def __init__(self, fmt: Format = Format.TABLE, quiet: bool = False) -> None:
        self.format = fmt
        self.quiet = quiet
        self.err = Console(stderr=True, highlight=False, soft_wrap=False)

    @property
    def machine(self) -> bool:
        return self.format is not Format.TABLE

    def info(self, text: str, style: str | None = None) -> None:
        if not self.quiet:
            self.err.print(shown(text), style=style, markup=False, soft_wrap=True)

    def styled(self, *parts: tuple[str, str | None]) -> None:
        """One line of (text, style) parts — e.g. a coloured status and a plain message —
        without markup parsing, every part made safe. Printing through this console also
        keeps a live progress bar below the line."""
        if not self.quiet:
            self.err.print(Text.assemble(*[(shown(t), s or "") for t, s in parts]), soft_wrap=True)

    def table(self, title: str, columns: list[str], rows: list[list[Any]], styles: dict[int, dict[str, str]] | None = None) -> None:
        """A rich table on stderr. ``styles`` maps column index → {cell value: style}."""
        if self.quiet:
            return
        tbl = Table(title=_escape(shown(title, newlines=False)), title_justify="left", expand=False)
        for col in columns:
            tbl.add_column(_escape(shown(col, newlines=False)), overflow="fold")
        for row in rows:
            cells = []
            for i, cell in enumerate(row):
                text = shown("" if cell is None else str(cell))
                style = (styles or {}).get(i, {}).get(text)
                cells.append(f"[{style}]{_escape(text)}[/]" if style else _escape(text))
            tbl.add_row(*cells)
        self.err.print(tbl)

    def data(self, obj: Any) -> None:
        """The machine-readable document on stdout (only in json/yaml format)."""
        if self.format is Format.JSON:
            text = json.dumps(obj, indent=2, default=str)
        elif self.format is Format.YAML:
            text = yaml.safe_dump(json.loads(json.dumps(obj, default=str)), sort_keys=False)
        else:
            return
        sys.stdout.write(scrub_text(text) + ("\n" if not text.endswith("\n") else ""))
        sys.stdout.flush()

    def document(self, text: str) -> None:
        """A document already written out (a resolved ladder's YAML) on stdout, as it is."""
        sys.stdout.write(scrub_text(text) + ("" if text.endswith("\n") else "\n"))
        sys.stdout.flush()

    def error(self, text: str) -> None:
        """A one-line error (always shown, even with --quiet); plain text so it is never wrapped."""
        error_line(text)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
