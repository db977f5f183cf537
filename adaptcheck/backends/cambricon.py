"""STUB backend (being written)."""

from __future__ import annotations

from adaptcheck.backends.base import Backend


class CambriconBackend(Backend):
    name = "cambricon"
    display_name = "cambricon"
    vendor = "cambricon"
    device_type = "cuda"
    torch_module = "cuda"
