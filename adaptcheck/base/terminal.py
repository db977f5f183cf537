"""What reaches a terminal: secrets scrubbed, control characters made inert, one-line errors.

Below the CLI so that library code which must speak before the process ends (a collectives
rank's watchdog, say) writes the same safe line as the CLI without importing it.
Why escaped text rather than removal: a reader sees that something was there.
"""

from __future__ import annotations

import re
import sys

from adaptcheck.base.redact import scrub_text

# C0 controls but \t and \n, DEL, C1 controls, and the bidi embeddings/overrides/isolates that
# reorder what the terminal shows (U+200E/F marks are harmless and kept).
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_NEWLINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str, newlines: bool = True) -> str:
    """``text`` with every control a terminal would act on replaced by its escaped text.

    Newlines stay when ``newlines`` (a multi-line message), else they are escaped too (a
    one-line error, a table cell); tabs always stay. Escaped rather than removed, so that
    nothing is dropped silently.
    """
    return (_UNSAFE_KEEP_NEWLINE if newlines else _UNSAFE).sub(_escaped, text)


def shown(text: str, newlines: bool = True) -> str:
    """What any string printed to the terminal becomes: secrets scrubbed, controls made inert."""
    return terminal_safe(scrub_text(text), newlines)


def error_line(text: str) -> None:
    """``adaptcheck: error: <text>`` on stderr as one safe line (always shown, even with --quiet)."""
    line = shown(text.replace("\n", " "), newlines=False)
    sys.stderr.write(f"adaptcheck: error: {line}\n")
    sys.stderr.flush()
