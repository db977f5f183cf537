"""The step-4 model-numerics bounds, read from ``matrices/tolerances.yaml`` (``model_numerics``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.base.schemas.numerics import ModelNumericsPolicy
from adaptcheck.base.yamldata import load_model, matrices_file


class _File(BaseModel):
    """tolerances.yaml as step 4 reads it: its own section, strictly; step 3 owns the rest."""

    model_config = ConfigDict(extra="allow")

    model_numerics: ModelNumericsPolicy = Field(description="The step-4 section.")


@lru_cache(maxsize=4)
def load_numerics(path: Path | None = None) -> ModelNumericsPolicy:
    """The shipped bounds (or another file with the same section)."""
    return load_model(path or matrices_file("tolerances.yaml"), _File).model_numerics
