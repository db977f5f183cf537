"""``framework.tensor_parallel``: tensor parallel over every device gives the same tokens as one device.

Everything of the kind lives here: params, probe, check, label and typical time
(docs/adding-a-check-kind.md); the shared lifecycle is :mod:`adaptcheck.steps.frameworks.lifecycle`.
"""

from __future__ import annotations

from adaptcheck.frameworks.registry import framework_class
from adaptcheck.ladder.check import CheckContext, Outcome
from adaptcheck.steps.frameworks.checks import FrameworkCheck
from adaptcheck.steps.frameworks.params import VariantsParams
from adaptcheck.steps.frameworks.probes import compare_variants, not_applicable


class TensorParallelParams(VariantsParams):
    """``framework.tensor_parallel``: TP over every device vs one device."""


class TensorParallelCheck(FrameworkCheck):
    """Tensor parallel over every device gives the same tokens as one device."""

    kind = "framework.tensor_parallel"
    step = 4
    description = "Tensor-parallel bring-up over every device, compared with one device (when >1 device)."
    params_model = TensorParallelParams
    label = "tensor parallel vs one device"

    def run(self, ctx: CheckContext, params: TensorParallelParams) -> Outcome:
        cls = framework_class(params.framework)
        if ctx.device_count < 2:
            return not_applicable(params, "tensor parallel needs more than one device")
        if not cls.supports_tensor_parallel:
            return not_applicable(params, f"{cls.display_name} has no tensor parallelism")
        return compare_variants(ctx, params, "tensor parallel", ("1 device", {"tensor_parallel_size": 1}),
                                (f"{ctx.device_count} devices", {"tensor_parallel_size": ctx.device_count}))
