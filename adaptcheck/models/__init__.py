"""The old import path of :mod:`adaptcheck.base.schemas`, kept for plugins written against it.

A backend or check-kind plugin may say ``from adaptcheck.models.environment import DeviceInfo``;
the schemas moved to ``adaptcheck.base.schemas`` (issue 28: schema modules named as schemas,
the base layer in a folder of its own). Each schema module is registered here under its old
name as the very same module object, so both paths give the same classes (an ``isinstance``
across them holds). New code imports ``adaptcheck.base.schemas``.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from adaptcheck.base import schemas as _schemas

for _info in pkgutil.iter_modules(_schemas.__path__):
    sys.modules[f"{__name__}.{_info.name}"] = importlib.import_module(f"{_schemas.__name__}.{_info.name}")
