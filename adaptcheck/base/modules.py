"""Whether a module is installed, asked without importing it (the backends' probes, and
base.errors telling a missing optional package from a broken one)."""

from __future__ import annotations

import importlib.util


def module_present(name: str) -> bool:
    """Whether a module can be imported, without importing it (no side effects, never raises)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
