"""The one output object every command writes through.

Humans read stderr (rich tables, progress, the grade); machines read stdout, which carries
only the ``--format json|yaml`` document. Every string leaving the process goes through the
secret scrubber first, so a token in the environment cannot leak through a message.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from adaptcheck.steps.matrix.redact import scrub_text


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
            self.err.print(scrub_text(text), style=style, markup=False, soft_wrap=True)

    def table(self, title: str, columns: list[str], rows: list[list[Any]], styles: dict[int, dict[str, str]] | None = None) -> None:
        """A rich table on stderr. ``styles`` maps column index → {cell value: style}."""
        if self.quiet:
            return
        tbl = Table(title=title, title_justify="left", expand=False)
        for col in columns:
            tbl.add_column(col, overflow="fold")
        for row in rows:
            cells = []
            for i, cell in enumerate(row):
                text = scrub_text("" if cell is None else str(cell))
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

    def error(self, text: str) -> None:
        """A one-line error (always shown, even with --quiet); plain text so it is never wrapped."""
        line = scrub_text(text).replace("\n", " ")
        sys.stderr.write(f"adaptcheck: error: {line}\n")
        sys.stderr.flush()


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
