"""STUB backend (being written)."""

from __future__ import annotations

from adaptcheck.backends.base import Backend


class MetaxBackend(Backend):
    name = "metax"
    display_name = "metax"
    vendor = "metax"
    device_type = "cuda"
    torch_module = "cuda"
