"""Typed evidence of the step-4 checks (``framework.load``, ``framework.reference``, …).

One model per kind (:data:`LIFECYCLE_EVIDENCE`): the framework a check ran on (one shape,
:class:`FrameworkInfo`, in every outcome), the model it served, its sub-check rows, and each
kind's own records: the per-prompt greedy comparison, the teacher-forced figures against the
float64 reference with their bounds, histogram and localisation, the same-framework
distribution rule; plus the reader-side schemas of what a step-4 check records beside them
(its metrics, an adapter's platform facts, the collectives table). The method and what each
figure means: docs/step4-numerics.md; the results file: docs/results-schema.md.
"""

from __future__ import annotations

from pydantic import Field, JsonValue, StrictBool

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


class SyntheticIdentity(Evidence):
    """Which synthetic model was generated (the probe details stay in its folder)."""

    name: str | None = Field(default=None, description="Synthetic model name, e.g. 'tiny-llama'.")
    seed: int | None = Field(default=None, description="Seed of the weights.")
    generator_version: int | None = Field(default=None, description="Version of the generator that wrote it.")
    spec_hash: str | None = Field(default=None, description="SHA-256 of the model's specification.")
    num_params: int | None = Field(default=None, description="Number of parameters.")
    eos_step: int | None = Field(default=None, description="Step at which the planted EOS answer ends.")


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
    synthetic: SyntheticIdentity | None = Field(default=None, description="Identity of a synthetic model.")
    # The provenance file of a converted model folder, as the model registry wrote it: its keys
    # are the registry's (upstream, license, conversion…), foreign to step 4, kept as they are.
    origin: dict[str, JsonValue] | None = Field(default=None, description="Provenance of a converted model (upstream, "
                                          "license, distribution, gguf_sha256).")
    auto: str | None = Field(default=None, description="What 'auto' stood for, in words.")


class SubcheckRow(Evidence):
    """One sub-check: held (``ok: true``), did not hold (``false``) or could not run here (``null``)."""

    name: str = Field(description="What the row checks, in words.")
    # Strict: only a literal true is a pass; a "yes" or 1 from a hand-made file does not fit.
    ok: StrictBool | None = Field(default=None, description="true held, false did not, null not run here (never a "
                                  "pass).")
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
    repro: str | None = Field(default=None, description="Run-folder path of the reproducer written for a failure.")
    repro_error: str | None = Field(default=None, description="Why the reproducer could not be written.")


class WeightsAuditFacts(Evidence):
    """``details.weights_audit``: which folder was audited, whether it was refused, how long it took.

    The audit's counts (files, tensors expected and found, missing, tied, the tokenizer's and
    the embedding's sizes…) depend on what the folder holds and are kept as extra fields.
    """

    path: str | None = Field(default=None, description="The audited model folder.")
    refused: bool | None = Field(default=None, description="True when the folder's weights do not cover the model.")
    seconds: float | None = Field(default=None, ge=0, description="Seconds the audit took (headers only).")


class LoadEvidence(FrameworkCheckEvidence):
    """``framework.load``: the load, and the header-only weights audit of a local folder."""

    weights_audit: WeightsAuditFacts | None = Field(default=None, description="The header-only audit of the served "
                                                    "folder; None for an endpoint's weights.")


class SingleRequestEvidence(FrameworkCheckEvidence):
    """``framework.single_request``: lengths, long input, max_tokens, stop strings and EOS (the rows)."""


