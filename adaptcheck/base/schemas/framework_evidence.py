"""Typed evidence of the step-4 lifecycle checks (``framework.load``, ``framework.reference``, …).

Every lifecycle check runs through one framework instance (``steps.frameworks.lifecycle``) and
records which framework answered (``details.framework``) and which model it served
(``details.model``). Before schema 1.3 the framework was a dict of facts when it loaded and a
bare name when it did not, and readers guessed between the two; now it is one shape,
:class:`FrameworkInfo`, in every outcome: the name always, the facts when it loaded.

One model per kind (:data:`LIFECYCLE_EVIDENCE`). This slice types the fields every reader
shares (framework, model, sub-check rows) and each kind's top-level keys; the nested
comparison, teacher-forced and distribution records are still plain JSON objects (typed in a
later slice), so they are declared as such rather than left to ``extra``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from adaptcheck.base.schemas.evidence import Evidence


class FrameworkInfo(Evidence):
    """The framework a step-4 check ran on: its name always, its facts when it loaded.

    The adapter's ``describe()`` facts (``vllm``/``transformers`` version, ``device``,
    ``platform``, ``url``, a plugin's own keys…) differ per framework, so they are kept as
    extra fields (:attr:`Evidence.extras`) rather than declared here.
    """

    name: str = Field(min_length=1, description="Adapter name the ladder asked for: transformers, vllm, vllm_serve, "
                      "transformers_serve, endpoint or 'module:Class'. Present in every outcome.")
    loaded: bool = Field(default=False, description="True when an instance loaded and the facts below describe it; "
                         "False when it was absent (skip), refused or failed to load (the check's message says why).")
    display_name: str | None = Field(default=None, description="The adapter's display name, e.g. 'vLLM'; None when "
                                     "it did not load.")
    load_s: float | None = Field(default=None, ge=0, description="Seconds the load took (charged to 'loaded_by').")
    loaded_by: str | None = Field(default=None, description="Id of the check that paid for the load (the others "
                                  "reused the instance).")


class ModelInfo(Evidence):
    """The model a framework served (``ResolvedModel.describe()``); facts it lacks are None."""

    name: str | None = Field(default=None, description="Model name as given ('embedded:tiny-llama', a path, …).")
    resolved: str | None = Field(default=None, description="What the name resolved to ('auto' → a concrete model).")
    path: str | None = Field(default=None, description="Local folder (or file) the framework loaded.")
    source: str | None = Field(default=None, description="Where it came from: embedded, pretrained, local, gguf, …")
    architecture: str | None = Field(default=None, description="config.json 'architectures[0]'.")
    model_type: str | None = Field(default=None, description="config.json 'model_type'.")
    head_dim: int | None = Field(default=None, description="Attention head dimension.")
    num_layers: int | None = Field(default=None, description="Transformer layers.")
    vocab_size: int | None = Field(default=None, description="Vocabulary size.")
    torch_dtype: str | None = Field(default=None, description="Stored weights dtype (config.json).")
    weights_sha256: str | None = Field(default=None, description="SHA-256 over the weights files.")
    weights_bytes: int | None = Field(default=None, ge=0, description="Size of the weights files in bytes.")
    generated_s: float | None = Field(default=None, description="Seconds spent generating a synthetic model.")
    synthetic: dict[str, Any] | None = Field(default=None, description="Identity of a synthetic model: name, seed, "
                                             "generator_version, spec_hash, num_params, eos_step.")
    origin: dict[str, Any] | None = Field(default=None, description="Provenance of a converted model (upstream, "
                                          "license, distribution, gguf_sha256).")
    auto: str | None = Field(default=None, description="What 'auto' stood for, in words.")


class SubcheckRow(Evidence):
    """One sub-check: held (``ok: true``), did not hold (``false``) or could not run here (``null``)."""

    name: str = Field(description="What the row checks, in words.")
    ok: bool | None = Field(default=None, description="true held, false did not, null not run here (never a pass).")
    detail: str = Field(default="", description="The numbers or the reason, one line.")


class FrameworkRef(Evidence):
    """The one part of a step-4 outcome every reader groups by: which framework it ran on.

    Readers that need only the framework (grouping, the certificate) read this, so a check whose
    other details do not fit (a hand-edited row) still lands in its framework's block.
    """

    framework: FrameworkInfo = Field(description="The framework the check ran on (one shape whether or not it loaded).")


class FrameworkCheckEvidence(FrameworkRef):
    """What every step-4 lifecycle outcome records: the framework, the model, the sub-check rows."""

    model: ModelInfo | None = Field(default=None, description="The model it served; None when it did not load.")
    subchecks: list[SubcheckRow] = Field(default_factory=list, description="Sub-check rows, in the order run.")


class LoadEvidence(FrameworkCheckEvidence):
    """``framework.load``: the load, and the header-only weights audit of a local folder."""

    weights_audit: dict[str, Any] | None = Field(default=None, description="The weights audit's facts (path, refused, "
                                                  "seconds, counts); None for an endpoint's weights.")


class SingleRequestEvidence(FrameworkCheckEvidence):
    """``framework.single_request``: lengths, long input, max_tokens, stop strings and EOS (the rows)."""


class ComparingEvidence(FrameworkCheckEvidence):
    """A step-4 kind that compares two sets of answers prompt by prompt."""

    comparison: list[dict[str, Any]] | None = Field(default=None, description="Per-prompt verdicts of the greedy "
                                                    "comparison (compare.Comparison.details()).")
    distribution: dict[str, Any] | None = Field(default=None, description="Teacher-forced distribution comparison of "
                                                "the two answers, scaled by the CPU control.")


class ReferenceEvidence(ComparingEvidence):
    """``framework.reference``: the framework's answers against the CPU float64 reference."""

    teacher_forced: dict[str, Any] | None = Field(default=None, description="Teacher-forced figures against the "
                                                  "float64 teacher (or the greedy fallback and why).")
    reference: str | None = Field(default=None, description="What the reference was, e.g. 'transformers fp64 on CPU'.")
    compared_as_text: int | None = Field(default=None, description="Prompts compared as text (token ids unavailable).")
    repro: str | None = Field(default=None, description="Run-folder path of the reproducer written for a failure.")
    repro_error: str | None = Field(default=None, description="Why the reproducer could not be written.")


