"""The default provider: device-generic torch, each op's ``native`` implementation read from the
catalog (so there is no second table of op names), which on an accelerator exercises the
vendor's torch kernels (docs/ops.md, docs/adding-an-op.md).
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