class PromptVerdict(Evidence):
    """One prompt's two greedy answers compared token by token (``a`` is the reference side).

    Every field is written for every prompt (null where it does not apply), so a verdict has
    one shape whether the answers were identical, diverged or were compared as text.
    """

    index: int | None = Field(default=None, description="The prompt's position in the comparison.")
    ok: StrictBool | None = Field(default=None, description="The answers agree within the comparison's rule.")
    exact: StrictBool | None = Field(default=None, description="The two answers are identical.")
    common_prefix: int | None = Field(default=None, description="Tokens the answers share from the start.")
    len_a: int | None = Field(default=None, description="Tokens of the first (reference) answer.")
    len_b: int | None = Field(default=None, description="Tokens of the second answer.")
    divergence: int | None = Field(default=None, description="Position of the first differing token; null when "
                                   "identical or one side stopped.")
    token_a: int | None = Field(default=None, description="The first answer's token at the divergence.")
    token_b: int | None = Field(default=None, description="The second answer's token at the divergence.")
    b_in_top_a: StrictBool | None = Field(default=None, description="token_b among the first answer's top-N (null: no "
                                    "logprobs).")
    a_in_top_b: StrictBool | None = Field(default=None, description="token_a among the second answer's top-N (null: no "
                                    "logprobs).")
    gap_a: float | None = Field(default=None, description="logprob_a(token_a) - logprob_a(token_b) at the divergence.")
    max_logprob_diff: float | None = Field(default=None, description="Largest |logprob_a - logprob_b| of the shared "
                                           "tokens over the common prefix.")
    reason: str = Field(default="", description="Why the prompt failed, in words ('' when it held).")
    by_text: StrictBool = Field(default=False, description="Compared as text (an answer had no token ids).")


class DivergenceStats(Evidence):
    """One side's divergence figures over every compared position (``divergence.summarize``).

    Figures are None where a non-finite value was stored (JSON has no NaN or infinity).
    """

    positions: int | None = Field(default=None, ge=0, description="Positions compared.")
    kl_mean: float | None = Field(default=None, description="Mean KL(reference || side) per position, nats.")
    kl_p99: float | None = Field(default=None, description="99th percentile of the per-position KL.")
    kl_max: float | None = Field(default=None, description="Largest per-position KL.")
    dlogprob_mean: float | None = Field(default=None, description="Mean |delta logprob| of the scored token.")
    dlogprob_max: float | None = Field(default=None, description="Largest |delta logprob| of the scored token.")
    same_top_rate: float | None = Field(default=None, description="Share of positions whose most likely token is the "
                                        "same on both sides.")

    def recorded(self) -> dict[str, float | None]:
        """The figures recorded, by statistic name (the name a bound is recorded under)."""
        return {name: float(value) if value is not None else None
                for name, value in self.model_dump(include=set(DivergenceStats.model_fields), exclude_unset=True).items()}


class BoundVerdict(Evidence):
    """One statistic held to its bound: ``value <= multiple x control + floor``."""

    value: float | None = Field(default=None, description="The figure measured.")
    bound: float | None = Field(default=None, description="The bound it is held to.")
    multiple: float | None = Field(default=None, description="Allowed multiple of the control's figure.")
    floor: float | None = Field(default=None, description="Added to the bound for the served dtype.")
    control: float | None = Field(default=None, description="The control's (or the run alone's) figure.")
    ok: StrictBool | None = Field(default=None, description="value <= bound.")


class KlHistogram(Evidence):
    """Counts of log10(KL per position) in half-decade bins, device beside control."""

    edges: list[float] = Field(default_factory=list, description="log10(KL) bin edges.")
    device: list[int] = Field(default_factory=list, description="The device's positions per bin.")
    control: list[int] = Field(default_factory=list, description="The CPU control's positions per bin.")


class ModuleError(Evidence):
    """One recorded tensor (a module's first input or its output) against the float64 reference."""

    module: str | None = Field(default=None, description="Module name, e.g. 'model.layers.0.mlp.act_fn'.")
    where: str | None = Field(default=None, description="'input' or 'output'.")
    error: float | None = Field(default=None, description="The device's normalized error ||dev - ref|| / ||ref||.")
    control: float | None = Field(default=None, description="The CPU control's normalized error at the same tensor.")
    bound: float | None = Field(default=None, description="The bound the device's error is held to.")
    departs: StrictBool | None = Field(default=None, description="error > bound.")


