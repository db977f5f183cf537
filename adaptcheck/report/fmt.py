"""Formatting of values for the report: numbers, durations, statuses, JSON evidence.

Everything here returns plain strings so the view stays plain data and the template never
has to format (templates that compute are hard to test and easy to get inconsistent).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from adaptcheck.base.jsonvalues import as_float  # noqa: F401 - re-exported: the report's readers import it from here
from adaptcheck.base.schemas.results import CheckResult, RunResults

# Display label of each status key. 'na' (a skip the backend declared inapplicable) is kept
# apart from 'skip' because only the latter can block a grade; 'notrun' is a planned check
# with no result at all.
STATUS_LABELS: dict[str, str] = {
    "pass": "pass",
    "fail": "fail",
    "error": "error",
    "skip": "skip",
    "na": "n/a",
    "notrun": "not run",
}

# A glyph next to each status so it reads without colour (and in black-and-white print).
STATUS_GLYPHS: dict[str, str] = {
    "pass": "✓",
    "fail": "✗",
    "error": "!",
    "skip": "–",
    "na": "○",
    "notrun": "·",
}

NOT_PRESENT = "not present"


@dataclass
class Label:
    """A status as the page shows it: key (CSS class), text label, glyph."""

    key: str
    label: str
    glyph: str


def status_label(key: str) -> Label:
    """The :class:`Label` of a status key of :data:`STATUS_LABELS`."""
    return Label(key=key, label=STATUS_LABELS[key], glyph=STATUS_GLYPHS[key])

# Long evidence would make the single-file report unwieldy; the full data is in results.json.
MAX_DETAILS_CHARS = 20_000
MAX_VALUE_CHARS = 300


def status_key(check: CheckResult) -> str:
    """The report's status key of one check result."""
    if check.not_applicable:
        return "na"
    return check.status.value


def format_float(value: float) -> str:
    """3-4 significant digits; scientific for tiny or huge magnitudes (errors, byte counts)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    mag = abs(value)
    if mag < 1e-3 or mag >= 1e9:
        return f"{value:.3e}"
    if mag >= 1e4:
        # Large but ordinary magnitudes (tokens, MiB): digits grouped, no spurious decimals.
        return f"{value:,.0f}"
    text = f"{value:.4g}"
    if "." not in text and "e" not in text and value != int(value):
        # Never print a non-integer as an integer: a cosine of 0.9999991 shown as '1' would
        # hide exactly the deviation the reader is looking for.
        for digits in range(5, 11):
            text = f"{value:.{digits}g}"
            if "." in text or "e" in text:
                break
    return text


def format_value(value: Any) -> str:
    """Any metric value as a short string."""
    if value is None:
        return "—"
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, str):
        text = value
    elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        text = "[" + ", ".join(format_value(v) for v in value) + "]"
    else:
        text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def format_duration(seconds: float) -> str:
    """A wall time as humans read it: '0.4 ms', '120 ms', '12.3 s', '2 min 05 s'."""
    if seconds < 1e-3:
        return f"{seconds * 1e3:.2f} ms" if seconds > 0 else "0 s"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def format_details(details: dict[str, Any]) -> str:
    """Structured evidence as indented JSON, truncated past a size the page can carry."""
    if not details:
        return ""
    text = json.dumps(details, indent=2, default=str, ensure_ascii=False, sort_keys=False)
    if len(text) > MAX_DETAILS_CHARS:
        text = text[:MAX_DETAILS_CHARS] + f"\n… truncated ({len(text):,} characters in all; see results.json)"
    return text


# ---------------------------------------------------------------- readers shared by the step sections


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a mapping, else empty (crashed checks, older or hand-edited files)."""
    return value if isinstance(value, dict) else {}


def section_anchor(prefix: str, *parts: str) -> str:
    """Attribute-safe fragment id ``PREFIX-part-part`` (op, provider and framework names
    come from plugins and ladders: untrusted)."""
    return prefix + "-" + "-".join(re.sub(r"[^A-Za-z0-9_.-]+", "-", p).strip("-") or "x" for p in parts)


def section_not_run_reason(results: RunResults, step: int, checks: str, none_in_ladder: str) -> str:
    """Why a step's report section is empty: not selected, interrupted, or no such checks.
    ``checks`` names the step's checks ('operator', 'framework'); ``none_in_ladder`` ends
    the last sentence ('operator (ops.op) checks')."""
    if step in results.grade.steps_not_run or step not in results.steps:
        selected = ", ".join(str(s) for s in results.steps) or "none"
        return f"step {step} not run: it was not selected for this run (steps run: {selected})"
    if not results.complete:
        return f"step {step} not run: the run was interrupted before any {checks} check finished"
    return f"step {step} ran but this ladder has no {none_in_ladder}"


@dataclass
class FileLink:
    """A file of the run; ``href`` is '' when the recorded path is not a safe relative one."""

    text: str
    href: str


def records_link(path: Any, base: str = "") -> FileLink | None:
    """A link to a file of the run (per-request records, a reproducer). ``path`` is relative
    to the run folder; ``base`` is the run folder relative to the report's folder ('' when the
    report sits in the run folder, as ``adaptcheck run`` writes it). Only a plain relative
    path becomes a link."""
    if not isinstance(path, str) or not path:
        return None
    p = PurePosixPath(path.replace("\\", "/"))
    safe = bool(p.parts) and not p.is_absolute() and ".." not in p.parts and ":" not in p.parts[0]
    href = quote(f"{base.rstrip('/')}/{p}" if base else str(p), safe="/") if safe else ""
    return FileLink(text=path, href=href)
