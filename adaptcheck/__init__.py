"""adaptcheck: validate and certify a machine for LLM inference (grades L1-L5)."""

from __future__ import annotations

__version__ = "0.1.0"
