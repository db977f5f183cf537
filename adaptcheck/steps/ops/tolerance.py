"""The step-3 tolerance policy, loaded from ``matrices/tolerances.yaml`` (data, with sources;
the classes and modes: docs/ops.md).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adaptcheck.base.errors import UnknownNameError, did_you_mean
from adaptcheck.base.schemas.numerics import ModelNumericsPolicy
from adaptcheck.base.yamldata import load_model, matrices_file


class Limit(BaseModel):
    """Per-dtype limits; which fields apply depends on the class mode."""

    model_config = ConfigDict(extra="forbid")

    rtol: float | None = Field(default=None, ge=0, description="allclose: relative tolerance.")
    atol: float | None = Field(default=None, ge=0, description="allclose: absolute tolerance.")
    max_normalized: float | None = Field(default=None, ge=0, description="normalized: max|Δ|/max|ref| limit.")
    min_cosine: float | None = Field(default=None, le=1, description="normalized: minimum cosine similarity.")


class ToleranceClass(BaseModel):
    """One class of the policy."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["allclose", "normalized", "exact", "codes"] = Field(description="How outputs are compared.")
    description: str = Field(description="What the class is for.")
    source: str = Field(description="Where the numbers come from.")
    limits: dict[str, Limit] = Field(default_factory=dict, description="dtype → limits (allclose/normalized).")
    max_code_distance: int | None = Field(default=None, ge=0, description="codes: allowed code distance.")

    @model_validator(mode="after")
    def _complete(self) -> ToleranceClass:
        need = {"allclose": ("rtol", "atol"), "normalized": ("max_normalized", "min_cosine")}.get(self.mode, ())
        for dtype, limit in self.limits.items():
            missing = [f for f in need if getattr(limit, f) is None]
            if missing:
                raise ValueError(f"{self.mode} limits for {dtype} need {', '.join(missing)}")
        if self.mode == "codes" and self.max_code_distance is None:
            raise ValueError("codes mode needs max_code_distance")
        return self

    def limit_for(self, dtype: str) -> Limit:
        """Limits for ``dtype``; an op run in a dtype the policy does not cover is a data error."""
        if self.mode in ("exact", "codes"):
            return Limit()
        if dtype not in self.limits:
            raise UnknownNameError(f"tolerance class has no limits for dtype {dtype!r}",
                                   hint=did_you_mean(dtype, list(self.limits)))
        return self.limits[dtype]


class TolerancePolicy(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = Field(description="File schema version.")
    classes: dict[str, ToleranceClass] = Field(description="Class name → class.")
    model_numerics: ModelNumericsPolicy = Field(description="Step-4 teacher-forced bounds (read by step 4).")

    def get(self, name: str) -> ToleranceClass:
        if name not in self.classes:
            raise UnknownNameError(f"unknown tolerance class {name!r}", hint=did_you_mean(name, list(self.classes)))
        return self.classes[name]


@lru_cache(maxsize=4)
def load_policy(path: Path | None = None) -> TolerancePolicy:
    """The shipped policy (or another file with the same schema)."""
    return load_model(path or matrices_file("tolerances.yaml"), TolerancePolicy)
