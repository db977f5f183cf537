"""Find framework adapters: the ``adaptcheck.frameworks`` entry points, or ``module:Class``.

Built-ins (transformers, vllm, vllm_serve, transformers_serve, endpoint) use the same
group a third party would use for, say, an SGLang adapter. A ``module:Class`` spec names
an adapter that is not installed as a plugin (tests use it for deliberately wrong ones).
"""

from __future__ import annotations

import importlib
from importlib import metadata

from adaptcheck.errors import UnknownNameError, UsageError, did_you_mean
from adaptcheck.frameworks.base import Framework

ENTRY_POINT_GROUP = "adaptcheck.frameworks"


def framework_names() -> list[str]:
    """Every registered adapter name."""
    return sorted(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))


def validate_name(name: str) -> str:
    """``name`` if it is registered or a ``module:Class`` spec; UnknownNameError otherwise."""
    if ":" in name or name in framework_names():
        return name
    raise UnknownNameError(f"unknown framework {name!r}", hint=did_you_mean(name, framework_names()))


def framework_class(name: str) -> type[Framework]:
    """The adapter class for a registered name or a ``module:Class`` spec."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"framework {name}: cannot load it ({type(exc).__name__}: {exc})",
                             hint="give an importable 'module:Class'") from None
    else:
        eps = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
        if name not in eps:
            raise UnknownNameError(f"unknown framework {name!r}", hint=did_you_mean(name, list(eps)))
        obj = eps[name].load()
    if not (isinstance(obj, type) and issubclass(obj, Framework)):
        raise UsageError(f"framework {name} is not a Framework subclass")
    return obj
