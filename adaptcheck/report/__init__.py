"""The self-contained HTML report: build plain view data first, render it second."""

from __future__ import annotations

from pathlib import Path

from adaptcheck.models.results import RunResults


def write_report(results: RunResults, path: Path) -> None:
    """Render the report of ``results`` into ``path`` (STUB: being written)."""
    import html

    path.write_text(f"<!doctype html><title>adaptcheck</title><pre>{html.escape(results.model_dump_json(indent=2))}</pre>",
                    encoding="utf-8")