class Localisation(ModuleError):
    """The first module whose output departs from the float64 reference, or why none is named.

    When a module departs, its own row's fields are at the top level; otherwise ``module`` is
    null and ``reason`` says why (no departure, no forward hooks, localisation failed).
    """

    reason: str | None = Field(default=None, description="Why no module is named; null when one is.")
    table: list[ModuleError] = Field(default_factory=list, description="Per-tensor rows in execution order, up to and "
                                     "a few beyond the departure.")
    sequence: int | None = Field(default=None, description="Index of the sequence localised (the worst one).")


class GreedyComparison(Evidence):
    """The greedy answers against the reference's, kept beside the teacher-forced figures."""

    comparison: list[PromptVerdict] = Field(default_factory=list, description="Per-prompt verdicts.")
    compared_as_text: int | None = Field(default=None, description="Prompts compared as text (no token ids).")


class ReferenceRun(Evidence):
    """How the CPU reference ran: in memory or streamed, its memory, and who generated.

    Streamed: the decoder layers read from the safetensors files a layer at a time; the device
    generates where the reference's generation would take too long (docs/reference-at-scale.md).
    """

    mode: str | None = Field(default=None, description="'in_memory' (the whole model loaded) or 'streamed' (the "
                             "decoder layers read from the safetensors files a layer at a time).")
    dtype: str | None = Field(default=None, description="The reference's dtype: 'fp64', or 'fp32' where not even one "
                              "float64 layer fits the budget.")
    budget_bytes: int | None = Field(default=None, ge=0, description="Bytes the reference may hold "
                                     "(--reference-memory, else half of the free memory); null: unknown, unbounded.")
    peak_bytes: int | None = Field(default=None, ge=0, description="Most weight bytes held at once (resident parts "
                                   "plus the layers loaded).")
    layers: int | None = Field(default=None, ge=0, description="Decoder layers (streamed only).")
    held_layers: int | None = Field(default=None, ge=0, description="Layers held at once (streamed only): the first "
                                    "held_layers - 1 stay loaded, the others pass through one slot.")
    bytes_read: int | None = Field(default=None, ge=0, description="Checkpoint bytes read for layer loads (streamed "
                                   "only).")
    load_s: float | None = Field(default=None, ge=0, description="Seconds spent reading and converting layers "
                                 "(streamed only).")
    seconds: float | None = Field(default=None, ge=0, description="Seconds the reference took in all (load, "
                                  "generation, scoring).")
    generation: str | None = Field(default=None, description="'reference generates' (the reference's greedy answers "
                                   "are scored) or 'device generates, reference scores' (the device's greedy answers, "
                                   "scored teacher-forced by the reference).")
    generation_estimate: str | None = Field(default=None, description="The estimate of the reference's generation "
                                            "time that chose the generation mode, in words.")
    cached: bool | None = Field(default=None, description="The figures were read back from this run's cache (the "
                                "reference ran for an earlier check).")


class TeacherForced(Evidence):
    """``details.teacher_forced``: the framework's distributions against the float64 reference.

    ``method`` says what ran: ``teacher_forced`` (the figures below), or ``greedy_fallback``
    for a framework that cannot score a given sequence (only ``fallback_reason`` then).
    """

    method: str | None = Field(default=None, description="'teacher_forced' or 'greedy_fallback'.")
    fallback_reason: str | None = Field(default=None, description="Why teacher forcing did not run; null when it did.")
    top_k: int | None = Field(default=None, description="Alternatives per position the device reported.")
    reference: str | None = Field(default=None, description="The reference, e.g. 'transformers fp64 on cpu (attention "
                                  "sdpa)'.")
    control: str | None = Field(default=None, description="The CPU control at the served dtype, in words.")
    sequences: int | None = Field(default=None, description="Sequences scored.")
    positions: int | None = Field(default=None, description="Positions compared.")
    device: DivergenceStats | None = Field(default=None, description="The device's divergence from the reference.")
    control_stats: DivergenceStats | None = Field(default=None, description="The control's divergence from the "
                                                  "reference.")
    bounds: dict[str, BoundVerdict] | None = Field(default=None, description="Each bounded statistic's verdict.")
    histogram: KlHistogram | None = Field(default=None, description="KL per position, device and control.")
    localisation: Localisation | None = Field(default=None, description="The first departing module (failures only).")
    implementations: dict[str, JsonValue] | None = Field(default=None, description="Which implementation each layer type "
                                                    "ran, as the framework tells.")
    worst_sequence: int | None = Field(default=None, description="Index of the sequence with the largest mean KL.")
    greedy: GreedyComparison | None = Field(default=None, description="The greedy comparison, when it ran.")
    reference_run: ReferenceRun | None = Field(default=None, description="How the CPU reference ran (in memory or "
                                               "streamed, budget, peak, who generated).")


