"""The base of the step-4 lifecycle kinds (each kind is a module under ``kinds/``; docs/adding-a-check-kind.md).

Every lifecycle kind takes ``framework:`` and shares the loaded instance with the checks after
it (:mod:`adaptcheck.steps.frameworks.lifecycle`); each outcome names the framework and the
model it used.
"""

from __future__ import annotations

from adaptcheck.base.schemas.framework_evidence import FrameworkCheckEvidence
from adaptcheck.ladder.check import Check
from adaptcheck.steps.frameworks.lifecycle import not_loaded
from adaptcheck.steps.frameworks.params import FrameworkParams


class FrameworkCheck(Check):
    """Base of the lifecycle kinds: every outcome names its framework, even one the runner writes."""

    @classmethod
    def identity(cls, params: FrameworkParams) -> FrameworkCheckEvidence:
        # A crashed or timed-out check still belongs to its framework's block in the report.
        return FrameworkCheckEvidence(framework=not_loaded(params.framework))
