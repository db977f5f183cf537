"""``framework.compile``: graph capture / torch.compile on and off give the same tokens (where switchable).

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared lifecycle is :mod:`adaptcheck.steps.frameworks.lifecycle`.
"""

from __future__ import annotations

from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.params import VariantsParams
from adaptcheck.steps.frameworks.probes import compare_variants, not_applicable


class CompileParams(VariantsParams):
    """``framework.compile``: graph capture / compile on vs off."""


class CompileCheck(FrameworkCheck):
    """Graph capture / compile on and off give the same tokens, where the framework has the switch."""

    kind = "framework.compile"
    step = 4
    description = "Graph capture / torch.compile on vs off give the same tokens (where supported)."
    params_model = CompileParams
    label = "compile on vs off"
    compares = "compile on vs off"

    def run(self, ctx: CheckContext, params: CompileParams) -> Outcome:
        cls = framework_class(params.framework)
        if not cls.supports_compile_toggle:
            return not_applicable(params, f"{cls.display_name} has no graph-capture / compile switch")
        # The first variant is the instance the shared loader brings up: compile off.
        return compare_variants(ctx, params.model_copy(update={"compile": False}), "compile",
                                ("compile off", {"compile": False}), ("compile on", {"compile": True}))
