"""Typed evidence: the schema of one check kind's ``details``.

``CheckResult.details`` stays a JSON object in results.json (so the file, the journal and
every older reader keep working), but a check kind that has a schema for it writes it
through an :class:`Evidence` model and its readers get it back typed::

    details = LoadEvidence(framework=FrameworkInfo(name="vllm")).dump()   # a step writes
    evidence = result.evidence(LoadEvidence)                             # a reader reads

so a fact has one shape in every outcome of a kind, and no reader guesses between shapes.

Unknown fields are *kept* (``extra="allow"``), on purpose:

* a kind's details are written by more code than its model knows: a framework adapter's
  ``describe()`` facts, a plugin's own keys, sections of the details a later slice types;
* a file written by a newer minor schema carries fields this version does not know, and a
  reader that re-serializes evidence (or a test that round-trips it) must not drop them;
* ``ignore`` would silently lose them, ``forbid`` would make every older reader refuse a
  newer file over one added key.

Known fields are validated with their declared types; the extras are reachable through
:attr:`Evidence.extras` for readers that show "everything else" (the report's fact table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from adaptcheck.base.errors import InvalidInputError

E = TypeVar("E", bound="Evidence")


class EvidenceError(InvalidInputError):
    """A check's details do not fit its kind's evidence model (hand-edited or foreign file)."""


class Evidence(BaseModel):
    """Base of every check kind's details model (see the module docstring for ``extra``)."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def parse(cls: type[E], details: Mapping[str, Any], *, where: str = "details") -> E:
        """``details`` validated as this model; :class:`EvidenceError` naming the first bad field."""
        try:
            return cls.model_validate(dict(details))
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(p) for p in first["loc"])
            raise EvidenceError(f"{where}: not {cls.__name__} evidence: '{at}': {first['msg']}") from None

    def dump(self) -> dict[str, Any]:
        """The JSON object stored as ``details`` (plain JSON values: results.json stays JSON).

        Fields left at their default are left out (``exclude_unset``), so a failed load's details
        do not grow a dozen nulls; a field set to None on purpose (a sub-check row's ``ok: null``,
        "not run here") is kept, because it says something.
        """
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def extras(self) -> dict[str, Any]:
        """The fields this model does not declare, as they were read (empty when none)."""
        return dict(self.model_extra or {})