class BatchedVsAlone(Evidence):
    """The batched run's divergence from float64, held to the same framework's alone."""

    alone: DivergenceStats | None = Field(default=None, description="Each sequence alone vs float64.")
    batched: DivergenceStats | None = Field(default=None, description="All sequences in one batch vs float64.")
    bounds: dict[str, BoundVerdict] | None = Field(default=None, description="Each bounded statistic's verdict.")
    ok: StrictBool | None = Field(default=None, description="Every bound held.")


class Distribution(DivergenceStats):
    """``details.distribution``: two runs of one framework, position by position (same-framework rule).

    A bound is either a verdict under ``bounds`` or, in the flat form, ``bound_<stat>``.
    """

    bounds: dict[str, BoundVerdict] | None = Field(default=None, description="Each bounded statistic's verdict.")
    bound_kl_mean: float | None = Field(default=None, description="Flat form: the KL mean's bound.")
    bound_kl_p99: float | None = Field(default=None, description="Flat form: the KL p99's bound.")
    bound_kl_max: float | None = Field(default=None, description="Flat form: the KL max's bound.")
    ok: StrictBool | None = Field(default=None, description="Every bound held; null without a CPU control (no bound).")
    vs_reference: BatchedVsAlone | None = Field(default=None, description="Alone vs batched only: each run against "
                                                "float64.")


class ComparingEvidence(FrameworkCheckEvidence):
    """A step-4 kind that compares two sets of answers prompt by prompt."""

    comparison: list[PromptVerdict] | None = Field(default=None, description="Per-prompt verdicts of the greedy "
                                                   "comparison.")
    distribution: Distribution | None = Field(default=None, description="Teacher-forced distribution comparison of "
                                              "the two runs, scaled by the CPU control.")


class ReferenceEvidence(ComparingEvidence):
    """``framework.reference``: the framework's answers against the CPU float64 reference."""

    teacher_forced: TeacherForced | None = Field(default=None, description="Teacher-forced figures against the "
                                                 "float64 teacher (or the greedy fallback and why).")
    reference: str | None = Field(default=None, description="What the reference was, e.g. 'transformers fp64 on CPU'.")
    compared_as_text: int | None = Field(default=None, description="Prompts compared as text (token ids unavailable).")


class ConcurrentEvidence(ComparingEvidence):
    """``framework.concurrent``: alone vs inside a concurrent batch."""


class KvCacheEvidence(ComparingEvidence):
    """``framework.kv_cache``: repeated rounds, KV-cache and memory baseline, prefix cache."""


class FeatureProof(Evidence):
    """That a serving feature was really active while it was compared, read back from the
    engine (not what was asked): a check whose feature never ran fails on this, not passes."""

    feature: str = Field(description="The feature's name in the certificate (spec_decode, fp8_kv_cache …).")
    active: StrictBool | None = Field(default=None, description="The engine shows the feature ran; null where "
                                      "nothing could be read back.")
    how: str | None = Field(default=None, description="What showed it, in words (counter deltas, engine settings).")
    engine: dict[str, JsonValue] = Field(default_factory=dict, description="The feature instance's engine facts "
                                         "as read back (compilation mode, cache dtype, world size …).")
    counters: dict[str, float] = Field(default_factory=dict, description="The framework's own counters that moved "
                                       "while the feature instance answered (deltas).")


