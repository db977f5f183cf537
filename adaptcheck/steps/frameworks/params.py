"""The parameters every step-4 kind shares: which framework and how to load it, the float64
teacher's size (each kind's own params model is in its module under ``kinds/``;
docs/adding-a-check-kind.md)."""

from __future__ import annotations

from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from adaptcheck.base.dtypes import FloatDtype

DEFAULT_TIE_MARGIN = {"fp32": 0.05, "fp16": 0.25, "bf16": 0.5}
"""Largest logprob gap (nats) between two tokens that still counts as a tie when the same
framework answers one prompt differently in two runs (alone vs batched, cached vs not).
bf16 carries ~3 significant digits, so logits of a few units differ by ~0.1 between
batch shapes; a confident token (gap of several nats) must never flip."""


class LoadOverrides(TypedDict, total=False):
    """Keyword arguments of ``lifecycle.acquire`` beyond the framework: what selects the loaded instance."""

    model: str | None
    dtype: FloatDtype | None
    max_model_len: int | None
    compile: bool | None
    enable_prefix_caching: bool | None
    tensor_parallel_size: int
    engine_args: dict[str, JsonValue]
    env: dict[str, str]
    extra: dict[str, JsonValue]


class FrameworkParams(BaseModel):
    """Which framework, and how to load the model on it."""

    model_config = ConfigDict(extra="forbid")

    framework: str = Field(description="Adapter: transformers, vllm, vllm_serve, transformers_serve, endpoint, "
                                       "or 'module:Class' (``adaptcheck frameworks`` lists them).")
    model: str | None = Field(default=None, description="Model for this check instead of the run's: 'embedded:NAME' "
                              "(e.g. embedded:tiny-moe to cover MoE), 'pretrained:NAME', 'auto' or a local path.")
    dtype: FloatDtype | None = Field(default=None, description="Serving dtype; default: the ladder model's precision.")
    max_model_len: int | None = Field(default=None, gt=0, description="Context length to load with; default: the ladder's.")
    compile: bool | None = Field(default=None, description="Graph capture / torch.compile on or off (vLLM: "
                                 "enforce_eager = not compile); None: the framework's default.")
    prefix_caching: bool | None = Field(default=None, description="Prefix caching on or off; None: the framework's default.")
    engine_args: dict[str, JsonValue] = Field(default_factory=dict, description="The framework's own engine "
                                              "arguments (vLLM: ``EngineArgs`` names, e.g. kv_cache_dtype, "
                                              "speculative_config), passed to ``LLM(...)`` in process and as "
                                              "``vllm serve`` flags when served. A name the installed framework "
                                              "does not take is a ladder error; a value it rejects fails the load "
                                              "with its own message.")

    @field_validator("framework")
    @classmethod
    def _known(cls, v: str) -> str:
        from adaptcheck.frameworks.registry import validate_name

        return validate_name(v)

    @model_validator(mode="after")
    def _engine_args_known(self) -> FrameworkParams:
        if self.engine_args:
            from adaptcheck.frameworks.engine_args import EngineArgsError, validate
            from adaptcheck.frameworks.registry import framework_class

            if self.framework == "auto":  # step 5's server choice: the arguments need to know whose they are
                raise EngineArgsError("engine_args need a named framework (vllm_serve, endpoint …), not auto")
            cls = framework_class(self.framework)
            validate(self.engine_args, cls.accepted_engine_args(), cls.display_name)
        return self

    def load_overrides(self) -> LoadOverrides:
        """The keyword arguments that select the loaded instance (shared by checks that agree)."""
        return {"model": self.model, "dtype": self.dtype, "max_model_len": self.max_model_len, "compile": self.compile,
                "enable_prefix_caching": self.prefix_caching, "engine_args": dict(self.engine_args)}


class TeacherSize(BaseModel):
    """The requests the float64 reference answers: ``framework.reference`` compares them, and
    every other check's teacher-forced rows are scaled by the CPU control's divergence on them.

    One set per run is the point: the float64 teacher is the largest single cost of step 4 on a
    deep model (it decodes token by token at 8 bytes a parameter), and it is cached by its
    requests, so checks that ask for the same sizes share one (a ladder that shrinks
    ``framework.reference`` gives its other checks the same ``teacher``)."""

    model_config = ConfigDict(extra="forbid")

    prompts: int = Field(default=6, ge=1, description="Short prompts compared (plus one long prompt and the chat ones).")
    long_prompt_tokens: int = Field(default=300, ge=0, description="Long prompt length in tokens (0: none).")
    chat: bool = Field(default=True, description="Also compare chat-template prompts (when the model has a template).")
    max_tokens: int = Field(default=32, gt=0, description="Tokens generated per prompt.")
    top_n: int = Field(default=5, ge=1, le=20, description="At the first divergence each token must be in the other's top-N.")
    images: int = Field(default=0, ge=0, description="Multimodal chat prompts, each showing one deterministic image "
                        "(a vision-language model; 0: text only). Sent as OpenAI image content parts to servers.")


class TeacherSized(FrameworkParams):
    """A check whose same-framework rows read the CPU control's divergence from the float64 teacher."""

    teacher: TeacherSize = Field(default_factory=TeacherSize, description="The float64 reference's requests whose "
                                 "control divergence scales this check's same-framework bound; give the ladder's "
                                 "framework.reference sizes so one float64 teacher serves every check.")


class VariantsParams(TeacherSized):
    """A kind that loads the framework two ways and compares their greedy answers
    (``framework.compile``, ``framework.tensor_parallel``)."""

    prompts: int = Field(default=4, ge=1, description="Short prompts compared.")
    max_tokens: int = Field(default=24, gt=0, description="Tokens per prompt.")
    top_n: int = Field(default=5, ge=1, le=20, description="Top-N rule at the first divergence.")
