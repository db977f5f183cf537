"""Registry of check kinds, discovered through the ``adaptcheck.checks`` entry points.

Built-in kinds use the same group as plugins. An unknown kind is answered with the
closest valid names ("did you mean …").
"""

from __future__ import annotations

from adaptcheck.base import plugins
from adaptcheck.base.errors import UnknownNameError
from adaptcheck.ladder.check import Check

ENTRY_POINT_GROUP = "adaptcheck.checks"


def kind_names() -> list[str]:
    """Every registered kind name."""
    return plugins.names(ENTRY_POINT_GROUP)


def get_check_class(kind: str) -> type[Check]:
    """The Check class of a kind, or UnknownNameError with suggestions."""
    cls = plugins.load(ENTRY_POINT_GROUP, kind, "check kind")
    if not (isinstance(cls, type) and issubclass(cls, Check)):
        raise UnknownNameError(f"check kind {kind!r} points to {plugins.value_of(ENTRY_POINT_GROUP, kind)}, "
                               "which is not a Check subclass")
    return cls


def kind_label(kind: str) -> str | None:
    """The report label a kind declares (``Check.label``); None for a kind without one or not
    installed (a planned check of a plugin gone since: the report then shows the kind)."""
    try:
        return get_check_class(kind).label
    except (UnknownNameError, ImportError, AttributeError):
        return None