class FeatureEvidence(ComparingEvidence):
    """A serving feature against the same framework without it (``framework.spec_decode`` …)."""

    feature: FeatureProof | None = Field(default=None, description="That the feature was active, and how it shows.")


class CompileEvidence(FeatureEvidence):
    """``framework.compile``: graph capture / compile off vs on."""


class TensorParallelEvidence(FeatureEvidence):
    """``framework.tensor_parallel``: one device vs every device."""


LIFECYCLE_EVIDENCE: dict[str, type[FrameworkCheckEvidence]] = {
    "framework.load": LoadEvidence,
    "framework.single_request": SingleRequestEvidence,
    "framework.reference": ReferenceEvidence,
    "framework.concurrent": ConcurrentEvidence,
    "framework.kv_cache": KvCacheEvidence,
    "framework.compile": CompileEvidence,
    "framework.tensor_parallel": TensorParallelEvidence,
    "framework.spec_decode": FeatureEvidence,
    "framework.fp8_kv_cache": FeatureEvidence,
    "framework.preemption": FeatureEvidence,
    "framework.long_context": FeatureEvidence,
}
"""The evidence model of each lifecycle kind. A kind not listed (a plugin's step-4 kind)
is read as :class:`FrameworkCheckEvidence`, the part they all share."""


def lifecycle_evidence_model(kind: str) -> type[FrameworkCheckEvidence]:
    """The evidence model of a step-4 kind (the shared part for a kind this version does not know)."""
    return LIFECYCLE_EVIDENCE.get(kind, FrameworkCheckEvidence)


# ------------------------------------------------------- read beside the lifecycle details


class FrameworkMetrics(Evidence):
    """The step-4 metrics a reader puts in words (``CheckResult.metrics``; flat name -> value).

    Each kind records a few of them; the others are absent. Per-variant load times
    (``load_s[compile on]``…) and the teacher-forced ``tf_*`` / ``control_*`` figures are kept
    as extra fields.
    """

    load_s: float | None = Field(default=None, description="Seconds the framework took to load.")
    model_generation_s: float | None = Field(default=None, description="Seconds spent generating a synthetic model.")
    requests: int | None = Field(default=None, description="Requests sent (single requests).")
    sequences: int | None = Field(default=None, description="Prompts compared.")
    sequences_exact: int | None = Field(default=None, description="Prompts whose answers were identical.")
    sequences_diverged_within_top_n: int | None = Field(default=None, description="Prompts whose answers diverged "
                                                        "within the comparison's tolerance.")
    sequences_failed: int | None = Field(default=None, description="Prompts whose answers did not agree.")
    token_agreement: float | None = Field(default=None, description="Share of tokens before the first divergence.")
    min_common_prefix_fraction: float | None = Field(default=None, description="The shortest common prefix, as a "
                                                     "share of its answer.")
    max_logprob_abs_diff: float | None = Field(default=None, description="Largest |delta logprob| over the common "
                                               "prefixes.")
    reference_dtype: str | None = Field(default=None, description="The CPU reference's dtype.")
    top_n: int | None = Field(default=None, description="Top-N rule of the comparison.")
    tie_margin: float | None = Field(default=None, description="Tie margin of a same-framework comparison (nats).")
    batch: int | None = Field(default=None, description="Requests per batch.")
    rounds: int | None = Field(default=None, description="Rounds of the KV-cache check.")
    kv_usage_before: float | int | None = Field(default=None, description="KV-cache usage before the rounds.")
    kv_usage_after: float | int | None = Field(default=None, description="KV-cache usage after the rounds.")
    rss_growth_mib: float | None = Field(default=None, description="Resident-memory growth over the rounds, MiB.")


class PlatformPlugin(Evidence):
    """One vLLM platform plugin: what its detector said (``answer`` absent: it was not asked)."""

    name: str = Field(default="", description="Plugin name.")
    source: str = Field(default="", description="'built-in' or the entry point's distribution.")
    answer: str | None = Field(default=None, description="The platform class it named; null: declined.")
    skipped: str | None = Field(default=None, description="Why it was not asked.")
    load_error: str | None = Field(default=None, description="Why it failed to load.")
    detect_error: str | None = Field(default=None, description="What its detector raised.")


