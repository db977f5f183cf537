"""The one plugin loader: entry-point groups and ``module:object`` references.

Every registry (backends, check kinds, frameworks, op providers) and every
``module:object`` parameter (a collectives ``impl``, ``--ops module:object``) loads through
here, so they agree on three things:

* discovery reads each entry-point group once per process and keeps, per plugin, where it
  came from (``dist version``) and the error that stopped it loading — one broken plugin is
  listed with its error, never a crash of discovery (pluggy's
  ``load_setuptools_entrypoints`` and lm-evaluation-harness's registry do the same);
* an unknown name is answered with the closest valid ones ("did you mean …");
* ``module:attr.attr`` resolves by import then attribute walk, and the error names which.

The registries keep their own wording and exception types (a backend that fails to load is
a device error, a framework that does is a usage error) and their own type checks.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from adaptcheck.base.errors import UnknownNameError, did_you_mean


@dataclass
class Plugin:
    """One entry point of a group: what it names, where it came from, and how loading went."""

    group: str
    name: str
    value: str
    """The ``module:object`` the entry point names."""
    source: str
    """``distribution version`` that declares it (the value itself when unknown)."""
    obj: Any = None
    error: str = ""
    """``Type: message`` of the exception that stopped it loading; empty when it loaded."""

    @property
    def loaded(self) -> bool:
        return not self.error and self.obj is not None


@cache
def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """The group's entry points by name (read once per process: plugins do not appear mid-run)."""
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def names(group: str) -> list[str]:
    """Every name registered in ``group``, sorted."""
    return sorted(entry_points(group))


def _source(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else ep.value


def load_all(group: str) -> dict[str, Plugin]:
    """Every plugin of ``group`` loaded, by name; a plugin that raises keeps its error."""
    found: dict[str, Plugin] = {}
    for name, ep in entry_points(group).items():
        plugin = Plugin(group=group, name=name, value=ep.value, source=_source(ep))
        try:
            plugin.obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, not fatal
            plugin.error = f"{type(exc).__name__}: {exc}"
        found[name] = plugin
    return found


def load(group: str, name: str, what: str) -> Any:
    """The object entry point ``name`` of ``group`` names; UnknownNameError ("unknown WHAT
    'name'", with the closest names) when the group has no such name. Import errors propagate."""
    eps = entry_points(group)
    if name not in eps:
        raise UnknownNameError(f"unknown {what} {name!r}", hint=did_you_mean(name, list(eps)))
    return eps[name].load()


def value_of(group: str, name: str) -> str:
    """The ``module:object`` an entry point names (for messages)."""
    return entry_points(group)[name].value


def is_ref(text: str) -> bool:
    """Whether ``text`` is a ``module:object`` reference rather than a registered name."""
    return ":" in text


def load_ref(ref: str) -> Any:
    """``'module:attr.attr'`` → the object; ImportError or AttributeError say which part failed."""
    module_name, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        if part:
            obj = getattr(obj, part)
    return obj


def class_ref(obj: type) -> str:
    """The ``module:Qualname`` reference that :func:`load_ref` turns back into ``obj``."""
    return f"{obj.__module__}:{obj.__qualname__}"


def import_root(module_name: str) -> str | None:
    """The sys.path entry a module was imported from, so a fresh interpreter (another cwd)
    can import it too. Importing here also fails early, with a clear error."""
    module = importlib.import_module(module_name)
    origin = getattr(module, "__file__", None)
    if not origin:
        return None
    path = Path(origin).resolve().parent
    depth = module_name.count(".") + (1 if Path(origin).name == "__init__.py" else 0)
    for _ in range(depth):
        path = path.parent
    return str(path)
