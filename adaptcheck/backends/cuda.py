"""STUB backend (being written)."""

from __future__ import annotations

from adaptcheck.backends.base import Backend


class CudaBackend(Backend):
    name = "cuda"
    display_name = "cuda"
    vendor = "cuda"
    device_type = "cuda"
    torch_module = "cuda"