class GeneralPlugin(Evidence):
    """One vLLM general plugin."""

    name: str = Field(default="", description="Plugin name.")
    source: str = Field(default="", description="Its entry point.")


class AdapterFacts(Evidence):
    """The adapter facts (:attr:`FrameworkInfo.extras`) the report lays out itself.

    The others are free-form and listed as they are; these are vLLM's platform resolution and
    a served framework's capability probe.
    """

    platform: str | None = Field(default=None, description="The platform class vLLM chose.")
    device_type: str | None = Field(default=None, description="The chosen platform's device type.")
    platform_plugins: list[PlatformPlugin] | None = Field(default=None, description="Every platform detector's "
                                                          "answer (vLLM only).")
    general_plugins: list[GeneralPlugin] | None = Field(default=None, description="vLLM's general plugins.")
    capabilities: dict[str, JsonValue] | None = Field(default=None, description="What a served framework's probe found.")


class InstanceFacts(Evidence):
    """The adapter facts a reproducer needs to load the same instance again."""

    dtype: str | None = Field(default=None, description="The served dtype, e.g. 'bf16'.")
    device: str | None = Field(default=None, description="The torch device it ran on.")
    attention: str | None = Field(default=None, description="Attention implementation (in-process transformers).")
    url: str | None = Field(default=None, description="A served framework's URL (redacted).")
    served_model: str | None = Field(default=None, description="The model name the server answers to.")


class RankProblem(Evidence):
    """What one rank got wrong in one collective."""

    mismatches: int | None = Field(default=None, description="Wrong elements.")
    first_index: int | None = Field(default=None, description="Index of the first wrong element.")
    got: str | int | float | bool | None = Field(default=None, description="The value there.")
    expected: str | int | float | bool | None = Field(default=None, description="The value expected there.")
    error: str | None = Field(default=None, description="What the rank raised.")


class CollectiveRow(Evidence):
    """One op x dtype x size of ``framework.collectives``."""

    op: str = Field(default="", description="The collective, e.g. 'all_reduce'.")
    dtype: str = Field(default="", description="Element dtype.")
    elements: int | None = Field(default=None, description="Elements per rank.")
    bytes_per_rank: int | None = Field(default=None, description="Bytes per rank.")
    status: str = Field(default="", description="ok, mismatch, raised, incomplete or unsupported.")
    time_s: float | None = Field(default=None, description="The slowest rank's time.")
    ranks: dict[str, RankProblem] = Field(default_factory=dict, description="The ranks that were not ok, by rank.")
    missing_ranks: list[int] = Field(default_factory=list, description="Ranks that sent no record.")


class RankExitRecord(Evidence):
    """How one rank process of ``framework.collectives`` ended."""

    rank: int | None = Field(default=None, description="Rank.")
    exit: str | None = Field(default=None, description="How it ended, e.g. 'exited with code 0'.")
    killed: str | None = Field(default=None, description="Why the launcher killed it.")
    last_line: str | None = Field(default=None, description="Its log's last line (or error line).")
    stuck_at: str | None = Field(default=None, description="Innermost frame of a hung rank.")


class CollectivesEvidence(Evidence):
    """``framework.collectives``: the exact-collectives table (it runs on no framework)."""

    table: list[CollectiveRow] = Field(default_factory=list, description="One row per op x dtype x size.")
    ranks: list[RankExitRecord] = Field(default_factory=list, description="How each rank process ended.")
    skipped_dtypes: dict[str, str] = Field(default_factory=dict, description="Dtypes not checked, and why.")


class CollectivesMetrics(Evidence):
    """The ``framework.collectives`` metrics a reader puts in words."""

    world_size: int | None = Field(default=None, description="Ranks launched.")
    library: str | None = Field(default=None, description="Communication library, e.g. 'nccl'.")
    wall_s: float | None = Field(default=None, description="Wall time of the launch.")
