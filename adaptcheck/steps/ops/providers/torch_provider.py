"""The default provider: device-generic torch, one module per family in ``torch_impl``.

It runs on whatever device the inputs are on, through the same public torch ops a model
would use, so on an accelerator it exercises the vendor's torch kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from adaptcheck.steps.ops.catalog import family_modules
from adaptcheck.steps.ops.providers.base import OpProvider


@lru_cache(maxsize=1)
def _collect() -> dict[str, Callable[..., Any]]:
    ops: dict[str, Callable[..., Any]] = {}
    for module in family_modules("adaptcheck.steps.ops.torch_impl"):
        ops.update(module.TORCH_OPS)
    return ops


class TorchProvider(OpProvider):
    """Plain torch on the selected device."""

    name = "torch"
    description = "device-generic torch ops (the path a model takes without custom kernels)"

    def ops(self) -> dict[str, Callable[..., Any]]:
        return _collect()
