"""Find framework adapters: the ``adaptcheck.frameworks`` entry points, or ``module:Class``
(docs/frameworks.md, "Adapter registry").
"""

from __future__ import annotations

from adaptcheck.base import plugins
from adaptcheck.base.errors import UnknownNameError, UsageError, did_you_mean
from adaptcheck.frameworks.base import Framework

ENTRY_POINT_GROUP = "adaptcheck.frameworks"


def framework_names() -> list[str]:
    """Every registered adapter name."""
    return plugins.names(ENTRY_POINT_GROUP)


def validate_name(name: str) -> str:
    """``name`` if it is registered or a ``module:Class`` spec; UnknownNameError otherwise."""
    if plugins.is_ref(name) or name in framework_names():
        return name
    raise UnknownNameError(f"unknown framework {name!r}", hint=did_you_mean(name, framework_names()))


def framework_class(name: str) -> type[Framework]:
    """The adapter class for a registered name or a ``module:Class`` spec."""
    if plugins.is_ref(name):
        try:
            obj = plugins.load_ref(name)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"framework {name}: cannot load it ({type(exc).__name__}: {exc})",
                             hint="give an importable 'module:Class'") from None
    else:
        obj = plugins.load(ENTRY_POINT_GROUP, name, "framework")
    if not (isinstance(obj, type) and issubclass(obj, Framework)):
        raise UsageError(f"framework {name} is not a Framework subclass")
    return obj
