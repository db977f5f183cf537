"""Stand-in for steps 3-5 until they exist: always ``skip`` "not implemented", never ``pass``.

Registered so the ladder already lists the steps, and the grade is capped by them with a
truthful reason.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.ladder.check import Check, CheckContext, Outcome


class NotImplementedParams(BaseModel):
    """Which capability the placeholder stands for."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=3, le=5, description="The step this placeholder stands in for.")
    what: str = Field(description="The capability that is not implemented yet.")


class NotImplementedCheck(Check):
    """Reports that a capability is not implemented in this adaptcheck version."""

    kind = "placeholder.not_implemented"
    step = 0  # accepted in any of steps 3-5: see the loader's step rule below
    description = "A capability that this adaptcheck version does not implement yet."
    params_model = NotImplementedParams

    def run(self, ctx: CheckContext, params: NotImplementedParams) -> Outcome:
        return Outcome.skipped(f"not implemented in this adaptcheck version: {params.what}")
