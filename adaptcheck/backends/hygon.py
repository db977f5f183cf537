"""STUB backend (being written)."""

from __future__ import annotations

from adaptcheck.backends.base import Backend


class HygonBackend(Backend):
    name = "hygon"
    display_name = "hygon"
    vendor = "hygon"
    device_type = "cuda"
    torch_module = "cuda"
