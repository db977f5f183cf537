"""Reading numbers back from results.json, where inf and NaN are stored as strings.

JSON has neither, so pydantic writes them as "inf"/"NaN"; anything that reads a metric back
(the report, the regression comparison) goes through :func:`as_float`. Kept apart from both
so the library (``adaptcheck.compare``) does not import the report package.
"""

from __future__ import annotations

from typing import Any


def as_float(value: Any) -> float | None:
    """A number from results.json (inf/nan may be strings); None for anything else, bools included."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
