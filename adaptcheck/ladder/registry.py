"""Registry of check kinds, discovered through the ``adaptcheck.checks`` entry points.

Built-in kinds use the same group as plugins. An unknown kind is answered with the
closest valid names ("did you mean …").
"""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata

from adaptcheck.errors import UnknownNameError, did_you_mean
from adaptcheck.ladder.check import Check

ENTRY_POINT_GROUP = "adaptcheck.checks"


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def kind_names() -> list[str]:
    """Every registered kind name."""
    return sorted(_entry_points())


def get_check_class(kind: str) -> type[Check]:
    """The Check class of a kind, or UnknownNameError with suggestions."""
    eps = _entry_points()
    ep = eps.get(kind)
    if ep is None:
        raise UnknownNameError(f"unknown check kind {kind!r}", hint=did_you_mean(kind, list(eps)))
    cls = ep.load()
    if not (isinstance(cls, type) and issubclass(cls, Check)):
        raise UnknownNameError(f"check kind {kind!r} points to {ep.value}, which is not a Check subclass")
    return cls
