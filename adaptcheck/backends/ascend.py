"""STUB backend (being written)."""

from __future__ import annotations

from adaptcheck.backends.base import Backend


class AscendBackend(Backend):
    name = "ascend"
    display_name = "ascend"
    vendor = "ascend"
    device_type = "cuda"
    torch_module = "cuda"
