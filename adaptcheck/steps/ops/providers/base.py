"""The op-provider contract.

A provider is a named set of op callables following the signatures in the catalog
(``adaptcheck ops`` lists them): keyword arguments are tensors already on the device
(scalars unchanged), the return value is a tensor or a tuple in the op's output order.
``available()`` never raises: it says why a provider cannot be used here (vLLM not
installed …). ``get()`` returns None for an op the provider lacks, which the check reports
as ``skip`` with that reason — never as a pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class OpProvider:
    """Base of every provider. A plain object with ``name`` and ``ops`` works too."""

    name: str = "provider"
    """Name shown in results (``--ops module:object`` providers are named by that spec)."""
    description: str = ""
    """What the provider runs, shown beside each op result."""

    def available(self) -> tuple[bool, str]:
        """(usable here, reason when not). Never raises."""
        return True, ""

    def installed(self) -> bool:
        """Cheaply, without importing what it wraps: could it be usable here at all? False only
        when it surely is not (the run header's estimate counts its checks as skips)."""
        return True

    def ops(self) -> dict[str, Callable[..., Any]]:
        """Op name → callable."""
        return {}

    def get(self, op: str) -> Callable[..., Any] | None:
        """The callable for ``op``, or None when this provider lacks it."""
        return self.ops().get(op)

    def lacks_dtype(self, op: str, dtype: str) -> str | None:
        """Why this provider cannot run ``op`` in ``dtype`` (a kernel built for bf16 only …), or None."""
        return None

    def lacks_reason(self, op: str) -> str:
        """Why ``get(op)`` is None (shown in the skip)."""
        return f"provider {self.name!r} does not implement {op!r}"

    def failure_hint(self, op: str, dtype: str) -> str | None:
        """A known cause to name when ``op`` fails in ``dtype`` here (a host ISA limit …), or None.

        Appended to a failure, never used to excuse one: the failure stands either way.
        """
        return None


class DictProvider(OpProvider):
    """A provider built from a mapping: what ``--ops module:object`` may point at."""

    def __init__(self, name: str, ops: dict[str, Callable[..., Any]], description: str = "") -> None:
        self.name = name
        self.description = description
        self._ops = dict(ops)

    def ops(self) -> dict[str, Callable[..., Any]]:
        return self._ops
