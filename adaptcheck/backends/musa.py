"""STUB backend (being written)."""

from __future__ import annotations

from adaptcheck.backends.base import Backend


class MusaBackend(Backend):
    name = "musa"
    display_name = "musa"
    vendor = "musa"
    device_type = "cuda"
    torch_module = "cuda"
