"""The default provider: device-generic torch, each op's ``native`` implementation.

It runs on whatever device the inputs are on, through the same public torch ops a model
would use, so on an accelerator it exercises the vendor's torch kernels. The functions live
in the family modules beside their OpDefs (``OpDef.native``, vLLM's ``forward_native``
model); this provider only reads them from the catalog, so there is no second table of op
names to keep in step with it. See docs/ops.md and docs/adding-an-op.md.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from adaptcheck.steps.ops.catalog import all_ops
from adaptcheck.steps.ops.providers.base import OpProvider


@lru_cache(maxsize=1)
def _collect() -> dict[str, Callable[..., Any]]:
    return {name: op.native for name, op in all_ops().items()}


class TorchProvider(OpProvider):
    """Plain torch on the selected device."""

    name = "torch"
    description = "device-generic torch ops (the path a model takes without custom kernels)"

    def ops(self) -> dict[str, Callable[..., Any]]:
        return _collect()