class ConcurrentEvidence(ComparingEvidence):
    """``framework.concurrent``: alone vs inside a concurrent batch."""


class KvCacheEvidence(ComparingEvidence):
    """``framework.kv_cache``: repeated rounds, KV-cache and memory baseline, prefix cache."""


class CompileEvidence(ComparingEvidence):
    """``framework.compile``: graph capture / compile off vs on."""


class TensorParallelEvidence(ComparingEvidence):
    """``framework.tensor_parallel``: one device vs every device."""


LIFECYCLE_EVIDENCE: dict[str, type[FrameworkCheckEvidence]] = {
    "framework.load": LoadEvidence,
    "framework.single_request": SingleRequestEvidence,
    "framework.reference": ReferenceEvidence,
    "framework.concurrent": ConcurrentEvidence,
    "framework.kv_cache": KvCacheEvidence,
    "framework.compile": CompileEvidence,
    "framework.tensor_parallel": TensorParallelEvidence,
}
"""The evidence model of each lifecycle kind. A kind not listed (a plugin's step-4 kind)
is read as :class:`FrameworkCheckEvidence`, the part they all share."""


def lifecycle_evidence_model(kind: str) -> type[FrameworkCheckEvidence]:
    """The evidence model of a step-4 kind (the shared part for a kind this version does not know)."""
    return LIFECYCLE_EVIDENCE.get(kind, FrameworkCheckEvidence)
