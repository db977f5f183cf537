"""What every compatibility rule shares: the common fields and what an evaluator returns.

Kept apart from :mod:`adaptcheck.compat.rules` (the file loader and the registry of rule
types) so that each rule type can live in a module of its own and still be one member of the
discriminated union the loader validates against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adaptcheck.base.schemas.environment import Environment
from adaptcheck.base.schemas.matrix_evidence import RuleCompared
from adaptcheck.compat import versions as V
from adaptcheck.compat.stackkeys import validate_backend

VerdictName = Literal["ok", "warn", "incompatible", "not_applicable"]


class Strict(BaseModel):
    """A data-file model: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid")


class RuleBase(Strict):
    """Fields of every rule."""

    id: str = Field(pattern=r"^[A-Za-z0-9_\-]+$", description="Rule id; the result id is matrix.rules.<id>.")
    description: str = Field(min_length=1, description="What the rule checks, in words.")
    source: str = Field(min_length=1, description="Where the fact comes from (URL and section, date read).")
    backends: list[str] | None = Field(default=None, min_length=1, description="Backends the rule is about "
                                       "(adaptcheck names); on any other it is not applicable. None = every backend.")

    @field_validator("backends")
    @classmethod
    def _known_backends(cls, v: list[str] | None) -> list[str] | None:
        for name in v or []:
            validate_backend(name)
        return v


@dataclass
class Evaluation:
    """What an evaluator found: the verdict, a one-line message, the values it compared and,
    when the verdict is not ``ok``, the smallest changes that would make the rule hold."""

    verdict: VerdictName
    message: str
    compared: RuleCompared = field(default_factory=RuleCompared)
    advice: list[str] = field(default_factory=list)


@dataclass
class RuleInputs:
    """What rules read: the captured environment and a Requires-Dist lookup."""

    env: Environment
    requires: V.RequiresLookup = V.distribution_requires
    version: Callable[[str], str | None] = V.distribution_version
    """Installed version of any distribution (dependencies are not all in the Environment)."""

    def __post_init__(self) -> None:
        self.installed = V.installed_versions(self.env)

    def version_of(self, dist: str) -> str | None:
        return self.installed.get(V.canonical(dist))

    def first_installed(self, dists: list[str]) -> tuple[str, str] | None:
        for d in dists:
            version = self.version_of(d)
            if version is not None:
                return d, version
        return None
