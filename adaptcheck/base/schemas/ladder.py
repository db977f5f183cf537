"""Schema of a ladder definition (``ladders/*.yaml``).

A ladder is flat, versioned data: the model it certifies with, the checks of each step
(kind + strict params + time limit + tags), and the grade rules. Everything is validated
strictly (unknown keys are errors) so a typo never silently disables a check.

A ladder *file* may be shorter: it may take its grade rules from a shared file or extend
another ladder (docs/ladders.md). :mod:`adaptcheck.ladder.loader` resolves it into this flat
form first; these models only ever see a resolved ladder.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from adaptcheck.base.dtypes import FloatDtype
from adaptcheck.base.families import FAMILY_TABLE, FAMILY_TAG, QUANT_FORMATS, Quantization
from adaptcheck.base.features import FEATURE_TAG, unknown_feature

LADDER_SCHEMA_VERSION = 1
LEVELS = ("L1", "L2", "L3", "L4", "L5")

QUANT_TAG = "quant:"
__all__ = ["QUANT_FORMATS", "QUANT_TAG", "Quantization"]  # the formats live with the families (base.families)


class Strict(BaseModel):
    """Base: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class ModelSpec(Strict):
    """The model the ladder certifies with."""

    name: str = Field(default="embedded:tiny-llama", description="'auto' (the first installed pretrained model, "
                      "else embedded:tiny-llama), 'pretrained:NAME', 'embedded:NAME', a local HF model folder "
                      "or a .gguf file.")
    precision: FloatDtype = Field(default="bf16", description="Serving precision.")
    context_length: int = Field(default=2048, gt=0, description="Context length to certify.")
    revision: str | None = Field(default=None, description="Model revision, when known.")
    quantization: Quantization = Field(
        default="none", description="How the model's weights and activations are quantized. A check tagged "
        "'quant:FORMAT' (int8 GEMM, fp8 quantizer …) counts towards the grade only for a model quantized in "
        "FORMAT: 'none' leaves them all out, 'other' (a quantized model of a format not listed) counts them "
        "all. Their results are reported either way.")
    families: list[str] = Field(
        default_factory=list, description="The model's families (base.families: dense, moe, mla, multimodal, "
        "hybrid and the quantized formats), read from its config.json when a run names the model; a check tagged "
        "'family:NAME' counts towards the grade only for a model of family NAME ('unknown' counts them all). "
        "Empty in a ladder file: the run fills it in.")
    family_note: str | None = Field(
        default=None, description="Why the families read as they do when something is off: an unknown family, or "
        "a config.json its weights contradict (one line); None when the reading is clean.")

    @field_validator("families")
    @classmethod
    def _known_families(cls, families: list[str]) -> list[str]:
        for name in families:
            complaint = None if name == "unknown" else FAMILY_TABLE.unknown(name)
            if complaint:
                raise ValueError(complaint)
        return families


class CheckSpec(Strict):
    """One check of the ladder."""

    id: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="Unique id, e.g. 'smoke.matmul'.")
    step: int = Field(ge=1, le=5, description="Ladder step 1-5.")
    kind: str = Field(description="Check kind from the registry (``adaptcheck kinds`` lists them).")
    description: str = Field(default="", description="What the check proves (shown in the report).")
    timeout_s: float | None = Field(default=None, gt=0, description="Time limit; defaults.timeout_s when absent.")
    params: dict[str, Any] = Field(default_factory=dict, description="Kind-specific parameters, validated strictly.")
    tags: list[str] = Field(default_factory=list, description="Free tags used by grade conditions; "
                            "'quant:FORMAT' marks a check only models quantized in FORMAT need; "
                            "'feature:NAME' makes the check certify the serving feature NAME (prefix_caching, "
                            "graph_capture, spec_decode, fp8_kv_cache, preemption, long_context, chunked_prefill, "
                            "tensor_parallel) in the features table (docs/features.md); 'family:NAME' makes it vouch for "
                            "the model family NAME (dense, moe, mla, multimodal, hybrid, gptq, awq, w4a16, int8_w8a8, "
                            "fp8, fp8_block) in the families table and counts it only for models of that family "
                            "(docs/families.md).")

    @field_validator("tags")
    @classmethod
    def _known_quant_formats(cls, tags: list[str]) -> list[str]:
        for tag in tags:
            if tag.startswith(QUANT_TAG) and tag[len(QUANT_TAG):] not in QUANT_FORMATS:
                raise ValueError(f"unknown quantization format in tag {tag!r}; known: "
                                 + ", ".join(QUANT_TAG + f for f in QUANT_FORMATS))
            # A misspelt feature tag would certify nothing, silently: the table would say 'not tested'.
            complaint = unknown_feature(tag[len(FEATURE_TAG):]) if tag.startswith(FEATURE_TAG) else None
            if tag.startswith(FAMILY_TAG):
                complaint = FAMILY_TABLE.unknown(tag[len(FAMILY_TAG):])
            if complaint:
                raise ValueError(f"tag {tag!r}: {complaint}")
        return tags


