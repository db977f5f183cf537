"""STUB backend (being written)."""

from __future__ import annotations

from adaptcheck.backends.base import Backend


class RocmBackend(Backend):
    name = "rocm"
    display_name = "rocm"
    vendor = "rocm"
    device_type = "cuda"
    torch_module = "cuda"
