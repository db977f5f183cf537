"""Find op providers: the ``adaptcheck.op_providers`` entry points (the built-in torch and vllm
too), or a ``module:object`` spec (``--ops``) naming an OpProvider subclass or instance, or a
dict of op callables (docs/ops.md, "Writing a provider").
"""

from __future__ import annotations

from typing import Any

from adaptcheck.base import plugins
from adaptcheck.base.errors import UsageError
from adaptcheck.steps.ops.providers.base import DictProvider, OpProvider

ENTRY_POINT_GROUP = "adaptcheck.op_providers"


def provider_names() -> list[str]:
    return plugins.names(ENTRY_POINT_GROUP)


def _instantiate(obj: Any, label: str) -> OpProvider:
    if isinstance(obj, type) and issubclass(obj, OpProvider):
        return obj()
    if isinstance(obj, OpProvider):
        return obj
    if isinstance(obj, dict):
        return DictProvider(label, obj)
    raise UsageError(f"{label} is not an OpProvider (class or instance) nor a dict of op callables")


def load_provider(name_or_spec: str) -> OpProvider:
    """A provider by entry-point name ('torch', 'vllm') or by 'module:object'."""
    if plugins.is_ref(name_or_spec):
        try:
            obj = plugins.load_ref(name_or_spec)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"--ops {name_or_spec}: cannot load it ({type(exc).__name__}: {exc})",
                             hint="give an importable 'module:object'") from None
        return _instantiate(obj, name_or_spec)
    return _instantiate(plugins.load(ENTRY_POINT_GROUP, name_or_spec, "op provider"), name_or_spec)
