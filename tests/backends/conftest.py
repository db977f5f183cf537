"""Fixtures shared by the backend tests; they are defined in ``tests/backends/fakes.py``."""

from __future__ import annotations

from tests.backends.fakes import fake_bin

__all__ = ["fake_bin"]
