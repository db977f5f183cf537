"""Schema of the step-4 model-numerics bounds (the ``model_numerics`` part of
matrices/tolerances.yaml): ``figure <= multiple x control + floor[dtype]``, each rule with the
reason for its numbers (docs/step4-numerics.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adaptcheck.base.dtypes import FloatDtype


class Rule(BaseModel):
    """One statistic's bound: ``value <= multiple * control + floor[dtype]``."""

    model_config = ConfigDict(extra="forbid")

    multiple: float = Field(gt=0, description="Allowed multiple of the healthy control's figure.")
    floor: dict[FloatDtype, float] = Field(description="Added to the bound per served dtype (same unit as the statistic).")
    reason: str = Field(min_length=10, description="Why these numbers: what was measured, on what.")

    def bound(self, control: float, dtype: str) -> float:
        if dtype not in self.floor:
            raise KeyError(f"no floor for dtype {dtype!r}")
        return self.multiple * control + self.floor[dtype]


class Fp8KvCachePolicy(BaseModel):
    """The fp8 KV-cache bound (``framework.fp8_kv_cache``, docs/features.md "FP8 KV cache"): the
    fp8 instance against the float64 reference, each statistic held to
    ``multiple x control x (1 + kv_share x (u_cache / u_served)^2) + floor[dtype]``, where ``u`` is
    a format's unit roundoff (the kind holds them: e4m3 2^-4, e5m2 2^-3, bf16 2^-8 …)."""

    model_config = ConfigDict(extra="forbid")

    kv_share: float = Field(gt=0, description="The KL that storing K and V at the served dtype's roundoff costs, "
                            "as a share of the control's whole KL (every rounding of the forward): measured, with margin.")
    reason: str = Field(min_length=10, description="How kv_share was measured, and why the form of the bound.")
    bounds: dict[Literal["kl_mean", "kl_p99"], Rule] = Field(description="Per statistic: its multiple (applied to the "
                                                              "fp8-scaled control) and floor.")


class ModelNumericsPolicy(BaseModel):
    """Bounds of step 4's teacher-forced comparisons and of the layer localisation."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field(description="What this section is for.")
    reference_top_k: int = Field(ge=1, le=1000, description="Alternatives kept per position from the float64 "
                                 "reference (the KL estimator's buckets are the device's top-K within these).")
    cross_framework: dict[Literal["kl_mean", "kl_p99"], Rule] = Field(
        description="Device vs float64 reference, relative to the CPU control at the served dtype.")
    same_framework: dict[Literal["kl_mean", "kl_max"], Rule] = Field(
        description="Two runs of one framework that must agree (alone vs batched, cache hit vs recompute, "
                    "compile on vs off), relative to the control's own divergence from the reference.")
    batched_vs_alone: dict[Literal["kl_mean", "kl_p99"], Rule] = Field(
        description="One framework's batched run against the float64 reference, relative to the same framework's "
                    "run of each sequence alone (same kernels, same dtype: only the batch differs), so the scale "
                    "grows with the model's depth exactly as the figure does.")
    localisation: Rule = Field(description="Per-module normalized error of the device's hidden states vs the "
                               "reference, relative to the control's at the same module.")
    fp8_kv_cache: Fp8KvCachePolicy | None = Field(default=None, description="The fp8 KV-cache instance vs the float64 "
                                                  "reference (absent: framework.fp8_kv_cache cannot judge, says so).")
