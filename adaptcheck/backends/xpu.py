"""STUB backend (being written)."""

from __future__ import annotations

from adaptcheck.backends.base import Backend


class XpuBackend(Backend):
    name = "xpu"
    display_name = "xpu"
    vendor = "xpu"
    device_type = "cuda"
    torch_module = "cuda"
