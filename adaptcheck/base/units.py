"""Sizes a user types (``--reference-memory 400MB``): read into bytes, or a one-line usage error."""

from __future__ import annotations

import re

from adaptcheck.base.errors import UsageError

_UNITS: dict[str, int] = {
    "": 1, "B": 1,
    "K": 1000, "KB": 1000, "KIB": 1 << 10,
    "M": 1000**2, "MB": 1000**2, "MIB": 1 << 20,
    "G": 1000**3, "GB": 1000**3, "GIB": 1 << 30,
    "T": 1000**4, "TB": 1000**4, "TIB": 1 << 40,
}
"""Decimal units as written (MB = 10⁶ bytes, as disk and memory vendors write them), binary ones with an i."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def memory_size(text: str, option: str) -> int:
    """``'400MB'`` → 400000000, ``'1.5GiB'`` → 1610612736; a :class:`UsageError` naming ``option`` otherwise."""
    m = _SIZE.match(text)
    unit = m.group(2).upper() if m else ""
    if m is None or unit not in _UNITS:
        raise UsageError(f"{option} {text!r} is not a size", hint="e.g. 400MB, 2GiB or 64GB")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"{option} {text!r} is not a positive size", hint="e.g. 400MB, 2GiB or 64GB")
    return size
