"""Op providers with a planted defect, for the reproducer tests (``--ops tests.repro.planted_ops:PLANTED``).

``silu`` is off by 0.1 % of its value: far outside the fp32 element-wise tolerance, so step 3
fails it; ``gelu`` is torch's own (correct), so its check passes.
"""

from __future__ import annotations

import torch

from adaptcheck.steps.ops.families.activations import gelu

SCALE = 1.001
"""The planted error: every SiLU output scaled by this factor."""


def scaled_silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU whose result is SCALE times too large (a wrong constant folded into a kernel)."""
    return (torch.nn.functional.silu(x.float()) * SCALE).to(x.dtype)


PLANTED = {"silu": scaled_silu, "gelu": gelu}