class ConditionSpec(Strict):
    """A grade condition: every selected check must pass, and at least one must be selected."""

    id: str = Field(description="Condition id.")
    description: str = Field(description="What must hold, in words.")
    checks: list[str] = Field(default_factory=list, description="Check ids or glob patterns ('smoke.*').")
    steps: list[int] = Field(default_factory=list, description="Every check of these steps.")
    tags: list[str] = Field(default_factory=list, description="Every check carrying one of these tags.")
    when: Literal["always", "multi_device", "where_applicable"] = Field(
        default="always", description="'multi_device': only demanded when more than one device is visible; "
        "'where_applicable': only demanded when some selected check applies here (e.g. a compile on/off "
        "comparison, which only frameworks with that switch can make)."
    )

    @model_validator(mode="after")
    def _selects_something(self) -> ConditionSpec:
        if not (self.checks or self.steps or self.tags):
            raise ValueError("a condition must select checks by 'checks', 'steps' or 'tags'")
        return self


class LevelSpec(Strict):
    """One grade level and its conditions."""

    level: Literal["L1", "L2", "L3", "L4", "L5"] = Field(description="Level id.")
    name: str = Field(description="Level name, e.g. 'device usable'.")
    conditions: list[ConditionSpec] = Field(min_length=1, description="All must hold.")


class GradeSpec(Strict):
    """The grade rules."""

    levels: list[LevelSpec] = Field(description="L1..L5 in order.")

    @field_validator("levels")
    @classmethod
    def _ordered(cls, levels: list[LevelSpec]) -> list[LevelSpec]:
        got = [lv.level for lv in levels]
        if got != list(LEVELS[: len(got)]) or not got:
            raise ValueError(f"levels must be listed in order starting at L1, got {got}")
        return levels


class Defaults(Strict):
    """Defaults applied to every check."""

    timeout_s: float = Field(default=120.0, gt=0, description="Per-check time limit in seconds.")


class LadderSpec(Strict):
    """A whole ladder file."""

    schema_version: int = Field(description=f"Ladder schema version; this adaptcheck reads {LADDER_SCHEMA_VERSION}.")
    id: str = Field(description="Ladder id, e.g. 'quick'.")
    version: str = Field(description="Version of this ladder's content.")
    description: str = Field(default="", description="What the ladder is for.")
    defaults: Defaults = Field(default_factory=Defaults, description="Defaults for every check.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="Model under certification.")
    steps: dict[int, str] = Field(
        default_factory=lambda: {
            1: "compatibility matrix",
            2: "tensor smoke",
            3: "operator numerics",
            4: "framework bring-up",
            5: "performance baseline",
        },
        description="Step number → name.",
    )
    checks: list[CheckSpec] = Field(min_length=1, description="Checks in run order.")
    grade: GradeSpec = Field(description="Grade rules.")

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != LADDER_SCHEMA_VERSION:
            raise ValueError(f"unsupported ladder schema_version {v}; this adaptcheck reads {LADDER_SCHEMA_VERSION}")
        return v

    @model_validator(mode="after")
    def _unique_ids(self) -> LadderSpec:
        seen: set[str] = set()
        for i, c in enumerate(self.checks):
            if c.id in seen:
                # ``at`` (in the error's context) is where, below this model, the problem is:
                # yamldata.describe() maps it to the duplicate's line, not the file's first.
                raise PydanticCustomError("duplicate_check_id", "duplicate check id '{id}'",
                                          {"id": c.id, "at": ("checks", i, "id")})
            seen.add(c.id)
        return self

    def timeout_for(self, check: CheckSpec) -> float:
        """The effective time limit of a check."""
        return check.timeout_s if check.timeout_s is not None else self.defaults.timeout_s
