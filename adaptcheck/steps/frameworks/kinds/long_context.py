"""``framework.long_context``: placeholder registered ahead of its implementation (issue 29); replaced by the real kind."""

from __future__ import annotations

from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.feature import FeatureParams


class LongContextCheck(FrameworkCheck):
    """Not built yet: never a pass."""

    kind = "framework.long_context"
    step = 4
    description = "Not built yet."
    params_model = FeatureParams

    def run(self, ctx: CheckContext, params: FeatureParams) -> Outcome:
        return Outcome.skipped("not built yet", applicable=False)
